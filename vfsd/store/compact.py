"""Give the store's disk space back: rewrite the LMDB file without free pages.

LMDB reuses the pages it frees but never shrinks its file, so a volume that
once held many small files keeps a file as large as its peak. Compaction
copies the live pages into a new file (LMDB's own compacting copy), makes it
durable, and swaps it in with renames.

Nobody may write to the store meanwhile: writes to the old file after the
copy would be lost, and a process that has the old file mapped would go on
writing to a deleted file. So every process that opens the store for
writing holds `locks/store.lock` shared (`hold`) for as long as it has it
open, and compaction holds it exclusively: it refuses to start while any
holder lives, and nobody can open the store while it runs. Volume locks are
not enough, since a run dir that never used the store has none yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from pathlib import Path

import lmdb

from vfsd import errors

LOCK_NAME = "store.lock"


def _lock_file(store_dir: Path) -> int:
    locks = Path(store_dir) / "locks"
    locks.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(locks / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def exists(store_dir: Path) -> bool:
    """Whether `store_dir` holds an LMDB file (or one a compaction is swapping in)."""
    return any((Path(store_dir) / name).is_dir() for name in ("lmdb", "lmdb.old"))


def _interrupted(store_dir: Path) -> bool:
    return any((Path(store_dir) / name).exists() for name in ("lmdb.compact", "lmdb.old"))


def hold(store_dir: Path) -> int:
    """Keep compaction off the store while the returned fd stays open.

    First finishes or undoes a compaction that a crash cut short. Raises
    StoreLocked while a compaction runs.
    """
    fd = _lock_file(store_dir)
    try:
        if _interrupted(store_dir):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            recover(store_dir)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise errors.StoreLocked(
            f"store {store_dir} is being compacted (`vfsd gc --compact`); "
            "try again when it has finished") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compact(store_dir: Path, on_progress=None) -> dict[str, int]:
    """Compact `store_dir/lmdb`; the sizes before and after, in bytes.

    Raises StoreLocked while any process has the store open for writing. A
    crash at any point leaves either the old file or the new one in place
    under `lmdb/` (plus a leftover `lmdb.compact/` or `lmdb.old/` that the
    next opener removes, see `recover`).
    `on_progress("compact", bytes_written, bytes_expected)` is told how the
    copy goes (a progress bar), a few times a second.
    """
    fd = _lock_file(store_dir)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise errors.StoreLocked(
                f"store {store_dir} is in use (a daemon or another vfsd command has it "
                "open): stop it to compact the store") from None
        recover(store_dir)
        return _compact(Path(store_dir), on_progress)
    finally:
        os.close(fd)


def _compact(store_dir: Path, on_progress=None) -> dict[str, int]:
    live = store_dir / "lmdb"
    new = store_dir / "lmdb.compact"
    old = store_dir / "lmdb.old"
    before = (live / "data.mdb").stat().st_size
    new.mkdir(mode=0o700)
    env = lmdb.open(str(live), readonly=True, lock=True, max_dbs=64)
    try:
        if on_progress is None:
            env.copy(str(new), compact=True)
        else:
            _copy_watched(env, new, on_progress)
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
    _fsync_dir(store_dir)
    shutil.rmtree(old, ignore_errors=True)
    return {"before_bytes": before, "after_bytes": (live / "data.mdb").stat().st_size}


def _copy_watched(env, new: Path, on_progress) -> None:
    """env.copy in a thread (it releases the GIL), the copy's size reported meanwhile."""
    info, stat = env.info(), env.stat()
    expected = (info["last_pgno"] + 1) * stat["psize"]  # an upper bound: free pages are not copied
    failed: list[BaseException] = []

    def copy() -> None:
        try:
            env.copy(str(new), compact=True)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller
            failed.append(exc)

    worker = threading.Thread(target=copy, name="vfsd-compact")
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        with contextlib.suppress(OSError):
            on_progress("compact", min(expected, (new / "data.mdb").stat().st_size), expected)
    if failed:
        raise failed[0]
    on_progress("compact", expected, expected)


def recover(store_dir: Path) -> None:
    """Finish or undo a compaction a crash interrupted (under the exclusive lock)."""
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
