"""Content of regular files while they are in use: write buffers and tiering.

Writes land in per-block buffers (`bytearray` per chunk-sized block) and are
committed to the store when a block fills up, when dirty memory passes a limit,
and on flush/fsync/release. A file whose size is at most `inline_max` is
committed inline; a larger one as chunks. The store does the transactions;
this module decides what to commit and when.
"""

from __future__ import annotations

import xxhash

from . import errors
from .inode import Inode
from .store import Store, now_ns


class OpenFile:
    """One regular file with open handles (or a transient truncate)."""

    __slots__ = ("inode", "committed_size", "handles", "dirty", "attr_dirty", "blocks", "inline_data",
                 "drop_from", "version", "unsynced")

    def __init__(self, inode: Inode, blocks: dict[int, bytes]) -> None:
        self.inode = inode
        self.committed_size = inode.size  # size as last committed, for quota accounting
        self.handles = 0
        self.dirty: dict[int, bytearray | bytes] = {}  # bytes: a whole, untouched block
        self.attr_dirty = False
        self.blocks = blocks            # committed chunk hashes by block index
        self.inline_data: bytes | None = None   # cached committed inline content
        self.drop_from: int | None = None       # pending truncate of committed blocks
        self.version = 0                # bumped on every content change
        self.unsynced: set[bytes] = set()       # chunks committed since last fsync

    @property
    def is_dirty(self) -> bool:
        return bool(self.dirty) or self.attr_dirty or self.drop_from is not None


class OpenFiles:
    """All open regular files of one daemon, keyed by inode number."""

    def __init__(self, store: Store, *, chunk_size: int, inline_max: int,
                 dirty_limit: int = 64 << 20) -> None:
        if inline_max > chunk_size:
            raise ValueError("inline_max must not exceed chunk_size")
        self.store = store
        self.chunks = store.chunks
        self.cs = chunk_size
        self.inline_max = inline_max
        self.dirty_limit = dirty_limit
        self.files: dict[int, OpenFile] = {}
        self.dirty_bytes = 0
        # Last content version the kernel has cached per inode, for keep_cache.
        self.cached_version: dict[int, int] = {}

    # ------------------------------------------------------------ lifetime

    def get(self, ino: int) -> OpenFile | None:
        return self.files.get(ino)

    def acquire(self, ino: int, inode: Inode | None = None) -> OpenFile:
        """A handle on the file; `inode` saves reading a record the caller has."""
        of = self.files.get(ino)
        if of is None:
            if inode is None:
                inode = self.store.get_inode(ino)
            of = OpenFile(inode, {} if inode.inline else self.store.block_map(ino))
            self.files[ino] = of
        of.handles += 1
        return of

    def release(self, of: OpenFile) -> None:
        """Drop one handle; commits and forgets the file after the last one."""
        of.handles -= 1
        if of.handles <= 0:
            try:
                self.flush(of)
            finally:
                # Even if the commit failed (disk full), the file leaves the
                # table: the error was logged and nothing can retry it later.
                self.dirty_bytes -= sum(len(b) for b in of.dirty.values())
                of.dirty.clear()
                del self.files[of.inode.ino]

    def names_changed(self, stored: Inode) -> None:
        """Take link count and ctime from the store after a namespace change."""
        of = self.files.get(stored.ino)
        if of is not None:
            of.inode.nlink = stored.nlink
            of.inode.ctime_ns = stored.ctime_ns

    def attrs(self, ino: int) -> Inode:
        """Current attributes: the in-memory ones while the file is open."""
        of = self.files.get(ino)
        return of.inode if of is not None else self.store.get_inode(ino)

    # ---------------------------------------------------------------- read

    def _inline(self, of: OpenFile) -> bytes:
        if of.inline_data is None:
            # A file that was empty when committed has nothing to read.
            of.inline_data = (self.store.read_inline(of.inode.ino) if of.committed_size
                              else b"")
        return of.inline_data

    def uncached_chunks(self, of: OpenFile, off: int, size: int) -> list[bytes]:
        """Chunks a read of this range needs that are not in memory yet."""
        if of.inode.inline:
            return []
        end = min(off + size, of.inode.size)
        out = []
        for idx in range(off // self.cs, -(-end // self.cs)):
            digest = of.blocks.get(idx)
            if digest and idx not in of.dirty and not self.chunks.is_cached(digest):
                out.append(digest)
        return out

    def next_chunk(self, of: OpenFile, off: int, size: int) -> bytes | None:
        """The chunk after this range, worth prefetching for a sequential reader."""
        if of.inode.inline:
            return None
        digest = of.blocks.get(-(-(off + size) // self.cs))
        return digest if digest and not self.chunks.is_cached(digest) else None

    def read(self, of: OpenFile, off: int, size: int) -> bytes:
        end = min(off + size, of.inode.size)
        if off >= end:
            return b""
        if of.inode.inline and 0 not in of.dirty:
            data = self._inline(of)[off:end]
            return data if len(data) == end - off else data.ljust(end - off, b"\0")
        cs = self.cs
        parts = []
        pos = off
        while pos < end:
            idx, boff = divmod(pos, cs)
            n = min(cs - boff, end - pos)
            blk = of.dirty.get(idx)
            if blk is not None:
                piece = bytes(blk[boff:boff + n])
            else:
                digest = of.blocks.get(idx)
                piece = self.chunks.read(digest, boff, n) if digest else b""
            if len(piece) < n:
                piece += bytes(n - len(piece))
            parts.append(piece)
            pos += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _committed_block(self, of: OpenFile, idx: int) -> bytearray:
        if of.inode.inline:
            return bytearray(self._inline(of)) if idx == 0 else bytearray()
        digest = of.blocks.get(idx)
        if digest is None:
            return bytearray()
        return bytearray(self.chunks.read(digest, 0, self.cs))

    def _load_dirty(self, of: OpenFile, idx: int) -> bytearray:
        """The buffered block `idx`, made mutable, loaded from the store if needed."""
        blk = of.dirty.get(idx)
        if blk is None:
            blk = self._committed_block(of, idx)
            of.dirty[idx] = blk
            self.dirty_bytes += len(blk)
        elif not isinstance(blk, bytearray):
            blk = of.dirty[idx] = bytearray(blk)
        return blk

    # --------------------------------------------------------------- write

    def write(self, of: OpenFile, off: int, buf: bytes) -> int:
        cs = self.cs
        if of.inode.inline:
            # Inline content is block 0; it must be committed together with
            # whatever comes next, so keep it in the buffers from now on.
            self._load_dirty(of, 0)
        view = memoryview(buf)
        pos = off
        full: list[int] = []
        while view:
            idx, boff = divmod(pos, cs)
            n = min(cs - boff, len(view))
            blk = of.dirty.get(idx)
            if blk is None:
                if boff == 0 and n == cs:
                    # A whole block, kept as immutable bytes: the usual 1 MiB
                    # write of a large file is then committed without a copy.
                    blk = buf if n == len(buf) and isinstance(buf, bytes) else bytes(view[:n])
                    of.dirty[idx] = blk
                    self.dirty_bytes += n
                    full.append(idx)
                    pos += n
                    view = view[n:]
                    continue
            blk = self._load_dirty(of, idx)
            before = len(blk)
            if before < boff:
                blk.extend(bytes(boff - before))
            blk[boff:boff + n] = view[:n]
            self.dirty_bytes += len(blk) - before
            if boff + n == cs and len(blk) == cs:
                full.append(idx)
            pos += n
            view = view[n:]
        end = off + len(buf)
        t = now_ns()
        inode = of.inode
        if end > inode.size:
            inode.size = end
        inode.mtime_ns = inode.ctime_ns = t
        of.attr_dirty = True
        of.version += 1
        if inode.size <= self.inline_max or end >= inode.size \
                or self.dirty_bytes > self.dirty_limit:
            # Commit now, as the bytes arrive: close() waits for the kernel's
            # write-back, so a closed file is in the store, safe from a daemon
            # crash, with no FLUSH request needed. Small files commit whole;
            # a sequential writer's writes all reach the end of the file.
            self.flush(of)
        elif full:
            # Writes into the middle of a large file (mmap, dd conv=notrunc)
            # commit whole chunks only, so a chunk is not rewritten per page;
            # the rest waits for release or fsync.
            self._flush_blocks(of, full)
        return len(buf)

    def truncate(self, of: OpenFile, size: int) -> None:
        cs = self.cs
        inode = of.inode
        if inode.inline:
            self._load_dirty(of, 0)
        if size < inode.size:
            keep = -(-size // cs)  # blocks that still hold data
            for idx in [i for i in of.dirty if i >= keep]:
                self.dirty_bytes -= len(of.dirty.pop(idx))
            if not inode.inline and any(i >= keep for i in of.blocks):
                for idx in [i for i in of.blocks if i >= keep]:
                    del of.blocks[idx]
                of.drop_from = keep if of.drop_from is None else min(of.drop_from, keep)
            tail = size - (keep - 1) * cs if keep else 0
            if keep and tail < cs:
                blk = self._load_dirty(of, keep - 1)
                if len(blk) > tail:
                    self.dirty_bytes -= len(blk) - tail
                    del blk[tail:]
            if size <= self.inline_max and not inode.inline:
                self._load_dirty(of, 0)
            if inode.inline:
                # Block 0 stays buffered (possibly empty) so no later write
                # reloads the committed, now cut-off, inline bytes.
                of.dirty.setdefault(0, bytearray())
                if of.inline_data is not None:
                    of.inline_data = of.inline_data[:size]
        inode.size = size
        inode.mtime_ns = inode.ctime_ns = now_ns()
        of.attr_dirty = True
        of.version += 1

    # -------------------------------------------------------------- commit

    def _cut(self, of: OpenFile, idx: int) -> bytearray:
        """A dirty block limited to the file size (bytes past EOF are not kept)."""
        blk = of.dirty[idx]
        limit = of.inode.size - idx * self.cs
        if len(blk) > limit:
            blk = self._load_dirty(of, idx)
            del blk[max(limit, 0):]
        return blk

    def _flush_blocks(self, of: OpenFile, idxs: list[int]) -> None:
        """Commit some full blocks early, to bound buffered memory."""
        if of.inode.inline:
            idxs = sorted(set(idxs) | {0})
        blocks = {i: self._cut(of, i) for i in idxs if i in of.dirty}
        self._commit_blocks(of, blocks)

    def _commit_blocks(self, of: OpenFile, blocks: dict[int, bytearray]) -> None:
        committed, hashes = self.store.commit_content(
            of.inode, blocks=blocks, drop_blocks_from=of.drop_from)
        of.drop_from = None
        of.attr_dirty = False  # the committed record carries the current attributes
        for idx, digest in hashes.items():
            self.dirty_bytes -= len(of.dirty.pop(idx, b""))
            if digest is None:
                of.blocks.pop(idx, None)
            else:
                of.blocks[idx] = digest
                of.unsynced.add(digest)
        of.inline_data = None
        self._adopt(of, committed)

    def _adopt(self, of: OpenFile, committed: Inode) -> None:
        # Keep in-memory attributes that may have moved on; take the step and
        # tier from what was committed.
        of.committed_size = committed.size
        of.inode.step = committed.step
        of.inode.inline = committed.inline
        of.inode.nblocks = committed.nblocks
        of.inode.hash = b""

    def flush(self, of: OpenFile) -> None:
        """Commit everything buffered for this file."""
        if not of.is_dirty:
            return
        inode = of.inode
        if inode.size <= self.inline_max:
            blk = of.dirty.get(0)
            if blk is None:
                blk = self._committed_block(of, 0)
            data = bytes(blk[:inode.size]).ljust(inode.size, b"\0")
            committed, _ = self.store.commit_content(inode, inline_data=data)
            for digest in list(of.blocks.values()):
                of.unsynced.discard(digest)
            of.blocks.clear()
            self.dirty_bytes -= sum(len(b) for b in of.dirty.values())
            of.dirty.clear()
            of.drop_from = None
            of.inline_data = data
            self._adopt(of, committed)
        else:
            blocks = {i: self._cut(of, i) for i in sorted(of.dirty)}
            self._commit_blocks(of, blocks)
        of.attr_dirty = False

    def content_hash(self, ino: int, *, cache: bool = True) -> bytes:
        """xxh3-128 of the whole content, cached in the inode until it changes.

        `cache=False` skips writing the result back (eviction hashes files it
        is about to delete: a write transaction each would be wasted).
        """
        of = self.files.get(ino)
        if of is not None:
            self.flush(of)
            inode = of.inode
        else:
            inode = self.store.get_inode(ino)
        if not inode.is_reg:
            raise errors.InvalidArgument("not a regular file")
        stored = inode  # an open file was just flushed: its record is the stored one
        if stored.hash:
            return stored.hash
        h = xxhash.xxh3_128()
        if stored.inline:
            h.update(self.store.read_inline(ino).ljust(stored.size, b"\0"))
        else:
            blocks = of.blocks if of is not None else self.store.block_map(ino)
            cs = self.cs
            for idx in range(-(-stored.size // cs)):
                n = min(cs, stored.size - idx * cs)
                digest = blocks.get(idx)
                piece = self.chunks.read(digest, 0, n) if digest else b""
                h.update(piece)
                if len(piece) < n:
                    h.update(bytes(n - len(piece)))
        digest = h.digest()
        if cache:
            self.store.set_hash(ino, digest)
        if of is not None:
            of.inode.hash = digest
        return digest
