"""`vfsd snapshot`, `snapshots`, `snapshot-delete`, `snapshot-pin`, `restore`, `fork`, `diff`."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import click

from vfsd.config import load_config
from vfsd.rundir import RunDir

from .common import (
    EXIT_USAGE,
    call,
    cli,
    emit,
    fail,
    human,
    json_option,
    phase_progress,
    running,
)
from .mount import say_degraded, spawn_daemon

#: what each change mark of `vfsd diff` means (its legend)
DIFF_MARKS = {"added": "A", "removed": "D", "modified": "M", "renamed": "R",
              "attributes": "T"}
DIFF_LEGEND = ("A added, D deleted, M content changed, R renamed, T attributes only "
               "(mode, owner, times, xattrs)")


@contextmanager
def offline_snapshots(run: RunDir):
    """The snapshots of an unmounted run dir, read-only (a post-mortem of a finished run)."""
    from vfsd.errors import StoreError
    from vfsd.snapshots.snapshots import Snapshots
    from vfsd.store import compact
    from vfsd.store.lmdbcheck import check_readable
    from vfsd.store.store import Store

    try:
        store_dir, volume = run.store_location()
    except (ValueError, OSError) as exc:
        fail(f"cannot read {run.store_file}: {exc}")
    if not compact.exists(store_dir):
        fail(f"{run.path} is not mounted and has no vfsd store ({store_dir})")
    # Damaged pages can crash whoever reads them: a child process reads them first.
    damage = check_readable(store_dir)
    if damage is not None:
        fail(f"{damage}; run `vfsd fsck {store_dir}` for a report")
    try:
        st = Store(store_dir, volume, readonly=True, create=False)
    except StoreError as exc:
        fail(str(exc))
    try:
        yield Snapshots(st), st
    except StoreError as exc:
        fail(str(exc))
    finally:
        st.close()


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--pin", is_flag=True, help="Keep it whatever the retention policy says.")
@click.option("--label", default="", help="A note stored with the snapshot.")
@json_option
def snapshot(run_dir: Path, pin: bool, label: str, as_json: bool) -> None:
    """Snapshot the files of RUN_DIR now; prints the snapshot's id (with --json, its record)."""
    args = {"pin": pin, "label": label}
    if as_json or not sys.stderr.isatty():
        rec = call(run_dir, "snapshot", **args)
    else:
        rec = _snapshot_watched(run_dir, args)
    emit(rec, as_json, lambda r: r["id"])


def _snapshot_watched(run_dir: Path, args: dict) -> dict:
    """The snapshot request, with a progress bar while the daemon builds a
    first snapshot in steps (it says how far it got in its `stats`)."""
    from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable

    result: dict = {}

    def work() -> None:
        try:
            result["rec"] = call(run_dir, "snapshot", **args)
        except SystemExit as exc:  # `fail` in this thread: said, and exits below
            result["exit"] = exc

    worker = threading.Thread(target=work, name="vfsd-snapshot", daemon=True)
    worker.start()
    with phase_progress(unit=" objects") as tell:
        while worker.is_alive():
            worker.join(0.3)
            if not worker.is_alive():
                break
            try:
                with ControlClient(RunDir(run_dir).sock, timeout=5) as c:
                    got = c.call("stats").get("snapshot_in_progress")
            except (ControlError, DaemonUnreachable, OSError):
                got = None
            if got:
                tell("snapshot", min(got["objects"], got["about"]), got["about"])
    if "exit" in result:
        raise result["exit"]
    return result["rec"]


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@json_option
def snapshots(run_dir: Path, as_json: bool) -> None:
    """List the retained snapshots of RUN_DIR, oldest first (mounted or not).

    On an unmounted run dir the store is read without starting a daemon.
    """
    run = RunDir(run_dir)
    if running(run):
        doc = call(run_dir, "snapshots")
    else:
        with offline_snapshots(run) as (snaps, st):
            doc = {"snapshots": snaps.list(), **snaps.state(), "run": st.run_id,
                   "mounted": False}
    emit(doc, as_json, _snapshots_text)


def _snapshots_text(doc: dict):
    for s in doc["snapshots"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["created_ns"] / 1e9))
        flags = " pinned" if s["pinned"] else ""
        label = f"  {s['label']}" if s["label"] else ""
        yield f"{s['id']:>8}  step {s['step']:<6} {when}{flags}{label}"
    if not doc["snapshots"]:
        yield "no snapshots"
    state = "unchanged since" if not doc["changed"] else "changed since"
    if doc["base"]:
        yield f"live files: {state} {doc['base']}"


@cli.command("snapshot-delete")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.option("--force", is_flag=True, help="Delete it even if it is pinned.")
@json_option
def snapshot_delete(run_dir: Path, snapshot_id: str, force: bool, as_json: bool) -> None:
    """Delete a snapshot (content only it kept is freed); a pinned one only with --force."""
    if not force:
        listed = {s["id"]: s for s in call(run_dir, "snapshots")["snapshots"]}
        if listed.get(snapshot_id, {}).get("pinned"):
            fail(f"{snapshot_id} is pinned (kept whatever retention says); unpin it with "
                 f"`vfsd snapshot-pin {RunDir(run_dir).path} {snapshot_id} --unpin`, or "
                 "delete it anyway with --force", EXIT_USAGE)
    rec = call(run_dir, "snapshot_delete", snapshot=snapshot_id)
    emit(rec, as_json, lambda r: f"vfsd: deleted {r['id']}")


@cli.command("snapshot-pin")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.option("--unpin", is_flag=True, help="Let retention delete it again.")
@json_option
def snapshot_pin(run_dir: Path, snapshot_id: str, unpin: bool, as_json: bool) -> None:
    """Pin a snapshot (retention never deletes it) or unpin it."""
    rec = call(run_dir, "snapshot_pin", snapshot=snapshot_id, pin=not unpin)
    emit(rec, as_json, lambda r: f"vfsd: {r['id']} {'pinned' if r['pinned'] else 'unpinned'}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.argument("paths", nargs=-1)
@click.option("--force", is_flag=True,
              help="Restore even over files that processes hold open for writing; "
                   "with PATHs: replace live files that differ.")
@json_option
def restore(run_dir: Path, snapshot_id: str, paths: tuple[str, ...], force: bool,
            as_json: bool) -> None:
    """Make the files of RUN_DIR what SNAPSHOT_ID holds: all of them, or only PATHs.

    Without PATH: files made since disappear, changed files revert, evicted
    ones return; the step goes back to the snapshot's. Refused (naming the
    processes) when it would change a file held open for writing, unless
    --force. With PATHs (files or directories): only those come back, with
    what lies below them, and nothing else changes (nor the step); a live
    file that differs refuses the whole request unless --force.
    """
    if paths:
        from .unevict import bring_back, report_text

        res = bring_back(run_dir, "restore", paths, snapshot=snapshot_id, force=force)
        emit(res, as_json, report_text)
        return
    res = call(run_dir, "restore", snapshot=snapshot_id, force=force)
    if as_json:
        emit(res, True)
    else:
        click.echo(f"vfsd: restored {res['id']} ({res['changed']} change(s) undone, "
                   f"step {res['step']})")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.argument("new_run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--no-mount", is_flag=True, help="Only create it; mount it later with `vfsd mount`.")
@json_option
def fork(run_dir: Path, snapshot_id: str, new_run_dir: Path, no_mount: bool,
         as_json: bool) -> None:
    """Start NEW_RUN_DIR from SNAPSHOT_ID of RUN_DIR (sharing its store; no content copied)."""
    new = RunDir(new_run_dir)
    res = call(run_dir, "fork", snapshot=snapshot_id, run_dir=str(new.path))
    if not no_mount:
        config = load_config(None, {})
        say_degraded(spawn_daemon(new, config, Path(res["store"]), res["volume"]))
    if as_json:
        emit(res, True)
    else:
        click.echo(f"vfsd: {new.path} starts from {snapshot_id} of {RunDir(run_dir).path} "
                   f"({res['files']} files)" + ("" if no_mount else f"; mounted {new.mountpoint}"))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("a")
@click.argument("b", required=False, default="live")
@click.option("--all", "show_all", is_flag=True,
              help="Also list directories whose only change is their attributes (times, mode).")
@json_option
def diff(run_dir: Path, a: str, b: str, show_all: bool, as_json: bool) -> None:
    """What changed from snapshot A to snapshot B (default: the live files), mounted or not.

    Each line is a mark and a path: A added, D deleted, M content changed,
    R renamed (OLD -> NEW), T attributes only. A directory whose entries
    changed also gets new times: such attribute-only directory lines are left
    out unless --all.
    """
    run = RunDir(run_dir)
    if running(run):
        res = call(run_dir, "diff", a=a, b=b)
    else:
        from vfsd.snapshots.snapshots import SnapshotError, SnapshotNotFound

        with offline_snapshots(run) as (snaps, _st):
            try:
                res = {"a": a, "b": b, "changes": snaps.diff(a, None if b == "live" else b)}
            except SnapshotNotFound as exc:
                fail(f"not found: {exc}")
            except SnapshotError as exc:
                fail(str(exc), EXIT_USAGE)
    if not show_all:
        res["changes"] = [c for c in res["changes"]
                          if not (c["change"] == "attributes" and c.get("type") == "dir")]
    emit(res, as_json, _diff_text)


def _diff_text(res: dict):
    changes = res["changes"]
    if not changes:
        yield f"no changes from {res['a']} to {res['b']}"
        return
    for c in changes:
        where = f"{c['old_path']} -> {c['path']}" if c.get("old_path") else c["path"]
        size = f"  ({human(c['size'])})" if c.get("type") == "file" and c["change"] != "removed" \
            else ""
        yield f"{DIFF_MARKS.get(c['change'], '?')}  {where}{size}"
    yield f"({DIFF_LEGEND})"
