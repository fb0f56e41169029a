"""`vfsd timeline`: the run step by step, as text, JSON or one HTML page."""

from __future__ import annotations

from pathlib import Path

import click

from vfsd.rundir import RunDir

from .common import EXIT_USAGE, call, cli, emit, fail, human, json_option, running
from .info import call_text


def offline_timeline(run: RunDir) -> dict:
    """The timeline of an unmounted run dir, from its store (read-only)."""
    from vfsd.store.calls import describe
    from vfsd.timeline import timeline

    from .snapshots import offline_snapshots

    with offline_snapshots(run) as (snaps, st):
        return timeline(st, snaps, describe_call=lambda key: describe(key, st.get_call(key)))


def who(entry: dict) -> str:
    """`write_file w1 (2 made, 1 changed)` for one call of a step."""
    c = entry["call"]
    name = "no tool call" if c is None else (
        f"{c['tool']} {c['id']}" if "tool" in c else call_text(c))
    counts = [f"{entry[k]} {label}" for k, label in
              (("created", "made"), ("changed", "changed"), ("deleted", "deleted"))
              if entry.get(k)]
    return f"{name} ({', '.join(counts)})" if counts else name


def _text(doc: dict):
    yield (f"run {doc['run']}: step {doc['step']}, {doc['files']} files, "
           f"{human(doc['logical_bytes'])} live, {human(doc['stored_bytes'])} stored")
    if not doc["steps"]:
        yield "nothing recorded yet"
        return
    yield (f"{'step':>6}  {'files':>6}  {'live':>10}  {'stored':>10}  {'made':>5}  "
           f"{'changed':>7}  {'deleted':>7}  {'evicted':>7}  snapshots / tool calls")
    for s in doc["steps"]:
        def num(v):
            return "-" if v is None else v

        def size(v):
            return "-" if v is None else human(v)

        extra = [s_["id"] + (f" ({s_['label']})" if s_.get("label") else "")
                 for s_ in s["snapshots"]]
        extra += [f"restored {r['id']} (from step {r['from_step']})" for r in s["restores"]]
        extra += [who(c) for c in s["calls"]]
        yield (f"{s['step']:>6}  {num(s['files']):>6}  {size(s['logical_bytes']):>10}  "
               f"{size(s['stored_bytes']):>10}  {s['created']:>5}  {s['changed']:>7}  "
               f"{s['deleted']:>7}  {s['evicted']:>7}  {'; '.join(extra)}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write one self-contained HTML page (a chart of bytes and files over "
                   "steps and the changes of each step; no network needed to view it).")
@click.option("--last", type=click.IntRange(1), default=None,
              help="Only the last N steps [all that are kept, up to 2,000].")
@json_option
def timeline(run_dir: Path, html_file: Path | None, last: int | None, as_json: bool) -> None:
    """The run step by step: files made, changed, deleted, evicted and restored, by which tool calls, bytes live and stored, snapshots and their checkpoints.

    Works on an unmounted run dir too (from the store).
    """
    run = RunDir(run_dir)
    doc = call(run_dir, "timeline") if running(run) else offline_timeline(run)
    if last is not None:
        doc["steps"] = doc["steps"][-last:]
    if html_file is not None:
        from .timeline_page import render

        try:
            html_file.write_text(render(doc, title=run.path.name), encoding="utf-8")
        except OSError as exc:
            fail(f"cannot write {html_file}: {exc}", EXIT_USAGE)
    emit(doc, as_json, _text)
