"""A shard's mount: every volume of the store as a directory of the mount's root.

    SHARD/fs/                 the root: one directory per volume, read-only
    SHARD/fs/<volume>/        the volume's own root (its tree, its `.vfsd/`)

Each volume is served by its own `VfsdOperations`, in the volume's own inode
numbers; this module routes each request to it and translates numbers both
ways, so no volume ever sees another's inodes or handles.

Kernel inode numbers. The root is 1. A volume gets a slot (1 .. 2**23-1) for
as long as it is served; its store inode N (< 2**40) is `slot << 40 | N`, so
the hot path is arithmetic. The volume's virtual inodes (`.vfsd/`, the
snapshot and eviction views, numbered from 2**62 up) get numbers from 2**63
up, allocated when the kernel first hears of one (a lookup or a READDIRPLUS
entry it takes) and dropped when it forgets the last reference. File
handles work the same way: a regular file's handle is its inode number,
translated like one; the views' handles are allocated at open and dropped at
release.

A request naming an inode of one volume and a directory of another (rename,
link) gets EXDEV; nothing may be made, removed or renamed at the root
(EPERM): volumes come and go through the control socket.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import time
from collections.abc import Callable
from typing import Any

import pyfuse3
import structlog

from .kernel import ABOVE_ROOT, Kernel

log = structlog.get_logger("vfsd.shard")

#: store inode numbers below this have static kernel numbers
LOCAL_BITS = 40
LOCAL_LIMIT = 1 << LOCAL_BITS
#: volume slots a shard can hand out at once
SLOT_LIMIT = 1 << 23
#: kernel numbers (and handles) from here up name a volume's virtual inodes
DYNAMIC_BASE = 1 << 63
ROOT = pyfuse3.ROOT_INODE


class Numbers:
    """The dynamic part of the kernel numbering: (slot, volume number) <-> kernel
    number, each mapping counted by the references the kernel holds."""

    def __init__(self) -> None:
        self.to_local: dict[int, tuple[int, int]] = {}
        self.to_kernel: dict[tuple[int, int], int] = {}
        self.refs: dict[int, int] = {}
        self._next = DYNAMIC_BASE

    def number(self, slot: int, local: int) -> int:
        """The kernel number of (slot, local), made if it has none yet."""
        key = (slot, local)
        got = self.to_kernel.get(key)
        if got is None:
            got = self._next
            self._next += 1
            self.to_kernel[key] = got
            self.to_local[got] = key
            self.refs[got] = 0
        return got

    def take(self, kernel_no: int, n: int = 1) -> None:
        self.refs[kernel_no] = self.refs.get(kernel_no, 0) + n

    def drop(self, kernel_no: int, n: int = 1) -> None:
        """The kernel let go of `n` references; the number goes with the last."""
        left = self.refs.get(kernel_no, 0) - n
        if left > 0:
            self.refs[kernel_no] = left
            return
        self.refs.pop(kernel_no, None)
        key = self.to_local.pop(kernel_no, None)
        if key is not None:
            self.to_kernel.pop(key, None)

    def discard_if_unused(self, kernel_no: int) -> None:
        if not self.refs.get(kernel_no):
            self.drop(kernel_no, 0)

    def forget_slot(self, slot: int) -> None:
        for kernel_no, (s, _local) in list(self.to_local.items()):
            if s == slot:
                self.refs.pop(kernel_no, None)
                del self.to_local[kernel_no]
                del self.to_kernel[(s, _local)]


class VolumeKernel(Kernel):
    """The kernel as one volume of a shard sees it (see the module docstring)."""

    above_root = ABOVE_ROOT

    def __init__(self, slot: int, numbers: Numbers) -> None:
        self.slot = slot
        self.base = slot << LOCAL_BITS
        self.numbers = numbers
        self.root_ino = self.base | ROOT

    def to_kernel(self, ino: int) -> int | None:
        if ino < LOCAL_LIMIT:
            return self.base | ino
        return self.numbers.to_kernel.get((self.slot, ino))

    def from_kernel(self, kernel_no: int) -> int | None:
        if kernel_no >> LOCAL_BITS != self.slot:
            return None
        return kernel_no & (LOCAL_LIMIT - 1)

    def entry_out(self, entry: pyfuse3.EntryAttributes, *, counted: bool) -> None:
        """Give `entry` its kernel number; `counted`: the kernel takes a reference."""
        ino = entry.st_ino
        if ino == 0:
            return  # a negative entry
        if ino < LOCAL_LIMIT:
            entry.st_ino = self.base | ino
            return
        kernel_no = self.numbers.number(self.slot, ino)
        if counted:
            self.numbers.take(kernel_no)
        entry.st_ino = kernel_no

    def invalidate_entry(self, parent: int, name: bytes, deleted: int = 0) -> None:
        kparent = self.to_kernel(parent)
        if kparent is None:
            return  # the kernel never heard of that directory: nothing cached
        kdeleted = self.to_kernel(deleted) if deleted else 0
        pyfuse3.invalidate_entry(kparent, name, deleted=kdeleted or 0)

    def invalidate_entry_async(self, parent: int, name: bytes, deleted: int = 0,
                               ignore_enoent: bool = False) -> None:
        kparent = self.to_kernel(parent)
        if kparent is None:
            return
        kdeleted = self.to_kernel(deleted) if deleted else 0
        pyfuse3.invalidate_entry_async(kparent, name, deleted=kdeleted or 0,
                                       ignore_enoent=ignore_enoent)

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        kino = self.to_kernel(ino)
        if kino is not None:
            pyfuse3.invalidate_inode(kino, attr_only=attr_only)

    def readdir_reply(self, token, name: bytes, entry: pyfuse3.EntryAttributes,
                      next_id: int) -> bool:
        if entry.st_ino == ABOVE_ROOT:
            entry.st_ino = ROOT  # `..` of a volume's root: the shard's root
            return pyfuse3.readdir_reply(token, name, entry, next_id)
        local = entry.st_ino
        self.entry_out(entry, counted=False)
        taken = pyfuse3.readdir_reply(token, name, entry, next_id)
        if local >= LOCAL_LIMIT:
            # The kernel takes a reference for each entry it keeps, dots aside.
            if taken and name not in (b".", b".."):
                self.numbers.take(entry.st_ino)
            else:
                self.numbers.discard_if_unused(entry.st_ino)
        return taken


def _routed(fn: Callable) -> Callable:
    """Only FUSEError leaves a handler (anything else would end pyfuse3's loop
    and leave a dead mount): what the routing itself raises is logged, EIO."""

    @functools.wraps(fn)
    async def wrapper(self, *args):
        self.requests += 1
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Exception:
            log.exception("shard_request_failed", op=fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


class ShardOperations(pyfuse3.Operations):
    """Routes each request to the volume it names (see the module docstring).

    `shard` is the daemon side: `volume_at_slot(slot)` (a served volume or
    None), `open_volume(name)` (the volume of that name, loaded if need be, or
    None), `volume_names()`, `root_owner()` ((uid, gid)), `store_dir` and
    `entry_timeout`; each served volume has `ops` (its VfsdOperations) and
    `kernel` (its VolumeKernel).
    """

    enable_writeback_cache = True
    supports_dot_lookup = False

    def __init__(self, shard: Any, numbers: Numbers) -> None:
        super().__init__()
        self.shard = shard
        self.numbers = numbers
        self.handles: dict[int, tuple[Any, int]] = {}  # kernel handle -> (volume, its handle)
        self._next_fh = DYNAMIC_BASE
        self.started_ns = time.time_ns()
        self.requests = 0

    # ---------------------------------------------------------- numbering

    def _volume(self, kernel_no: int) -> tuple[Any, int]:
        """(volume, its inode number) for a kernel inode number other than the root."""
        if kernel_no >= DYNAMIC_BASE:
            key = self.numbers.to_local.get(kernel_no)
            if key is None:
                raise pyfuse3.FUSEError(errno.ESTALE)
            slot, local = key
        else:
            slot, local = kernel_no >> LOCAL_BITS, kernel_no & (LOCAL_LIMIT - 1)
        volume = self.shard.volume_at_slot(slot)
        if volume is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        return volume, local

    def _not_root(self, kernel_no: int, err: int = errno.EPERM) -> tuple[Any, int]:
        if kernel_no == ROOT:
            raise pyfuse3.FUSEError(err)
        return self._volume(kernel_no)

    def _fh_out(self, volume, fh: int) -> int:
        if fh < LOCAL_LIMIT:
            return volume.kernel.base | fh
        self._next_fh += 1
        self.handles[self._next_fh] = (volume, fh)
        return self._next_fh

    def _fh_in(self, kernel_fh: int) -> tuple[Any, int]:
        if kernel_fh >= DYNAMIC_BASE:
            got = self.handles.get(kernel_fh)
            if got is None:
                raise pyfuse3.FUSEError(errno.EBADF)
            return got
        volume = self.shard.volume_at_slot(kernel_fh >> LOCAL_BITS)
        if volume is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return volume, kernel_fh & (LOCAL_LIMIT - 1)

    @staticmethod
    def _entry(volume, entry: pyfuse3.EntryAttributes, counted: bool = True):
        volume.kernel.entry_out(entry, counted=counted)
        return entry

    async def _gate(self, volume) -> None:
        """Wait while a long operation holds the volume (see `Volume.hold`)."""
        if volume.held is not None:
            await volume.wait_free()

    # --------------------------------------------------------------- root

    def _root_entry(self) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = ROOT
        e.st_mode = stat.S_IFDIR | 0o755
        e.st_nlink = 2
        e.st_uid, e.st_gid = self.shard.root_owner()
        e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = self.started_ns
        e.st_blksize = 4096
        e.entry_timeout = e.attr_timeout = 1.0
        return e

    def _negative(self) -> pyfuse3.EntryAttributes:
        # Volumes appear through the control socket, never through this mount:
        # a miss is not cached, so a volume made a moment later is found.
        e = pyfuse3.EntryAttributes()
        e.st_ino = 0
        e.entry_timeout = 0
        return e

    # ------------------------------------------------------------ requests

    @_routed
    async def lookup(self, parent_inode, name, ctx):
        if parent_inode == ROOT:
            volume = self.shard.open_volume(name)
            if volume is None:
                return self._negative()
            await self._gate(volume)
            return self._entry(volume, volume.ops.root_entry())
        volume, local = self._volume(parent_inode)
        await self._gate(volume)
        return self._entry(volume, await volume.ops.lookup(local, name, ctx))

    async def forget(self, inode_list):
        # Must not raise: it answers no request.
        by_volume: dict[int, tuple[Any, list]] = {}
        for kernel_no, n in inode_list:
            if kernel_no == ROOT:
                continue
            try:
                volume, local = self._volume(kernel_no)
            except pyfuse3.FUSEError:
                continue  # a volume that went: nothing left to forget
            if kernel_no >= DYNAMIC_BASE:
                self.numbers.drop(kernel_no, n)
            by_volume.setdefault(id(volume), (volume, []))[1].append((local, n))
        for volume, items in by_volume.values():
            try:
                await volume.ops.forget(items)
            except Exception:
                log.exception("forget_failed", volume=volume.name)
            self.shard.forgotten(volume)

    @_routed
    async def getattr(self, inode, ctx):
        if inode == ROOT:
            return self._root_entry()
        volume, local = self._volume(inode)
        await self._gate(volume)
        return self._entry(volume, await volume.ops.getattr(local, ctx), counted=False)

    @_routed
    async def setattr(self, inode, attr, fields, fh, ctx):
        volume, local = self._not_root(inode)
        await self._gate(volume)
        if fh is not None:
            _, fh = self._fh_in(fh)
        return self._entry(volume, await volume.ops.setattr(local, attr, fields, fh, ctx),
                           counted=False)

    @_routed
    async def readlink(self, inode, ctx):
        volume, local = self._not_root(inode, errno.EINVAL)
        await self._gate(volume)
        return await volume.ops.readlink(local, ctx)

    @_routed
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        volume, local = self._not_root(parent_inode)
        await self._gate(volume)
        return self._entry(volume, await volume.ops.mknod(local, name, mode, rdev, ctx))

    @_routed
    async def mkdir(self, parent_inode, name, mode, ctx):
        volume, local = self._not_root(parent_inode)
        await self._gate(volume)
        return self._entry(volume, await volume.ops.mkdir(local, name, mode, ctx))

    @_routed
    async def symlink(self, parent_inode, name, target, ctx):
        volume, local = self._not_root(parent_inode)
        await self._gate(volume)
        return self._entry(volume, await volume.ops.symlink(local, name, target, ctx))

    @_routed
    async def unlink(self, parent_inode, name, ctx):
        volume, local = self._not_root(parent_inode)
        await self._gate(volume)
        await volume.ops.unlink(local, name, ctx)

    @_routed
    async def rmdir(self, parent_inode, name, ctx):
        volume, local = self._not_root(parent_inode)
        await self._gate(volume)
        await volume.ops.rmdir(local, name, ctx)

    @_routed
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        old, old_local = self._not_root(parent_inode_old)
        new, new_local = self._not_root(parent_inode_new)
        if old is not new:
            raise pyfuse3.FUSEError(errno.EXDEV)
        await self._gate(old)
        await old.ops.rename(old_local, name_old, new_local, name_new, flags, ctx)

    @_routed
    async def link(self, inode, new_parent_inode, new_name, ctx):
        volume, local = self._not_root(inode)
        target, parent_local = self._not_root(new_parent_inode)
        if target is not volume:
            raise pyfuse3.FUSEError(errno.EXDEV)
        await self._gate(volume)
        return self._entry(volume, await volume.ops.link(local, parent_local, new_name, ctx))

    @_routed
    async def open(self, inode, flags, ctx):
        volume, local = self._not_root(inode, errno.EISDIR)
        await self._gate(volume)
        info = await volume.ops.open(local, flags, ctx)
        info.fh = self._fh_out(volume, info.fh)
        return info

    @_routed
    async def create(self, parent_inode, name, mode, flags, ctx):
        volume, local = self._not_root(parent_inode)
        await self._gate(volume)
        info, entry = await volume.ops.create(local, name, mode, flags, ctx)
        info.fh = self._fh_out(volume, info.fh)
        return info, self._entry(volume, entry)

    @_routed
    async def read(self, fh, off, size):
        volume, local_fh = self._fh_in(fh)
        await self._gate(volume)
        return await volume.ops.read(local_fh, off, size)

    @_routed
    async def write(self, fh, off, buf):
        volume, local_fh = self._fh_in(fh)
        await self._gate(volume)
        return await volume.ops.write(local_fh, off, buf)

    @_routed
    async def flush(self, fh):
        volume, local_fh = self._fh_in(fh)
        await self._gate(volume)
        return await volume.ops.flush(local_fh)

    @_routed
    async def fsync(self, fh, datasync):
        volume, local_fh = self._fh_in(fh)
        await self._gate(volume)
        return await volume.ops.fsync(local_fh, datasync)

    @_routed
    async def release(self, fh):
        volume, local_fh = self._fh_in(fh)
        try:
            await self._gate(volume)
            await volume.ops.release(local_fh)
        finally:
            self.handles.pop(fh, None)
            self.shard.forgotten(volume)

    @_routed
    async def opendir(self, inode, ctx):
        if inode == ROOT:
            return ROOT
        volume, local = self._volume(inode)
        await self._gate(volume)
        return self._fh_out(volume, await volume.ops.opendir(local, ctx))

    @_routed
    async def readdir(self, fh, start_id, token):
        if fh == ROOT:
            self._readdir_root(start_id, token)
            return
        volume, local_fh = self._fh_in(fh)
        await self._gate(volume)
        await volume.ops.readdir(local_fh, start_id, token)

    def _readdir_root(self, start_id: int, token) -> None:
        """`.`, `..`, then every volume, in name order (offset: position + 1).
        A listed volume is served from then on: the kernel holds its root."""
        names = [b".", b".."] + self.shard.volume_names()
        for i in range(start_id, len(names)):
            name = names[i]
            if i < 2:
                e = self._root_entry()
                if not pyfuse3.readdir_reply(token, name, e, i + 1):
                    return
                continue
            volume = self.shard.open_volume(name)
            if volume is None:
                continue  # dropped since the listing was read
            entry = volume.ops.root_entry()
            volume.kernel.entry_out(entry, counted=True)
            if not pyfuse3.readdir_reply(token, name, entry, i + 1):
                volume.ops.lookups[volume.ops.root] -= 1  # not taken
                return

    @_routed
    async def releasedir(self, fh):
        if fh == ROOT:
            return
        volume, local_fh = self._fh_in(fh)
        try:
            await volume.ops.releasedir(local_fh)
        finally:
            self.handles.pop(fh, None)

    @_routed
    async def fsyncdir(self, fh, datasync):
        if fh == ROOT:
            return
        volume, local_fh = self._fh_in(fh)
        await self._gate(volume)
        await volume.ops.fsyncdir(local_fh, datasync)

    @_routed
    async def statfs(self, ctx):
        st = os.statvfs(self.shard.store_dir)
        s = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail"):
            setattr(s, name, getattr(st, name))
        s.f_namemax = 255
        return s

    @_routed
    async def getxattr(self, inode, name, ctx):
        volume, local = self._not_root(inode, pyfuse3.ENOATTR)
        await self._gate(volume)
        return await volume.ops.getxattr(local, name, ctx)

    @_routed
    async def setxattr(self, inode, name, value, ctx):
        volume, local = self._not_root(inode)
        await self._gate(volume)
        await volume.ops.setxattr(local, name, value, ctx)

    @_routed
    async def listxattr(self, inode, ctx):
        if inode == ROOT:
            return []
        volume, local = self._volume(inode)
        await self._gate(volume)
        return await volume.ops.listxattr(local, ctx)

    @_routed
    async def removexattr(self, inode, name, ctx):
        volume, local = self._not_root(inode)
        await self._gate(volume)
        await volume.ops.removexattr(local, name, ctx)

