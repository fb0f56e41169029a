"""`vfsd warmup`: fetch a resumed run's chunks before programs read them."""

from __future__ import annotations

from pathlib import Path

import click

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir

from .common import (
    EXIT_FAILED,
    cli,
    control_failure,
    emit,
    fail,
    human,
    json_option,
    progress,
    rows,
    unreachable,
)
from .info import mount_relative

#: chunks per fetch request (a progress step)
BATCH = 16


def _text(doc: dict) -> str:
    p = doc["plan"]
    pairs = [("files", p["files"]),
             ("local", f"{p['local_chunks']} of {p['chunks']} chunks "
                       f"({human(p['local_bytes'])})"),
             ("in the bucket only", f"{p['missing_chunks']} chunks "
                                    f"({human(p['missing_bytes'])})")]
    bound = (f"the cache bound ({human(p['cache_limit'])})" if p["cache_limit"]
             else "the free disk space")
    if doc["check"]:
        pairs.append(("a warm-up would fetch", f"{p['fetch']} chunks "
                                               f"({human(p['fetch_bytes'])})"))
    else:
        r = doc["result"]
        pairs.append(("fetched", f"{r['fetched']} chunks ({human(r['bytes'])})"
                      + (f", {r['already']} were local meanwhile" if r["already"] else "")))
        if r["failed"]:
            pairs.append(("failed", f"{len(r['failed'])} chunks: {r['failed'][0]['error']}"))
    if p["skipped_chunks"]:
        pairs.append(("left in the bucket", f"{p['skipped_chunks']} chunks "
                                            f"({human(p['skipped_bytes'])}): beyond {bound}"))
    return rows(pairs)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("paths", nargs=-1)
@click.option("--check", is_flag=True,
              help="Only say how much of it is local and what a warm-up would fetch.")
@json_option
def warmup(run_dir: Path, paths: tuple[str, ...], check: bool, as_json: bool) -> None:
    """Fetch a remote run's chunks (of PATHs, or every file) ahead of use, within the chunk cache's bound; --check says how much is local.

    For a run resumed with `vfsd mount --from`: its content is in the bucket
    and is otherwise fetched at each file's first read. PATHs (files or
    directories) are relative to the mount root, or absolute inside it;
    those named first are fetched first. Exit 1 if a chunk could not be
    fetched.
    """
    run = RunDir(run_dir)
    rel = [mount_relative(run, p) for p in paths]
    try:
        with ControlClient(run.sock, timeout=600) as client:
            plan = client.call("warmup_plan", paths=rel)
            doc = {"check": check, "plan": plan, "result": None}
            if not check:
                result = {"fetched": 0, "bytes": 0, "already": 0, "failed": []}
                todo = plan["fetch"]
                with progress(plan["fetch_bytes"], "warmup", unit="B",
                              enabled=not as_json) as bar:
                    for i in range(0, len(todo), BATCH):
                        batch = todo[i:i + BATCH]
                        got = client.call("warmup_fetch", digests=[d for d, _ in batch])
                        for key in ("fetched", "bytes", "already"):
                            result[key] += got[key]
                        result["failed"] += got["failed"]
                        bar.update(sum(size for _, size in batch))
                doc["result"] = result
    except DaemonUnreachable as exc:
        fail(unreachable(run, exc))
    except ControlError as exc:
        if exc.code == "no_remote":
            fail(f"{run.path} has no remote tier: its chunks are all local already")
        fail(control_failure(run, exc))
    plan["fetch"] = len(plan["fetch"])  # chunks; the digests are the daemon's business
    emit(doc, as_json, _text)
    if doc["result"] and doc["result"]["failed"]:
        raise SystemExit(EXIT_FAILED)
