"""Content-addressed chunk files on local disk.

A chunk is immutable and named by the xxh3-128 of its bytes:
`chunks/ab/abcdef...` (hex, first byte as fan-out directory). New chunks are
written to `chunks/tmp/` and renamed into place, so a chunk file under its final
name is always complete. This module knows nothing of refcounts: the store
decides when a chunk may be created or deleted (always inside an LMDB write
transaction, which serializes it against other daemons sharing the store).
"""

from __future__ import annotations

import os
import secrets
from collections import OrderedDict
from pathlib import Path

import xxhash

from vfsd.errors import CorruptChunk


def chunk_hash(data: bytes | bytearray | memoryview) -> bytes:
    """The 16-byte xxh3-128 digest that names a chunk."""
    return xxhash.xxh3_128_digest(data)


class ChunkStore:
    """Chunk files under `root` (the store's `chunks/` directory)."""

    def __init__(self, root: Path, create: bool = True, cache_bytes: int = 16 << 20) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        if create:
            self.tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Verified chunk contents, least recently used first. A chunk is read
        # whole and checked against its name the first time it is needed, so
        # bytes altered on disk are never served; the kernel's 128 KiB reads
        # of the same chunk are then slices of memory.
        self._cache: OrderedDict[bytes, bytes] = OrderedDict()
        self._cache_bytes = 0
        self.cache_limit = cache_bytes
        self.cache_hits = 0
        self.cache_misses = 0

    def path(self, digest: bytes) -> Path:
        hx = digest.hex()
        return self.root / hx[:2] / hx

    def exists(self, digest: bytes) -> bool:
        return self.path(digest).exists()

    def write_temp(self, data: bytes | bytearray | memoryview) -> Path:
        """Write `data` to a fresh temporary file and return its path."""
        tmp = self.tmp / secrets.token_hex(12)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except BaseException:
            os.close(fd)
            os.unlink(tmp)  # a full disk must not leave half a chunk behind
            raise
        os.close(fd)
        return tmp

    def install(self, tmp: Path, digest: bytes) -> None:
        """Rename a temporary file to its final name (atomic)."""
        dest = self.path(digest)
        try:
            os.rename(tmp, dest)
        except FileNotFoundError:
            dest.parent.mkdir(exist_ok=True)
            os.rename(tmp, dest)

    def put(self, digest: bytes, data: bytes | bytearray | memoryview) -> None:
        """Store `data` under `digest` (write temp, rename)."""
        tmp = self.write_temp(data)
        try:
            self.install(tmp, digest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def delete(self, digest: bytes) -> None:
        old = self._cache.pop(digest, None)
        if old is not None:
            self._cache_bytes -= len(old)
        try:
            os.unlink(self.path(digest))
        except FileNotFoundError:
            pass

    def read(self, digest: bytes, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset` of a chunk, from verified content.

        Raises CorruptChunk if the chunk file is missing or does not match its
        hash: never someone else's bytes, never zeros in their place.
        """
        data = self._cache.get(digest)
        if data is not None:
            self.cache_hits += 1
            self._cache.move_to_end(digest)
        else:
            self.cache_misses += 1
            data = self.read_all(digest)
            self.insert(digest, data)
        if offset == 0 and length >= len(data):
            return data
        return data[offset:offset + length]

    def prefetch(self, digest: bytes) -> None:
        """Ask the kernel to start reading a chunk file we will likely need."""
        try:
            fd = os.open(self.path(digest), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    @property
    def cache_bytes(self) -> int:
        """Bytes of verified chunk content held in memory."""
        return self._cache_bytes

    def is_cached(self, digest: bytes) -> bool:
        return digest in self._cache

    def insert(self, digest: bytes, data: bytes) -> None:
        """Add verified content (from read_all, maybe run in a worker thread)."""
        if digest in self._cache:
            return
        self._cache[digest] = data
        self._cache_bytes += len(data)
        while self._cache_bytes > self.cache_limit and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old)

    def read_all(self, digest: bytes) -> bytes:
        """The whole chunk, verified against its name."""
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            raise CorruptChunk(f"chunk {digest.hex()} is missing") from None
        if chunk_hash(data) != digest:
            raise CorruptChunk(f"chunk {digest.hex()} does not match its hash")
        return data

    def read_all_path(self, path: Path, digest: bytes) -> bytes:
        """The bytes of a temporary file that must hash to `digest`."""
        data = Path(path).read_bytes()
        os.unlink(path)
        if chunk_hash(data) != digest:
            raise CorruptChunk(f"prepared content {digest.hex()} does not match its hash")
        return data

    def fsync(self, digests: list[bytes]) -> None:
        """Make chunk files (and their directory entries) durable."""
        dirs = set()
        for digest in digests:
            p = self.path(digest)
            try:
                fd = os.open(p, os.O_RDONLY)
            except FileNotFoundError:
                continue  # superseded and deleted meanwhile
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dirs.add(p.parent)
        for d in dirs:
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def iter_all(self):
        """Yield the digest of every chunk file present on disk."""
        for sub in sorted(self.root.iterdir()):
            if sub.name == "tmp" or not sub.is_dir() or len(sub.name) != 2:
                continue
            for f in sub.iterdir():
                try:
                    yield bytes.fromhex(f.name)
                except ValueError:
                    continue

    def iter_temps(self):
        yield from self.tmp.iterdir()

    def close(self) -> None:
        self._cache.clear()
        self._cache_bytes = 0
