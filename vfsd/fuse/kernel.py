"""What a volume's operations say to the kernel, in the volume's own inode numbers.

A volume's handlers, its snapshot service and its evictor name inodes by the
volume's numbers (the store's, the root is 1, and the virtual ones of `.vfsd/`).
A run dir's mount shows one volume at its root, so those are the kernel's
numbers too (`Kernel`); a shard's mount shows each volume as a directory, and
`shardops.VolumeKernel` translates. Every notification and every READDIRPLUS
entry goes through one of them, so no handler calls pyfuse3's notify functions
itself.
"""

from __future__ import annotations

import pyfuse3

#: the number a volume gives the `..` of its root (see `Kernel.above_root`): far
#: from every number the volume uses, below the `.vfsd/` ones
ABOVE_ROOT = (1 << 62) - 1


class Kernel:
    """The kernel as a run dir's mount sees it: volume numbers are kernel numbers."""

    #: the kernel inode number of the volume's root
    root_ino = pyfuse3.ROOT_INODE
    #: what `..` of the volume's root names, in the volume's numbers: the root
    #: itself at the top of a mount, the mount's root in a shard
    above_root = pyfuse3.ROOT_INODE

    def to_kernel(self, ino: int) -> int | None:
        """The kernel's number for a volume inode (None: the kernel cannot know it)."""
        return ino

    def from_kernel(self, kernel_no: int) -> int | None:
        """The volume's number for a kernel inode number of this mount (None:
        not one of this volume's store inodes)."""
        return kernel_no

    def invalidate_entry(self, parent: int, name: bytes, deleted: int = 0) -> None:
        """Drop a cached name and wait for the kernel (blocks: worker threads only)."""
        pyfuse3.invalidate_entry(parent, name, deleted=deleted)

    def invalidate_entry_async(self, parent: int, name: bytes, deleted: int = 0,
                               ignore_enoent: bool = False) -> None:
        """Queue dropping a cached name (never blocks)."""
        pyfuse3.invalidate_entry_async(parent, name, deleted=deleted,
                                       ignore_enoent=ignore_enoent)

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        """Drop cached attributes (and pages, unless `attr_only`); blocks."""
        pyfuse3.invalidate_inode(ino, attr_only=attr_only)

    def readdir_reply(self, token, name: bytes, entry: pyfuse3.EntryAttributes,
                      next_id: int) -> bool:
        """One READDIRPLUS entry; False when the kernel's buffer is full."""
        return pyfuse3.readdir_reply(token, name, entry, next_id)
