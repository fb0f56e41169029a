"""Virtual entries of the mount root: `.vfsd/` and the sandbox's mount points.

`.vfsd/` lets an agent's shell see the daemon's state with plain tools
(`cat .vfsd/status.json`, `tail .vfsd/evicted.ndjson`), the vfsd attributes
of any file (`cat .vfsd/attr/notes/plan.md`: `.vfsd/attr/` mirrors the tree,
each regular file shown as a JSON document of its step, status, pin, hash,
tier, provenance and extended attributes), retained snapshots
(`.vfsd/snapshots/`, see `snapview`) and, while someone reads it, a line per
operation (`.vfsd/accesslog`, see `accesslog`). The directory and its files are virtual: inode numbers far above
anything the store allocates, content rendered when a file is opened.

The sandbox directories (`usr`, `etc`, `proc`, ...) are where mount_tool's
`execute` sandbox, which makes the mount root its `/`, mounts the system's
directories, /run, /proc and /dev. A mount point must exist in the tree it is
mounted on, and the user's tree must not gain entries for them, so they are
empty, read-only directories that answer lookups but are left out of
listings. They are served only once a sandbox claims them (the
`user.vfsd.sandbox` xattr set on the root, which the sandbox does before its
first command): a mount whose user never runs `execute` keeps every name
ordinary (`mkdir etc`, `touch run` just work). From the claim on, no real
entry can be created under those names at the root; a real entry that already
has such a name (made before the claim) wins over the virtual one.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable

import pyfuse3
import trio

from vfsd import RESERVED_ROOT_NAMES, SANDBOX_MOUNT_POINTS

NAME = b".vfsd"
BASE = 1 << 62
DIR_INO = BASE
#: file name -> inode number
FILES = {b"status.json": BASE + 1, b"evicted.ndjson": BASE + 2, b"accesslog": BASE + 3}
#: `.vfsd/accesslog`: streamed while read (see `accesslog`)
ACCESSLOG_INO = BASE + 3
NAMES = {ino: name for name, ino in FILES.items()}
#: `.vfsd/attr/`: the mirror of the volume root. The mirror of store inode N is
#: MIRROR_BASE + N (store inode numbers stay far below 2**61).
ATTR_NAME = b"attr"
MIRROR_BASE = BASE + (1 << 61)
DIR_MODE = stat.S_IFDIR | 0o555
#: status.json, evicted.ndjson, accesslog: the owner's only. With --allow-other
#: they would tell other users the names of files in directories they cannot
#: list (what was evicted, what was opened); the mirror and the snapshots below
#: `.vfsd/` follow each file's own permissions instead.
FILE_MODE = stat.S_IFREG | 0o400


#: Mount points of the execute sandbox: name -> inode number.
SANDBOX_DIRS = {name: BASE + 0x100 + i for i, name in enumerate(SANDBOX_MOUNT_POINTS)}
SANDBOX_INOS = frozenset(SANDBOX_DIRS.values())
SANDBOX_DIR_MODE = stat.S_IFDIR | 0o555
#: Names that cannot become real entries of the root (the sandbox's mount
#: points join them once claimed).
RESERVED = RESERVED_ROOT_NAMES


def is_ctl(ino: int) -> bool:
    """True for every virtual inode (`.vfsd/`, its files, the sandbox dirs)."""
    return ino >= BASE


def is_mirror(ino: int) -> bool:
    """True for `.vfsd/attr/` and everything below it."""
    return ino >= MIRROR_BASE


def mirror_of(store_ino: int) -> int:
    return MIRROR_BASE + store_ino


def mirrored(ino: int) -> int:
    """The store inode a mirror inode stands for."""
    return ino - MIRROR_BASE


#: open handles on `.vfsd/` files at once (ENFILE beyond): bounds snapshot memory
MAX_HANDLES = 4096


def is_dir(ino: int) -> bool:
    """True for the virtual directories."""
    return ino == DIR_INO or ino in SANDBOX_INOS


class ControlDir:
    """Serves the virtual files from what the daemon provides, in bounded memory.

    Small documents (status.json, a few KB) are rendered when opened, one
    snapshot per open handle, with at most MAX_HANDLES handles open at once.
    Paged files (evicted.ndjson) keep no content per handle: a handle holds
    the (start, end) of the log at its open, and each read renders only the
    records it covers (see `evictlog_view`). Bringing the index up to date
    yields to other requests between batches.

    `renderers`: inode -> callable returning a small document's bytes.
    `paged`: inode -> a paged source (`catch_up_batch()`, `span()`,
    `read(start, end, off, size)`), such as `EvictionLogView`.
    """

    def __init__(self) -> None:
        self.renderers: dict[int, Callable[[], bytes]] = {}
        self.paged: dict[int, object] = {}
        self.handles: dict[int, bytes | tuple[object, int, int]] = {}
        self._next_fh = BASE

    def render(self, ino: int) -> bytes:
        fn = self.renderers.get(ino)
        return fn() if fn is not None else b""

    async def refresh(self, ino: int) -> None:
        """Bring a paged file up to date, yielding to other requests between batches."""
        source = self.paged.get(ino)
        if source is None:
            return
        while not source.catch_up_batch():
            await trio.sleep(0)

    async def open(self, ino: int) -> int:
        if len(self.handles) >= MAX_HANDLES:
            raise pyfuse3.FUSEError(errno.ENFILE)
        source = self.paged.get(ino)
        if source is not None:
            await self.refresh(ino)
            content: bytes | tuple[object, int, int] = (source, *source.span())
        else:
            content = self.render(ino)
        self._next_fh += 1
        self.handles[self._next_fh] = content
        return self._next_fh

    def open_bytes(self, data: bytes) -> int:
        """A handle on a snapshot the caller rendered (the files of `.vfsd/attr/`)."""
        if len(self.handles) >= MAX_HANDLES:
            raise pyfuse3.FUSEError(errno.ENFILE)
        self._next_fh += 1
        self.handles[self._next_fh] = data
        return self._next_fh

    def read(self, fh: int, off: int, size: int) -> bytes:
        content = self.handles.get(fh)
        if content is None:
            return b""
        if isinstance(content, bytes):
            return content[off:off + size]
        source, start, end = content
        return source.read(start, end, off, size)

    def release(self, fh: int) -> None:
        self.handles.pop(fh, None)
