"""Give the store's disk space back: rewrite the LMDB file without free pages.

LMDB reuses the pages it frees but never shrinks its file, so a volume that
once held many small files keeps a file as large as its peak. Compaction
copies the live pages into a new file (LMDB's own compacting copy), makes it
durable, and swaps it in with renames. It runs only with no daemon on the
store (it takes every volume's lock), like fsck.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lmdb

from . import errors


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compact(store_dir: Path) -> dict[str, int]:
    """Compact `store_dir/lmdb`; the sizes before and after, in bytes.

    The caller holds every volume's lock. A crash at any point leaves either
    the old file or the new one in place under `lmdb/` (plus a leftover
    `lmdb.compact/` or `lmdb.old/` that the next run removes).
    """
    live = Path(store_dir) / "lmdb"
    new = Path(store_dir) / "lmdb.compact"
    old = Path(store_dir) / "lmdb.old"
    for stale in (new, old):
        shutil.rmtree(stale, ignore_errors=True)
    before = (live / "data.mdb").stat().st_size
    new.mkdir(mode=0o700)
    env = lmdb.open(str(live), readonly=True, lock=True, max_dbs=64)
    try:
        env.copy(str(new), compact=True)
    except lmdb.Error as exc:
        shutil.rmtree(new, ignore_errors=True)
        raise errors.Corrupt(f"cannot copy the store's LMDB file: {exc}") from None
    finally:
        env.close()
    fd = os.open(new / "data.mdb", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(new)
    os.rename(live, old)
    os.rename(new, live)
    _fsync_dir(Path(store_dir))
    shutil.rmtree(old, ignore_errors=True)
    return {"before_bytes": before, "after_bytes": (live / "data.mdb").stat().st_size}


def recover(store_dir: Path) -> None:
    """Finish or undo a compaction a crash interrupted (called before opening)."""
    live = Path(store_dir) / "lmdb"
    new = Path(store_dir) / "lmdb.compact"
    old = Path(store_dir) / "lmdb.old"
    if not (live / "data.mdb").exists():
        # Between the two renames: the new file was complete and durable
        # before the first rename, so it wins; else the old one goes back.
        if (new / "data.mdb").exists() and old.exists():
            os.rename(new, live)
        elif (old / "data.mdb").exists():
            os.rename(old, live)
        else:
            return
        _fsync_dir(Path(store_dir))
    for stale in (new, old):
        shutil.rmtree(stale, ignore_errors=True)
