"""FUSE request handlers (pyfuse3 Operations).

Handlers translate between FUSE and the storage API: they never see LMDB keys.
Every handler goes through `_guard`, so only `FUSEError` ever reaches pyfuse3
(anything else would end `pyfuse3.main` and leave a dead mount). Storage calls
are synchronous; the only awaits are for fsync work in a worker thread, and no
handler awaits between two storage calls that must be atomic together.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import stat
from collections.abc import Callable

import pyfuse3
import structlog
import trio

from vfsd import errors
from vfsd.steps import make_way
from vfsd.store import filehash
from vfsd.store.groupcommit import in_request
from vfsd.store.inode import NO_CALL, STATUS_BY_NAME, STATUS_NAMES, Inode
from vfsd.store.invariants import MAX_FILE_SIZE  # 16 TiB: past it, EFBIG
from vfsd.store.store import Store, now_ns

from . import ctldir, evictedview, snapview
from .diskspace import DISK_RESERVE, DiskSpace
from .journal import StepJournal
from .kernel import Kernel
from .openfiles import OpenFiles, hash_hot_blocks
from .provenance import Provenance
from .tracer import Tracer

#: `.` and `..`, the first two entries of every directory listing
DOT_ENTRIES = 2

log = structlog.get_logger("vfsd.fs")

XATTR_PREFIX = b"user.vfsd."
XATTR_RW = (b"user.vfsd.step", b"user.vfsd.status", b"user.vfsd.pin")
XATTR_RO = (b"user.vfsd.hash", b"user.vfsd.tier")
#: write-only: the tool call about to write the file (a JSON object, see `provenance`)
XATTR_CALL = b"user.vfsd.call"
#: a directory that is a unit for eviction ("1") or not one ("0"), see `vfsd.evictscope`
XATTR_UNIT = b"user.vfsd.unit"
#: set on the root: a sandbox uses this mount, serve its mount points (ctldir)
XATTR_SANDBOX = b"user.vfsd.sandbox"
#: what mknod may create (directories and symlinks have their own requests)
_MKNOD_TYPES = frozenset({stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK})


def _parse_step(value: bytes) -> int:
    """A `user.vfsd.step` value: ASCII decimal digits only (int() would also
    take "1_000", "+5" and other scripts' digits such as "١٢"), below 2^63."""
    text = value.strip(b" \t\r\n")
    if not 0 < len(text) <= 19 or not text.isdigit():  # bytes.isdigit: ASCII only
        raise pyfuse3.FUSEError(errno.EINVAL)
    step = int(text)
    if step >= 1 << 63:
        raise pyfuse3.FUSEError(errno.EINVAL)
    return step


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    # A quota's refusal is the evictor's to log and count, not the disk's.
    return isinstance(exc, errors.NoSpace) and not isinstance(exc, errors.QuotaExceeded)


#: Inode fields a times-only SETATTR changes.
_TIMES = frozenset({"atime_ns", "mtime_ns", "ctime_ns"})

#: Operations that free space: with the disk full, worth releasing the reserve.
_FREEING_OPS = frozenset({"unlink", "rmdir", "rename", "setattr", "removexattr"})


def _guard(fn: Callable) -> Callable:
    """Map storage errors to errnos and anything unexpected to EIO (logged).

    While someone looks (`tracer`), the request is timed and maybe logged; the
    check is the only cost otherwise.
    """

    op = fn.__name__

    async def guarded(self, *args):
        for attempt in (0, 1):
            try:
                return await fn(self, *args)
            except pyfuse3.FUSEError:
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to an errno or EIO
                self._failed(op, exc, attempt)
        raise AssertionError("unreachable")

    @functools.wraps(fn)
    async def wrapper(self, *args):
        requests = self.counters.requests
        requests[op] = requests.get(op, 0) + 1
        # This task's write transactions may join the group commit (`groupcommit`).
        grouped = in_request.set(True)
        try:
            if self.tracer.on:
                return await self.tracer.timed(self, op, guarded, args)
            for attempt in (0, 1):
                try:
                    return await fn(self, *args)
                except pyfuse3.FUSEError:
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to an errno or EIO
                    self._failed(op, exc, attempt)
            raise AssertionError("unreachable")
        finally:
            in_request.reset(grouped)

    return wrapper


def _failed(self, op: str, exc: Exception, attempt: int) -> None:
    """Raise the FUSEError for a handler's failure, or return to retry it once
    (disk full on an operation that frees space, after releasing the reserve)."""
    if isinstance(exc, errors.StoreError) and not _disk_full(exc):
        if isinstance(exc, errors.Unavailable):
            pass  # the remote tier logged it; a reader gets EIO
        elif isinstance(exc, errors.Corrupt):
            log.error("store_damaged", op=op, error=str(exc))
        elif exc.errno == errno.EIO:
            log.error("store_error", op=op, error=str(exc))
        raise pyfuse3.FUSEError(exc.errno) from None
    if not _disk_full(exc):
        log.exception("handler_failed", op=op)
        raise pyfuse3.FUSEError(errno.EIO) from None
    # The failed transaction changed nothing, so a retry is safe.
    if attempt == 0 and op in _FREEING_OPS and self.store.release_reserve():
        log.warning("store_disk_full_reserve_released", op=op)
        return
    log.warning("store_disk_full", op=op, error=str(exc))
    self.disk.refused()
    raise pyfuse3.FUSEError(errno.ENOSPC) from None


class Counters:
    """Live operation counters shown by `vfsd status`.

    `requests` counts FUSE requests by handler name (a dict increment per
    request), so a benchmark can say how many round trips an operation cost.
    """

    __slots__ = ("bytes_read", "bytes_written", "reads", "writes", "lookups",
                 "creates", "unlinks", "requests")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)
        self.requests: dict[str, int] = {}

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__ if name != "requests"}


def _pid(ctx) -> int:
    """The requesting process (0 when there is no request context: the
    daemon's own calls and the unit tests that drive operations directly)."""
    return ctx.pid if ctx is not None else 0


class VfsdOperations(pyfuse3.Operations):
    """The vfsd filesystem."""

    enable_writeback_cache = True
    supports_dot_lookup = False
    #: room kept free on the store's disk for LMDB pages and chunk metadata
    DISK_RESERVE = DISK_RESERVE
    #: attribute cache time for files open at the moment of the reply (seconds)
    OPEN_ATTR_TIMEOUT = 1.0
    _failed = _failed

    def __init__(self, store: Store, openfiles: OpenFiles, *, entry_timeout: float = 3600.0,
                 durability: str = "fsync", quota=None, xattr_reads: bool = False) -> None:
        super().__init__()
        # False: getxattr answers ENOSYS, so the kernel stops sending it for
        # good, including the security.capability query it makes before every
        # write() under the writeback cache (libfuse 3.14 cannot negotiate the
        # flag that would mark the superblock SB_NOSEC). Attributes are read
        # through `.vfsd/attr/PATH` instead; setxattr and listxattr still work.
        self.xattr_reads = xattr_reads
        self.store = store
        self.files = openfiles
        openfiles.on_closed = self._closed
        self.root = store.root_ino
        # Where notifications and READDIRPLUS entries go (see `kernel`): a
        # shard's mount translates this volume's inode numbers.
        self.kernel = Kernel()
        # (vol, ino) -> whether a hot file is still in use: the daemon's view
        # over every volume it serves (a sync frees files of any of them).
        self.in_use = lambda vol, ino: vol == store.vol and ino in openfiles.files
        # The sandbox's mount points are served once a sandbox claims them.
        self.sandbox_points = False
        self.entry_timeout = entry_timeout
        self.durability = durability
        self.lookups: dict[int, int] = {}
        #: nameless inodes nobody has open that wait for the kernel's FORGET
        self._awaiting_forget: set[int] = set()
        self.counters = Counters()
        self.tracer = Tracer()
        # Which tool call each request comes from (see `provenance`).
        self.provenance = Provenance(store)
        self.tracer.call_name = self.provenance.name_of_pid
        # The running step's record for the timeline (see `journal`).
        self.journal = StepJournal(store)
        # Called before a write grows a file (bytes, ino) and before a file is
        # created; they evict to make room or raise NoSpace. Set by the daemon.
        self.quota = quota
        self.reserve_file = None
        # () -> (quota bytes or None, bytes used, max files or None), for statfs.
        self.limits = None
        # () -> [(parent, name, ino)] that eviction removed and the kernel may cache.
        self.evicted_names = None
        # Called with an inode number when a file's last handle goes (eviction
        # reconsiders the files it deferred because they were open).
        self.on_last_close = None
        # Called with an inode number on every open of a regular file (its
        # age for eviction counts from its last use).
        self.on_open = None
        # Inode -> the last step it was written or opened, opens not yet stored included.
        self.used_step = None
        # Room on the store's disk: writes refused up front, refusals counted.
        self.disk = DiskSpace(store.dir)
        self._loading: dict[bytes, trio.Event] = {}  # chunk loads in flight
        # `.vfsd/` answers lookups by name but is left out of readdir of the
        # root, so `ls`, `find` and `grep -r` over the mount never trip on it.
        self.ctl = ctldir.ControlDir()
        # `.vfsd/snapshots/`: retained snapshots, read-only (set by the daemon).
        self.snapview: snapview.SnapshotView | None = None
        # `.vfsd/evicted/`: why an evicted path is gone (set by the daemon).
        self.evicted: evictedview.EvictedIndex | None = None
        self.evictedview: evictedview.EvictedView | None = None
        # The remote tier (`remotetier.RemoteTier`), set by the daemon for a
        # remote store: chunks missing locally are fetched through it, and it
        # says whether this worker may write (EROFS once another holds the run).
        self.remote = None
        # Attribute invalidations go through a worker thread (see run_invalidator):
        # the kernel call may block, and a handler must never block the loop.
        self._inval_send, self._inval_recv = trio.open_memory_channel(math.inf)

    # ------------------------------------------------------------- helpers

    def _ino(self, fuse_ino: int) -> int:
        """Store inode number for a FUSE one (the same number; the root is 1).

        The virtual `.vfsd/` inodes are refused here: every handler that does
        not serve them explicitly treats them as read-only.
        """
        if fuse_ino >= ctldir.BASE:
            raise pyfuse3.FUSEError(errno.EROFS)
        return fuse_ino

    @staticmethod
    def _fuse_ino(ino: int) -> int:
        return ino

    def _new_name(self, parent: int, name: bytes) -> None:
        """Refuse to make a real entry under a name the root serves itself."""
        self._check_writable()
        if parent == self.root and self._served_at_root(name):
            raise pyfuse3.FUSEError(errno.EEXIST)

    def _served_at_root(self, name: bytes) -> bool:
        """`.vfsd`, and the sandbox's mount points once a sandbox claimed them."""
        return name in ctldir.RESERVED or (self.sandbox_points and name in ctldir.SANDBOX_DIRS)

    def _check_writable(self) -> None:
        """EROFS once this worker lost its run to another (remote tier)."""
        if self.remote is not None and not self.remote.writable():
            raise pyfuse3.FUSEError(errno.EROFS)

    def _reserved_missing(self, parent: int, name: bytes) -> pyfuse3.FUSEError:
        """The error for removing or renaming a reserved root name the store lacks.

        The entry is visible (a virtual directory), so "no such file" would
        puzzle; it simply cannot be removed.
        """
        if parent == self.root and self._served_at_root(name):
            return pyfuse3.FUSEError(errno.EPERM)
        return pyfuse3.FUSEError(errno.ENOENT)

    def _mirror_lookup(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        """Lookup below `.vfsd/attr/`: directories and regular files of the tree."""
        try:
            inode = self.store.lookup(parent, name)
        except errors.NotFound:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        if not (inode.is_dir or inode.is_reg):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._ctl_entry(ctldir.mirror_of(inode.ino), self._attrs(inode.ino))

    async def attr_document(self, ino: int) -> dict:
        """The vfsd attributes of a regular file, as `.vfsd/attr/PATH` shows them."""
        rec, digest = await self.content_ref(ino)
        of = self.files.get(ino)
        inline = rec.size <= self.files.inline_max if of else rec.inline
        xattrs = {name.decode(errors="backslashreplace"):
                  (self.store.get_xattr(ino, name) or b"").decode(errors="backslashreplace")
                  for name in self.store.list_xattrs(ino)}
        used = self.used_step(rec) if self.used_step is not None else rec.use_step
        return {"path": self.store.path_of(ino), "ino": ino, "gen": rec.gen, "size": rec.size,
                "step": rec.step, "written_step": rec.step, "used_step": used,
                "status": STATUS_NAMES[rec.status], "pin": rec.pinned,
                "hash": digest.hex(),
                "tier": "inline" if inline else "chunked", "mtime_ns": rec.mtime_ns,
                "made_by": self.provenance.describe(rec.made_by),
                "changed_by": self.provenance.describe(rec.changed_by),
                "xattrs": xattrs}

    def _ctl_entry(self, ino: int, mirrored: Inode | None = None) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = ino
        e.entry_timeout = self.entry_timeout
        e.attr_timeout = 0  # content (and so size) changes all the time
        root = self.store.get_inode(self.root)
        e.st_uid, e.st_gid = root.uid, root.gid
        e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = now_ns()
        e.st_blksize = 4096
        if ino in ctldir.SANDBOX_INOS:
            # Never changes: the sandbox stats these on every run, let the kernel keep them.
            e.attr_timeout = self.entry_timeout
            e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = root.ctime_ns
            e.st_mode, e.st_nlink = ctldir.SANDBOX_DIR_MODE, 2
        elif ctldir.is_mirror(ino):
            # Names below `.vfsd/attr/` follow the real tree, which the kernel
            # does not know they depend on: never cached.
            e.entry_timeout = 0
            if mirrored is None:
                mirrored = self._attrs(ctldir.mirrored(ino))
            e.st_uid, e.st_gid = mirrored.uid, mirrored.gid
            e.st_mtime_ns = e.st_ctime_ns = mirrored.ctime_ns
            # Listed, searched and read on the terms of what it mirrors: with
            # --allow-other, a private directory's names and a private file's
            # hash and xattrs stay private here too.
            if mirrored.is_dir:
                e.st_mode, e.st_nlink = stat.S_IFDIR | (mirrored.mode & 0o555), 2
            else:
                # Rendered when opened (direct I/O, like /proc): size unknown.
                e.st_mode, e.st_nlink = stat.S_IFREG | (mirrored.mode & 0o444), 1
        elif ino == ctldir.DIR_INO:
            e.st_mode, e.st_nlink = ctldir.DIR_MODE, 2
        else:
            e.st_mode, e.st_nlink = ctldir.FILE_MODE, 1
            # Size 0, as for /proc files: under the writeback cache the kernel
            # keeps the first size it hears of a regular file for good, and
            # these files change all the time. Reads go past it (direct_io),
            # and tools read to the end when a file says 0.
        return e

    def _entry(self, inode: Inode) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = self._fuse_ino(inode.ino)
        e.generation = inode.gen
        e.entry_timeout = self.entry_timeout
        # The kernel keeps size and times of files itself (writeback cache),
        # but not st_blocks: while a file is open its attributes are only
        # trusted for a second, so `du` and `stat` catch up soon after close.
        of = self.files.files.get(inode.ino)
        e.attr_timeout = self.OPEN_ATTR_TIMEOUT if of is not None else self.entry_timeout
        e.st_mode = inode.mode
        e.st_nlink = inode.nlink
        e.st_uid = inode.uid
        e.st_gid = inode.gid
        e.st_rdev = inode.rdev
        e.st_size = inode.size
        e.st_blksize = 128 * 1024
        nblocks = len(of.blocks.keys() | of.dirty.keys()) if of else inode.nblocks
        e.st_blocks = -(-min(nblocks * self.files.cs, inode.size) // 512)
        e.st_atime_ns = inode.atime_ns
        e.st_mtime_ns = inode.mtime_ns
        e.st_ctime_ns = inode.ctime_ns
        return e

    def _attrs(self, ino: int) -> Inode:
        return self.files.attrs(ino)

    def root_entry(self) -> pyfuse3.EntryAttributes:
        """The root's entry, taken as a lookup: a shard's mount shows a
        volume's root as a directory of its own root."""
        return self._remember(self._attrs(self.root))

    def _remember(self, inode: Inode) -> pyfuse3.EntryAttributes:
        """Entry reply that the kernel will hold a reference to."""
        self.lookups[inode.ino] = self.lookups.get(inode.ino, 0) + 1
        return self._entry(inode)

    def _closed(self, inode) -> None:
        """An inode's last handle went (a reader's, the settler's): free it if
        it has no name and the kernel forgot it."""
        if inode.nlink == 0:
            self._maybe_free(inode.ino)
        elif self.on_last_close is not None:
            self.on_last_close(inode.ino)

    def _maybe_free(self, *inos: int) -> None:
        """Free inodes with no names, no kernel references and no handles.

        One transaction for the lot; the store itself skips any that still
        have a name.
        """
        unused = []
        for ino in inos:
            if ino in self.files.files:
                continue
            if self.lookups.get(ino, 0) > 0:
                self._awaiting_forget.add(ino)  # nameless, unopened: the kernel's FORGET is due
            else:
                self._awaiting_forget.discard(ino)
                unused.append(ino)
        if unused:
            self.store.free_inodes(unused)

    async def _take_quota(self, grow: int, ino: int) -> None:
        """Make room for `grow` more bytes of `ino` under the quota (evicting
        if need be), or raise QuotaExceeded.

        A file unlinked with nothing open counts until the kernel forgets it.
        Its FORGET is sent as the unlink returns but may still wait for the
        loop: before a change that does not fit evicts or is refused, the loop
        takes such FORGETs in (`rm big; echo small > f` under a full quota)."""
        if self._awaiting_forget and self.limits is not None:
            quota, used, _ = self.limits()
            if quota is not None and used + grow > quota:
                await make_way(0.05)
        self.quota(grow, ino)
        await self._drop_evicted_names()

    def free_in_steps(self, inos: list[int], batch: int = 256):
        """`_maybe_free` over many inodes (a restore's), a transaction per
        batch (a generator, see `vfsd.steps`)."""
        for i in range(0, len(inos), batch):
            self._maybe_free(*inos[i:i + batch])
            yield

    # ----------------------------------------------------------- namespace

    @_guard
    async def lookup(self, parent_inode, name, ctx):
        self.counters.lookups += 1
        if parent_inode == snapview.DIR_INO or snapview.is_snap(parent_inode):
            return self._snapview().lookup(parent_inode, name)
        if ctldir.is_mirror(parent_inode):
            return self._mirror_lookup(ctldir.mirrored(parent_inode), name)
        if evictedview.is_evicted(parent_inode):
            return await self._evictedview().lookup(parent_inode, name)
        if parent_inode == ctldir.DIR_INO:
            if name == evictedview.NAME and self.evictedview is not None:
                return self.evictedview.dir_entry()
            if name in ctldir.FILES:
                return self._ctl_entry(ctldir.FILES[name])
            if name == ctldir.ATTR_NAME:
                return self._ctl_entry(ctldir.mirror_of(self.root))
            if name == snapview.NAME and self.snapview is not None:
                return self.snapview.dir_entry()
            raise pyfuse3.FUSEError(errno.ENOENT)
        if parent_inode in ctldir.SANDBOX_INOS:
            raise pyfuse3.FUSEError(errno.ENOENT)  # always empty
        if parent_inode == pyfuse3.ROOT_INODE and name == ctldir.NAME:
            return self._ctl_entry(ctldir.DIR_INO)
        parent = self._ino(parent_inode)
        try:
            inode = self.store.lookup(parent, name)
        except errors.NotFound:
            if parent == self.root and name in ctldir.SANDBOX_DIRS:
                if self.sandbox_points:
                    return self._ctl_entry(ctldir.SANDBOX_DIRS[name])
                # Not cached: the claim that serves it needs no invalidation.
                miss = pyfuse3.EntryAttributes()
                miss.st_ino = 0
                miss.entry_timeout = 0
                return miss
            # Every name change passes through this mount's kernel, which drops
            # a cached negative entry itself, so "not there" can be cached too:
            # shells probing $PATH and tools probing config files pay once.
            miss = pyfuse3.EntryAttributes()
            miss.st_ino = 0
            miss.entry_timeout = self.entry_timeout
            return miss
        of = self.files.get(inode.ino)
        return self._remember(of.inode if of else inode)

    async def forget(self, inode_list):
        # Must not raise: it answers no request.
        self.counters.requests["forget"] = self.counters.requests.get("forget", 0) + 1
        forgotten = []
        for fuse_ino, n in inode_list:
            if ctldir.is_ctl(fuse_ino):
                continue
            ino = self._fuse_ino(fuse_ino)
            left = self.lookups.get(ino, 0) - n
            if left > 0:
                self.lookups[ino] = left
            else:
                self.lookups.pop(ino, None)
                forgotten.append(ino)
        grouped = in_request.set(True)
        try:
            # The kernel forgets in batches (after eviction, thousands at once).
            self._maybe_free(*forgotten)
        except Exception:
            log.exception("forget_failed", inodes=len(forgotten))
        finally:
            in_request.reset(grouped)

    def _evictedview(self) -> evictedview.EvictedView:
        if self.evictedview is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.evictedview

    async def evicted_index_current(self) -> None:
        """Bring the index of evicted paths up to date, yielding between batches."""
        if self.evicted is not None:
            while not self.evicted.catch_up_batch():
                await trio.sleep(0)

    def _snapview(self) -> snapview.SnapshotView:
        if self.snapview is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.snapview

    @_guard
    async def getattr(self, inode, ctx):
        if inode == snapview.DIR_INO or snapview.is_snap(inode):
            return self._snapview().getattr(inode)
        if evictedview.is_evicted(inode):
            return await self._evictedview().getattr(inode)
        if ctldir.is_ctl(inode):
            return self._ctl_entry(inode)
        return self._entry(self._attrs(self._ino(inode)))

    @_guard
    async def setattr(self, inode, attr, fields, fh, ctx):
        ino = self._ino(inode)
        self._check_writable()
        of = self.files.get(ino)
        if fields.update_size:
            if attr.st_size > MAX_FILE_SIZE or attr.st_size < 0:
                raise pyfuse3.FUSEError(errno.EFBIG)
            temp = of is None
            of = self.files.acquire(ino) if temp else of
            try:
                if not of.inode.is_reg:
                    raise pyfuse3.FUSEError(errno.EINVAL)
                self._note_writer(of, _pid(ctx))
                if self.quota is not None and attr.st_size > of.inode.size:
                    await self._take_quota(attr.st_size - of.inode.size, ino)
                if self.remote is not None:
                    await self._load_for_change(of, attr.st_size, None)
                self.files.truncate(of, attr.st_size)
            finally:
                if temp:
                    self.files.release(of)
                    of = None
        changes = {}
        if fields.update_mode:
            changes["mode"] = attr.st_mode
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        if fields.update_atime:
            changes["atime_ns"] = attr.st_atime_ns
        if fields.update_mtime:
            changes["mtime_ns"] = attr.st_mtime_ns
        if changes or fields.update_ctime:
            changes["ctime_ns"] = attr.st_ctime_ns if fields.update_ctime else now_ns()
            if of is not None and changes.keys() <= _TIMES and of.inode.is_reg:
                # The kernel's own times of a file it writes back (writeback
                # cache): they commit with the file's content, at the latest
                # when it is closed, not in a transaction of their own.
                for name, value in changes.items():
                    setattr(of.inode, name, value)
                of.attr_dirty = True
                return self._entry(of.inode)
            if of is None and changes.keys() <= _TIMES:
                current = self.store.get_inode(ino)
                if current.nlink == 0:
                    # Under the writeback cache the kernel flushes the ctime that
                    # unlink() changed before it forgets the inode, which is then
                    # freed: nothing worth an LMDB transaction (one per unlink).
                    for name, value in changes.items():
                        setattr(current, name, value)
                    return self._entry(current)
            return self._entry(self.set_attrs(ino, **changes))
        return self._entry(self._attrs(ino))

    async def content_ref(self, ino: int) -> tuple[Inode, bytes]:
        """A regular file's attributes and content hash, both of one moment.

        The hashing runs in a worker thread, and for a closed file so does
        reading its block list: a file with millions of stored blocks costs
        the loop nothing. Only an open file's digests are gathered here (its
        buffers and hot blocks live on the loop).
        """
        await self.hash_hot_blocks(ino)
        if self.files.get(ino) is None:
            got = await trio.to_thread.run_sync(self.store.hashed_inode, ino)
            if got is not None and self.files.get(ino) is None:
                return got
        of = self.files.get(ino)
        if of is None:  # closed, with hot blocks the settler has not taken yet
            inode = self.store.get_inode(ino)
            return inode, self.files.content_hash(ino)
        inode, digests = self.files.hash_inputs(of)
        digest = await trio.to_thread.run_sync(filehash.file_hash, inode.size, digests,
                                               self.files.cs)
        return inode, digest

    async def hash_hot_blocks(self, ino: int) -> bool:
        """Hash an open file's hot blocks in a worker thread, so that the file
        hash that follows on the loop reads none (or only those written
        meanwhile): a big database being written can have a GiB of them.
        Returns whether it waited (the tree may have changed meanwhile)."""
        of = self.files.get(ino)
        if of is None or not of.hot:
            return False
        path, plan = self.files.hot_hash_plan(of)
        if not plan:
            return False
        try:
            hashed = await trio.to_thread.run_sync(hash_hot_blocks, self.files.cs, path, plan)
        except OSError:
            return True  # settled and gone meanwhile: the hash reads what is there now
        self.files.adopt_hot_hashes(of, hashed)
        return True

    def set_attrs(self, ino: int, **changes) -> Inode:
        """Change attributes in the store and in the open file, if any; the result.

        Used by setattr, the user.vfsd.* xattrs and control requests alike.
        """
        stored = self.store.set_attrs(ino, **changes)
        of = self.files.get(ino)
        if of is None:
            return stored
        for name in changes:
            setattr(of.inode, name, getattr(stored, name))
        return of.inode

    @_guard
    async def readlink(self, inode, ctx):
        if snapview.is_snap(inode):
            return self._snapview().readlink(inode)
        return self.store.readlink(self._ino(inode))

    @_guard
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        self._new_name(self._ino(parent_inode), name)
        # Device nodes are metadata only: the mount is `nodev`, so the kernel
        # refuses to open them; it also checks CAP_MKNOD before asking us.
        if stat.S_IFMT(mode) not in _MKNOD_TYPES:
            raise pyfuse3.FUSEError(errno.EINVAL)
        self.counters.creates += 1
        if self.reserve_file is not None and stat.S_ISREG(mode):
            self.reserve_file()
            self._queue_evicted_names()
        call = self.provenance.of_pid(_pid(ctx))
        inode = self.store.create(self._ino(parent_inode), name, mode, ctx.uid, ctx.gid, rdev,
                                  call=call)
        if inode.is_reg:
            self.journal.file_created(self._ino(parent_inode), name, call)
        return self._remember(inode)

    @_guard
    async def mkdir(self, parent_inode, name, mode, ctx):
        self._new_name(self._ino(parent_inode), name)
        inode = self.store.create(self._ino(parent_inode), name,
                                  stat.S_IFDIR | (mode & 0o7777), ctx.uid, ctx.gid,
                                  call=self.provenance.of_pid(_pid(ctx)))
        return self._remember(inode)

    @_guard
    async def symlink(self, parent_inode, name, target, ctx):
        self._new_name(self._ino(parent_inode), name)
        inode = self.store.create(self._ino(parent_inode), name, stat.S_IFLNK | 0o777,
                                  ctx.uid, ctx.gid, target=target,
                                  call=self.provenance.of_pid(_pid(ctx)))
        return self._remember(inode)

    @_guard
    async def unlink(self, parent_inode, name, ctx):
        self._check_writable()
        self.counters.unlinks += 1
        parent = self._ino(parent_inode)
        try:
            child = self.store.unlink(parent, name)
        except errors.NotFound:
            raise self._reserved_missing(parent, name) from None
        self.files.names_changed(child)
        if child.nlink == 0:
            if child.is_reg:
                self.journal.file_deleted(parent, name, self.provenance.of_pid(_pid(ctx)))
            self._maybe_free(child.ino)

    @_guard
    async def rmdir(self, parent_inode, name, ctx):
        self._check_writable()
        parent = self._ino(parent_inode)
        try:
            child = self.store.unlink(parent, name, rmdir=True)
        except errors.NotFound:
            raise self._reserved_missing(parent, name) from None
        self._maybe_free(child.ino)

    @_guard
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._new_name(self._ino(parent_inode_new), name_new)
        if flags & ~(pyfuse3.RENAME_EXCHANGE | pyfuse3.RENAME_NOREPLACE):
            raise pyfuse3.FUSEError(errno.EINVAL)
        old_parent = self._ino(parent_inode_old)
        try:
            replaced = self.store.rename(
                old_parent, name_old, self._ino(parent_inode_new), name_new,
                noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE),
                exchange=bool(flags & pyfuse3.RENAME_EXCHANGE))
        except errors.NotFound:
            if not (old_parent == self.root and self._served_at_root(name_old)):
                raise
            raise pyfuse3.FUSEError(errno.EPERM) from None
        if replaced is not None:
            self.files.names_changed(replaced)
            if replaced.nlink == 0:
                if replaced.is_reg:
                    self.journal.file_deleted(self._ino(parent_inode_new), name_new,
                                              self.provenance.of_pid(_pid(ctx)))
                self._maybe_free(replaced.ino)

    @_guard
    async def link(self, inode, new_parent_inode, new_name, ctx):
        self._new_name(self._ino(new_parent_inode), new_name)
        ino = self._ino(inode)
        stored = self.store.link(ino, self._ino(new_parent_inode), new_name)
        self.files.names_changed(stored)
        return self._remember(self.files.attrs(ino))

    # ---------------------------------------------------------------- files

    @_guard
    async def open(self, inode, flags, ctx):
        if snapview.is_snap(inode):
            return self._snapview().open(inode, flags)
        if evictedview.is_evicted(inode):
            return await self._evictedview().open(inode, flags)
        if ctldir.is_ctl(inode):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
                raise pyfuse3.FUSEError(errno.EROFS)
            if ctldir.is_dir(inode):
                raise pyfuse3.FUSEError(errno.EISDIR)
            if ctldir.is_mirror(inode):
                ino = ctldir.mirrored(inode)
                if not self._attrs(ino).is_reg:
                    raise pyfuse3.FUSEError(errno.EISDIR)
                doc = json.dumps(await self.attr_document(ino)).encode() + b"\n"
                return pyfuse3.FileInfo(fh=self.ctl.open_bytes(doc), direct_io=True,
                                        keep_cache=False)
            if inode == ctldir.ACCESSLOG_INO:
                fh = self.ctl.open_bytes(b"")
                try:
                    self.tracer.log.open(fh)
                except pyfuse3.FUSEError:
                    self.ctl.release(fh)
                    raise
                return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
            return pyfuse3.FileInfo(fh=await self.ctl.open(inode), direct_io=True,
                                    keep_cache=False)
        ino = self._ino(inode)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            self._check_writable()
        of = self.files.acquire(ino)
        if not of.inode.is_reg:
            self.files.release(of)
            raise pyfuse3.FUSEError(errno.EINVAL)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            self._note_writer(of, _pid(ctx))
            of.fresh = False
        if flags & os.O_TRUNC and of.inode.size:
            self.files.truncate(of, 0)
        if self.on_open is not None:
            self.on_open(ino)
        # All content changes pass through this mount's page cache, so what
        # the kernel cached is never stale: keep it across opens.
        return pyfuse3.FileInfo(fh=ino, keep_cache=True)

    @_guard
    async def create(self, parent_inode, name, mode, flags, ctx):
        self._new_name(self._ino(parent_inode), name)
        self.counters.creates += 1
        if self.reserve_file is not None:
            self.reserve_file()
            self._queue_evicted_names()
        call = self.provenance.of_pid(_pid(ctx))
        inode = self.store.create(self._ino(parent_inode), name,
                                  stat.S_IFREG | (mode & 0o7777), ctx.uid, ctx.gid, call=call)
        of = self.files.acquire(inode.ino, inode, new=True)
        of.writer = call
        of.fresh = True
        self.journal.file_created(self._ino(parent_inode), name, call)
        return pyfuse3.FileInfo(fh=inode.ino, keep_cache=True), self._remember(inode)

    @_guard
    async def read(self, fh, off, size):
        if fh > snapview.FH_BASE:
            return await self._snapview().read(fh, off, size)
        if fh > ctldir.BASE:
            if fh in self.tracer.log.readers:
                return await self.tracer.log.read(fh, size)
            return self.ctl.read(fh, off, size)
        of = self.files.get(fh)
        if of is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        missing = self.files.uncached_chunks(of, off, size)
        if self.remote is not None:
            self.remote.on_read(of.inode.ino, of.blocks, off, size)
        if missing:
            await self._load_chunks(missing, self.files.next_chunk(of, off, size))
            of = self.files.get(fh)  # released while we waited: nothing to read
            if of is None:
                raise pyfuse3.FUSEError(errno.EBADF)
        data = self.files.read(of, off, size)
        self.counters.reads += 1
        self.counters.bytes_read += len(data)
        return data

    async def _load_chunks(self, digests: list[bytes], prefetch: bytes | None) -> None:
        """Read and verify chunks in worker threads, so the loop keeps serving
        other requests and the kernel's parallel readahead reads in parallel.

        Chunks are immutable, so loading one needs no lock; a read of the same
        chunk that arrives meanwhile waits for the load in flight.
        """
        chunks = self.store.chunks
        for digest in digests:
            pending = self._loading.get(digest)
            if pending is not None:
                await pending.wait()
                continue
            done = self._loading[digest] = trio.Event()
            try:
                if self.remote is not None:
                    data = await self.remote.load_chunk(digest)  # local or fetched, verified
                else:
                    data = await trio.to_thread.run_sync(self._read_chunk, digest, prefetch)
                chunks.insert(digest, data)
            finally:
                del self._loading[digest]
                done.set()

    def _read_chunk(self, digest: bytes, prefetch: bytes | None) -> bytes:
        # In a worker thread: the disk works on the next chunk while this one
        # is hashed and served.
        if prefetch is not None:
            self.store.chunks.prefetch(prefetch)
        return self.store.chunks.read_all(digest)

    async def _load_for_change(self, of, off: int, length: int | None) -> None:
        """Bring into memory the committed chunks a write (or a truncate to `off`,
        `length` None) reads back, when they may be only in the object store."""
        need = self.files.chunks_to_rewrite(of, off, length)
        if need:
            await self._load_chunks(need, None)

    @_guard
    async def write(self, fh, off, buf):
        self._check_writable()
        of = self.files.get(fh)
        if of is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        end = off + len(buf)
        try:
            if end > MAX_FILE_SIZE:
                raise pyfuse3.FUSEError(errno.EFBIG)
            if self.quota is not None and end > of.inode.size:
                await self._take_quota(end - of.inode.size, of.inode.ino)
            await self._check_disk_space(len(buf))
        except (errors.NoSpace, pyfuse3.FUSEError):
            # The kernel already took these bytes into its page cache and grew
            # its own idea of the size (writeback cache), which it never takes
            # back from us while it holds the inode. Drop every name of the
            # file, so the inode goes when the writer closes it and the next
            # look shows what the store holds; and drop the cached pages.
            names = self.store.names_of(fh)
            await trio.to_thread.run_sync(self._drop_names, names)
            await self._drop_evicted_names()
            self._inval_send.send_nowait((fh, False))
            raise
        if self.remote is not None:
            await self._load_for_change(of, off, len(buf))
            of = self.files.get(fh)
            if of is None:
                raise pyfuse3.FUSEError(errno.EBADF)
        n = self.files.write(of, off, buf)
        self.counters.writes += 1
        self.counters.bytes_written += n
        return n

    async def _check_disk_space(self, incoming: int) -> None:
        """ENOSPC now, while the writer can still see it, if buffers could not
        commit (see `diskspace`). Files freed but waiting for a sync to be
        deleted are room too: the sync runs now, in a worker thread."""
        if self.disk.fits(self.files.dirty_bytes + incoming):
            return
        if self.store.durability.awaiting_deletion():
            self.store.flush_group()
            await trio.to_thread.run_sync(self.store.sync)
            self.store.delete_synced(self.files.files.__contains__)
            if self.disk.fits(self.files.dirty_bytes + incoming):
                return
        self.disk.refuse(self.files.dirty_bytes + incoming)
        raise pyfuse3.FUSEError(errno.ENOSPC)

    @_guard
    async def flush(self, fh):
        if self.durability != "sync":
            # The kernel writes a file's dirty pages back before it sends FLUSH,
            # and small files commit as those writes arrive (see write()), so
            # there is nothing left to do at close(). ENOSYS makes the kernel
            # stop sending FLUSH at all: one round trip less per close(), which
            # is a third of the cost of `grep -r` over a warm tree.
            raise pyfuse3.FUSEError(errno.ENOSYS)
        # close() waits for this reply: with durability = "sync" the data is
        # on disk when close() returns.
        of = self.files.get(fh) if fh < ctldir.BASE else None
        # Writes that arrived before FLUSH committed as they came, but with
        # group commit into the open group, which a daemon crash loses: close()
        # must not return before it is committed (and synced).
        if of is not None and (of.is_dirty or self.store.group.txn is not None):
            await self._make_durable(of)

    @_guard
    async def fsync(self, fh, datasync):
        of = self.files.get(fh)
        if of is not None:
            await self._make_durable(of)

    async def _make_durable(self, of) -> None:
        self.files.flush(of)
        digests = list(of.unsynced)
        of.unsynced.clear()
        # fsync is slow and touches only files the loop does not rewrite
        # (chunks, and the hot file through its own descriptor): a worker thread.
        hot = of.inode.ino if of.hot_file else None
        self.store.flush_group()  # here, rather than have the sync ask the loop for it
        await trio.to_thread.run_sync(self._sync_now, digests, hot)
        self.store.delete_synced(self.in_use)

    def _sync_now(self, digests: list[bytes], hot: int | None = None) -> None:
        # One sync fsyncs each file once: these and what the ledger holds.
        self.store.sync(digests, [(self.store.vol, hot)] if hot is not None else ())

    @_guard
    async def release(self, fh):
        if fh > snapview.FH_BASE:
            self._snapview().release(fh)
            return
        if fh > ctldir.BASE:
            self.ctl.release(fh)
            self.tracer.log.release(fh)
            return
        of = self.files.get(fh)
        if of is None:
            return
        if self.durability == "sync" and of.handles == 1 and of.is_dirty:
            await self._make_durable(of)  # written through mmap after the last close()
        ino = of.inode.ino
        try:
            self.files.release(of)  # the last one frees a nameless inode (`_closed`)
        except Exception as exc:
            # close() has returned already: the log is the only place left to say it.
            log.error("commit_failed_data_lost", ino=ino, path=self.store.path_of(ino),
                      error=str(exc))
            raise


    # ---------------------------------------------------------- directories

    @_guard
    async def opendir(self, inode, ctx):
        if inode == snapview.DIR_INO or snapview.is_snap(inode):
            return self._snapview().opendir(inode)
        if evictedview.is_evicted(inode):
            return self._evictedview().opendir(inode)
        if ctldir.is_dir(inode):
            return inode
        if ctldir.is_mirror(inode):
            if not self._attrs(ctldir.mirrored(inode)).is_dir:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            return inode
        ino = self._ino(inode)
        if not self.store.get_inode(ino).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return ino

    def _dot_entry(self, ino: int) -> pyfuse3.EntryAttributes:
        # The kernel takes no lookup for `.` and `..` and ignores their
        # attributes (READDIRPLUS too): the inode number and type are what count.
        e = pyfuse3.EntryAttributes()
        e.st_ino = ino
        e.st_mode = stat.S_IFDIR | 0o755
        return e

    def _parent_for_dots(self, fh: int) -> int:
        """The inode number a directory's `..` entry names (the root's own at the root)."""
        if fh == snapview.DIR_INO:
            return ctldir.DIR_INO
        if snapview.is_snap(fh):
            return self._snapview().parent_of(fh)
        if evictedview.is_evicted(fh):
            return self._evictedview().parent_of(fh)
        if fh == ctldir.DIR_INO or fh in ctldir.SANDBOX_INOS:
            return pyfuse3.ROOT_INODE
        if ctldir.is_mirror(fh):
            below = ctldir.mirrored(fh)
            if below == self.root:
                return ctldir.DIR_INO
            names = self.store.names_of(below)
            return ctldir.mirror_of(names[0][0]) if names else fh
        if fh == self.root:
            return self.kernel.above_root
        names = self.store.names_of(fh)
        return self._fuse_ino(names[0][0]) if names else fh

    @_guard
    async def readdir(self, fh, start_id, token):
        # `.` and `..` first, as ext4 lists them (ls -a, readdir(3) users,
        # programs that count entries); they take cookies 1 and 2, so every
        # other entry's cookie is its own offset plus DOT_ENTRIES.
        if start_id < DOT_ENTRIES:
            dots = ((b".", fh), (b"..", self._parent_for_dots(fh)))
            for cookie, (name, ino) in enumerate(dots, 1):
                if cookie > start_id and not self.kernel.readdir_reply(
                        token, name, self._dot_entry(ino), cookie):
                    return
        start_id = max(0, start_id - DOT_ENTRIES)

        def reply(name, entry, cookie) -> bool:
            return self.kernel.readdir_reply(token, name, entry, cookie + DOT_ENTRIES)

        await self._readdir_after_dots(fh, start_id, reply)

    async def _readdir_after_dots(self, fh, start_id, reply) -> None:
        if fh == snapview.DIR_INO or snapview.is_snap(fh):
            self._snapview().readdir(fh, start_id, reply)
            return
        if evictedview.is_evicted(fh):
            await self._evictedview().readdir(fh, start_id, reply)
            return
        if fh == ctldir.DIR_INO:
            items = [(name, self._ctl_entry(ino)) for name, ino in ctldir.FILES.items()]
            items.append((ctldir.ATTR_NAME, self._ctl_entry(ctldir.mirror_of(self.root))))
            if self.snapview is not None:
                items.append((snapview.NAME, self.snapview.dir_entry()))
            if self.evictedview is not None:
                items.append((evictedview.NAME, self.evictedview.dir_entry()))
            for i, (name, entry) in enumerate(items):
                if i >= start_id and not reply(name, entry, i + 1):
                    return
            return
        if fh in ctldir.SANDBOX_INOS:
            return  # always empty
        if ctldir.is_mirror(fh):
            after = start_id
            while batch := self.store.readdir(ctldir.mirrored(fh), after):
                for cookie, name, inode in batch:
                    after = cookie
                    if not (inode.is_dir or inode.is_reg):
                        continue
                    # The kernel counts lookups of these too; forget ignores them.
                    if not reply(name, self._ctl_entry(ctldir.mirror_of(inode.ino), inode), cookie):
                        return
            return
        after = start_id
        while True:
            batch = self.store.readdir(fh, after)
            if not batch:
                return
            for cookie, name, inode in batch:
                of = self.files.get(inode.ino)
                if not reply(name, self._entry(of.inode if of else inode), cookie):
                    return
                # READDIRPLUS: an entry the kernel took is a lookup it will forget.
                self.lookups[inode.ino] = self.lookups.get(inode.ino, 0) + 1
                after = cookie

    async def releasedir(self, fh):
        pass

    @_guard
    async def fsyncdir(self, fh, datasync):
        # A sync point like any other: removals made durable free their files.
        self.store.flush_group()
        await trio.to_thread.run_sync(self.store.sync)
        self.store.delete_synced(self.in_use)

    @_guard
    async def statfs(self, ctx):
        st = os.statvfs(self.store.dir)
        counters = self.store.counters()
        s = pyfuse3.StatvfsData()
        s.f_bsize = st.f_bsize
        s.f_frsize = st.f_frsize
        s.f_blocks = st.f_blocks
        s.f_bfree = st.f_bfree
        s.f_bavail = st.f_bavail
        s.f_files = counters["files"] + st.f_ffree
        s.f_ffree = st.f_ffree
        s.f_favail = st.f_ffree
        s.f_namemax = 255
        if self.limits is not None:
            # `df` tells the truth: with a quota, the room is what the quota
            # leaves (or the disk, if that is less), so tools can see it coming.
            quota, used, max_files = self.limits()
            if quota is not None:
                total = quota // st.f_frsize
                room = max(quota - used, 0) // st.f_frsize
                s.f_blocks = min(s.f_blocks, total)
                s.f_bfree = min(s.f_bfree, room)
                s.f_bavail = min(s.f_bavail, room)
            if max_files is not None:
                s.f_files = max_files
                s.f_ffree = s.f_favail = max(max_files - counters["files"], 0)
        return s

    # --------------------------------------------------------------- xattrs

    @_guard
    async def getxattr(self, inode, name, ctx):
        if not self.xattr_reads:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        if ctldir.is_ctl(inode):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        ino = self._ino(inode)
        if name == XATTR_SANDBOX and ino == self.root:
            return b"1" if self.sandbox_points else b"0"
        if name.startswith(XATTR_PREFIX):
            rec = self._attrs(ino)
            if rec.is_dir and name == b"user.vfsd.pin":
                return b"1" if rec.pinned else b"0"
            if rec.is_reg:
                if name == b"user.vfsd.step":
                    return str(rec.step).encode()
                if name == b"user.vfsd.status":
                    return STATUS_NAMES[rec.status].encode()
                if name == b"user.vfsd.pin":
                    return b"1" if rec.pinned else b"0"
                if name == b"user.vfsd.hash":
                    return (await self.content_ref(ino))[1].hex().encode()
                if name == b"user.vfsd.tier":
                    return b"inline" if rec.size <= self.files.inline_max else b"chunked"
        value = self.store.get_xattr(ino, name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @_guard
    async def setxattr(self, inode, name, value, ctx):
        ino = self._ino(inode)
        if name == XATTR_SANDBOX:
            if ino != self.root:
                raise pyfuse3.FUSEError(errno.EINVAL)
            self.sandbox_points = True  # for the daemon's life: a claim is never undone
            return
        self._check_writable()
        if name.startswith(XATTR_PREFIX):
            self._set_vfsd_xattr(ino, name, value, _pid(ctx))
            return
        if len(name) > 255:
            raise pyfuse3.FUSEError(errno.ERANGE)
        if len(value) > 64 * 1024:
            raise pyfuse3.FUSEError(errno.E2BIG)
        # Attributes take room like content does: they count against the quota.
        growth = self.store.xattr_growth(ino, name, value)
        if self.quota is not None and growth > 0:
            await self._take_quota(growth, ino)
        self.store.set_xattr(ino, name, value)

    def _set_vfsd_xattr(self, ino: int, name: bytes, value: bytes, pid: int = 0) -> None:
        if name == XATTR_CALL:
            self._tag(ino, value, pid)
            return
        if name in XATTR_RO:
            raise pyfuse3.FUSEError(errno.EPERM)
        text = value.decode(errors="replace").strip()
        if name == XATTR_UNIT:
            # A directory evicted whole or not at all ("1"), or never as one ("0"):
            # kept as a plain attribute the evictor reads.
            if not self._attrs(ino).is_dir or text not in ("0", "1", "true", "false"):
                raise pyfuse3.FUSEError(errno.EINVAL)
            self.store.set_xattr(ino, XATTR_UNIT, b"1" if text in ("1", "true") else b"0")
            return
        if name not in XATTR_RW:
            raise pyfuse3.FUSEError(errno.EINVAL)
        kind = self._attrs(ino)
        if kind.is_dir and name == b"user.vfsd.pin":
            pass  # a pinned directory keeps its whole subtree
        elif not kind.is_reg:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if name == b"user.vfsd.status":
            if text not in STATUS_BY_NAME:
                raise pyfuse3.FUSEError(errno.EINVAL)
            self.set_attrs(ino, status=STATUS_BY_NAME[text])
        elif name == b"user.vfsd.pin":
            if text not in ("0", "1", "true", "false"):
                raise pyfuse3.FUSEError(errno.EINVAL)
            self.set_attrs(ino, pinned=text in ("1", "true"))
        else:
            # A step set by hand is the file's last use too, or it could not age it.
            self.set_attrs(ino, step=_parse_step(value), used=0)

    def _note_writer(self, of, pid: int) -> None:
        """The requesting process's tool call is the author of what the open
        file commits next; a process outside any call (the agent program
        itself, truncating the file its file tool tagged) takes nothing away
        from a tool call already named."""
        call = self.provenance.of_pid(pid)
        if call != NO_CALL or of.writer is None:
            of.writer = call

    def _tag(self, ino: int, value: bytes, pid: int) -> None:
        """`user.vfsd.call`: the tool call that is about to write this file
        (see `provenance`). On an open file it is the author of what the file
        commits next (and its maker, if the open made it), stored with that
        commit; on a closed one it becomes the last changer at once. Only a
        process that reached the control socket may set it (EPERM)."""
        refused = self.provenance.may_tag(pid)
        if refused is not None:
            log.info("call_tag_refused", ino=ino, pid=pid, why=refused)
            raise pyfuse3.FUSEError(errno.EPERM)
        if not self._attrs(ino).is_reg or len(value) > 4096:
            raise pyfuse3.FUSEError(errno.EINVAL)
        try:
            key = self.provenance.intern_tag(json.loads(value))
        except (ValueError, errors.InvalidArgument) as exc:
            log.info("bad_call_tag", ino=ino, error=str(exc)[:200])
            raise pyfuse3.FUSEError(errno.EINVAL) from None
        of = self.files.get(ino)
        if of is None:
            self.set_attrs(ino, changed_by=key)
            return
        of.writer = key
        if of.fresh and of.inode.made_by != key:
            self.journal.maker_named(of.inode.made_by, key)
            of.inode.made_by = key
        of.inode.changed_by = key
        of.attr_dirty = True  # commits with the content (or at release, if none comes)

    @_guard
    async def listxattr(self, inode, ctx):
        if ctldir.is_ctl(inode) or not self.xattr_reads:
            # Nothing is listed that getxattr cannot read: cp -a, tar --xattrs
            # and rsync -X then copy no attributes, silently, instead of
            # failing on every name.
            return []
        ino = self._ino(inode)
        names = self.store.list_xattrs(ino)
        if self._attrs(ino).is_reg:
            names = list(XATTR_RW + XATTR_RO) + names
        return names

    @_guard
    async def removexattr(self, inode, name, ctx):
        self._check_writable()
        if name == XATTR_UNIT:  # back to what the directory holds deciding
            if not self.store.remove_xattr(self._ino(inode), name):
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
            return
        if name.startswith(XATTR_PREFIX):
            raise pyfuse3.FUSEError(errno.EPERM)
        if not self.store.remove_xattr(self._ino(inode), name):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def run_invalidator(self) -> None:
        """Forward attribute invalidations to the kernel from a worker thread."""
        async for item in self._inval_recv:
            batch = {item}
            while True:
                try:
                    batch.add(self._inval_recv.receive_nowait())
                except trio.WouldBlock:
                    break
            await trio.to_thread.run_sync(self._invalidate, batch)

    def _queue_evicted_names(self) -> None:
        """As `_drop_evicted_names`, without waiting: for create and mknod,
        whose caller holds the directory's lock until we answer, which the
        kernel needs to drop a name in it."""
        if self.evicted_names is None:
            return
        for parent, name, ino in self.evicted_names():
            try:
                self.kernel.invalidate_entry_async(parent, name, deleted=ino, ignore_enoent=True)
            except Exception as exc:  # not mounted (unit tests)
                log.debug("invalidate_failed", ino=ino, error=str(exc))

    async def _drop_evicted_names(self) -> None:
        """Names that quota eviction just removed leave the kernel's cache
        before this request is answered (from a worker thread: the calls
        block, and only this request waits)."""
        if self.evicted_names is None:
            return
        pending = self.evicted_names()
        if pending:
            await trio.to_thread.run_sync(self._drop_names,
                                          [(parent, name) for parent, name, _ in pending])

    def _drop_names(self, names: list[tuple[int, bytes]]) -> None:
        for parent, name in names:
            try:
                self.kernel.invalidate_entry(parent, name)
            except OSError:
                pass  # not in the kernel's cache

    def _invalidate(self, items: set[tuple[int, bool]]) -> None:
        for ino, attr_only in items:
            try:
                self.kernel.invalidate_inode(self._fuse_ino(ino), attr_only=attr_only)
            except OSError:
                pass  # the kernel forgot it already: nothing cached to drop

    # ------------------------------------------------------------ shutdown

    def flush_all(self) -> None:
        """Commit every buffered write (at unmount)."""
        for of in list(self.files.files.values()):
            try:
                self.files.flush(of)
            except Exception:
                log.exception("flush_failed", ino=of.inode.ino)

    def forget_all(self) -> None:
        """Free inodes the kernel never forgot before unmount (like destroy())."""
        self.flush_all()
        self.files.files.clear()
        self.lookups.clear()
        self._awaiting_forget.clear()
        for ino in self.store.orphans():
            self.store.free_inode(ino)

