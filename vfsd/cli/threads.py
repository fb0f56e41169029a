"""`vfsd threads`: the graph threads of a Runs root, and where each one's files are."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from .common import (
    EXIT_FAILED,
    EXIT_USAGE,
    cli,
    emit,
    escaped,
    fail,
    human,
    json_option,
    rows,
    shown_id,
    table,
)

#: what "last use" means, said with every answer
LAST_USE = ("last use: the later of the thread's last checkpoint (VfsdCheckpointer rewrites "
            "ROOT/threads/<name>/.vfsd/langgraph.position at each) and its newest snapshot "
            "(one per graph step that changed files, and every `snapshot`); files written "
            "outside a checkpointed run leave no such mark")
#: characters of a thread id shown in the list (all of it: `vfsd threads ROOT ID`, --json)
ID_COLUMN = 40


def when(ns: int | None) -> str:
    if ns is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def _num(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


def _list_text(doc: dict) -> list[str]:
    header = ("THREAD", "SHARD", "FILES", "BYTES", "STEP", "SNAPSHOTS", "LAST USE", "SERVED",
              "FILES AT")
    body = []
    for t in doc["threads"]:
        ident = shown_id(t["thread_id"])
        if len(ident) > ID_COLUMN:
            ident = ident[:ID_COLUMN - 3] + "..."
        use = when(t["last_use_ns"])
        if t["last_use_from"]:
            use += f" ({t['last_use_from']})"
        body.append((ident, t["shard"] or "-", _num(t["files"]),
                      human(t["bytes"]) if isinstance(t["bytes"], int) else "-",
                      _num(t["step"]), _num(t["snapshots"]), use,
                      "yes" if t["served"] else "no",
                      escaped(t["files_at"], "surrogateescape") if t["files_at"]
                      else f"({t['state']})"))
    lines = table(header, body, right=frozenset({2, 3, 4, 5}))
    shards = doc["shards"]
    running = sum(1 for s in shards if s["daemon"].get("state") == "running")
    lines.append(f"{len(doc['threads']):,} thread(s) on {len(shards)} shard(s), {running} "
                 "running")
    lines.append(LAST_USE)
    lines += [f"problem: {p}" for p in doc["problems"]]
    return lines


def _one_text(doc: dict) -> str:
    t = doc
    snaps = _num(t["snapshots"])
    if t["last_snapshot"]:
        snaps += f" (last {t['last_snapshot']}, {when(t['last_snapshot_ns'])})"
    use = when(t["last_use_ns"]) + (f" (from its {t['last_use_from']})"
                                    if t["last_use_from"] else " (never: no checkpoint, "
                                                               "no snapshot)")
    shard = t["shard"] or "-"
    if t["shard"]:
        shard += " (running)" if t["shard_running"] else " (not mounted)"
    served = "yes" if t["served"] else (
        "no (its shard is not mounted: a Runs mounts it at the thread's next use)"
        if not t["shard_running"] else "no (not used since its shard started)")
    pairs: list[tuple[str, object]] = [
        ("thread", shown_id(t["thread_id"])),
        ("name", t["name"]),
        ("state", t["state"]),
        ("shard", shard),
        ("files at", escaped(t["files_at"], "surrogateescape") if t["files_at"] else "-"),
        ("records", escaped(t["records"], "surrogateescape")),
        ("files", _num(t["files"])),
        ("bytes", human(t["bytes"]) if isinstance(t["bytes"], int) else "-"),
        ("step", _num(t["step"])),
        ("snapshots", snaps),
        ("last checkpoint", when(t["last_checkpoint_ns"])),
        *([("unbound checkpoints", f"{t['unbound_checkpoints']:,} (their checkpointer could "
                                   "not bind their files: a run from one raises "
                                   "SnapshotUnavailable; see the shard's vfsd.log)")]
          if t.get("unbound_checkpoints") else []),
        ("last use", use),
        ("served", served),
    ]
    pairs += [("problem", p) for p in t["problems"]]
    return rows(pairs)


@cli.command()
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("thread_id", required=False)
@click.option("--id-json", "id_json", metavar="JSON",
              help="The thread id as a JSON string ('\"a\\u0000b\"'), for an id a command "
                   "line cannot carry (NUL, a lone surrogate); instead of THREAD_ID.")
@json_option
def threads(root: Path, thread_id: str | None, id_json: str | None, as_json: bool) -> None:
    """The threads of a Runs root: where each one's files are, its shard, files, bytes, step, snapshots, last use, and whether it is served.

    With THREAD_ID, that thread alone: any id (it is hashed to find its
    directory, never used as a path; an id that starts with '-' goes after
    `--`). A thread's directory whose record names another id is said so and
    never shown as this one (exit 1). Works whether the shards are mounted
    (asked over their sockets) or not (their stores read). Ids are shown
    escaped (spaces, control characters, backslashes and non-ASCII as \\xNN
    of their UTF-8 bytes); --json has them as they are.
    """
    from .runsroot import (
        MAX_THREAD_ID_BYTES,
        RECORD,
        THREADS_DIR,
        is_runs_root,
        read_one,
        read_root,
        thread_name,
    )

    if not is_runs_root(root):
        fail(f"{root} is no Runs root (it has no threads/ or shards/ directory; "
             "mount_tool.runs(ROOT) makes one)", EXIT_USAGE)
    if id_json is not None:
        if thread_id is not None:
            fail("give THREAD_ID or --id-json, not both", EXIT_USAGE)
        try:
            thread_id = json.loads(id_json)
        except ValueError as exc:
            fail(f"--id-json takes a JSON string: {exc}", EXIT_USAGE)
        if not isinstance(thread_id, str):
            fail("--id-json takes a JSON string (in double quotes)", EXIT_USAGE)
    if thread_id is None:
        view = read_root(root)
        threads = [t.as_dict(view.shards) for t in view.threads]
        threads.sort(key=lambda t: (-(t["last_use_ns"] or 0), escaped(t["thread_id"] or "")))
        doc = {"root": str(view.root), "threads": threads,
               "shards": [s.as_dict() for s in view.shards.values()],
               "problems": view.problems, "last_use": LAST_USE}
        emit(doc, as_json, _list_text)
        return
    if len(thread_id.encode("utf-8", "surrogatepass")) > MAX_THREAD_ID_BYTES:
        fail(f"no thread has this id: ids are at most {MAX_THREAD_ID_BYTES:,} bytes")
    name = thread_name(thread_id)
    where = Path(root).absolute() / THREADS_DIR / name
    t, shards = read_one(root, thread_id)
    if t.thread_id is None and not where.exists():
        fail(f"{root} has no thread {shown_id(thread_id)} (its records would be in {where})")
    if t.thread_id is not None and t.thread_id != thread_id:
        fail(f"{where / RECORD} records another thread ({shown_id(t.thread_id)[:200]}), not "
             f"{shown_id(thread_id)[:200]}: two ids with one hash, or a record edited by hand; "
             "not shown as this thread")
    if t.thread_id is None:
        fail(f"thread {shown_id(thread_id)[:200]}: " + "; ".join(t.problems))
    doc = {"root": str(Path(root).absolute()), **t.as_dict(shards), "last_use": LAST_USE}
    emit(doc, as_json, _one_text)
    if t.state == "broken":
        raise SystemExit(EXIT_FAILED)
