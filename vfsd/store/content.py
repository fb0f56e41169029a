"""Content objects: immutable blocks named by their xxh3-128, refcounted.

Every block of file content, wherever it lives, is one object named by the
xxh3-128 digest of its bytes. Small objects (at most `inline_max` bytes when
first stored) live in LMDB's `blob` database; larger ones are chunk files
(`chunks.ChunkStore`). Whoever names an object holds one reference on it: a
block of a live file, a block in a snapshot entry. Objects are shared by every
file, snapshot and volume of the store that has the same bytes.

A block reference, as the `block` database and snapshot entries store it, is
17 bytes: the digest, then one location byte (`LOC_FILE` or `LOC_LMDB`). A
digest's location never changes while it has references, so the copy in the
reference is always right; readers need no lookup to find the bytes. A live
block may instead be hot (`HOT_REF`: its bytes are in the inode's hot file,
see `hotfiles`); a hot block names no object and holds no reference, and
snapshot entries never hold one.

The records (`content` and `blob` databases) are described in `store`; this
module owns every change to them. A new chunk file is also recorded as
pending upload (`remotestate`, table `upload`) in the transaction that
creates its record, and forgotten there when its last reference goes. Reads are verified: bytes that do not hash
to their name are never served (`CorruptChunk`, EIO).
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections import Counter
from collections.abc import Iterable

import xxhash

from vfsd import errors

from . import remotestate
from .chunks import ChunkStore, chunk_hash

LOC_FILE = 0
LOC_LMDB = 1
#: not a content object: the block's bytes are in the inode's hot file (`hotfiles`)
LOC_HOT = 2
REF_LEN = 17
HOT_REF = bytes(16) + bytes((LOC_HOT,))
#: refcount u64 + size u32 + location u8
_RECORD = struct.Struct(">QIB")


def make_ref(digest: bytes, loc: int) -> bytes:
    return digest + bytes((loc,))


def ref_digest(ref: bytes) -> bytes:
    return ref[:16]


def ref_loc(ref: bytes) -> int:
    return ref[16]


def is_hot(ref: bytes) -> bool:
    return ref[16] == LOC_HOT


def unpack_record(raw: bytes) -> tuple[int, int, int]:
    """(refcount, size, location) of a `content` record."""
    return _RECORD.unpack(raw)


def pack_record(count: int, size: int, loc: int) -> bytes:
    return _RECORD.pack(count, size, loc)


def all_zero(buf: bytes | bytearray | memoryview) -> bool:
    # Cheap exits first: real data rarely starts and ends with NUL.
    return not buf or (buf[0] == 0 and buf[-1] == 0 and bytes(buf).count(0) == len(buf))


def _disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


class ContentStore:
    """Reference counting and verified reads of content objects.

    Methods that take `txn` run inside the caller's LMDB write transaction;
    chunk files are written before that transaction commits and deleted only
    after a later transaction has seen their count still at zero
    (`delete_unreferenced`), so a record never names a missing file.
    """

    def __init__(self, db: dict, chunks: ChunkStore, bump, inline_max: int) -> None:
        self.db = db
        self.chunks = chunks
        self._bump = bump  # store counter update: bump(txn, key, delta, volume=False)
        self.inline_max = inline_max
        # Chunk files made and deleted by the transaction in progress:
        # (digest, size) and digests, handed to `Store.on_chunk_files` once
        # it commits (the remote tier queues uploads and bounds its cache).
        self.created: list[tuple[bytes, int]] = []
        self.removed: list[bytes] = []
        # While held (a snapshot being built from a read view), objects whose
        # count falls to zero are kept as tombstones, so the build can take
        # references on what it saw; `release_hold` deletes those still unused.
        self.holding = 0
        self.held: set[bytes] = set()
        # Set by a store that defers chunk deletes to its next sync: called
        # with digests whose files may go once the tombstones are durable.
        self.doom = None

    # -------------------------------------------------------------- writing

    def put(self, txn, data: bytes | bytearray | memoryview) -> bytes | None:
        """Take one reference on an object holding `data`; its block reference.

        All-zero data is a hole: no object, None.
        """
        if all_zero(data):
            return None
        digest = chunk_hash(data)
        db = self.db["content"]
        raw = txn.get(digest, db=db)
        if raw is not None:
            count, size, loc = _RECORD.unpack(raw)
            if count > 0:
                txn.put(digest, _RECORD.pack(count + 1, size, loc), db=db)
                return make_ref(digest, loc)
            # A chunk tombstone: its file may already be gone.
            if loc == LOC_FILE and not self.chunks.exists(digest):
                self._write_file(digest, data)
        else:
            loc = LOC_LMDB if len(data) <= self.inline_max else LOC_FILE
            if loc == LOC_LMDB:
                txn.put(digest, bytes(data), db=self.db["blob"])
            else:
                self._write_file(digest, data)
        return self._first_ref(txn, digest, len(data), loc)

    def put_settled(self, txn, digest: bytes, size: int, *, data: bytes | None = None,
                    tmp=None) -> bytes:
        """Take one reference on the object `digest`, whose bytes were hashed and
        (for a chunk) written to the temporary file `tmp` off the loop; small
        objects come as `data`. Returns the block reference. `tmp` is used or
        removed."""
        try:
            db = self.db["content"]
            raw = txn.get(digest, db=db)
            if raw is not None:
                count, rsize, loc = _RECORD.unpack(raw)
                if count > 0:
                    txn.put(digest, _RECORD.pack(count + 1, rsize, loc), db=db)
                    return make_ref(digest, loc)
            else:
                loc = LOC_LMDB if data is not None else LOC_FILE
            if loc == LOC_LMDB:
                if data is None:
                    data = self.chunks.read_all_path(tmp, digest)
                    tmp = None
                txn.put(digest, data, db=self.db["blob"])
            elif raw is None or not self.chunks.exists(digest):
                if tmp is None:
                    self._write_file(digest, data)
                else:
                    self.chunks.install(tmp, digest)
                    tmp = None
            return self._first_ref(txn, digest, size, loc)
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _first_ref(self, txn, digest: bytes, size: int, loc: int) -> bytes:
        """Record an object whose bytes are in place (new, or back from a
        tombstone) with one reference; its block reference."""
        if loc == LOC_FILE:
            remotestate.add_pending(txn, self.db, self._bump, digest, size)
            self.created.append((digest, size))
        self._count_object(txn, loc, size, +1)
        txn.put(digest, _RECORD.pack(1, size, loc), db=self.db["content"])
        return make_ref(digest, loc)

    def _write_file(self, digest: bytes, data) -> None:
        try:
            self.chunks.put(digest, data)
        except OSError as exc:
            if _disk_full(exc):
                raise errors.NoSpace(f"no room for a chunk: {exc.strerror}") from None
            raise

    def _count_object(self, txn, loc: int, size: int, sign: int) -> None:
        if loc == LOC_LMDB:
            self._bump(txn, b"blob_count", sign, volume=False)
            self._bump(txn, b"blob_bytes", sign * size, volume=False)
        else:
            self._bump(txn, b"chunk_count", sign, volume=False)
            self._bump(txn, b"chunk_bytes", sign * size, volume=False)

    def incref(self, txn, ref: bytes, n: int = 1) -> None:
        """Take `n` more references on an object that has at least one (or,
        while held, one kept as a tombstone)."""
        digest = ref_digest(ref)
        raw = txn.get(digest, db=self.db["content"])
        if raw is None or (_RECORD.unpack(raw)[0] == 0 and digest not in self.held):
            raise errors.Corrupt(f"content {digest.hex()} has no references to share")
        count, size, loc = _RECORD.unpack(raw)
        if count == 0:
            self._count_object(txn, loc, size, +1)  # back from a held tombstone
        txn.put(digest, _RECORD.pack(count + n, size, loc), db=self.db["content"])

    def decref(self, txn, ref: bytes, n: int = 1) -> bytes | None:
        """Drop `n` references; the digest if the chunk file is now unreferenced.

        An inline object is deleted at once (same transaction); a chunk file
        stays as a tombstone until `delete_unreferenced` runs after commit.
        """
        if is_hot(ref):
            return None
        digest = ref_digest(ref)
        db = self.db["content"]
        raw = txn.get(digest, db=db)
        if raw is None:
            return None
        count, size, loc = _RECORD.unpack(raw)
        if count == 0:
            return None
        count = max(count - n, 0)
        if count:
            txn.put(digest, _RECORD.pack(count, size, loc), db=db)
            return None
        self._count_object(txn, loc, size, -1)
        if self.holding:
            txn.put(digest, _RECORD.pack(0, size, loc), db=db)
            self.held.add(digest)
            return None
        if loc == LOC_LMDB:
            txn.delete(digest, db=db)
            txn.delete(digest, db=self.db["blob"])
            return None
        txn.put(digest, _RECORD.pack(0, size, loc), db=db)
        remotestate.drop(txn, self.db, self._bump, digest)
        return digest

    def adopt(self, txn, ref: bytes, size: int, n: int, blob: bytes | None = None) -> None:
        """Take `n` references on an object that may exist only in the bucket
        (a snapshot imported from a manifest).

        A chunk file not present locally becomes "remote-only": its record
        says it exists, the local cache does not have it, and it is fetched
        on first read. A small object (LMDB location) needs its bytes, `blob`.
        """
        digest = ref_digest(ref)
        loc = ref_loc(ref)
        db = self.db["content"]
        raw = txn.get(digest, db=db)
        if raw is not None:
            count, osize, oloc = _RECORD.unpack(raw)
            if oloc != loc:
                raise errors.Corrupt(f"content {digest.hex()} is stored at another location")
            if count > 0:
                txn.put(digest, _RECORD.pack(count + n, osize, loc), db=db)
                return
        if loc == LOC_LMDB:
            if blob is None:
                raise errors.Corrupt(f"inline content {digest.hex()} has no bytes to adopt")
            txn.put(digest, blob, db=self.db["blob"])
        self._count_object(txn, loc, size, +1)
        txn.put(digest, _RECORD.pack(n, size, loc), db=db)

    def release_hold(self, env_txn_factory) -> None:
        """End a hold: delete what it kept that nothing references now (chunk
        files through `doom` when the store defers deletes to a sync)."""
        self.holding -= 1
        if self.holding or not self.held:
            return
        held, self.held = self.held, set()
        db = self.db["content"]
        doomed = []
        with env_txn_factory(write=True) as txn:
            for digest in held:
                raw = txn.get(digest, db=db)
                if raw is None or _RECORD.unpack(raw)[0]:
                    continue
                if _RECORD.unpack(raw)[2] == LOC_LMDB:
                    txn.delete(digest, db=db)
                    txn.delete(digest, db=self.db["blob"])
                    continue
                remotestate.drop(txn, self.db, self._bump, digest)
                if self.doom is not None:
                    doomed.append(digest)  # a tombstone until then
                else:
                    self.chunks.delete(digest)
                    txn.delete(digest, db=db)
                    self.removed.append(digest)
        if doomed:
            self.doom(doomed)

    def apply(self, txn, deltas: Counter) -> list[bytes]:
        """Apply net reference changes {ref: +n/-n}; chunk digests freed.

        Increments first, so an object moving between holders is never freed.
        """
        for ref, n in deltas.items():
            if n > 0:
                self.incref(txn, ref, n)
        freed = []
        for ref, n in deltas.items():
            if n < 0:
                digest = self.decref(txn, ref, -n)
                if digest is not None:
                    freed.append(digest)
        return freed

    def delete_unreferenced(self, env_txn, digests: Iterable[bytes]) -> int:
        """Delete chunk files whose count is still zero (called in a new write
        txn); how many went."""
        db = self.db["content"]
        n = 0
        for digest in digests:
            raw = env_txn.get(digest, db=db)
            if raw is not None and _RECORD.unpack(raw)[0] == 0 and digest not in self.held:
                self.chunks.delete(digest)
                env_txn.delete(digest, db=db)
                self.removed.append(digest)
                n += 1
        return n

    def tombstones(self, txn) -> list[bytes]:
        """Chunk records at count zero: files a crash left waiting for deletion."""
        return [bytes(k) for k, v in txn.cursor(db=self.db["content"])
                if v[:8] == bytes(8) and _RECORD.unpack(v)[2] == LOC_FILE]

    # -------------------------------------------------------------- reading

    def is_cached(self, ref: bytes) -> bool:
        return ref_loc(ref) != LOC_FILE or self.chunks.is_cached(ref_digest(ref))

    def read(self, txn_source, ref: bytes, offset: int, length: int) -> bytes:
        """Bytes of an object, verified against its name.

        `txn_source()` opens a read transaction (for inline objects).
        """
        digest = ref_digest(ref)
        if ref_loc(ref) == LOC_FILE:
            return self.chunks.read(digest, offset, length)
        with txn_source() as txn:
            raw = txn.get(digest, db=self.db["blob"])
            data = bytes(raw) if raw is not None else None
        if data is None:
            raise errors.CorruptChunk(f"inline content {digest.hex()} is missing")
        if xxhash.xxh3_128_digest(data) != digest:
            raise errors.CorruptChunk(f"inline content {digest.hex()} does not match its hash")
        if offset == 0 and length >= len(data):
            return data
        return data[offset:offset + length]


def seed_pending(store) -> int:
    """Make every referenced chunk file PENDING unless it has an entry: for a
    store going remote whose chunks were written before the table existed.
    Returns how many were added."""
    added = 0
    with store.txn(write=True) as txn:
        table = store.db["upload"]
        for k, v in txn.cursor(db=store.db["content"]):
            count, size, loc = unpack_record(v)
            if count and loc == LOC_FILE and txn.get(k, db=table) is None:
                remotestate.add_pending(txn, store.db, store._bump, bytes(k), size)
                added += 1
    return added
