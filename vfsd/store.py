"""The metadata store: one LMDB environment, the only module that knows its layout.

A store directory holds `lmdb/` (this environment) and `chunks/` (see `chunks`).
One store may serve several volumes (one per run dir); inode numbers are global,
so only the step indexes, logs and counters carry the volume id.

Named databases (all integers big-endian, so range scans run in order):

`meta`       ascii key -> value. Global: `schema` (u32 SCHEMA_VERSION),
             `chunk_size` (u64, fixed when the store is created),
             `next_ino`, `next_cookie`, `next_vol` (u64), `chunk_count`,
             `chunk_bytes` (u64, over chunks with refcount > 0). Per volume, the
             key is prefixed `v<vol u32>:`: `step` (u64 current agent step),
             `files`, `logical_bytes`, `inline_bytes` (u64 counters over regular
             files), `evict_seq` (u64, next eviction log sequence number).
`volume`     volume name (utf-8) -> vol u32 + root ino u64.
`inode`      ino u64 -> `Inode.pack()`. Inode numbers are never reused.
`dentry`     parent u64 + name -> child u64 + cookie u64.
`dirlist`    parent u64 + cookie u64 -> child u64 + name. The cookie is the
             entry's readdir offset: allocated from `next_cookie` when the entry
             is made, so offsets stay valid while other entries come and go.
`backlink`   child u64 + parent u64 + name -> b"". Names of an inode, to build
             paths for references and logs without a tree walk.
`data`       ino u64 -> bytes. Inline content (inode.inline) or symlink target.
`block`      ino u64 + block index u64 -> chunk hash (16 bytes). A missing block
             inside the file size is a hole (reads as zeros).
`chunkref`   chunk hash -> refcount u64 + size u32. Invariant: a record with
             refcount > 0 names a chunk file present on disk. A record with
             refcount 0 is a tombstone waiting for its file to be deleted and
             counts as absent.
`xattr`      ino u64 + name -> value.
`bystep`     vol u32 + step u64 + ino u64 -> b"", every regular file, by the
             step of its last change (for `changes`).
`agestep`    same key, unpinned regular files only (max-age and quota eviction).
`donestep`   same key, unpinned regular files with status done.
`orphan`     ino u64 -> b"". Inodes with no names left whose storage waits for
             the last open handle or kernel reference; freed at the next start.
`evicted`    vol u32 + seq u64 -> JSON eviction record (bounded log).
`evictino`   ino u64 -> vol u32 + seq u64, to answer `resolve` of an evicted ref.
`removed`    vol u32 + step u64 + ino u64 -> JSON removal record (bounded log,
             for `changes`).

Chunk files are created (renamed into place) and deleted only inside an LMDB
write transaction, which serializes them against other processes sharing the
store: a daemon never deletes a chunk another one has just re-referenced.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import lmdb
import xxhash

from . import errors
from .chunks import ChunkStore, chunk_hash
from .inode import STATUS_DONE, Inode

SCHEMA_VERSION = 1
MAX_NAME = 255
EVICT_LOG_MAX = 10_000
REMOVED_LOG_MAX = 10_000

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
_VOL_STEP_INO = struct.Struct(">IQQ")
_VOL_SEQ = struct.Struct(">IQ")
_REF = struct.Struct(">QI")

_DB_NAMES = (
    "meta", "volume", "inode", "dentry", "dirlist", "backlink", "data", "block",
    "chunkref", "xattr", "bystep", "agestep", "donestep", "orphan", "evicted",
    "evictino", "removed",
)


def now_ns() -> int:
    return time.time_ns()


def _all_zero(buf: bytes | bytearray) -> bool:
    # Cheap exits first: real data rarely starts and ends with NUL.
    return not buf or (buf[0] == 0 and buf[-1] == 0 and buf.count(0) == len(buf))


def _u64(n: int) -> bytes:
    return _U64.pack(n)


def _get_u64(txn, db, key: bytes, default: int = 0) -> int:
    raw = txn.get(key, db=db)
    return _U64.unpack(raw)[0] if raw is not None else default


class Store:
    """Metadata of one volume in a store directory, plus its chunk files.

    Every method is one LMDB transaction (or none); none of them awaits, so a
    caller on the trio thread sees each call as atomic.
    """

    def __init__(
        self,
        store_dir: Path,
        volume: str | None = "default",
        *,
        readonly: bool = False,
        map_size: int = 1 << 38,
        sync: bool = False,
        create: bool = True,
        chunk_size: int | None = None,
    ) -> None:
        self.dir = Path(store_dir)
        self.readonly = readonly
        lmdb_dir = self.dir / "lmdb"
        data_file = lmdb_dir / "data.mdb"
        if data_file.exists():
            if data_file.stat().st_size < 2 * 4096:  # not even LMDB's two meta pages
                raise errors.StoreVersionError(
                    f"{data_file} is empty or truncated: the store is damaged "
                    "(restore it from a backup; refusing to start a new store over its chunks)")
        elif readonly or not create:
            raise errors.StoreVersionError(f"no vfsd store at {self.dir}")
        elif any((self.dir / "chunks").glob("??/*")):
            raise errors.StoreVersionError(
                f"{data_file} is missing but {self.dir / 'chunks'} holds chunks: "
                "the store is damaged (refusing to start a new store over its chunks)")
        if not readonly:
            lmdb_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            # sync=False: a commit reaches the OS page cache, which survives a
            # daemon crash; fsync() and durability="sync" call sync() explicitly.
            self.env = lmdb.open(
                str(lmdb_dir), map_size=map_size, max_dbs=len(_DB_NAMES) + 1,
                readonly=readonly, sync=sync, metasync=sync, readahead=False,
                max_readers=256, lock=True, mode=0o600,
            )
        except lmdb.Error as exc:
            raise errors.StoreVersionError(f"cannot open LMDB store at {lmdb_dir}: {exc}") from exc
        # LMDB maps the file and trusts its meta page: a file cut short would
        # kill the process with SIGBUS at the first read past its end.
        needed = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        if data_file.exists() and data_file.stat().st_size < needed:
            self.env.close()
            raise errors.StoreVersionError(
                f"{data_file} is truncated ({data_file.stat().st_size} bytes, its own "
                f"metadata says {needed}): the store is damaged")
        try:
            self.db = {
                name: self.env.open_db(name.encode(), create=not readonly)
                for name in _DB_NAMES
            }
        except lmdb.Error as exc:
            self.env.close()
            raise errors.StoreVersionError(
                f"store at {lmdb_dir} is damaged or not a vfsd store: {exc}"
            ) from exc
        self.chunks = ChunkStore(self.dir / "chunks", create=not readonly)
        self.volume = volume or "default"
        self._deltas: dict[bytes, int] | None = None
        self.vol, self.root_ino = self._open_volume(volume, create and not readonly)
        self.chunk_size = self._chunk_size(chunk_size)
        if not readonly:
            self._make_reserve()
        self._vp = b"v" + _U32.pack(self.vol) + b":"

    # ------------------------------------------------------------------ setup

    def _open_volume(self, name: str | None, create: bool) -> tuple[int, int]:
        db = self.db
        if name is None:  # any volume (store-wide tools such as fsck)
            with self.env.begin() as txn:
                cur = txn.cursor(db=db["volume"])
                if cur.first():
                    self.volume = bytes(cur.key()).decode()
                    return struct.unpack(">IQ", cur.value())
            name = "default"
        key = name.encode()
        with self.env.begin() as txn:
            schema = txn.get(b"schema", db=db["meta"])
            if schema is not None and _U32.unpack(schema)[0] != SCHEMA_VERSION:
                raise errors.StoreVersionError(
                    f"store schema {_U32.unpack(schema)[0]} is not {SCHEMA_VERSION}"
                )
            raw = txn.get(key, db=db["volume"])
        if raw is not None:
            vol, root = struct.unpack(">IQ", raw)
            return vol, root
        if not create:
            raise errors.StoreVersionError(f"store {self.dir} has no volume {name!r}")
        with self.env.begin(write=True) as txn:
            if txn.get(b"schema", db=db["meta"]) is None:
                txn.put(b"schema", _U32.pack(SCHEMA_VERSION), db=db["meta"])
            vol = _get_u64(txn, db["meta"], b"next_vol", 1)
            txn.put(b"next_vol", _u64(vol + 1), db=db["meta"])
            root = self._alloc_ino(txn)
            t = now_ns()
            ino = Inode(root, vol, stat.S_IFDIR | 0o755, nlink=2, uid=os.getuid(),
                        gid=os.getgid(), atime_ns=t, mtime_ns=t, ctime_ns=t,
                        gen=secrets.randbits(32))
            txn.put(_u64(root), ino.pack(), db=db["inode"])
            txn.put(key, struct.pack(">IQ", vol, root), db=db["volume"])
        return vol, root

    RESERVE_BYTES = 8 << 20

    def _make_reserve(self) -> None:
        """Keep some disk space aside for deletions when the disk fills up.

        LMDB writes new pages even to delete (copy on write): with the disk
        full, nothing could be removed to make room. Releasing the reserve
        lets deletions through; it is made again at the next start.
        """
        path = self.dir / "reserve"
        if path.exists():
            return
        st = os.statvfs(self.dir)
        size = min(self.RESERVE_BYTES, st.f_blocks * st.f_frsize // 32)  # small disks: 3%
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError:
            path.unlink(missing_ok=True)  # no room for it now; try next start

    def release_reserve(self) -> bool:
        """Free the reserved space; False if there was none left to free."""
        try:
            (self.dir / "reserve").unlink()
        except FileNotFoundError:
            return False
        return True

    def _chunk_size(self, wanted: int | None) -> int | None:
        """The store's chunk size: recorded by the first writer, fixed after.

        Block indexes only mean something with the chunk size they were cut
        with, so a store never changes it (the daemon adopts the stored one).
        """
        with self.env.begin() as txn:
            raw = txn.get(b"chunk_size", db=self.db["meta"])
        if raw is not None:
            return _U64.unpack(raw)[0]
        if wanted is not None and not self.readonly:
            with self.env.begin(write=True) as txn:
                txn.put(b"chunk_size", _u64(wanted), db=self.db["meta"])
        return wanted

    def close(self) -> None:
        self.chunks.close()
        self.env.close()

    def sync(self) -> None:
        """Flush committed transactions to disk."""
        self.env.sync(True)

    # -------------------------------------------------------------- counters

    def _alloc_ino(self, txn) -> int:
        ino = _get_u64(txn, self.db["meta"], b"next_ino", 1)
        txn.put(b"next_ino", _u64(ino + 1), db=self.db["meta"])
        return ino

    def _alloc_cookie(self, txn) -> int:
        # Offsets 0 is "from the start"; real cookies begin at 1.
        c = _get_u64(txn, self.db["meta"], b"next_cookie", 1)
        txn.put(b"next_cookie", _u64(c + 1), db=self.db["meta"])
        return c

    def _bump(self, txn, key: bytes, delta: int, volume: bool = True) -> None:
        if not delta:
            return
        k = self._vp + key if volume else key
        if self._deltas is not None:  # batched: written once at the end
            self._deltas[k] = self._deltas.get(k, 0) + delta
            return
        val = _get_u64(txn, self.db["meta"], k) + delta
        txn.put(k, _u64(max(val, 0)), db=self.db["meta"])

    def _counter(self, txn, key: bytes) -> int:
        k = self._vp + key
        pending = self._deltas.get(k, 0) if self._deltas is not None else 0
        return _get_u64(txn, self.db["meta"], k) + pending

    def _apply_deltas(self, txn) -> None:
        deltas, self._deltas = self._deltas, None
        for k, delta in (deltas or {}).items():
            val = _get_u64(txn, self.db["meta"], k) + delta
            txn.put(k, _u64(max(val, 0)), db=self.db["meta"])

    def counters(self) -> dict[str, int]:
        """Volume and store counters (files, bytes per tier, chunks)."""
        m = self.db["meta"]
        with self.env.begin() as txn:
            out = {k: _get_u64(txn, m, self._vp + k.encode())
                   for k in ("files", "logical_bytes", "inline_bytes", "step")}
            out["chunk_count"] = _get_u64(txn, m, b"chunk_count")
            out["chunk_bytes"] = _get_u64(txn, m, b"chunk_bytes")
            out["inodes_allocated"] = _get_u64(txn, m, b"next_ino", 1) - 1
        return out

    # ------------------------------------------------------------------ step

    def get_step(self) -> int:
        with self.env.begin() as txn:
            return _get_u64(txn, self.db["meta"], self._vp + b"step")

    def set_step(self, step: int) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(self._vp + b"step", _u64(step), db=self.db["meta"])

    # ---------------------------------------------------------------- inodes

    def get_inode(self, ino: int) -> Inode:
        with self.env.begin() as txn:
            return self._get_inode(txn, ino)

    def _get_inode(self, txn, ino: int) -> Inode:
        raw = txn.get(_u64(ino), db=self.db["inode"])
        if raw is None:
            raise errors.NotFound(f"inode {ino}")
        return Inode.unpack(ino, raw)

    def _put_inode(self, txn, inode: Inode) -> None:
        txn.put(_u64(inode.ino), inode.pack(), db=self.db["inode"])

    def inode_exists(self, ino: int) -> bool:
        with self.env.begin() as txn:
            return txn.get(_u64(ino), db=self.db["inode"]) is not None

    #: attributes `set_attrs` may change (content fields go through commit_content)
    SETTABLE = frozenset({"mode", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns",
                          "status", "pinned", "step"})

    def set_attrs(self, ino: int, **changes) -> Inode:
        """Change some attributes in one transaction; the new record.

        Only the named fields change, so a caller holding newer buffered
        content (an open file) never writes stale sizes back. Step, status
        and pin move the file between the step indexes.
        """
        bad = set(changes) - self.SETTABLE
        if bad:
            raise ValueError(f"not settable: {sorted(bad)}")
        with self.env.begin(write=True) as txn:
            old = self._get_inode(txn, ino)
            new = old.copy()
            for name, value in changes.items():
                if name == "mode":  # the file type never changes
                    value = (old.mode & ~0o7777) | (value & 0o7777)
                setattr(new, name, value)
            self._reindex(txn, old, new)
            self._put_inode(txn, new)
        return new

    # --------------------------------------------------------- step indexes

    def _index_keys(self, inode: Inode) -> list[tuple[str, bytes]]:
        if not inode.is_reg or inode.nlink == 0:
            return []
        key = _VOL_STEP_INO.pack(inode.vol, inode.step, inode.ino)
        keys = [("bystep", key)]
        if not inode.pinned:
            keys.append(("agestep", key))
            if inode.status == STATUS_DONE:
                keys.append(("donestep", key))
        return keys

    def _reindex(self, txn, old: Inode | None, new: Inode | None) -> None:
        before = set(self._index_keys(old)) if old else set()
        after = set(self._index_keys(new)) if new else set()
        for name, key in before - after:
            txn.delete(key, db=self.db[name])
        for name, key in after - before:
            txn.put(key, b"", db=self.db[name])
        # Counters over regular files with names.
        old_live = old is not None and old.is_reg and old.nlink > 0
        new_live = new is not None and new.is_reg and new.nlink > 0
        self._bump(txn, b"files", int(new_live) - int(old_live))
        old_size = old.size if old_live else 0
        new_size = new.size if new_live else 0
        self._bump(txn, b"logical_bytes", new_size - old_size)
        old_inl = old.size if old_live and old.inline else 0
        new_inl = new.size if new_live and new.inline else 0
        self._bump(txn, b"inline_bytes", new_inl - old_inl)

    def scan_index(self, index: str, before_step: int | None = None,
                   since_step: int = 0, limit: int | None = None) -> Iterator[tuple[int, int]]:
        """Yield (step, ino) from a step index, oldest first.

        `index` is "bystep", "agestep" or "donestep". Cost is proportional to
        what is yielded, not to the size of the index.
        """
        db = self.db[index]
        start = _VOL_STEP_INO.pack(self.vol, since_step, 0)
        n = 0
        with self.env.begin() as txn:
            cur = txn.cursor(db=db)
            if not cur.set_range(start):
                return
            for key in cur.iternext(values=False):
                vol, step, ino = _VOL_STEP_INO.unpack(key)
                if vol != self.vol or (before_step is not None and step >= before_step):
                    return
                yield step, ino
                n += 1
                if limit is not None and n >= limit:
                    return

    # ----------------------------------------------------------- namespace

    @staticmethod
    def _check_name(name: bytes) -> None:
        if len(name) > MAX_NAME:
            raise errors.NameTooLong(f"a name is longer than {MAX_NAME} bytes")
        if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
            raise errors.InvalidArgument(f"bad name {name!r}")

    def lookup(self, parent: int, name: bytes) -> Inode:
        if len(name) > MAX_NAME:
            raise errors.NameTooLong(f"a name is longer than {MAX_NAME} bytes")
        with self.env.begin() as txn:
            raw = txn.get(_u64(parent) + name, db=self.db["dentry"])
            if raw is None:
                raise errors.NotFound(name.decode(errors="replace"))
            return self._get_inode(txn, _U64X2.unpack(raw)[0])

    def _add_entry(self, txn, parent: int, name: bytes, child: int) -> None:
        cookie = self._alloc_cookie(txn)
        txn.put(_u64(parent) + name, _U64X2.pack(child, cookie), db=self.db["dentry"])
        txn.put(_U64X2.pack(parent, cookie), _u64(child) + name, db=self.db["dirlist"])
        txn.put(_U64X2.pack(child, parent) + name, b"", db=self.db["backlink"])

    def _del_entry(self, txn, parent: int, name: bytes) -> int:
        key = _u64(parent) + name
        raw = txn.get(key, db=self.db["dentry"])
        if raw is None:
            raise errors.NotFound(name.decode(errors="replace"))
        child, cookie = _U64X2.unpack(raw)
        txn.delete(key, db=self.db["dentry"])
        txn.delete(_U64X2.pack(parent, cookie), db=self.db["dirlist"])
        txn.delete(_U64X2.pack(child, parent) + name, db=self.db["backlink"])
        return child

    def _parent_dir(self, txn, parent: int) -> Inode:
        p = self._get_inode(txn, parent)
        if not p.is_dir:
            raise errors.NotADirectory()
        return p

    def _touch_dir(self, txn, dir_inode: Inode, t: int, nlink_delta: int = 0) -> None:
        dir_inode.mtime_ns = dir_inode.ctime_ns = t
        dir_inode.nlink += nlink_delta
        self._put_inode(txn, dir_inode)

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               rdev: int = 0, target: bytes | None = None) -> Inode:
        """Make a file, directory, device node or (with `target`) a symlink."""
        self._check_name(name)
        t = now_ns()
        with self.env.begin(write=True) as txn:
            p = self._parent_dir(txn, parent)
            if txn.get(_u64(parent) + name, db=self.db["dentry"]) is not None:
                raise errors.Exists()
            ino = self._alloc_ino(txn)
            is_dir = stat.S_ISDIR(mode)
            if p.mode & stat.S_ISGID:
                # POSIX: a setgid directory gives new entries its group, and
                # new subdirectories its setgid bit.
                gid = p.gid
                if is_dir:
                    mode |= stat.S_ISGID
            inode = Inode(ino, self.vol, mode, nlink=2 if is_dir else 1, uid=uid, gid=gid,
                          rdev=rdev, atime_ns=t, mtime_ns=t, ctime_ns=t,
                          gen=secrets.randbits(32), step=self._step(txn))
            if target is not None:
                inode.size = len(target)
                txn.put(_u64(ino), target, db=self.db["data"])
            self._put_inode(txn, inode)
            self._reindex(txn, None, inode)
            self._add_entry(txn, parent, name, ino)
            self._touch_dir(txn, p, t, 1 if is_dir else 0)
        return inode

    def _step(self, txn) -> int:
        return _get_u64(txn, self.db["meta"], self._vp + b"step")

    def link(self, ino: int, new_parent: int, new_name: bytes) -> Inode:
        self._check_name(new_name)
        t = now_ns()
        with self.env.begin(write=True) as txn:
            p = self._parent_dir(txn, new_parent)
            if txn.get(_u64(new_parent) + new_name, db=self.db["dentry"]) is not None:
                raise errors.Exists()
            inode = self._get_inode(txn, ino)
            if inode.is_dir:
                raise errors.StoreError("cannot hard-link a directory")
            old = inode.copy()
            inode.nlink += 1
            inode.ctime_ns = t
            self._reindex(txn, old, inode)
            self._put_inode(txn, inode)
            self._add_entry(txn, new_parent, new_name, ino)
            self._touch_dir(txn, p, t)
        return inode

    def _drop_name(self, txn, parent: Inode, name: bytes, t: int,
                   expect_dir: bool | None) -> Inode:
        """Remove one name; returns the child with its new link count."""
        raw = txn.get(_u64(parent.ino) + name, db=self.db["dentry"])
        if raw is None:
            raise errors.NotFound(name.decode(errors="replace"))
        child = self._get_inode(txn, _U64X2.unpack(raw)[0])
        if expect_dir is True:
            if not child.is_dir:
                raise errors.NotADirectory()
            if self._has_entries(txn, child.ino):
                raise errors.NotEmpty()
        elif expect_dir is False and child.is_dir:
            raise errors.IsADirectory()
        self._del_entry(txn, parent.ino, name)
        old = child.copy()
        child.nlink = 0 if child.is_dir else child.nlink - 1
        child.ctime_ns = t
        self._reindex(txn, old, child)
        self._put_inode(txn, child)
        if child.nlink == 0:
            txn.put(_u64(child.ino), b"", db=self.db["orphan"])
        return child

    def _has_entries(self, txn, ino: int) -> bool:
        cur = txn.cursor(db=self.db["dirlist"])
        prefix = _u64(ino)
        return cur.set_range(prefix) and cur.key()[:8] == prefix

    def unlink(self, parent: int, name: bytes, *, rmdir: bool = False) -> Inode:
        """Remove a name. The inode stays until `free_inode` (no names, no users)."""
        t = now_ns()
        with self.env.begin(write=True) as txn:
            p = self._parent_dir(txn, parent)
            child = self._drop_name(txn, p, name, t, expect_dir=rmdir)
            self._touch_dir(txn, p, t, -1 if rmdir else 0)
            if not rmdir and child.is_reg and child.nlink == 0:
                self._log_removed(txn, child, parent, name, "unlink")
        return child

    def rename(self, old_parent: int, old_name: bytes, new_parent: int,
               new_name: bytes, *, noreplace: bool = False,
               exchange: bool = False) -> Inode | None:
        """Rename; returns the inode that lost its name at the target, if any."""
        self._check_name(new_name)
        t = now_ns()
        with self.env.begin(write=True) as txn:
            op = self._parent_dir(txn, old_parent)
            raw = txn.get(_u64(old_parent) + old_name, db=self.db["dentry"])
            if raw is None:
                raise errors.NotFound(old_name.decode(errors="replace"))
            src = self._get_inode(txn, _U64X2.unpack(raw)[0])
            np_ = op if new_parent == old_parent else self._parent_dir(txn, new_parent)
            if src.is_dir:
                self._check_not_ancestor(txn, src.ino, new_parent)
            traw = txn.get(_u64(new_parent) + new_name, db=self.db["dentry"])
            target = self._get_inode(txn, _U64X2.unpack(traw)[0]) if traw else None
            if target is not None and target.ino == src.ino:
                return None  # same inode under both names: POSIX says do nothing
            if exchange:
                if target is None:
                    raise errors.NotFound(new_name.decode(errors="replace"))
                if target.is_dir:
                    self._check_not_ancestor(txn, target.ino, old_parent)
                self._del_entry(txn, old_parent, old_name)
                self._del_entry(txn, new_parent, new_name)
                self._add_entry(txn, new_parent, new_name, src.ino)
                self._add_entry(txn, old_parent, old_name, target.ino)
                if src.is_dir != target.is_dir and old_parent != new_parent:
                    d = 1 if src.is_dir else -1
                    op.nlink -= d
                    np_.nlink += d
                for node in (src, target):
                    node.ctime_ns = t
                    self._put_inode(txn, node)
                self._touch_dir(txn, op, t)
                if np_ is not op:
                    self._touch_dir(txn, np_, t)
                return None
            replaced = None
            if target is not None:
                if noreplace:
                    raise errors.Exists()
                if src.is_dir and not target.is_dir:
                    raise errors.NotADirectory()
                if not src.is_dir and target.is_dir:
                    raise errors.IsADirectory()
                replaced = self._drop_name(txn, np_, new_name, t, expect_dir=target.is_dir)
                if target.is_dir:
                    np_.nlink -= 1
                elif replaced.is_reg and replaced.nlink == 0:
                    self._log_removed(txn, replaced, new_parent, new_name, "unlink")
            self._del_entry(txn, old_parent, old_name)
            self._add_entry(txn, new_parent, new_name, src.ino)
            if src.is_dir and old_parent != new_parent:
                op.nlink -= 1
                np_.nlink += 1
            src = self._get_inode(txn, src.ino)
            src.ctime_ns = t
            self._put_inode(txn, src)
            self._touch_dir(txn, op, t)
            if np_ is not op:
                self._touch_dir(txn, np_, t)
            return replaced

    def _check_not_ancestor(self, txn, ancestor: int, ino: int) -> None:
        """Refuse to move a directory below itself."""
        while ino != self.root_ino:
            if ino == ancestor:
                raise errors.InvalidArgument("cannot move a directory into itself")
            cur = txn.cursor(db=self.db["backlink"])
            if not cur.set_range(_u64(ino)) or cur.key()[:8] != _u64(ino):
                return
            ino = _U64.unpack(cur.key()[8:16])[0]

    def readdir(self, ino: int, after: int, limit: int = 256) -> list[tuple[int, bytes, Inode]]:
        """Entries of a directory with cookie > `after`, in cookie order."""
        out = []
        prefix = _u64(ino)
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["dirlist"])
            if not cur.set_range(_U64X2.pack(ino, after + 1)):
                return out
            for key, val in cur:
                if key[:8] != prefix:
                    break
                child = _U64.unpack(val[:8])[0]
                out.append((_U64.unpack(key[8:])[0], bytes(val[8:]),
                            self._get_inode(txn, child)))
                if len(out) >= limit:
                    break
        return out

    def path_of(self, ino: int) -> str | None:
        """A path of `ino` relative to the volume root, or None if it has no name."""
        with self.env.begin() as txn:
            return self._path_in(txn, ino)

    def _path_in(self, txn, ino: int) -> str | None:
        parts: list[bytes] = []
        cur = txn.cursor(db=self.db["backlink"])
        while ino != self.root_ino:
            key = _u64(ino)
            if not cur.set_range(key) or cur.key()[:8] != key or len(parts) > 4096:
                return None
            k = cur.key()
            parts.append(bytes(k[16:]))
            ino = _U64.unpack(k[8:16])[0]
        return "/".join(p.decode(errors="surrogateescape") for p in reversed(parts))

    def resolve_path(self, path: str) -> Inode:
        """Look up a path relative to the volume root (no symlinks followed)."""
        with self.env.begin() as txn:
            inode = self._get_inode(txn, self.root_ino)
            for part in path.strip("/").split("/"):
                if part in ("", "."):
                    continue
                if part == "..":
                    raise errors.InvalidArgument("'..' is not allowed")
                name = part.encode(errors="surrogateescape")
                if len(name) > MAX_NAME:
                    raise errors.NameTooLong(f"a name is longer than {MAX_NAME} bytes")
                raw = txn.get(_u64(inode.ino) + name, db=self.db["dentry"])
                if raw is None:
                    raise errors.NotFound(part)
                inode = self._get_inode(txn, _U64X2.unpack(raw)[0])
        return inode

    def readlink(self, ino: int) -> bytes:
        with self.env.begin() as txn:
            raw = txn.get(_u64(ino), db=self.db["data"])
        if raw is None:
            raise errors.InvalidArgument("not a symlink")
        return bytes(raw)

    # -------------------------------------------------------------- content

    def read_inline(self, ino: int) -> bytes:
        with self.env.begin() as txn:
            raw = txn.get(_u64(ino), db=self.db["data"])
        return bytes(raw) if raw is not None else b""

    def block_map(self, ino: int) -> dict[int, bytes]:
        """All chunk hashes of a chunked file, by block index."""
        out = {}
        prefix = _u64(ino)
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["block"])
            if cur.set_range(prefix):
                for key, val in cur:
                    if key[:8] != prefix:
                        break
                    out[_U64.unpack(key[8:])[0]] = bytes(val)
        return out

    def commit_content(
        self,
        inode: Inode,
        *,
        inline_data: bytes | None = None,
        blocks: dict[int, bytes | bytearray | None] | None = None,
        drop_blocks_from: int | None = None,
        stamp_step: bool = True,
    ) -> tuple[Inode, dict[int, bytes | None]]:
        """Commit new content and attributes of a regular file in one transaction.

        `inline_data` (not None) makes the file inline with exactly these bytes
        and drops all its blocks. Otherwise `blocks` maps block index -> new
        block bytes (None makes a hole), and `drop_blocks_from` drops every block
        at or past that index (truncate). Returns the committed inode and the new
        hashes by block index (None for holes).
        """
        new_hashes: dict[int, bytes | None] = {}
        freed: list[bytes] = []
        with self.env.begin(write=True) as txn:
            old = self._get_inode(txn, inode.ino)
            new = inode.copy()
            # Names are not content: link count comes from the store, whatever
            # the caller's copy says (an unlinked open file must stay unlinked).
            new.nlink = old.nlink
            new.nblocks = old.nblocks
            if stamp_step:
                new.step = self._step(txn)
            new.hash = b""
            dkey = _u64(inode.ino)
            if inline_data is not None:
                freed += self._drop_blocks(txn, inode.ino, 0)
                txn.put(dkey, inline_data, db=self.db["data"])
                new.inline = True
                new.nblocks = 0
            else:
                if old.inline:
                    txn.delete(dkey, db=self.db["data"])
                new.inline = False
                if old.inline:
                    new.nblocks = 0
                if drop_blocks_from is not None:
                    dropped = self._drop_blocks(txn, inode.ino, drop_blocks_from)
                    new.nblocks = self._count_blocks(txn, inode.ino)
                    freed += dropped
                for idx, content in (blocks or {}).items():
                    bkey = _U64X2.pack(inode.ino, idx)
                    prev = txn.get(bkey, db=self.db["block"])
                    digest = self._put_chunk(txn, content) if content else None
                    if digest is None:
                        txn.delete(bkey, db=self.db["block"])
                    else:
                        txn.put(bkey, digest, db=self.db["block"])
                    new.nblocks += (digest is not None) - (prev is not None)
                    if prev is not None:
                        prev = bytes(prev)
                        if self._decref(txn, prev):
                            freed.append(prev)
                    new_hashes[idx] = digest
            self._reindex(txn, old, new)
            self._put_inode(txn, new)
        self._delete_unreferenced(freed)
        return new, new_hashes

    def _put_chunk(self, txn, content: bytes | bytearray) -> bytes | None:
        """Reference a chunk with this content, writing its file if new.

        An all-zero block is stored as a hole (no chunk at all).
        """
        if _all_zero(content):
            return None
        digest = chunk_hash(content)
        db = self.db["chunkref"]
        raw = txn.get(digest, db=db)
        count = _REF.unpack(raw)[0] if raw is not None else 0
        if count == 0:
            # New (or tombstoned): the file must be in place before we commit.
            if raw is None or not self.chunks.exists(digest):
                self.chunks.put(digest, content)
            self._bump(txn, b"chunk_count", 1, volume=False)
            self._bump(txn, b"chunk_bytes", len(content), volume=False)
        txn.put(digest, _REF.pack(count + 1, len(content)), db=db)
        return digest

    def _decref(self, txn, digest: bytes) -> bool:
        """Drop one reference; True if the chunk is now unreferenced."""
        db = self.db["chunkref"]
        raw = txn.get(digest, db=db)
        if raw is None:
            return False
        count, size = _REF.unpack(raw)
        count = max(count - 1, 0)
        txn.put(digest, _REF.pack(count, size), db=db)
        if count == 0:
            self._bump(txn, b"chunk_count", -1, volume=False)
            self._bump(txn, b"chunk_bytes", -size, volume=False)
            return True
        return False

    def _count_blocks(self, txn, ino: int) -> int:
        prefix = _u64(ino)
        cur = txn.cursor(db=self.db["block"])
        n = 0
        if cur.set_range(prefix):
            for key in cur.iternext(values=False):
                if key[:8] != prefix:
                    break
                n += 1
        return n

    def _drop_blocks(self, txn, ino: int, first: int) -> list[bytes]:
        freed = []
        prefix = _u64(ino)
        cur = txn.cursor(db=self.db["block"])
        if not cur.set_range(_U64X2.pack(ino, first)):
            return freed
        while cur.key()[:8] == prefix:
            digest = bytes(cur.value())
            if self._decref(txn, digest):
                freed.append(digest)
            if not cur.delete():
                break
            if not cur.key():
                break
        return freed

    def _delete_unreferenced(self, digests: list[bytes]) -> None:
        """Delete chunk files whose refcount is still zero (tombstones)."""
        if not digests:
            return
        db = self.db["chunkref"]
        with self.env.begin(write=True) as txn:
            for digest in digests:
                raw = txn.get(digest, db=db)
                if raw is not None and _REF.unpack(raw)[0] == 0:
                    self.chunks.delete(digest)
                    txn.delete(digest, db=db)

    def set_hash(self, ino: int, digest: bytes) -> None:
        """Cache the content hash of an unchanged file."""
        with self.env.begin(write=True) as txn:
            inode = self._get_inode(txn, ino)
            inode.hash = digest
            self._put_inode(txn, inode)

    # ------------------------------------------------------------- freeing

    def free_inode(self, ino: int) -> None:
        """Delete an inode that has no names and no users, and its content."""
        self.free_inodes([ino])

    def free_inodes(self, inos: list[int]) -> None:
        """Free several nameless, unused inodes in one transaction."""
        freed: list[bytes] = []
        with self.env.begin(write=True) as txn:
            for ino in inos:
                key = _u64(ino)
                raw = txn.get(key, db=self.db["inode"])
                if raw is None:
                    txn.delete(key, db=self.db["orphan"])
                    continue
                if Inode.unpack(ino, raw).nlink > 0:
                    continue
                freed += self._drop_blocks(txn, ino, 0)
                txn.delete(key, db=self.db["data"])
                cur = txn.cursor(db=self.db["xattr"])
                if cur.set_range(key):
                    while cur.key()[:8] == key:
                        if not cur.delete() or not cur.key():
                            break
                txn.delete(key, db=self.db["inode"])
                txn.delete(key, db=self.db["orphan"])
        self._delete_unreferenced(freed)

    def orphans(self) -> list[int]:
        with self.env.begin() as txn:
            return [_U64.unpack(k)[0] for k in txn.cursor(db=self.db["orphan"]).iternext(values=False)]

    # --------------------------------------------------------------- xattrs

    def get_xattr(self, ino: int, name: bytes) -> bytes | None:
        with self.env.begin() as txn:
            raw = txn.get(_u64(ino) + name, db=self.db["xattr"])
        return bytes(raw) if raw is not None else None

    def set_xattr(self, ino: int, name: bytes, value: bytes) -> None:
        with self.env.begin(write=True) as txn:
            self._get_inode(txn, ino)
            txn.put(_u64(ino) + name, value, db=self.db["xattr"])

    def remove_xattr(self, ino: int, name: bytes) -> bool:
        with self.env.begin(write=True) as txn:
            return txn.delete(_u64(ino) + name, db=self.db["xattr"])

    def list_xattrs(self, ino: int) -> list[bytes]:
        key = _u64(ino)
        out = []
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["xattr"])
            if cur.set_range(key):
                for k in cur.iternext(values=False):
                    if k[:8] != key:
                        break
                    out.append(bytes(k[8:]))
        return out

    # --------------------------------------------------------- logs

    def _log_removed(self, txn, inode: Inode, parent: int, name: bytes, reason: str) -> None:
        parent_path = self._path_in(txn, parent) or ""
        name_s = name.decode(errors="surrogateescape")
        rec = {"ino": inode.ino, "gen": inode.gen,
               "path": f"{parent_path}/{name_s}" if parent_path else name_s,
               "step": self._step(txn), "reason": reason}
        key = _VOL_STEP_INO.pack(self.vol, rec["step"], inode.ino)
        txn.put(key, json.dumps(rec).encode(), db=self.db["removed"])
        self._trim_log(txn, "removed", REMOVED_LOG_MAX, b"removed_n")

    def _trim_log(self, txn, db_name: str, limit: int, counter: bytes) -> None:
        self._bump(txn, counter, 1)
        if self._counter(txn, counter) <= limit:
            return
        cur = txn.cursor(db=self.db[db_name])
        prefix = _U32.pack(self.vol)
        if cur.set_range(prefix) and cur.key()[:4] == prefix:
            cur.delete()
            self._bump(txn, counter, -1)

    def removed_since(self, step: int) -> list[dict]:
        out = []
        db = self.db["removed"]
        with self.env.begin() as txn:
            cur = txn.cursor(db=db)
            if cur.set_range(_VOL_STEP_INO.pack(self.vol, step, 0)):
                for key, val in cur:
                    if _U32.unpack(key[:4])[0] != self.vol:
                        break
                    out.append(json.loads(bytes(val)))
        return out

    def log_eviction(self, txn, inode: Inode, record: dict) -> None:
        seq = self._counter(txn, b"evict_seq")
        self._bump(txn, b"evict_seq", 1)
        txn.put(_VOL_SEQ.pack(self.vol, seq), json.dumps(record).encode(), db=self.db["evicted"])
        txn.put(_u64(inode.ino), _VOL_SEQ.pack(self.vol, seq), db=self.db["evictino"])
        self._bump(txn, b"evicted_n", 1)
        if self._counter(txn, b"evicted_n") > EVICT_LOG_MAX:
            cur = txn.cursor(db=self.db["evicted"])
            prefix = _U32.pack(self.vol)
            if cur.set_range(prefix) and cur.key()[:4] == prefix:
                old = json.loads(bytes(cur.value()))
                cur.delete()
                txn.delete(_u64(old["ino"]), db=self.db["evictino"])
                self._bump(txn, b"evicted_n", -1)

    def eviction_log(self, limit: int = 100) -> list[dict]:
        """The newest `limit` eviction records, oldest first."""
        out: list[dict] = []
        db = self.db["evicted"]
        with self.env.begin() as txn:
            cur = txn.cursor(db=db)
            end = _VOL_SEQ.pack(self.vol + 1, 0)
            if cur.set_range(end):
                ok = cur.prev()
            else:
                ok = cur.last()
            while ok and len(out) < limit:
                if _U32.unpack(cur.key()[:4])[0] != self.vol:
                    break
                out.append(json.loads(bytes(cur.value())))
                ok = cur.prev()
        out.reverse()
        return out

    def eviction_record(self, ino: int) -> dict | None:
        with self.env.begin() as txn:
            raw = txn.get(_u64(ino), db=self.db["evictino"])
            if raw is None:
                return None
            val = txn.get(bytes(raw), db=self.db["evicted"])
        return json.loads(bytes(val)) if val is not None else None

    def eviction_facts(self, inos: list[int]) -> dict[int, tuple[Inode, str, bytes | None]]:
        """(inode, path, content hash or None if not cheaply known) per inode.

        One read transaction for a whole eviction batch; inline content is
        hashed here, chunked content only if its hash is cached.
        """
        out = {}
        with self.env.begin() as txn:
            for ino in inos:
                inode = self._get_inode(txn, ino)
                digest = inode.hash or None
                if digest is None and inode.inline:
                    raw = txn.get(_u64(ino), db=self.db["data"])
                    data = bytes(raw) if raw is not None else b""
                    digest = xxhash.xxh3_128_digest(data.ljust(inode.size, b"\0"))
                out[ino] = (inode, self._path_in(txn, ino) or "", digest)
        return out

    def evict(self, victims: list[tuple[int, dict]]) -> list[tuple[int, list[tuple[int, bytes]]]]:
        """Remove every name of each victim and log it, in one transaction.

        `victims` is [(ino, eviction record)]. Returns [(ino, [(parent, name)])]
        so the caller can tell the kernel. The inodes become orphans, freed once
        nothing uses them.
        """
        t = now_ns()
        out = []
        parents: set[int] = set()
        self._deltas = {}  # counters change once per batch, not per file
        try:
            with self.env.begin(write=True) as txn:
                for ino, record in victims:
                    inode = self._get_inode(txn, ino)
                    names: list[tuple[int, bytes]] = []
                    cur = txn.cursor(db=self.db["backlink"])
                    key = _u64(ino)
                    if cur.set_range(key):
                        for k in cur.iternext(values=False):
                            if k[:8] != key:
                                break
                            names.append((_U64.unpack(k[8:16])[0], bytes(k[16:])))
                    for parent, name in names:
                        self._del_entry(txn, parent, name)
                        parents.add(parent)
                    old = inode.copy()
                    inode.nlink = 0
                    inode.ctime_ns = t
                    self._reindex(txn, old, inode)
                    self._put_inode(txn, inode)
                    txn.put(key, b"", db=self.db["orphan"])
                    self.log_eviction(txn, inode, record)
                    rec = {"ino": ino, "gen": inode.gen, "path": record.get("path", ""),
                           "step": record["evicted_step"], "reason": record["reason"]}
                    txn.put(_VOL_STEP_INO.pack(self.vol, record["evicted_step"], ino),
                            json.dumps(rec).encode(), db=self.db["removed"])
                    self._trim_log(txn, "removed", REMOVED_LOG_MAX, b"removed_n")
                    out.append((ino, names))
                for parent in parents:  # once per directory, not once per file
                    self._touch_dir(txn, self._get_inode(txn, parent), t)
                self._apply_deltas(txn)
        finally:
            self._deltas = None  # an aborted batch leaves no pending counts behind
        return out

    # ----------------------------------------------------------- chunk maintenance

    def chunk_refs(self) -> dict[bytes, tuple[int, int]]:
        """Every chunkref record: hash -> (refcount, size)."""
        with self.env.begin() as txn:
            return {bytes(k): _REF.unpack(v) for k, v in txn.cursor(db=self.db["chunkref"])}

    def gc_chunks(self, min_temp_age_s: float = 60.0) -> dict[str, int]:
        """Delete chunk files no record references, tombstones and old temporaries."""
        removed = tomb = temps = 0
        with self.env.begin(write=True) as txn:
            db = self.db["chunkref"]
            for digest in list(self.chunks.iter_all()):
                raw = txn.get(digest, db=db)
                if raw is None or _REF.unpack(raw)[0] == 0:
                    self.chunks.delete(digest)
                    removed += 1
            cur = txn.cursor(db=db)
            dead = [bytes(k) for k, v in cur if _REF.unpack(v)[0] == 0]
            for digest in dead:
                txn.delete(digest, db=db)
                tomb += 1
            cutoff = time.time() - min_temp_age_s
            for tmp in self.chunks.iter_temps():
                try:
                    if tmp.stat().st_mtime < cutoff:
                        tmp.unlink()
                        temps += 1
                except FileNotFoundError:
                    pass
        return {"chunks_removed": removed, "tombstones_removed": tomb, "temps_removed": temps}

    def begin(self, write: bool = False):
        """A raw transaction, for eviction's multi-step updates."""
        return self.env.begin(write=write)

