"""Content of regular files while they are in use: write buffers, hot blocks, commits.

New content lands in per-block buffers (`bytearray` per chunk-sized block) and
is committed to the store when a block fills up, when dirty memory passes a
limit, and on flush/fsync/release. A committed block always holds exactly its
extent of the file (the last one is shorter), so its digest is what the file
hash of `filehash` needs; the store decides where each block lives (inline in
LMDB when small, a chunk file otherwise).

A chunk-file block that a program modifies in place (a database page, the tail
of a big log) goes hot instead (`hotfiles`): its bytes move to the inode's hot
file once, and every later write is one `pwrite` there, with no hashing and no
copy in memory. Hot blocks settle back into content objects when the file is
closed, before a snapshot, or when the whole file's hash is needed: hashing
runs in worker threads (`settle`); `settle_now` is the short synchronous rest.

The store does the transactions; this module decides what to commit and when.
"""

from __future__ import annotations

import itertools
import os

from vfsd import errors
from vfsd.store import filehash
from vfsd.store.chunks import chunk_hash
from vfsd.store.content import LOC_FILE, all_zero, is_hot, ref_digest, ref_loc
from vfsd.store.inode import Inode
from vfsd.store.store import Store, now_ns


class OpenFile:
    """One regular file with open handles (or a transient truncate)."""

    __slots__ = ("inode", "committed_size", "handles", "dirty", "attr_dirty", "blocks",
                 "drop_from", "version", "unsynced", "hot", "hot_gen", "hot_valid",
                 "hot_file", "content_dirty", "hot_hashes", "writer", "fresh")

    def __init__(self, inode: Inode, blocks: dict[int, bytes]) -> None:
        self.inode = inode
        self.committed_size = inode.size  # size as last committed, for quota accounting
        self.handles = 0
        self.dirty: dict[int, bytearray | bytes] = {}  # bytes: a whole, untouched block
        self.attr_dirty = False
        # Content or size changed since the last commit, which then stamps the
        # step (the age counts from content changes; times alone do not count).
        self.content_dirty = False
        # Committed content references by index; hot blocks are in `hot` instead.
        self.blocks = {i: r for i, r in blocks.items() if not is_hot(r)}
        self.drop_from: int | None = None       # pending truncate of committed blocks
        self.version = 0                # bumped on every content change
        self.unsynced: set[bytes] = set()       # chunk files committed since last fsync
        self.hot: set[int] = {i for i, r in blocks.items() if is_hot(r)}
        self.hot_gen: dict[int, int] = {}       # last change of each hot block, to spot races
        # Settled blocks whose bytes the hot file still holds: going hot
        # again costs no copy while the reference is the same.
        self.hot_valid: dict[int, bytes] = {}
        self.hot_file = bool(self.hot)  # a hot file may exist for this inode
        # idx -> (generation, extent, digest) of the last hash of a hot block:
        # a file hash then reads only the hot blocks written since.
        self.hot_hashes: dict[int, tuple[int, int, bytes | None]] = {}
        # The tool call (a key, see `vfsd.store.calls`) of the last opener for
        # writing: the content commits that follow record it as `changed_by`.
        self.writer: int | None = None
        self.fresh = False  # made by the create that opened it (a tag names its maker too)

    @property
    def is_dirty(self) -> bool:
        return bool(self.dirty) or self.attr_dirty or self.drop_from is not None


class OpenFiles:
    """All open regular files of one daemon, keyed by inode number."""

    def __init__(self, store: Store, *, chunk_size: int, inline_max: int,
                 dirty_limit: int = 8 << 20) -> None:
        if inline_max > chunk_size:
            raise ValueError("inline_max must not exceed chunk_size")
        self.store = store
        store.inline_max = inline_max
        if store.chunk_size is None:
            store.chunk_size = store._chunk_size(chunk_size)
        if store.chunk_size != chunk_size:
            raise ValueError(f"the store's chunk size is {store.chunk_size}, not {chunk_size}")
        self.cs = chunk_size
        self.inline_max = inline_max
        self.dirty_limit = dirty_limit
        self.files: dict[int, OpenFile] = {}
        self.dirty_bytes = 0
        self.hot = store.hot
        # Called with an inode number when its last handle goes and hot blocks
        # remain (the daemon settles them in the background).
        self.on_hot_release = None
        # Called with the inode after its last handle went (whoever held it:
        # a reader, the settler): the daemon frees it if it has no name.
        self.on_closed = None
        # Write generations of hot blocks: one counter that never goes back, so
        # a settle that read a block can tell any later change from none.
        self._gens = itertools.count(1)

    # ------------------------------------------------------------ lifetime

    def get(self, ino: int) -> OpenFile | None:
        return self.files.get(ino)

    def acquire(self, ino: int, inode: Inode | None = None, new: bool = False) -> OpenFile:
        """A handle on the file; `inode` saves reading a record the caller has,
        `new` (a file just created, which has none) reading its blocks."""
        of = self.files.get(ino)
        if of is None:
            if inode is None:
                inode = self.store.get_inode(ino)
            blocks = self.store.block_map(ino) if inode.is_reg and not new else {}
            of = OpenFile(inode, blocks)
            self.files[ino] = of
        of.handles += 1
        return of

    def release(self, of: OpenFile) -> None:
        """Drop one handle; commits and forgets the file after the last one."""
        of.handles -= 1
        if of.handles <= 0:
            try:
                self.flush(of)
                if of.hot and self.on_hot_release is None and of.inode.nlink > 0:
                    self.settle_now(of)  # no background settler (library use)
            finally:
                # Even if the commit failed (disk full), the file leaves the
                # table: the error was logged and nothing can retry it later.
                self.dirty_bytes -= sum(len(b) for b in of.dirty.values())
                of.dirty.clear()
                del self.files[of.inode.ino]
                if of.hot:
                    if of.inode.nlink > 0 and self.on_hot_release is not None:
                        self.on_hot_release(of.inode.ino)
                elif of.hot_file:
                    # Settled and closed: the copy it kept is of no use.
                    self.store.retire_hot_file(of.inode.vol, of.inode.ino)
                if self.on_closed is not None:
                    self.on_closed(of.inode)

    def names_changed(self, stored: Inode) -> None:
        """Take link count and ctime from the store after a namespace change."""
        of = self.files.get(stored.ino)
        if of is not None:
            of.inode.nlink = stored.nlink
            of.inode.ctime_ns = stored.ctime_ns

    def reload(self, ino: int) -> None:
        """Take an open file's state from the store again (after a restore).

        Its buffers were committed before the store changed under it.
        """
        of = self.files.get(ino)
        if of is None:
            return
        self.dirty_bytes -= sum(len(b) for b in of.dirty.values())
        of.dirty.clear()
        of.drop_from = None
        of.attr_dirty = of.content_dirty = False
        of.hot_valid.clear()
        of.hot_gen.clear()
        of.hot_hashes.clear()
        try:
            of.inode = self.store.get_inode(ino)
        except errors.NotFound:
            of.inode.nlink = 0
            of.inode.size = 0
            blocks: dict[int, bytes] = {}
        else:
            blocks = self.store.block_map(ino) if of.inode.is_reg else {}
        of.blocks = {i: r for i, r in blocks.items() if not is_hot(r)}
        of.hot = {i for i, r in blocks.items() if is_hot(r)}
        of.hot_gen = {i: next(self._gens) for i in of.hot}
        of.committed_size = of.inode.size
        of.version += 1

    def attrs(self, ino: int) -> Inode:
        """Current attributes: the in-memory ones while the file is open."""
        of = self.files.get(ino)
        return of.inode if of is not None else self.store.get_inode(ino)

    # ---------------------------------------------------------------- read

    def uncached_chunks(self, of: OpenFile, off: int, size: int) -> list[bytes]:
        """Chunk files a read of this range needs that are not in memory yet."""
        end = min(off + size, of.inode.size)
        out = []
        for idx in range(off // self.cs, -(-end // self.cs)):
            ref = of.blocks.get(idx)
            if ref and idx not in of.dirty and not self.store.content.is_cached(ref):
                out.append(ref_digest(ref))
        return out

    def chunks_to_rewrite(self, of: OpenFile, off: int, length: int | None) -> list[bytes]:
        """Chunk files absent locally (only in the object store) that a write of
        `length` bytes at `off` (or, with `length` None, a truncate to `off`) reads
        back: partly overwritten committed blocks, and the short last block a
        growing file stores again."""
        cs = self.cs
        idxs = set()
        if length is None:
            if off < of.inode.size and off % cs:
                idxs.add(off // cs)  # the new last block keeps its head
            new_size = off
        else:
            end = off + length
            for idx in {off // cs, (end - 1) // cs} if length else ():
                if not (idx * cs >= off and idx * cs + cs <= end):
                    idxs.add(idx)  # not wholly overwritten
            new_size = max(of.inode.size, end)
        old = of.committed_size
        if old % cs and new_size > old:
            idxs.add(old // cs)
        out = []
        for idx in sorted(idxs):
            ref = of.blocks.get(idx)
            # Only chunks absent locally: a local one is read where it is used, on
            # the loop, so no other write can supersede it in between.
            if ref and idx not in of.dirty and ref_loc(ref) == LOC_FILE \
                    and not self.store.content.is_cached(ref) \
                    and not self.store.chunks.exists(ref_digest(ref)):
                out.append(ref_digest(ref))
        return out

    def next_chunk(self, of: OpenFile, off: int, size: int) -> bytes | None:
        """The chunk file after this range, worth prefetching for a sequential reader."""
        ref = of.blocks.get(-(-(off + size) // self.cs))
        if ref and ref_loc(ref) == LOC_FILE and not self.store.content.is_cached(ref):
            return ref_digest(ref)
        return None

    def read(self, of: OpenFile, off: int, size: int) -> bytes:
        end = min(off + size, of.inode.size)
        if off >= end:
            return b""
        cs = self.cs
        parts = []
        pos = off
        while pos < end:
            idx, boff = divmod(pos, cs)
            n = min(cs - boff, end - pos)
            blk = of.dirty.get(idx)
            if blk is not None:
                piece = bytes(blk[boff:boff + n])
            elif idx in of.hot:
                piece = self.hot.read(of.inode.vol, of.inode.ino, pos, n)
            else:
                ref = of.blocks.get(idx)
                piece = self.store.read_block(ref, boff, n) if ref else b""
            if len(piece) < n:
                piece += bytes(n - len(piece))
            parts.append(piece)
            pos += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _committed_block(self, of: OpenFile, idx: int) -> bytearray:
        if idx in of.hot:
            n = max(min(self.cs, of.committed_size - idx * self.cs), 0)
            return bytearray(self.hot.read(of.inode.vol, of.inode.ino, idx * self.cs, n))
        ref = of.blocks.get(idx)
        if ref is None:
            return bytearray()
        return bytearray(self.store.read_block(ref, 0, self.cs))

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

    # ------------------------------------------------------------- hot blocks

    def _wants_hot(self, of: OpenFile, idx: int) -> bool:
        """A partial write into a committed chunk file: cheaper in place."""
        ref = of.blocks.get(idx)
        return ref is not None and ref_loc(ref) == LOC_FILE and idx not in of.dirty

    def _go_hot(self, of: OpenFile, idx: int) -> None:
        """Move a committed block's bytes to the hot file and mark it hot."""
        # The marker's commit records the current size: pending truncates and
        # tail padding must commit with it (or before), never be left behind.
        if of.is_dirty:
            self.flush(of)
        ref = of.blocks.get(idx)
        if ref is None or ref_loc(ref) != LOC_FILE:
            return  # re-stored by that flush: the write buffers it instead
        vol, ino = of.inode.vol, of.inode.ino
        if of.hot_valid.get(idx) != ref:
            data = self.store.read_block(ref, 0, self.cs)
            # The whole block's range: past a short last block the hot file
            # must read as zeros, whatever an earlier use left there.
            self.hot.write(vol, ino, idx * self.cs, data.ljust(self.cs, b"\0"))
            self.store.durability.hot_copied(vol, ino)
        # The marker commits before the first write lands in the hot file, so
        # after a crash the hot file holds the block (old or new bytes).
        committed, _ = self.store.commit_content(of.inode, hot=[idx], hot_after=True,
                                                 stamp_step=False)
        del of.blocks[idx]
        of.hot_valid.pop(idx, None)
        of.hot.add(idx)
        of.hot_file = True
        of.hot_gen[idx] = next(self._gens)
        self._adopt(of, committed)

    def hot_digests(self, of: OpenFile) -> dict[int, bytes | None]:
        """Digest of each hot block (None: all zeros), hashed from the hot file
        unless it was hashed at its current write generation and extent."""
        known = of.hot_hashes
        for idx in [i for i in known if i not in of.hot]:
            del known[idx]
        path, plan = self.hot_hash_plan(of)
        if plan:
            self.adopt_hot_hashes(of, hash_hot_blocks(self.cs, path, plan))
        return {idx: known[idx][2] for idx in sorted(of.hot) if idx in known}

    def hot_hash_plan(self, of: OpenFile) -> tuple[object, list[tuple[int, int, int]]]:
        """(hot file path, [(idx, generation, extent)]) of the hot blocks a
        file hash would have to read: `hash_hot_blocks` reads them anywhere,
        `adopt_hot_hashes` keeps what is still current (on the loop)."""
        plan = []
        for idx in sorted(of.hot):
            n = min(self.cs, of.inode.size - idx * self.cs)
            gen = of.hot_gen.get(idx, 0)
            got = of.hot_hashes.get(idx)
            if n > 0 and (got is None or got[:2] != (gen, n)):
                plan.append((idx, gen, n))
        return self.hot.path(of.inode.vol, of.inode.ino), plan

    def adopt_hot_hashes(self, of: OpenFile, hashed: dict) -> None:
        """Keep the digests of blocks not written or resized since they were read."""
        for idx, (gen, n, digest) in hashed.items():
            if idx in of.hot and of.hot_gen.get(idx, 0) == gen \
                    and n == min(self.cs, of.inode.size - idx * self.cs):
                of.hot_hashes[idx] = (gen, n, digest)

    def settle_plan(self, of: OpenFile) -> tuple[dict[int, int], dict[int, int], object]:
        """What settling reads: (write generations, extents, hot file path).

        Taken on the loop; `prepare_blocks` then runs anywhere and
        `commit_settled` back on the loop.
        """
        gens = {idx: of.hot_gen.get(idx, 0) for idx in of.hot}
        extents = {idx: min(self.cs, of.inode.size - idx * self.cs) for idx in gens}
        return gens, extents, self.hot.path(of.inode.vol, of.inode.ino)

    def commit_settled(self, of: OpenFile, gens: dict[int, int],
                       prepared: dict[int, tuple]) -> None:
        """Turn hot blocks back into content, those not written since they were read."""
        settled = {}
        for idx, item in prepared.items():
            if idx in of.hot and of.hot_gen.get(idx, 0) == gens.get(idx) \
                    and item[1] == min(self.cs, of.inode.size - idx * self.cs):
                settled[idx] = item
            elif item[3] is not None:
                item[3].unlink(missing_ok=True)  # raced with a write: stays hot
        if not settled:
            return
        self.flush(of)  # attributes first, so the settled record carries the size
        remaining = of.hot - settled.keys()
        committed, refs = self.store.commit_content(of.inode, settled=settled,
                                                    hot_after=bool(remaining), stamp_step=False)
        for idx, ref in refs.items():
            of.hot.discard(idx)
            of.hot_gen.pop(idx, None)
            if ref is None:
                of.blocks.pop(idx, None)
            else:
                of.blocks[idx] = ref
                of.hot_valid[idx] = ref
                if ref_loc(ref) == LOC_FILE:
                    of.unsynced.add(ref_digest(ref))
        self._adopt(of, committed)

    def settle_now(self, of: OpenFile) -> None:
        """Settle every hot block on this thread (for the few left after `settle`)."""
        if of.hot:
            gens, extents, path = self.settle_plan(of)
            prepared = prepare_blocks(self.store, path, extents, self.inline_max)
            self.commit_settled(of, gens, prepared)

    # --------------------------------------------------------------- write

    def write(self, of: OpenFile, off: int, buf: bytes) -> int:
        cs = self.cs
        view = memoryview(buf)
        pos = off
        full: list[int] = []
        vol, ino = of.inode.vol, of.inode.ino
        while view:
            idx, boff = divmod(pos, cs)
            n = min(cs - boff, len(view))
            if idx not in of.hot and self._wants_hot(of, idx) and not (boff == 0 and n == cs):
                self._go_hot(of, idx)
            if idx in of.hot:
                self.hot.write(vol, ino, pos, view[:n])
                of.hot_gen[idx] = next(self._gens)
                pos += n
                view = view[n:]
                continue
            blk = of.dirty.get(idx)
            if blk is None and boff == 0 and n == cs:
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
        inode = of.inode
        if end > inode.size:
            inode.size = end
        inode.mtime_ns = inode.ctime_ns = now_ns()
        of.attr_dirty = of.content_dirty = True
        of.version += 1
        if inode.size <= self.inline_max or end >= inode.size \
                or self.dirty_bytes > self.dirty_limit:
            # Commit now, as the bytes arrive: close() waits for the kernel's
            # write-back, so a closed file is in the store, safe from a daemon
            # crash, with no FLUSH request needed. Small files commit whole;
            # a sequential writer's writes all reach the end of the file.
            self.flush(of)
        elif full:
            # Writes into the middle of a large file (dd conv=notrunc) commit
            # whole chunks only, so a chunk is not rewritten per page; the
            # rest waits for release or fsync.
            self._commit_blocks(of, sorted(set(full)))
        return len(buf)

    def truncate(self, of: OpenFile, size: int) -> None:
        cs = self.cs
        inode = of.inode
        # Hot blocks from the old or new end on change bytes or extent: a
        # settle that read them before must not commit what it read.
        for idx in of.hot:
            if idx >= min(size, inode.size) // cs:
                of.hot_gen[idx] = next(self._gens)
        if size < inode.size:
            keep = -(-size // cs)  # blocks that still hold data
            for idx in [i for i in of.dirty if i >= keep]:
                self.dirty_bytes -= len(of.dirty.pop(idx))
            gone = [i for i in of.blocks if i >= keep] + [i for i in of.hot if i >= keep]
            if gone:
                for idx in gone:
                    of.blocks.pop(idx, None)
                    of.hot.discard(idx)
                    of.hot_gen.pop(idx, None)
                of.drop_from = keep if of.drop_from is None else min(of.drop_from, keep)
            for idx in [i for i in of.hot_valid if i >= keep - 1]:
                del of.hot_valid[idx]
            # Hot file offsets are file offsets: cutting it cuts the hot tail.
            self.hot.truncate(inode.vol, inode.ino, size)
            tail = size - (keep - 1) * cs if keep else 0
            if keep and tail < cs and keep - 1 not in of.hot:
                blk = self._load_dirty(of, keep - 1)
                if len(blk) > tail:
                    self.dirty_bytes -= len(blk) - tail
                    del blk[tail:]
        inode.size = size
        inode.mtime_ns = inode.ctime_ns = now_ns()
        of.attr_dirty = of.content_dirty = True
        of.version += 1

    # -------------------------------------------------------------- commit

    def _extent(self, of: OpenFile, idx: int) -> int:
        return max(min(self.cs, of.inode.size - idx * self.cs), 0)

    def _exact(self, of: OpenFile, idx: int) -> bytes | bytearray:
        """A dirty block cut or zero-padded to exactly its extent of the file."""
        blk = of.dirty[idx]
        want = self._extent(of, idx)
        if len(blk) == want:
            return blk
        blk = self._load_dirty(of, idx)
        before = len(blk)
        if before > want:
            del blk[want:]
        else:
            blk.extend(bytes(want - before))
        self.dirty_bytes += len(blk) - before
        return blk

    def _pad_tail(self, of: OpenFile) -> None:
        """The file grew past a short last block: that block must be stored
        again at its new length (a block's digest covers its whole extent)."""
        old = of.committed_size
        if old % self.cs and of.inode.size > old:
            idx = old // self.cs
            if idx in of.blocks and idx not in of.dirty:
                self._load_dirty(of, idx)

    def _commit_blocks(self, of: OpenFile, idxs: list[int]) -> None:
        self._pad_tail(of)
        idxs = sorted(set(idxs) | ({of.committed_size // self.cs} & of.dirty.keys()))
        blocks = {i: self._exact(of, i) for i in idxs if i in of.dirty}
        if of.content_dirty and of.writer is not None:
            of.inode.changed_by = of.writer
        committed, refs = self.store.commit_content(
            of.inode, blocks=blocks, drop_blocks_from=of.drop_from,
            hot_after=bool(of.hot) if of.drop_from is not None else None,
            stamp_step=of.content_dirty)
        of.drop_from = None
        # The committed record carries the current attributes.
        of.attr_dirty = of.content_dirty = False
        for idx, ref in refs.items():
            self.dirty_bytes -= len(of.dirty.pop(idx, b""))
            of.hot_valid.pop(idx, None)
            if ref is None:
                of.blocks.pop(idx, None)
            else:
                of.blocks[idx] = ref
                if ref_loc(ref) == LOC_FILE:
                    of.unsynced.add(ref_digest(ref))
        self._adopt(of, committed)

    @staticmethod
    def _adopt(of: OpenFile, committed: Inode) -> None:
        of.committed_size = committed.size
        of.inode.step = committed.step
        of.inode.inline = committed.inline
        of.inode.nblocks = committed.nblocks

    def flush(self, of: OpenFile) -> None:
        """Commit everything buffered for this file (hot blocks stay hot)."""
        if not of.is_dirty:
            return
        self._pad_tail(of)
        self._commit_blocks(of, list(of.dirty))

    def hash_inputs(self, of: OpenFile) -> tuple[Inode, dict[int, bytes]]:
        """What the hash of an open file needs, as of now: its attributes and
        its block digests (buffered writes committed first; hot blocks not
        hashed yet are read from the hot file). `filehash.file_hash` of them
        may then run anywhere."""
        self.flush(of)
        digests = {i: ref_digest(r) for i, r in of.blocks.items()}
        digests.update((i, d) for i, d in self.hot_digests(of).items() if d)
        return of.inode.copy(), digests

    def content_hash(self, ino: int) -> bytes:
        """The file hash (see `filehash`): from block digests, no content read
        except hot blocks, which are hashed from the hot file."""
        of = self.files.get(ino)
        if of is not None:
            inode, digests = self.hash_inputs(of)
            return filehash.file_hash(inode.size, digests, self.cs)
        inode = self.store.get_inode(ino)
        if not inode.is_reg:
            raise errors.InvalidArgument("not a regular file")
        return self.store.file_hash(inode.size, self.store.block_map(ino), ino)


def hash_hot_blocks(cs: int, hot_path, plan: list[tuple[int, int, int]]) -> dict:
    """idx -> (generation, extent, digest or None for zeros) of the planned hot
    blocks (safe in a worker thread: own descriptor; a block written
    meanwhile is caught by `OpenFiles.adopt_hot_hashes`)."""
    out = {}
    fd = os.open(hot_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for idx, gen, n in plan:
            data = os.pread(fd, n, idx * cs)
            data = data if len(data) == n else data.ljust(n, b"\0")
            out[idx] = (gen, n, None if all_zero(data) else chunk_hash(data))
    finally:
        os.close(fd)
    return out


def prepare_blocks(store: Store, hot_path, extents: dict[int, int],
                   inline_max: int) -> dict[int, tuple]:
    """Read, hash and stage hot blocks (safe in a worker thread: own descriptor).

    Returns index -> (digest or None for zeros, size, small bytes or None,
    temporary chunk file or None), as `Store.commit_content(settled=...)` takes.
    """
    out: dict[int, tuple] = {}
    try:
        fd = os.open(hot_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return out
    try:
        for idx, n in sorted(extents.items()):
            if n <= 0:
                continue
            data = os.pread(fd, n, idx * store.chunk_size)
            data = data if len(data) == n else data.ljust(n, b"\0")
            if all_zero(data):
                out[idx] = (None, n, None, None)
            elif n <= inline_max:
                out[idx] = (chunk_hash(data), n, data, None)
            else:
                out[idx] = (chunk_hash(data), n, None, store.chunks.write_temp(data))
    finally:
        os.close(fd)
    return out
