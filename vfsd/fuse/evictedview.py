"""`.vfsd/evicted/PATH`: why a file the shell cannot find is gone.

The mount answers an evicted path with ENOENT, as a missing file should: a
stub in its place would mislead every program that opens it. The reason is
here instead: `.vfsd/evicted/` mirrors the paths eviction removed (the
directories they lay in, and one read-only file per evicted path) and
`cat .vfsd/evicted/out/report.txt` says when and why it went, which retained
snapshot still holds it, and how to bring it back; its last line is the
eviction record as JSON. Paths that live again (made anew, or brought back)
leave the view.

Inode numbers live above `EVICTED_BASE`, one per path the kernel has looked
up, kept while the daemon runs (bounded by the paths of the eviction log).
Like the other files of `.vfsd/` that name files, the view is the owner's
only, and nothing of it is cached by the kernel: it changes with every step.
"""

from __future__ import annotations

import errno
import json
import stat

import pyfuse3

from . import ctldir
from .evictindex import EvictedIndex

NAME = b"evicted"
EVICTED_BASE = ctldir.BASE + (1 << 59)
DIR_INO = EVICTED_BASE
#: the view's inode numbers stay below this (far from the snapshot view's)
EVICTED_END = EVICTED_BASE + (1 << 58)
DIR_MODE = stat.S_IFDIR | 0o500
FILE_MODE = stat.S_IFREG | 0o400


def is_evicted(ino: int) -> bool:
    return EVICTED_BASE <= ino < EVICTED_END


class EvictedView:
    """Lookup, attributes, listing and reading of `.vfsd/evicted/`."""

    def __init__(self, index: EvictedIndex, ops) -> None:
        self.index = index
        self.ops = ops
        self.path_of: dict[int, str] = {DIR_INO: ""}
        self.ino_of: dict[str, int] = {"": DIR_INO}

    def _ino(self, path: str) -> int:
        ino = self.ino_of.get(path)
        if ino is None:
            ino = EVICTED_BASE + len(self.path_of)
            if ino >= EVICTED_END:
                raise pyfuse3.FUSEError(errno.ENFILE)
            self.ino_of[path] = ino
            self.path_of[ino] = path
        return ino

    def _path(self, ino: int) -> str:
        path = self.path_of.get(ino)
        if path is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        return path

    async def _current(self) -> None:
        await self.ops.evicted_index_current()

    def _entry(self, path: str, is_dir: bool) -> pyfuse3.EntryAttributes:
        e = self.ops._ctl_entry(ctldir.DIR_INO)
        e.st_ino = self._ino(path)
        e.entry_timeout = e.attr_timeout = 0
        e.st_mode, e.st_nlink = (DIR_MODE, 2) if is_dir else (FILE_MODE, 1)
        return e

    def dir_entry(self) -> pyfuse3.EntryAttributes:
        return self._entry("", True)

    def _kind(self, path: str) -> bool | None:
        """True: a directory of the view; False: an evicted file; None: neither."""
        if path == "" or self.index.is_dir(path):
            return True
        if self.index.record(path) is not None:
            return False
        return None

    async def getattr(self, ino: int) -> pyfuse3.EntryAttributes:
        await self._current()
        path = self._path(ino)
        kind = self._kind(path)
        if kind is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(path, kind)

    async def lookup(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        await self._current()
        base = self._path(parent)
        rel = name.decode(errors="surrogateescape")
        path = f"{base}/{rel}" if base else rel
        kind = self._kind(path)
        if kind is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(path, kind)

    def parent_of(self, ino: int) -> int:
        """The directory a `..` entry names (the view's own for its top level)."""
        path = self._path(ino)
        return self._ino(path.rpartition("/")[0]) if path else ctldir.DIR_INO

    def opendir(self, ino: int) -> int:
        self._path(ino)
        return ino

    async def readdir(self, fh: int, start: int, reply) -> None:
        """List a directory; `reply(name, entry, cookie)` is pyfuse3.readdir_reply's part."""
        await self._current()
        base = self._path(fh)
        items = self.index.children(base)
        for i, (name, is_dir) in enumerate(items[start:], start):
            path = f"{base}/{name}" if base else name
            if not is_dir and self.index.record(path) is None:
                continue  # lives again
            if not reply(name.encode(errors="surrogateescape"), self._entry(path, is_dir),
                         i + 1):
                return

    async def open(self, ino: int, flags: int) -> pyfuse3.FileInfo:
        if flags & (0o3 | 0o1000):  # O_WRONLY, O_RDWR, O_TRUNC
            raise pyfuse3.FUSEError(errno.EROFS)
        await self._current()
        path = self._path(ino)
        if self._kind(path) is not False:
            raise pyfuse3.FUSEError(errno.EISDIR if self._kind(path) else errno.ENOENT)
        doc = self.render(self.index.record(path) or {})
        return pyfuse3.FileInfo(fh=self.ops.ctl.open_bytes(doc), direct_io=True,
                                keep_cache=False)

    def render(self, rec: dict) -> bytes:
        said = self.index.explain(rec)
        return (f"{rec.get('path')} was {said['message']}.\n"
                f"{json.dumps(said)}\n").encode(errors="surrogateescape")
