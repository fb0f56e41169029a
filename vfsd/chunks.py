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
from pathlib import Path

import xxhash

from .errors import CorruptChunk


def chunk_hash(data: bytes | bytearray | memoryview) -> bytes:
    """The 16-byte xxh3-128 digest that names a chunk."""
    return xxhash.xxh3_128_digest(data)


class ChunkStore:
    """Chunk files under `root` (the store's `chunks/` directory)."""

    def __init__(self, root: Path, verify_reads: bool = False, create: bool = True) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        if create:
            self.tmp.mkdir(parents=True, exist_ok=True)
        self.verify_reads = verify_reads
        # Small cache of open descriptors: reads of the same chunk come in runs
        # (128 KiB kernel reads of a 1 MiB chunk), and open() is the costly part.
        self._fds: dict[bytes, int] = {}
        self._fd_order: list[bytes] = []
        self._max_fds = 64
        self.fd_hits = 0
        self.fd_misses = 0

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
        finally:
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
        self.install(self.write_temp(data), digest)

    def delete(self, digest: bytes) -> None:
        self._drop_fd(digest)
        try:
            os.unlink(self.path(digest))
        except FileNotFoundError:
            pass

    def read(self, digest: bytes, offset: int, length: int) -> bytes:
        """Read up to `length` bytes at `offset` of a chunk.

        Raises CorruptChunk if the chunk file is missing (never returns
        someone else's bytes or zeros in its place).
        """
        fd = self._fds.get(digest)
        if fd is not None:
            self.fd_hits += 1
        else:
            self.fd_misses += 1
            try:
                fd = os.open(self.path(digest), os.O_RDONLY)
            except FileNotFoundError:
                raise CorruptChunk(f"chunk {digest.hex()} is missing") from None
            # A chunk is read front to back by sequential readers: ask for all
            # of it at once rather than one 128 KiB kernel readahead at a time.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            self._fds[digest] = fd
            self._fd_order.append(digest)
            if len(self._fd_order) > self._max_fds:
                self._drop_fd(self._fd_order[0])
        if self.verify_reads:
            data = os.pread(fd, 1 << 30, 0)
            if chunk_hash(data) != digest:
                raise CorruptChunk(f"chunk {digest.hex()} does not match its hash")
            return data[offset:offset + length]
        return os.pread(fd, length, offset)

    def read_all(self, digest: bytes) -> bytes:
        """The whole chunk, verified against its name."""
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            raise CorruptChunk(f"chunk {digest.hex()} is missing") from None
        if chunk_hash(data) != digest:
            raise CorruptChunk(f"chunk {digest.hex()} does not match its hash")
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

    def _drop_fd(self, digest: bytes) -> None:
        fd = self._fds.pop(digest, None)
        if fd is not None:
            os.close(fd)
            self._fd_order.remove(digest)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._fd_order.clear()
