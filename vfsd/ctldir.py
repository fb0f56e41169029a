"""The read-only `.vfsd/` directory in the mount root.

It lets an agent's shell see the daemon's state with plain tools
(`cat .vfsd/status.json`, `tail .vfsd/evicted.ndjson`). The directory and its
files are virtual: inode numbers far above anything the store allocates,
content rendered when a file is opened (a snapshot per open handle).
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


def is_ctl(ino: int) -> bool:
    return ino >= BASE


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
