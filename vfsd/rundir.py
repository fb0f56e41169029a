"""The layout of a run directory and where its store lives.

    RUN_DIR/fs/        the mountpoint
    RUN_DIR/.vfsd/     vfsd.sock, vfsd.log, vfsd.pid, store.json, and (by
                       default) the store itself: lmdb/ and chunks/

With `--store DIR` the store lives elsewhere and may be shared by several run
dirs; `store.json` remembers which store and volume this run dir uses.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import MOUNT_DIRNAME, STATE_DIRNAME
from .errors import StoreLocked

_MOUNTINFO_ESCAPE = re.compile(rb"\\([0-7]{3})")
#: the lock a shard daemon holds on its whole store (`lock_volume`'s name for it):
#: no other daemon, and no fsck, may open the store meanwhile
SHARD_LOCK = "\0shard"


@dataclass
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        self.path = Path(os.path.abspath(self.path))

    @property
    def mountpoint(self) -> Path:
        return self.path / MOUNT_DIRNAME

    @property
    def mount_root(self) -> Path:
        """The FUSE mount (a run dir's volume is seen at its root)."""
        return self.mountpoint

    @property
    def state(self) -> Path:
        return self.path / STATE_DIRNAME

    @property
    def sock(self) -> Path:
        return self.state / "vfsd.sock"

    @property
    def log(self) -> Path:
        return self.state / "vfsd.log"

    @property
    def pidfile(self) -> Path:
        return self.state / "vfsd.pid"

    @property
    def store_file(self) -> Path:
        return self.state / "store.json"

    def store_location(self, store: Path | None = None) -> tuple[Path, str]:
        """(store dir, volume name), from `store` or what was recorded earlier."""
        recorded = None
        if self.store_file.exists():
            recorded = json.loads(self.store_file.read_text())
        if store is None:
            if recorded:
                return Path(recorded["store"]), recorded["volume"]
            return self.state, "default"
        store = Path(os.path.abspath(store))
        if recorded and Path(recorded["store"]) != store:
            raise ValueError(
                f"{self.path} already uses store {recorded['store']}, not {store}")
        if store == self.state:
            return store, "default"
        return store, volume_name(self.path)

    def record_store(self, store: Path, volume: str) -> None:
        if store == self.state and volume == "default":
            return
        tmp = self.store_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"store": str(store), "volume": volume}))
        os.replace(tmp, self.store_file)

    def read_pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None


def volume_name(run_path: Path) -> str:
    """The volume name of a run dir in a shared store: its path, as text that
    encodes to UTF-8 (bytes of a non-UTF-8 path are written as \\xNN)."""
    return os.fsencode(run_path).decode("utf-8", "backslashreplace")


def utf8_problem(path: Path) -> str | None:
    """Why LMDB cannot open a store at `path` (it takes UTF-8 paths only), or None."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        return (f"the store path {shown} is not valid UTF-8, which LMDB requires; "
                "give --store a directory whose path is UTF-8")
    return None


def pid_alive(pid: int | None) -> bool:
    """True if `pid` runs (a zombie waiting for its parent to reap it counts as gone)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def lock_volume(store: Path, volume: str) -> int:
    """Take the volume's lock (held for the daemon's life); StoreLocked if taken."""
    locks = store / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(volume.encode()).hexdigest()[:24]
    fd = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        raise StoreLocked(
            f"volume {volume!r} of store {store} is in use by another vfsd"
            + (f" (pid {holder})" if holder else "")) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _unescape_mountinfo(field: bytes) -> bytes:
    """A mountinfo path field as the kernel saw it: space, tab, newline and
    backslash are written there as octal escapes (\\040, \\011, \\012, \\134)."""
    return _MOUNTINFO_ESCAPE.sub(lambda m: bytes([int(m[1], 8)]), field)


def mounted_paths() -> set[bytes]:
    """Every mount point in this process's mount namespace, as raw bytes."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            return {_unescape_mountinfo(line.split(b" ")[4]) for line in f}
    except OSError:
        return set()


def mount_ids(path: Path) -> tuple[int, int, int] | None:
    """(mount id, device major, minor) of the mount on `path` (symlinks
    resolved), as /proc names it in fdinfo and maps; None if none."""
    want = os.fsencode(os.path.realpath(path))
    found = None
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split(b" ")
                if _unescape_mountinfo(fields[4]) == want:
                    major, minor = fields[2].split(b":")
                    found = int(fields[0]), int(major), int(minor)  # the last one is on top
    except (OSError, ValueError, IndexError):
        return None
    return found


def is_mount_point(path: Path) -> bool:
    """True when `path` (symlinks resolved) is a mount point."""
    return os.fsencode(os.path.realpath(path)) in mounted_paths()


def syncfs(path: Path) -> None:
    """Write back every dirty page of the filesystem holding `path` (OSError if not)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


#: sync_file_range(2): wait for writeback in flight, start it, wait for it
_SYNC_RANGE_ALL = 1 | 2 | 4


def write_back(paths: list[Path]) -> None:
    """Write back the kernel's dirty pages of each file in `paths` (what
    syncfs does for a whole filesystem); a file that is gone is skipped.
    Blocks: a worker thread."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # renamed or removed since: its pages went with it, or stay its own
        try:
            libc.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), _SYNC_RANGE_ALL)
        finally:
            os.close(fd)


def remove_stale_mount(mountpoint: Path) -> bool:
    """Detach the mount on `mountpoint` lazily; True if fusermount3 succeeded.

    An argument list, never a shell line: a run dir may be named anything.
    """
    try:
        proc = subprocess.run(["fusermount3", "-u", "-z", "--", str(mountpoint)],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def mount_state(mountpoint: Path) -> str:
    """'none', 'live' or 'stale' (a FUSE mount whose daemon is gone)."""
    if not is_mount_point(mountpoint):
        return "none"
    try:
        # statfs is never answered from the kernel's caches (stat may be), so
        # it reaches the daemon, or fails at once when the daemon is gone.
        os.statvfs(mountpoint)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO):
            return "stale"
        raise
    return "live"
