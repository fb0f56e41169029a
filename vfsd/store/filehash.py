"""The content hash of a whole file, as references carry it.

A file's hash is the xxh3-128 of a short header (format tag, size, chunk size)
followed by, for each chunk-sized block that is not all zeros, its index (u64)
and the xxh3-128 digest of its bytes, in order. Every stored block is named
by exactly that digest, so hashing a file reads no content at all, and a
hole (or a stored block of zeros, whose digest is the digest of zeros) adds
nothing: the cost follows the stored blocks, whatever the size. A 2**63-byte
sparse file hashes as fast as an empty one. (Version 1 of the definition
hashed a digest per block, holes included: one per MiB of hole, on the
daemon's loop.) `mount_tool.refs` implements the same definition for bytes it
reads (it never imports vfsd); `tests/test_filehash.py` keeps the two equal.
"""

from __future__ import annotations

import functools
import struct

import xxhash

TAG = b"vfsd-file-hash-2\0"
_HEADER = struct.Struct(">QI")
_INDEX = struct.Struct(">Q")


@functools.lru_cache(maxsize=64)
def zero_digest(length: int) -> bytes:
    """Digest of `length` zero bytes (what a stored block of zeros is named)."""
    return xxhash.xxh3_128_digest(bytes(length))


def file_hash(size: int, digests: dict[int, bytes], chunk_size: int) -> bytes:
    """The file hash from the block digests (missing indexes are holes).

    Costs one step per stored block: holes, and blocks of zeros, add nothing.
    """
    h = xxhash.xxh3_128()
    h.update(TAG + _HEADER.pack(size, chunk_size))
    nblocks = -(-size // chunk_size)
    full_zero = zero_digest(chunk_size)
    last = nblocks - 1
    last_zero = zero_digest(size - last * chunk_size) if nblocks else b""
    pack = _INDEX.pack
    parts = [pack(idx) + digests[idx] for idx in sorted(digests)
             if 0 <= idx < nblocks and digests[idx] != (last_zero if idx == last else full_zero)]
    h.update(b"".join(parts))
    return h.digest()


def bytes_hash(data: bytes | bytearray | memoryview, chunk_size: int) -> bytes:
    """The file hash of `data` (what `file_hash` gives for a file holding it)."""
    view = memoryview(data)
    digests = {i: xxhash.xxh3_128_digest(view[off:off + chunk_size])
               for i, off in enumerate(range(0, len(view), chunk_size))}
    return file_hash(len(view), digests, chunk_size)
