"""FileRef: the small dict that graph state keeps instead of a file's content."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

import xxhash

REF_KEYS = ("ino", "gen", "path", "size", "hash", "step", "status")


class FileRef(TypedDict):
    """A reference to one version of one file in a vfsd mount.

    A plain dict at run time (TypedDict), so JSON, msgpack and LangGraph's
    checkpoint serializer store it as is, in about 150 bytes.

    - ino, gen: the daemon's inode number (never reused) and generation
    - path: path relative to the mount root when the ref was taken
    - size: content size in bytes
    - hash: hex xxh3-128 of the content
    - step: step of the last create or content change
    - status: "active" or "done"
    """

    ino: int
    gen: int
    path: str
    size: int
    hash: str
    step: int
    status: Literal["active", "done"]


def as_ref(value: Mapping[str, Any]) -> FileRef:
    """Return a FileRef holding exactly the ref keys of `value` (a daemon reply or a ref).

    Raises ValueError when a key is missing or has the wrong type, so a corrupted
    state entry fails loudly instead of reading the wrong file.
    """
    try:
        ref: FileRef = {
            "ino": int(value["ino"]),
            "gen": int(value["gen"]),
            "path": str(value["path"]),
            "size": int(value["size"]),
            "hash": str(value["hash"]),
            "step": int(value["step"]),
            "status": value["status"],
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a FileRef: {value!r}") from exc
    if ref["status"] not in ("active", "done"):
        raise ValueError(f"bad FileRef status {ref['status']!r}")
    return ref


def is_ref(value: object) -> bool:
    """True when `value` looks like a FileRef (a mapping with all ref keys)."""
    return isinstance(value, Mapping) and all(k in value for k in REF_KEYS)


#: vfsd's default chunk size; a store made with another says so in `Mount.stats()`
DEFAULT_CHUNK_SIZE = 1 << 20
_HASH_TAG = b"vfsd-file-hash-2\0"


def content_hash(data: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> str:
    """The hash a FileRef carries for `data` (hex).

    vfsd hashes a file as the xxh3-128 of a header (tag, size, chunk size)
    followed by, for each `chunk_size` block that is not all zeros, its
    index and its xxh3-128, so it can hash any file from its block digests
    without reading it, and holes cost nothing. This is the same definition,
    over bytes in memory (`vfsd.store.filehash`; the tests keep the two equal).
    """
    view = memoryview(data)
    h = xxhash.xxh3_128()
    h.update(_HASH_TAG + len(view).to_bytes(8, "big") + chunk_size.to_bytes(4, "big"))
    zeros = {}
    for idx, off in enumerate(range(0, len(view), chunk_size)):
        block = view[off:off + chunk_size]
        digest = xxhash.xxh3_128_digest(block)
        n = len(block)
        if n not in zeros:
            zeros[n] = xxhash.xxh3_128_digest(bytes(n))
        if digest != zeros[n]:
            h.update(idx.to_bytes(8, "big") + digest)
    return h.hexdigest()
