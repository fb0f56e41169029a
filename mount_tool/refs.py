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


def content_hash(data: bytes) -> str:
    """The hash a FileRef carries for `data`: hex xxh3-128."""
    return xxhash.xxh3_128(data).hexdigest()
