"""Small helpers shared by the store's modules: object keys and the clock."""

from __future__ import annotations

import struct
import time

_U64 = struct.Struct(">Q")


def now_ns() -> int:
    return time.time_ns()


def dentry_key(parent: int, name: bytes) -> bytes:
    """Object key of a directory entry, as snapshot tracking names it."""
    return b"d" + _U64.pack(parent) + bytes((len(name),)) + name


def inode_key(ino: int) -> bytes:
    """Object key of an inode (attributes, content, xattrs, link target)."""
    return b"i" + _U64.pack(ino)
