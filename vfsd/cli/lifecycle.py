"""`vfsd copy` and `vfsd drop`: a run dir copied with its history, or deleted for good."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import click

from vfsd.rundir import RunDir, mount_state, pid_alive

from .common import EXIT_USAGE, call, cli, emit, fail, json_option


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("new_run_dir", type=click.Path(file_okay=False, path_type=Path))
@json_option
def copy(run_dir: Path, new_run_dir: Path, as_json: bool) -> None:
    """Copy mounted RUN_DIR to NEW_RUN_DIR with its files and every snapshot, sharing content.

    The copy shares RUN_DIR's store (no content is copied), has the same
    snapshots under the same ids, and diverges independently from then on;
    mount it with `vfsd mount NEW_RUN_DIR`. RUN_DIR must use a shared store
    (`--store`) for the copy to live in.
    """
    new = RunDir(new_run_dir)
    res = call(run_dir, "copy", client_timeout=3600, run_dir=str(new.path))
    emit(res, as_json, lambda r: (
        f"vfsd: {new.path} is a copy of {RunDir(run_dir).path} as of {r['snapshot']} "
        f"({r['files']} files, {r['snapshots']} snapshots)"))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@json_option
def drop(run_dir: Path, as_json: bool) -> None:
    """Delete unmounted RUN_DIR for good: its files, its snapshots, the directory.

    In a shared store (`--store`) only this run dir's volume goes: content
    that other run dirs or their snapshots hold stays. Nothing of another
    run dir is touched. A run published to a bucket keeps its objects there
    (`vfsd gc --remote` collects chunks no run names).
    """
    run = RunDir(run_dir)
    if not run.path.is_dir():
        fail(f"{run.path} is not a directory", EXIT_USAGE)
    if not run.state.is_dir():
        fail(f"{run.path} is not a vfsd run dir (no {run.state.name}/)", EXIT_USAGE)
    if mount_state(run.mountpoint) != "none" or pid_alive(run.read_pid()):
        fail(f"{run.path} is mounted: `vfsd umount {run.path}` first")
    try:
        store_dir, volume = run.store_location()
    except (OSError, ValueError) as exc:
        fail(f"cannot tell where {run.path} keeps its store: {exc}")
    shared = store_dir != run.state
    if shared:
        _drop_volume(store_dir, volume)
    shutil.rmtree(run.path)
    res = {"run_dir": str(run.path), "store": str(store_dir), "volume": volume,
           "shared_store": shared}
    emit(res, as_json, lambda r: f"vfsd: deleted {r['run_dir']}" + (
        f" and its volume in {r['store']}" if shared else ""))


#: seconds a drop waits for the volume's lock of a daemon on its way out
LOCK_RELEASE_WAIT = 10.0


def _drop_volume(store_dir: Path, volume: str) -> None:
    """Drop `volume` of the store at `store_dir`, holding its lock (no daemon may serve it)."""
    import os

    from vfsd.errors import StoreError, StoreLocked
    from vfsd.rundir import lock_volume
    from vfsd.snapshots.snapshots import drop_volume
    from vfsd.store.store import Store

    if not (store_dir / "lmdb" / "data.mdb").exists():
        return  # the store was never written: nothing of the volume is there
    # A daemon that was just unmounted removes its pid file, then closes the
    # store and exits: its lock goes a moment after (a drop right behind an
    # unmount, as a thread's deletion does, must not fail on that).
    gone_by = time.monotonic() + LOCK_RELEASE_WAIT
    while True:
        try:
            lock = lock_volume(store_dir, volume)
            break
        except StoreLocked as exc:
            if time.monotonic() > gone_by:
                fail(str(exc))
            time.sleep(0.05)
    try:
        st = Store(store_dir, None, create=False)
        try:
            if volume in st.volumes():
                drop_volume(st, volume)
        finally:
            st.close()
    except StoreError as exc:
        fail(f"cannot drop {volume} from {store_dir}: {exc}")
    finally:
        os.close(lock)
