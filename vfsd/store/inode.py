"""The inode record: what the store keeps per file, directory or symlink."""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass

STATUS_ACTIVE = 0
STATUS_DONE = 1
STATUS_NAMES = {STATUS_ACTIVE: "active", STATUS_DONE: "done"}
STATUS_BY_NAME = {v: k for k, v in STATUS_NAMES.items()}

#: `Inode.made_by` / `changed_by`: no tool call (the shell, the agent program
#: itself), and "not known" (records written before provenance was kept)
NO_CALL = 0
UNKNOWN_CALL = (1 << 64) - 1

# Big-endian, fixed width. Schema 3 records end before the step of last use,
# schema 2 records also before the two call keys.
_FORMAT = struct.Struct(">IIIIIIQqqqIQBBBQQQQ")
_FORMAT_V3 = struct.Struct(">IIIIIIQqqqIQBBBQQQ")
_FORMAT_V2 = struct.Struct(">IIIIIIQqqqIQBBBQ")


@dataclass(slots=True)
class Inode:
    """Attributes of one inode.

    `step` is the agent step of the last create or content change; `inline` says
    whether all content is small enough to live in LMDB (one block at most).
    `made_by` and `changed_by` are the tool calls (call keys, see `calls`) that
    created the inode and last changed its content, or NO_CALL / UNKNOWN_CALL.
    `used` is the last step the file was opened (0: never recorded); its age
    for eviction counts from `use_step`, the later of that and `step`.
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
    made_by: int = NO_CALL
    changed_by: int = NO_CALL
    used: int = 0

    @property
    def use_step(self) -> int:
        """The last step the file was written or opened."""
        return max(self.step, self.used)

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
            self.made_by, self.changed_by, self.used,
        )

    @classmethod
    def unpack(cls, ino: int, raw: bytes) -> Inode:
        used = 0
        if len(raw) >= INODE_SIZE:
            (vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen, step,
             status, pinned, inline, nblocks, made_by, changed_by,
             used) = _FORMAT.unpack_from(raw)
        elif len(raw) >= _FORMAT_V3.size:  # a schema 3 record: no step of last use
            (vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen, step,
             status, pinned, inline, nblocks, made_by, changed_by) = _FORMAT_V3.unpack_from(raw)
        else:  # a schema 2 record (or a snapshot entry written then)
            (vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen, step,
             status, pinned, inline, nblocks) = _FORMAT_V2.unpack_from(raw)
            made_by = changed_by = UNKNOWN_CALL
        return cls(ino, vol, mode, nlink, uid, gid, rdev, size, atime, mtime, ctime, gen,
                   step, status, bool(pinned), bool(inline), nblocks, made_by, changed_by, used)


#: bytes of a packed inode record
INODE_SIZE = _FORMAT.size
_USED = struct.Struct(">Q")


def with_used(raw: bytes, used: int) -> bytes:
    """A packed record (schema 3 or 4) with its step of last use set to `used`:
    the field is the record's last, so nothing else is decoded or packed."""
    return bytes(raw[:_FORMAT_V3.size]) + _USED.pack(used)
