"""The read-only `.vfsd/` directory in the mount root.

It lets an agent's shell see the daemon's state with plain tools
(`cat .vfsd/status.json`, `tail .vfsd/evicted.ndjson`) and the vfsd attributes
of any file (`cat .vfsd/attr/notes/plan.md`: `.vfsd/attr/` mirrors the tree,
each regular file shown as a JSON document of its step, status, pin, hash,
tier and extended attributes). The directory and its files are virtual: inode
numbers far above anything the store allocates, content rendered when a file is
opened (a snapshot per open handle).
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
#: `.vfsd/attr/`: the mirror of the volume root. The mirror of store inode N is
#: MIRROR_BASE + N (store inode numbers stay far below 2**61).
ATTR_NAME = b"attr"
MIRROR_BASE = BASE + (1 << 61)
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444


def is_ctl(ino: int) -> bool:
    return ino >= BASE


def is_mirror(ino: int) -> bool:
    """True for `.vfsd/attr/` and everything below it."""
    return ino >= MIRROR_BASE


def mirror_of(store_ino: int) -> int:
    return MIRROR_BASE + store_ino


def mirrored(ino: int) -> int:
    """The store inode a mirror inode stands for."""
    return ino - MIRROR_BASE


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
        return self.open_bytes(self.render(ino))

    def open_bytes(self, data: bytes) -> int:
        """A handle on a snapshot the caller rendered (the files of `.vfsd/attr/`)."""
        self._next_fh += 1
        self.snapshots[self._next_fh] = data
        return self._next_fh

    def read(self, fh: int, off: int, size: int) -> bytes:
        return self.snapshots.get(fh, b"")[off:off + size]

    def release(self, fh: int) -> None:
        self.snapshots.pop(fh, None)
