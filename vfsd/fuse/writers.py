"""Which processes hold files of the mount open for writing, read from /proc.

A restore changes files under whoever has them open: a program writing a
database across it goes on from its own idea of the file and corrupts it. The
daemon knows which inodes are open, not by whom nor how, so the restore asks
the kernel: every process's descriptors (`/proc/PID/fdinfo/N`: mount id,
inode number and open flags) and shared writable mappings (`/proc/PID/maps`:
device and inode) on this mount. Inode numbers on the mount are the store's,
so no path is resolved and no request reaches the mount. Only processes this
daemon may inspect are seen: all of them as root, its own user's otherwise.

Blocking (it reads /proc): call it from a worker thread.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from vfsd.rundir import mount_ids

_ACCMODE = os.O_WRONLY | os.O_RDWR


def writers(mountpoint: Path) -> dict[int, list[tuple[int, str]]]:
    """inode -> [(pid, command)] of the processes that hold it open for
    writing (or mapped shared and writable) on the mount at `mountpoint`."""
    ids = mount_ids(mountpoint)
    if ids is None:
        return {}
    mnt_id, major, minor = ids
    maps_dev = f"{major:02x}:{minor:02x}"
    out: dict[int, set[int]] = defaultdict(set)
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        for ino in _fd_writers(pid, mnt_id) | _mapped_writers(pid, maps_dev):
            out[ino].add(pid)
    return {ino: sorted((pid, _command(pid)) for pid in pids) for ino, pids in out.items()}


def _fd_writers(pid: int, mnt_id: int) -> set[int]:
    found = set()
    base = f"/proc/{pid}/fdinfo"
    try:
        fds = os.listdir(base)
    except OSError:
        return found  # gone, or not ours to look at
    for fd in fds:
        try:
            with open(f"{base}/{fd}", "rb") as f:
                info = dict(line.split(b":", 1) for line in f.read().splitlines()
                            if b":" in line)
            if int(info.get(b"mnt_id", b"-1")) != mnt_id:
                continue
            if int(info.get(b"flags", b"0"), 8) & _ACCMODE:
                found.add(int(info[b"ino"]))
        except (OSError, ValueError, KeyError):
            continue
    return found


def _mapped_writers(pid: int, dev: str) -> set[int]:
    found = set()
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                parts = line.split(None, 5)
                # address perms offset dev inode [path]; "rw-s": shared, writable
                if len(parts) >= 5 and parts[3].decode() == dev and parts[1][1:2] == b"w" \
                        and parts[1][3:4] == b"s":
                    found.add(int(parts[4]))
    except (OSError, ValueError):
        pass
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
