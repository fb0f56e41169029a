"""Hot files: the bytes of blocks that programs modify in place.

A database writes 4 KiB pages at random offsets of a file stored as 1 MiB
content-addressed chunks. Re-hashing and rewriting a whole chunk for every
page (and once more at every fsync) costs two orders of magnitude more than
the page. So a chunk-sized block that is modified in place goes *hot*: its
bytes move to a per-inode sparse file, `STORE/hot/<vol>/<ino>`, at the same
offset as in the file, where writes land with one `pwrite` and reads with one
`pread`. The store records the block as hot (`content.LOC_HOT`); it settles
back into a content-addressed chunk (hashed off the FUSE loop) when the file
is closed, when a snapshot is taken, or when its hash is needed.

The hot file's offsets are the file's offsets, so truncating the file is
truncating its hot file, and bytes past the end read as zeros. A hot file
survives a daemon crash like any file in the page cache; `fsync` of the
vfsd file fsyncs it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path


class HotFiles:
    """The hot files of a store directory, with a bounded cache of open fds."""

    def __init__(self, root: Path, max_fds: int = 64) -> None:
        self.root = Path(root)
        self.max_fds = max_fds
        self._fds: OrderedDict[tuple[int, int], int] = OrderedDict()

    def path(self, vol: int, ino: int) -> Path:
        return self.root / str(vol) / str(ino)

    def fd(self, vol: int, ino: int, *, create: bool = False) -> int:
        """An open descriptor of the hot file (created empty if asked)."""
        key = (vol, ino)
        fd = self._fds.get(key)
        if fd is not None:
            self._fds.move_to_end(key)
            return fd
        path = self.path(vol, ino)
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            if not create:
                raise
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, flags, 0o600)
        self._fds[key] = fd
        while len(self._fds) > self.max_fds:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def read(self, vol: int, ino: int, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` (zeros past the end of the hot file)."""
        data = os.pread(self.fd(vol, ino), length, offset)
        return data if len(data) == length else data.ljust(length, b"\0")

    def write(self, vol: int, ino: int, offset: int, data) -> None:
        fd = self.fd(vol, ino, create=True)
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n

    def truncate(self, vol: int, ino: int, size: int) -> None:
        try:
            os.ftruncate(self.fd(vol, ino), size)
        except FileNotFoundError:
            pass

    def fsync(self, vol: int, ino: int) -> None:
        """Make the hot file and its name durable (through its own descriptors:
        safe in a worker thread while the loop uses the cached ones)."""
        path = self.path(vol, ino)
        for target in (path, path.parent):
            try:
                fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self, vol: int, ino: int) -> None:
        fd = self._fds.pop((vol, ino), None)
        if fd is not None:
            os.close(fd)

    def delete(self, vol: int, ino: int) -> None:
        self.close(vol, ino)
        try:
            os.unlink(self.path(vol, ino))
        except FileNotFoundError:
            pass

    def inodes(self, vol: int) -> list[int]:
        """Inode numbers that have a hot file in this volume."""
        try:
            names = os.listdir(self.root / str(vol))
        except FileNotFoundError:
            return []
        return [int(n) for n in names if n.isdigit()]

    def exists(self, vol: int, ino: int) -> bool:
        return self.path(vol, ino).exists()

    def close_all(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            os.close(fd)
