#!/usr/bin/env python3
"""The floor: a whole POSIX tree in Python dicts, on pyfuse3, doing nothing else.

    python bench/floorfs.py MOUNTPOINT COUNTS_FILE

What no pyfuse3 daemon gets below on this machine: every request reaches
Python and trio, and the handler only touches a dict. It answers the kernel
the way vfsd does, so the kernel sends both the same requests for the same
program: writeback cache, entry and attribute timeouts of an hour (a second
for the attributes of an open file), cached negative lookups, keep_cache,
FLUSH and getxattr answered ENOSYS (the kernel then stops sending them),
READDIRPLUS entries. Files, directories, symlinks, hard links, renames,
truncates, modes, owners and times work, so tar, cp, rsync, du and find run
on it unchanged.

The requests received, by handler name, are written to COUNTS_FILE as JSON
on SIGUSR1 (the bench reads them between workloads) and at unmount.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import sys
import time

import pyfuse3
import trio

ENTRY_TIMEOUT = 3600.0
OPEN_ATTR_TIMEOUT = 1.0  # as vfsd: the size of an open file changes under the kernel


class Node:
    """One inode: attributes, and content (bytes), children (dict) or a target."""

    __slots__ = ("ino", "mode", "uid", "gid", "rdev", "nlink", "atime", "mtime", "ctime",
                 "data", "children", "target", "opens", "lookups")

    def __init__(self, ino: int, mode: int, uid: int, gid: int, rdev: int = 0) -> None:
        now = time.time_ns()
        self.ino, self.mode, self.uid, self.gid, self.rdev = ino, mode, uid, gid, rdev
        self.nlink = 2 if stat.S_ISDIR(mode) else 1
        self.atime = self.mtime = self.ctime = now
        self.data = bytearray()
        self.children: dict[bytes, tuple[int, int]] | None = {} if stat.S_ISDIR(mode) else None
        self.target = b""
        self.opens = 0
        self.lookups = 0


class FloorFS(pyfuse3.Operations):
    enable_writeback_cache = True
    supports_dot_lookup = False

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[int, Node] = {}
        root = Node(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755, os.getuid(), os.getgid())
        self.nodes[root.ino] = root
        self.next_ino = root.ino + 1
        self.next_cookie = 1
        self.counts: dict[str, int] = {}

    # ------------------------------------------------------------ helpers

    def _count(self, op: str) -> None:
        self.counts[op] = self.counts.get(op, 0) + 1

    def _node(self, ino: int) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _entry(self, n: Node) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = n.ino
        e.generation = 1
        e.entry_timeout = ENTRY_TIMEOUT
        e.attr_timeout = OPEN_ATTR_TIMEOUT if n.opens else ENTRY_TIMEOUT
        e.st_mode, e.st_nlink, e.st_uid, e.st_gid, e.st_rdev = n.mode, n.nlink, n.uid, n.gid, n.rdev
        e.st_size = len(n.target) if stat.S_ISLNK(n.mode) else len(n.data)
        e.st_blksize = 128 * 1024
        e.st_blocks = -(-e.st_size // 512)
        e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = n.atime, n.mtime, n.ctime
        return e

    def _remember(self, n: Node) -> pyfuse3.EntryAttributes:
        n.lookups += 1
        return self._entry(n)

    def _maybe_free(self, n: Node) -> None:
        if n.nlink == 0 and n.lookups <= 0 and n.opens == 0:
            del self.nodes[n.ino]

    def _add(self, parent: int, name: bytes, mode: int, ctx, rdev: int = 0) -> Node:
        p = self._node(parent)
        if name in p.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        n = Node(self.next_ino, mode, ctx.uid, ctx.gid, rdev)
        self.next_ino += 1
        self.nodes[n.ino] = n
        self._link_in(p, name, n)
        if stat.S_ISDIR(mode):
            p.nlink += 1
        return n

    def _link_in(self, p: Node, name: bytes, n: Node) -> None:
        p.children[name] = (self.next_cookie, n.ino)
        self.next_cookie += 1
        p.mtime = p.ctime = time.time_ns()

    def _unlink_from(self, p: Node, name: bytes) -> Node:
        _cookie, ino = p.children.pop(name)
        p.mtime = p.ctime = time.time_ns()
        n = self.nodes[ino]
        n.nlink -= 2 if stat.S_ISDIR(n.mode) else 1
        n.ctime = p.ctime
        if stat.S_ISDIR(n.mode):
            p.nlink -= 1
        return n

    # ---------------------------------------------------------- namespace

    async def lookup(self, parent_inode, name, ctx):
        self._count("lookup")
        got = self._node(parent_inode).children.get(name)
        if got is None:
            miss = pyfuse3.EntryAttributes()
            miss.st_ino = 0
            miss.entry_timeout = ENTRY_TIMEOUT
            return miss
        return self._remember(self.nodes[got[1]])

    async def forget(self, inode_list):
        self._count("forget")
        for ino, count in inode_list:
            n = self.nodes.get(ino)
            if n is not None:
                n.lookups -= count
                self._maybe_free(n)

    async def getattr(self, inode, ctx):
        self._count("getattr")
        return self._entry(self._node(inode))

    async def setattr(self, inode, attr, fields, fh, ctx):
        self._count("setattr")
        n = self._node(inode)
        if fields.update_size:
            size = attr.st_size
            del n.data[size:]
            n.data.extend(bytes(size - len(n.data)))
        if fields.update_mode:
            n.mode = (n.mode & ~0o7777) | (attr.st_mode & 0o7777)
        if fields.update_uid:
            n.uid = attr.st_uid
        if fields.update_gid:
            n.gid = attr.st_gid
        if fields.update_atime:
            n.atime = attr.st_atime_ns
        if fields.update_mtime:
            n.mtime = attr.st_mtime_ns
        n.ctime = attr.st_ctime_ns if fields.update_ctime else time.time_ns()
        return self._entry(n)

    async def readlink(self, inode, ctx):
        self._count("readlink")
        return self._node(inode).target

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        self._count("mknod")
        return self._remember(self._add(parent_inode, name, mode, ctx, rdev))

    async def mkdir(self, parent_inode, name, mode, ctx):
        self._count("mkdir")
        return self._remember(self._add(parent_inode, name, stat.S_IFDIR | (mode & 0o7777), ctx))

    async def symlink(self, parent_inode, name, target, ctx):
        self._count("symlink")
        n = self._add(parent_inode, name, stat.S_IFLNK | 0o777, ctx)
        n.target = target
        return self._remember(n)

    async def unlink(self, parent_inode, name, ctx):
        self._count("unlink")
        p = self._node(parent_inode)
        if name not in p.children:
            raise pyfuse3.FUSEError(errno.ENOENT)
        self._maybe_free(self._unlink_from(p, name))

    async def rmdir(self, parent_inode, name, ctx):
        self._count("rmdir")
        p = self._node(parent_inode)
        got = p.children.get(name)
        if got is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if self.nodes[got[1]].children:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        self._maybe_free(self._unlink_from(p, name))

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._count("rename")
        if flags & ~pyfuse3.RENAME_NOREPLACE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old, new = self._node(parent_inode_old), self._node(parent_inode_new)
        got = old.children.get(name_old)
        if got is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        moving = self.nodes[got[1]]
        if name_new in new.children:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise pyfuse3.FUSEError(errno.EEXIST)
            self._maybe_free(self._unlink_from(new, name_new))
        old.children.pop(name_old)
        old.mtime = old.ctime = time.time_ns()
        if stat.S_ISDIR(moving.mode) and old is not new:
            old.nlink -= 1
            new.nlink += 1
        self._link_in(new, name_new, moving)
        moving.ctime = new.ctime

    async def link(self, inode, new_parent_inode, new_name, ctx):
        self._count("link")
        n, p = self._node(inode), self._node(new_parent_inode)
        if new_name in p.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        n.nlink += 1
        n.ctime = time.time_ns()
        self._link_in(p, new_name, n)
        return self._remember(n)

    # -------------------------------------------------------------- files

    async def open(self, inode, flags, ctx):
        self._count("open")
        n = self._node(inode)
        if flags & os.O_TRUNC:
            n.data.clear()
        n.opens += 1
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def create(self, parent_inode, name, mode, flags, ctx):
        self._count("create")
        n = self._add(parent_inode, name, stat.S_IFREG | (mode & 0o7777), ctx)
        n.opens += 1
        return pyfuse3.FileInfo(fh=n.ino, keep_cache=True), self._remember(n)

    async def read(self, fh, off, size):
        self._count("read")
        return bytes(self.nodes[fh].data[off:off + size])

    async def write(self, fh, off, buf):
        self._count("write")
        data = self.nodes[fh].data
        if off > len(data):
            data.extend(bytes(off - len(data)))
        data[off:off + len(buf)] = buf
        return len(buf)

    async def flush(self, fh):
        self._count("flush")
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def fsync(self, fh, datasync):
        self._count("fsync")

    async def release(self, fh):
        self._count("release")
        n = self.nodes[fh]
        n.opens -= 1
        self._maybe_free(n)

    # -------------------------------------------------------- directories

    async def opendir(self, inode, ctx):
        self._count("opendir")
        if self._node(inode).children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        self._count("readdir")
        for name, (cookie, ino) in list(self._node(fh).children.items()):
            if cookie <= start_id:
                continue
            n = self.nodes[ino]
            if not pyfuse3.readdir_reply(token, name, self._entry(n), cookie):
                return
            n.lookups += 1  # READDIRPLUS: an entry the kernel took, it will forget

    async def releasedir(self, fh):
        self._count("releasedir")

    async def fsyncdir(self, fh, datasync):
        self._count("fsyncdir")

    async def statfs(self, ctx):
        self._count("statfs")
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = s.f_bfree = s.f_bavail = 1 << 24
        s.f_files = s.f_ffree = s.f_favail = 1 << 24
        s.f_namemax = 255
        return s

    # ------------------------------------------------------------- xattrs

    async def getxattr(self, inode, name, ctx):
        self._count("getxattr")
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def listxattr(self, inode, ctx):
        self._count("listxattr")
        return []

    async def setxattr(self, inode, name, value, ctx):
        self._count("setxattr")
        raise pyfuse3.FUSEError(errno.ENOTSUP)


def main(mountpoint: str, counts_file: str) -> None:
    fs = FloorFS()

    def dump() -> None:
        tmp = counts_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(fs.counts, f)
        os.replace(tmp, counts_file)

    async def on_signal() -> None:
        with trio.open_signal_receiver(signal.SIGUSR1) as signals:
            async for _ in signals:
                dump()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    pyfuse3.init(fs, mountpoint, {"fsname=floorfs", "default_permissions"})
    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
        dump()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
