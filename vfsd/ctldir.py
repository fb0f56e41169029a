"""Virtual entries of the mount root: `.vfsd/` and the sandbox's mount points.

`.vfsd/` lets an agent's shell see the daemon's state with plain tools
(`cat .vfsd/status.json`, `tail .vfsd/evicted.ndjson`). The directory and its
files are virtual: inode numbers far above anything the store allocates,
content rendered when a file is opened (a snapshot per open handle).

The sandbox directories (`usr`, `etc`, `tmp`, ...) are where mount_tool's
`execute` sandbox, which makes the mount root its `/`, mounts the system's
directories, a private /tmp, /proc and /dev. A mount point must exist in the
tree it is mounted on, and the user's tree must not gain entries for them, so
they are empty, read-only directories that answer lookups but are left out of
listings, and no real entry can be created under their names at the root. A
real entry that already has such a name (made before they were reserved)
wins over the virtual one.
"""

from __future__ import annotations

import stat
from collections.abc import Callable

NAME = b".vfsd"
BASE = 1 << 62
DIR_INO = BASE
#: file name -> inode number
FILES = {b"status.json": BASE + 1, b"evicted.ndjson": BASE + 2}
NAMES = {ino: name for name, ino in FILES.items()}
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444


#: Mount points of the execute sandbox (mount_tool/sandbox.py keeps the same
#: list): name -> inode number.
SANDBOX_DIRS = {
    name: BASE + 0x100 + i
    for i, name in enumerate(
        (b"bin", b"dev", b"etc", b"lib", b"lib32", b"lib64", b"libx32", b"proc", b"run",
         b"sbin", b"tmp", b"usr")
    )
}
SANDBOX_INOS = frozenset(SANDBOX_DIRS.values())
SANDBOX_DIR_MODE = stat.S_IFDIR | 0o555
#: Names that cannot become real entries of the root.
RESERVED = frozenset({NAME, *SANDBOX_DIRS})


def is_ctl(ino: int) -> bool:
    """True for every virtual inode (`.vfsd/`, its files, the sandbox dirs)."""
    return ino >= BASE


def is_dir(ino: int) -> bool:
    """True for the virtual directories."""
    return ino == DIR_INO or ino in SANDBOX_INOS


class ControlDir:
    """Renders the virtual files from callables the daemon provides."""

    def __init__(self) -> None:
        self.renderers: dict[int, Callable[[], bytes]] = {}
        self.snapshots: dict[int, bytes] = {}
        self._next_fh = BASE

    def render(self, ino: int) -> bytes:
        fn = self.renderers.get(ino)
        return fn() if fn is not None else b""

    def open(self, ino: int) -> int:
        self._next_fh += 1
        self.snapshots[self._next_fh] = self.render(ino)
        return self._next_fh

    def read(self, fh: int, off: int, size: int) -> bytes:
        return self.snapshots.get(fh, b"")[off:off + size]

    def release(self, fh: int) -> None:
        self.snapshots.pop(fh, None)
