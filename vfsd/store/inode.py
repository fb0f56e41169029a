"""The inode record: what the store keeps per file, directory or symlink."""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass

STATUS_ACTIVE = 0
STATUS_DONE = 1
STATUS_NAMES = {STATUS_ACTIVE: "active", STATUS_DONE: "done"}
STATUS_BY_NAME = {v: k for k, v in STATUS_NAMES.items()}

# Big-endian, fixed width.
_FORMAT = struct.Struct(">IIIIIIQqqqIQBBBQ")


@dataclass(slots=True)
class Inode:
    """Attributes of one inode.

    `step` is the agent step of the last create or content change; `inline` says
    whether all content is small enough to live in LMDB (one block at most).
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
    #: number of stored (non-hole) blocks, for st_blocks
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
        return _FORMAT.pack(
            self.vol, self.mode, self.nlink, self.uid, self.gid, self.rdev,
            self.size, self.atime_ns, self.mtime_ns, self.ctime_ns, self.gen,
            self.step, self.status, int(self.pinned), int(self.inline), self.nblocks,
        )

    @classmethod
    def unpack(cls, ino: int, raw: bytes) -> Inode:
        (vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen, step,
         status, pinned, inline, nblocks) = _FORMAT.unpack_from(raw)
        return cls(
            ino, vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen,
            step, status, bool(pinned), bool(inline), nblocks,
        )


#: bytes of a packed inode record
INODE_SIZE = _FORMAT.size
