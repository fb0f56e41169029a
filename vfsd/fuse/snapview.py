"""`.vfsd/snapshots/<id>/...`: every retained snapshot, browsable read-only.

An agent can `diff .vfsd/snapshots/s12/report.md report.md` or `grep -r`
an earlier version of its files with plain tools. The tree is read straight
from the snapshot's entries (see `snapshots`); nothing is copied.

FUSE inode numbers of snapshot objects live above `SNAP_BASE`: a 20-bit slot
for the snapshot and the object's own inode number below 2**40
(`store.MAX_INO`). A slot is bound to a snapshot when its directory is first
looked up; a snapshot that is deleted frees its slot, and the kernel is told
to drop the name. Everything here is immutable, so the kernel may cache it.
"""

from __future__ import annotations

import errno
import itertools
import stat
from collections import OrderedDict

import pyfuse3

from vfsd.snapshots.snapshots import SnapshotError, Snapshots, parse_id, snapshot_id
from vfsd.store.store import MAX_INO, ROOT_INO

from . import ctldir

NAME = b"snapshots"
DIR_INO = ctldir.BASE + 16
SNAP_BASE = ctldir.BASE + (1 << 60)
SLOT_BITS = 20
#: file handles of snapshot files (the control directory's count up from BASE)
FH_BASE = SNAP_BASE
#: directory listings kept: `ls` of a big directory takes many readdir calls,
#: each of which would otherwise list the whole directory again. Bounded in
#: entries too (~100 B each); the newest listing is kept whatever its size.
LISTINGS_KEPT = 4
LISTED_ENTRIES_KEPT = 100_000


def is_snap(ino: int) -> bool:
    return SNAP_BASE <= ino < ctldir.MIRROR_BASE


class SnapshotView:
    """Lookup, attributes, listing and reading of retained snapshots."""

    def __init__(self, snaps: Snapshots, ops) -> None:
        self.snaps = snaps
        self.ops = ops  # for the chunk loader and the entry timeout
        self.store = snaps.store
        self.slots: dict[int, int] = {}  # slot -> seq
        self.handles: dict[int, tuple[int, object]] = {}  # fh -> (seq, entry)
        self._fh = itertools.count(FH_BASE + 1)
        # (seq, ino) -> [(name, child)]: a snapshot never changes, so a
        # listing stays right until the snapshot goes.
        self._listings: OrderedDict[tuple[int, int], list] = OrderedDict()

    # ------------------------------------------------------------ numbering

    def _slot(self, seq: int) -> int:
        slot = seq & ((1 << SLOT_BITS) - 1)
        self.slots[slot] = seq
        return slot

    def _fuse_ino(self, seq: int, ino: int) -> int:
        return SNAP_BASE | (self._slot(seq) << 40) | ino

    def _decode(self, fuse_ino: int) -> tuple[int, int]:
        slot = (fuse_ino >> 40) & ((1 << SLOT_BITS) - 1)
        seq = self.slots.get(slot)
        if seq is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        return seq, fuse_ino & (MAX_INO - 1)

    def forget_snapshot(self, ident: str) -> None:
        """A deleted snapshot: its slot no longer resolves."""
        seq = parse_id(ident)
        slot = seq & ((1 << SLOT_BITS) - 1)
        if self.slots.get(slot) == seq:
            del self.slots[slot]
        for key in [k for k in self._listings if k[0] == seq]:
            del self._listings[key]

    # ------------------------------------------------------------ attributes

    def dir_entry(self) -> pyfuse3.EntryAttributes:
        e = self.ops._ctl_entry(ctldir.DIR_INO)
        e.st_ino = DIR_INO
        e.attr_timeout = 1.0  # its listing changes with every snapshot
        return e

    def _entry(self, seq: int, ino: int) -> pyfuse3.EntryAttributes:
        got = self.snaps.inode_at(seq, ino)
        if got is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        inode = got.inode
        e = pyfuse3.EntryAttributes()
        e.st_ino = self._fuse_ino(seq, ino)
        e.generation = inode.gen
        e.entry_timeout = e.attr_timeout = self.ops.entry_timeout
        e.st_mode = inode.mode
        e.st_nlink = inode.nlink
        e.st_uid, e.st_gid, e.st_rdev = inode.uid, inode.gid, inode.rdev
        e.st_size = inode.size
        e.st_blksize = 128 * 1024
        e.st_blocks = -(-min(len(got.blocks) * self.store.chunk_size, inode.size) // 512)
        e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = (inode.atime_ns, inode.mtime_ns,
                                                       inode.ctime_ns)
        return e

    def getattr(self, fuse_ino: int) -> pyfuse3.EntryAttributes:
        if fuse_ino == DIR_INO:
            return self.dir_entry()
        return self._entry(*self._decode(fuse_ino))

    # ------------------------------------------------------------- namespace

    def lookup(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        if parent == DIR_INO:
            try:
                seq = parse_id(name.decode("ascii", errors="replace"))
                self.snaps.get(snapshot_id(seq))
            except SnapshotError:
                raise pyfuse3.FUSEError(errno.ENOENT) from None
            return self._entry(seq, ROOT_INO)
        seq, ino = self._decode(parent)
        child = self.snaps.lookup(seq, ino, name)
        if child is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(seq, child)

    def parent_of(self, fuse_ino: int) -> int:
        """The directory a `..` entry names: `.vfsd/snapshots` for a snapshot's
        root, else the directory's parent as the snapshot holds it."""
        seq, ino = self._decode(fuse_ino)
        got = None if ino == ROOT_INO else self.snaps.inode_at(seq, ino)
        return self._fuse_ino(seq, got.parent) if got and got.parent else DIR_INO

    def readdir(self, fuse_ino: int, start: int, reply) -> None:
        """List a directory; `reply(name, entry, cookie)` is pyfuse3.readdir_reply's part."""
        if fuse_ino == DIR_INO:
            snaps = [(s["id"].encode(), s["seq"], ROOT_INO) for s in self.snaps.list()]
            items = iter(snaps[start:])
        else:
            seq, ino = self._decode(fuse_ino)
            items = ((name, seq, child) for name, child in
                     itertools.islice(self._listing(seq, ino), start, None))
        for i, (name, seq, child) in enumerate(items, start):
            try:
                entry = self._entry(seq, child)
            except pyfuse3.FUSEError:
                continue
            if not reply(name, entry, i + 1):
                return

    def _listing(self, seq: int, ino: int) -> list[tuple[bytes, int]]:
        key = (seq, ino)
        items = self._listings.get(key)
        if items is None:
            items = self._listings[key] = self.snaps.readdir(seq, ino)
            while len(self._listings) > 1 and (
                    len(self._listings) > LISTINGS_KEPT
                    or sum(map(len, self._listings.values())) > LISTED_ENTRIES_KEPT):
                self._listings.popitem(last=False)
        else:
            self._listings.move_to_end(key)
        return items

    def readlink(self, fuse_ino: int) -> bytes:
        got = self.snaps.inode_at(*self._decode(fuse_ino))
        if got is None or not got.inode.is_link:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return got.target

    def opendir(self, fuse_ino: int) -> int:
        if fuse_ino != DIR_INO:
            got = self.snaps.inode_at(*self._decode(fuse_ino))
            if got is None or not got.inode.is_dir:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
        return fuse_ino

    # ----------------------------------------------------------------- files

    def open(self, fuse_ino: int, flags: int) -> pyfuse3.FileInfo:
        if flags & (0o3 | 0o1000):  # O_WRONLY, O_RDWR, O_TRUNC
            raise pyfuse3.FUSEError(errno.EROFS)
        seq, ino = self._decode(fuse_ino)
        got = self.snaps.inode_at(seq, ino)
        if got is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not stat.S_ISREG(got.inode.mode):
            raise pyfuse3.FUSEError(errno.EISDIR if got.inode.is_dir else errno.EINVAL)
        fh = next(self._fh)
        self.handles[fh] = (seq, got)
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        try:
            _, got = self.handles[fh]
        except KeyError:
            raise pyfuse3.FUSEError(errno.EBADF) from None
        cs = self.store.chunk_size
        end = min(off + size, got.inode.size)
        if off >= end:
            return b""
        idxs = range(off // cs, -(-end // cs))
        missing = [got.blocks[i][:16] for i in idxs
                   if i in got.blocks and not self.store.content.is_cached(got.blocks[i])]
        if missing:
            await self.ops._load_chunks(missing, None)
        parts = []
        pos = off
        while pos < end:
            idx, boff = divmod(pos, cs)
            n = min(cs - boff, end - pos)
            ref = got.blocks.get(idx)
            piece = self.store.read_block(ref, boff, n) if ref else b""
            parts.append(piece.ljust(n, b"\0"))
            pos += n
        return b"".join(parts)

    def release(self, fh: int) -> None:
        self.handles.pop(fh, None)
