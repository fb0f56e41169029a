"""A Runs root of the earlier layout (one daemon and one mount per thread), served as is.

That layout kept every thread's files in one shared store, `ROOT/store`, as
one volume per thread named by its run dir's absolute path, with the run dir
`ROOT/threads/t<hex>/` holding `thread.json` (version 1), `fs/` (the
thread's mountpoint) and `.vfsd/` (the daemon's `store.json`, `vfsd.log`, and
VfsdCheckpointer's records).

Nothing is copied. That store becomes the store of one more shard,
`ROOT/shards/legacy` (`vfsd mount --shard ROOT/shards/legacy --store
ROOT/store`), and each earlier thread is moved onto it on its first use: its
volume is renamed to the thread's shard name (`volume_adopt`: files,
snapshots, run id and history stay as they are, so its checkpoints restore
their files), its record becomes version 2 naming the shard, and its empty
`fs/` mountpoint becomes the link to its directory in the shard's mount.
`.vfsd/store.json` is renamed `store.json.adopted` (it names a volume that
no longer exists under that name). A thread copied from such a thread lives
on the legacy shard too; new threads go to the ordinary shards.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..daemon.mountinfo import is_mounted
from ..errors import ControlError, MountToolError
from .jsonfile import read_json_record

if TYPE_CHECKING:
    from . import Runs

#: the shard that serves the earlier layout's store
LEGACY_SHARD = "legacy"
#: where the earlier layout kept the store every thread shared
LEGACY_STORE = "store"
STORE_RECORD = "store.json"


def legacy_volume(run_dir: Path) -> str | None:
    """The volume an earlier run dir's daemon served (None: it never mounted)."""
    path = run_dir / ".vfsd" / STORE_RECORD
    doc = read_json_record(path, "the volume that holds this thread's files in the earlier "
                                 "layout")
    if doc is None:
        return None
    volume = doc.get("volume")
    if not isinstance(volume, str) or not volume:
        raise MountToolError(f"{path} names no volume")
    return volume


def check_no_earlier_daemons(threads_dir: Path) -> None:
    """Refuse while a daemon of the earlier layout still serves a run dir of
    this root: it would write to the store the legacy shard opens."""
    prefix = os.fsencode(threads_dir) + b"/"
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            target = line.split(b" ")[4]
            if target.startswith(prefix):
                shown = os.fsdecode(target)
                raise MountToolError(
                    f"{shown} is still mounted by a vfsd of the earlier layout (one daemon "
                    f"per thread): stop what serves it (`vfsd umount {shown[:-3]}`) before "
                    "a Runs of this version serves the root")


def adopt(runs: Runs, run_dir: Path, name: str, thread_id: str) -> str:
    """Move an earlier thread onto the legacy shard (see the module docstring);
    the shard its record names afterwards. A thread whose first mount never
    happened holds no files: it goes to an ordinary shard like a new one."""
    if is_mounted(run_dir / "fs"):
        raise MountToolError(
            f"{run_dir / 'fs'} is still mounted by a vfsd of the earlier layout: unmount it "
            f"(`vfsd umount {run_dir}`) before a Runs of this version serves the thread")
    old = legacy_volume(run_dir)
    if old is None:
        return runs.shard_for(name)
    shard = runs.shard(LEGACY_SHARD)
    if not shard.alive():
        check_no_earlier_daemons(runs.threads_dir)
    try:
        shard.call("volume_adopt", from_name=old, volume=name, thread=thread_id)
    except ControlError as exc:
        if exc.code == "no_such_volume":
            raise MountToolError(
                f"{run_dir} is a thread of the earlier layout, but its volume ({old!r:.200}) "
                f"is not in {runs.root / LEGACY_STORE}: its files are not there") from None
        if exc.code == "wrong_thread":
            raise MountToolError(f"{run_dir}: {exc.message}") from None
        raise
    fs = run_dir / "fs"
    if fs.is_dir() and not fs.is_symlink():
        try:
            os.rmdir(fs)  # the earlier mountpoint: empty while unmounted
        except OSError as exc:
            raise MountToolError(
                f"{fs}, the earlier mountpoint of thread {thread_id!r:.200}, holds files of "
                f"its own ({exc}): move them away; the thread's files are served from "
                f"{shard.mountpoint / name}") from None
    os.replace(run_dir / ".vfsd" / STORE_RECORD, run_dir / ".vfsd" / (STORE_RECORD + ".adopted"))
    return LEGACY_SHARD
