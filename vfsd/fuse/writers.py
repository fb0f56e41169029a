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


def holders(mountpoint: Path, owns) -> list[tuple[int, str]]:
    """[(pid, command)] of the processes that hold an inode of the mount at
    `mountpoint` for which `owns(kernel inode number)` is true: by a
    descriptor, a mapping, or as working or root directory. Seen in every
    mount namespace (a sandbox's bind mount of a directory of the mount has
    a mount id of its own but the same device)."""
    ids = mount_ids(mountpoint)
    if ids is None:
        return []
    _mnt_id, major, minor = ids
    dev = os.makedev(major, minor)
    maps_dev = f"{major:02x}:{minor:02x}"
    ours_by_ns: dict[str, set[int]] = {}
    out = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            continue  # gone, or not ours to look at
        if ns not in ours_by_ns:
            ours_by_ns[ns] = _mount_ids_of(pid, f"{major}:{minor}".encode())
        if _holds(pid, ours_by_ns[ns], maps_dev, dev, owns):
            out.append((pid, _command(pid)))
    return out


def _mount_ids_of(pid: int, dev: bytes) -> set[int]:
    """The ids of the mounts of device `dev` ("major:minor") in `pid`'s namespace."""
    found = set()
    try:
        with open(f"/proc/{pid}/mountinfo", "rb") as f:
            for line in f:
                fields = line.split(b" ", 4)
                if len(fields) > 3 and fields[2] == dev:
                    found.add(int(fields[0]))
    except (OSError, ValueError):
        pass
    return found


def _holds(pid: int, mnt_ids: set[int], maps_dev: str, dev: int, owns) -> bool:
    for link in ("cwd", "root"):
        try:
            st = os.stat(f"/proc/{pid}/{link}")
        except OSError:
            continue
        if st.st_dev == dev and owns(st.st_ino):
            return True
    base = f"/proc/{pid}/fdinfo"
    try:
        fds = os.listdir(base)
    except OSError:
        return False
    for fd in fds:
        try:
            with open(f"{base}/{fd}", "rb") as f:
                info = dict(line.split(b":", 1) for line in f.read().splitlines()
                            if b":" in line)
            if int(info.get(b"mnt_id", b"-1")) in mnt_ids and owns(int(info[b"ino"])):
                return True
        except (OSError, ValueError, KeyError):
            continue
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) >= 5 and parts[3].decode() == maps_dev and owns(int(parts[4])):
                    return True
    except (OSError, ValueError):
        pass
    return False
