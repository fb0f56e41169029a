"""The inode record: what the store keeps per file, directory or symlink."""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass, field

STATUS_ACTIVE = 0
STATUS_DONE = 1
STATUS_NAMES = {STATUS_ACTIVE: "active", STATUS_DONE: "done"}
STATUS_BY_NAME = {v: k for k, v in STATUS_NAMES.items()}

# Big-endian, fixed width; the content hash is appended only when known.
_FORMAT = struct.Struct(">IIIIIIQqqqIQBBBQ")
HASH_LEN = 16


@dataclass(slots=True)
class Inode:
    """Attributes of one inode.

    `step` is the agent step of the last create or content change; `inline` says
    whether the content lives in the `data` database (True) or in chunks (False);
    `hash` is the cached xxh3-128 of the whole content, empty when not yet known.
    """

    ino: int
    vol: int
    mode: int
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    rdev: int = 0
    size: int = 0
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    gen: int = 0
    step: int = 0
    status: int = STATUS_ACTIVE
    pinned: bool = False
    inline: bool = True
    hash: bytes = field(default=b"")
    #: number of stored (non-hole) chunks, for st_blocks
    nblocks: int = 0

    def copy(self) -> Inode:
        return Inode.unpack(self.ino, self.pack())

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def status_name(self) -> str:
        return STATUS_NAMES[self.status]

    def pack(self) -> bytes:
        head = _FORMAT.pack(
            self.vol, self.mode, self.nlink, self.uid, self.gid, self.rdev,
            self.size, self.atime_ns, self.mtime_ns, self.ctime_ns, self.gen,
            self.step, self.status, int(self.pinned), int(self.inline), self.nblocks,
        )
        return head + self.hash

    @classmethod
    def unpack(cls, ino: int, raw: bytes) -> Inode:
        (vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen, step,
         status, pinned, inline, nblocks) = _FORMAT.unpack_from(raw)
        return cls(
            ino, vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen,
            step, status, bool(pinned), bool(inline), bytes(raw[_FORMAT.size:]), nblocks,
        )
