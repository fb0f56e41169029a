"""`Store`: a handle on one volume of the store's LMDB environment.

It opens the environment and the named databases (their layout is in the
package docstring, `vfsd.store`), runs the transactions, and composes the
namespace, xattr, content and hot-block pieces into the file operations the
layers above call. Nothing outside this package sees an LMDB key.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import stat
import struct
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import lmdb

from vfsd import DEFAULT_INLINE_MAX, LMDB_MAP_SIZE, errors

from . import compact, filehash
from .calls import CallsMixin
from .chunks import ChunkStore, chunk_hash
from .content import HOT_REF, ContentStore, is_hot, ref_digest
from .content import all_zero as content_all_zero
from .durability import Batch, Ledger
from .eventlog import EventLog
from .groupcommit import GroupCommit, in_request
from .hotfiles import HotFiles
from .inode import _FORMAT_V3, STATUS_DONE, Inode, with_used
from .keys import inode_key, now_ns
from .namespace import NamespaceMixin
from .steplog import StepLogMixin
from .xattrstore import XattrMixin

SCHEMA_VERSION = 4
#: older schemas this vfsd reads, and upgrades in place when it opens them for
#: writing (`_upgrade`): version -> what changed since
_UPGRADABLE = {2: "inode records gained the two call keys; the `call` and `steplog` tables",
               3: "inode records gained the step of last use"}
ROOT_INO = 1
#: inode numbers stay below this (the FUSE layer uses the space above for views)
MAX_INO = 1 << 40

_U32 = struct.Struct(">I")
_INODE_V3_SIZE = _FORMAT_V3.size
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
_VI = struct.Struct(">IQ")
_VII = struct.Struct(">IQQ")
_VOL_STEP_INO = struct.Struct(">IQQ")

_DB_NAMES = (
    "meta", "volume", "inode", "dentry", "dirlist", "backlink", "link", "block",
    "content", "blob", "xattr", "bystep", "agestep", "donestep", "orphan",
    "evicted", "evictino", "removed", "snap", "sgone", "sver", "sgen", "sdirty", "hotino",
    "upload", "published", "call", "steplog",
)
_OPTIONAL_DBS = ("upload", "published", "call", "steplog")  # None in a read-only handle on an older store

_CORRUPT = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.PanicError,
            lmdb.VersionMismatchError, lmdb.InvalidError, lmdb.BadValsizeError)


#: `Store(dir, BASE)`: the environment without a volume (see `Store.base`)
BASE = object()


def _u64(n: int) -> bytes:
    return _U64.pack(n)


def _get_u64(txn, db, key: bytes, default: int = 0) -> int:
    raw = txn.get(key, db=db)
    return _U64.unpack(raw)[0] if raw is not None else default


def translate(exc: lmdb.Error) -> errors.StoreError:
    """The store's own exception for an LMDB one."""
    if isinstance(exc, lmdb.MapFullError):
        return errors.NoSpace("the store's LMDB map is full")
    if "No space left" in str(exc) or "Disk quota" in str(exc):
        return errors.NoSpace(f"no room on the store's disk: {exc}")
    if isinstance(exc, _CORRUPT):
        return errors.Corrupt(f"the store's LMDB file is damaged: {exc}")
    return errors.StoreError(f"LMDB: {exc}")


#: how a `_Txn` holds its transaction
_OWN, _CHILD, _SHARED = 0, 1, 2
_NESTED = ("a transaction was begun inside a request's write transaction: with group "
           "commit it would not see the group's changes (pass the open txn down instead)")


class _Txn:
    """`Store.txn()`: a plain class, cheaper than a generator context manager
    (every request opens at least one). With group commit on (see
    `groupcommit`), a request's write transaction is a child of the open
    group, and a read on the loop thread reads inside the group."""

    __slots__ = ("store", "write", "txn", "how")

    def __init__(self, store: Store, write: bool) -> None:
        self.store = store
        self.write = write
        self.how = _OWN

    def __enter__(self):
        st = self.store
        g = st.group
        try:
            if g.txn is not None or (self.write and g.enabled):
                return self._enter_grouped(st, g)
            self.txn = st.env.begin(write=self.write)
        except lmdb.Error as exc:
            raise translate(exc) from exc
        return self.txn

    def _enter_grouped(self, st: Store, g: GroupCommit):
        if not g.owner():
            # Another thread sees (and may write) only after the loop's group
            # committed, as it would have without groups.
            if g.txn is not None and g.request_flush is not None:
                g.request_flush()
        elif not self.write:
            if g.child_active:
                raise RuntimeError(_NESTED)
            if g.txn is not None and not g.child_active:
                self.how = _SHARED
                self.txn = g.txn
                return self.txn
        elif g.enabled and in_request.get() and not g.child_active:
            if g.txn is None and g.room_for_a_group(st.dir):
                g.txn = st.env.begin(write=True)
                if g.on_open is not None:
                    g.on_open()
            if g.txn is not None:
                self.how = _CHILD
                self.txn = st.env.begin(write=True, parent=g.txn)
                g.child_active = True
                return self.txn
        elif g.child_active:
            raise RuntimeError(_NESTED)
        elif g.txn is not None:
            st.flush_group()  # a transaction of its own starts after the group's
        self.txn = st.env.begin(write=self.write)
        return self.txn

    def __exit__(self, exc_type, exc, tb) -> bool:
        st = self.store
        how = self.how
        if how == _SHARED:
            if isinstance(exc, lmdb.Error):
                raise translate(exc) from exc
            return False
        if how == _CHILD:
            st.group.child_active = False
        if exc_type is not None:
            self.txn.abort()
            if self.write:
                st._abandoned()
            if isinstance(exc, lmdb.Error):
                raise translate(exc) from exc
            return False
        try:
            self.txn.commit()
        except lmdb.Error as err:
            if self.write:
                st._abandoned()
            raise translate(err) from err
        if not self.write:
            return False
        st.commits += 1
        st.durability.committed()
        if st._pending_marks:
            if st.dirty_since is None:
                st.dirty_since = time.time()
            st._marked |= st._pending_marks
            st._pending_marks.clear()
        if st._base_touched:
            st.base_clean = st._base_touched = False
        content = getattr(st, "content", None)
        if content is not None and (content.created or content.removed):
            made, gone, content.created, content.removed = content.created, content.removed, [], []
            if made:
                st.durability.chunks_made(d for d, _ in made)
            if st.on_chunk_files is not None:
                st.on_chunk_files(made, gone)
        if how == _CHILD:
            g = st.group
            g.children += 1
            if g.children >= g.max_children:
                st.flush_group()
        return False


class Store(NamespaceMixin, XattrMixin, CallsMixin, StepLogMixin):
    """Metadata of one volume in a store directory, plus its content objects.

    Names live in `namespace`, extended attributes in `xattrstore`, tool
    calls in `calls`, the step history in `steplog`; this class holds the environment, volumes, counters, inodes, step indexes,
    content and freeing.

    Every method is one LMDB transaction (or none); none of them awaits, so a
    caller on the trio thread sees each call as atomic.
    """

    def __init__(
        self,
        store_dir: Path,
        volume: str | None = "default",
        *,
        readonly: bool = False,
        map_size: int = LMDB_MAP_SIZE,
        sync: bool = False,
        create: bool = True,
        chunk_size: int | None = None,
        inline_max: int = DEFAULT_INLINE_MAX,
        incomplete_ok: bool = False,
        defer_deletes: bool = False,
    ) -> None:
        self.dir = Path(store_dir)
        self.readonly = readonly
        # Files before records, records before deletes (see `durability`). The
        # daemon defers deletes to after a sync; one-shot tools delete at once.
        self.durability = Ledger()
        self.group = GroupCommit()  # shared with volume views (see `groupcommit`)
        self.defer_deletes = defer_deletes
        # Snapshot change tracking: keys marked in committed transactions since
        # the last snapshot, and those of the transaction in progress.
        self.tracking = False
        self._marked: set[bytes] = set()
        self._pending_marks: set[bytes] = set()
        # Whether the live tree still equals the snapshot it was taken as or
        # restored from (`snapshots`: meta `base_changed`).
        self.base_clean = False
        self._base_touched = False
        self.dirty_since: float | None = None  # first change since the last snapshot
        #: write transactions this handle committed (a volume's own, in a shared
        #: environment: see `view`)
        self.commits = 0
        self.on_chunk_files = None  # remote tier: (made [(digest, size)], deleted [digest])
        # Writers keep compaction away while they have the store open (and
        # make no directory where there is no store to open).
        wanted = create or compact.exists(self.dir)
        self._hold = compact.hold(self.dir) if wanted and not readonly else None
        self.env = None
        self._closed = False
        try:
            self._open(volume, readonly, create, map_size, sync, chunk_size, inline_max,
                       incomplete_ok)
        except BaseException:
            if self.env is not None:
                self.env.close()
            self._release_hold()
            raise

    @classmethod
    def base(cls, store_dir: Path, **options) -> Store:
        """A handle on the store's environment and content alone, no volume of
        its own: a shard's, which serves each volume through a `view`."""
        return cls(store_dir, BASE, **options)

    def _open(self, volume, readonly, create, map_size, sync, chunk_size, inline_max,
              incomplete_ok) -> None:
        self.env = self._open_env(readonly, create, map_size, sync)
        try:
            with self.txn() as txn:
                found = self._check_schema(txn)
            self.db = {name: self._open_db(name) for name in _DB_NAMES}
            if found is not None and found != SCHEMA_VERSION and not readonly:
                self._upgrade(found)
        except errors.StoreError as exc:
            raise errors.StoreVersionError(
                f"store at {self.dir / 'lmdb'} is damaged or not a vfsd store: {exc}") from None
        self.chunks = ChunkStore(self.dir / "chunks", create=not readonly)
        self.hot = HotFiles(self.dir / "hot")
        self._hot_gone: list[int] = []
        self.content = ContentStore(self.db, self.chunks, self._bump, inline_max)
        if self.defer_deletes:
            self.content.doom = self.durability.doom_chunks
        self.logs = EventLog(self)
        self._deltas: dict[bytes, int] | None = None
        if volume is BASE:
            # The environment alone: its volumes are `view`s of this handle.
            self.volume, self.vol, self.root_ino = "", 0, 0
            if not readonly:
                with self.txn(write=True) as txn:
                    if txn.get(b"schema", db=self.db["meta"]) is None:
                        txn.put(b"schema", _U32.pack(SCHEMA_VERSION), db=self.db["meta"])
        else:
            self.volume = volume or "default"
            self.vol, self.root_ino = self._open_volume(volume, create and not readonly)
        self._vp = b"v" + _U32.pack(self.vol) + b":"
        self._vb = _U32.pack(self.vol)
        if volume not in (None, BASE) and self.meta_u64(b"incomplete") and not incomplete_ok:
            raise errors.StoreVersionError(
                f"volume {self.volume!r} of store {self.dir} is a fork or an import that did "
                "not finish copying; run `vfsd fork` (or `vfsd mount --from`) again to redo it")
        self.chunk_size = self._chunk_size(chunk_size)
        self.reload_snapshot_state()
        if not readonly:
            self._make_reserve()

    # ------------------------------------------------------------------ setup

    def _open_env(self, readonly: bool, create: bool, map_size: int, sync: bool):
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
            env = lmdb.open(
                str(lmdb_dir), map_size=map_size, max_dbs=len(_DB_NAMES) + 1,
                readonly=readonly, sync=sync, metasync=sync, readahead=False,
                max_readers=256, lock=True, mode=0o600,
            )
        except lmdb.Error as exc:
            raise errors.StoreVersionError(f"cannot open LMDB store at {lmdb_dir}: {exc}") from exc
        # LMDB maps the file and trusts its meta page: a file cut short would
        # kill the process with SIGBUS at the first read past its end.
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if data_file.exists() and data_file.stat().st_size < needed:
            env.close()
            raise errors.StoreVersionError(
                f"{data_file} is truncated ({data_file.stat().st_size} bytes, its own "
                f"metadata says {needed}): the store is damaged")
        return env

    def _check_schema(self, txn) -> int | None:
        """The store's schema version (None for a new store); refuses what this
        vfsd can neither read nor upgrade."""
        try:
            meta = self.env.open_db(b"meta", txn=txn, create=False)
        except lmdb.NotFoundError:
            return None  # a new store
        schema = txn.get(b"schema", db=meta)
        if schema is None:
            return None
        found = _U32.unpack(schema)[0]
        if found != SCHEMA_VERSION and found not in _UPGRADABLE:
            raise errors.StoreVersionError(
                f"store {self.dir} has schema {found}; this vfsd reads schema "
                f"{SCHEMA_VERSION}" + (" (a store made by vfsd 0.1: copy its files out with "
                                       "that version, then into a new store)" if found == 1 else ""))
        return found

    def _upgrade(self, found: int) -> None:
        """Bring an older store to SCHEMA_VERSION in one write transaction.

        2 -> 3: nothing to rewrite. Schema 2 inode records (and snapshot
        entries) are shorter and read as made and changed by an unknown call;
        the `call` and `steplog` tables were created when the databases were
        opened. 3 -> 4: nothing to rewrite either: schema 3 records read as
        never opened since written, which is what their step indexes say.
        """
        with self.txn(write=True) as txn:
            txn.put(b"schema", _U32.pack(SCHEMA_VERSION), db=self.db["meta"])

    def _open_db(self, name: str):
        try:
            return self.env.open_db(name.encode(), create=not self.readonly)
        except lmdb.NotFoundError:
            if name in _OPTIONAL_DBS:
                return None
            # Read-only on a store whose writer never made this table yet.
            raise errors.StoreVersionError(f"store {self.dir} lacks table {name!r}") from None
        except lmdb.Error as exc:
            raise translate(exc) from exc

    def txn(self, write: bool = False) -> _Txn:
        """An LMDB transaction whose failures are store errors (a context manager).

        Snapshot change marks made in a write transaction count only once it
        has committed; read ones (maybe in worker threads) touch no bookkeeping.
        """
        return _Txn(self, write)

    def _read(self, fn, *args):
        """`fn(txn, *args)` in a read transaction. On the loop inside an open
        group (see `groupcommit`) that is the group's own, with no `_Txn`
        around it: getattr and lookup, the most frequent requests, cost a get."""
        txn = self.group.open_for_reads()
        if txn is None:
            with self.txn() as txn:
                return fn(txn, *args)
        try:
            return fn(txn, *args)
        except lmdb.Error as exc:
            raise translate(exc) from exc

    def _abandoned(self) -> None:
        """A write transaction that did not commit: forget what it would have done."""
        self._pending_marks.clear()
        self._base_touched = False
        if hasattr(self, "content"):
            self.content.created.clear()
            self.content.removed.clear()

    def _open_volume(self, name: str | None, create: bool) -> tuple[int, int]:
        db = self.db
        if name is None:  # any volume (store-wide tools such as fsck)
            with self.txn() as txn:
                cur = txn.cursor(db=db["volume"])
                if cur.first():
                    self.volume = bytes(cur.key()).decode()
                    return _VI.unpack(cur.value())
            name = "default"
        key = name.encode()
        with self.txn() as txn:
            raw = txn.get(key, db=db["volume"])
        if raw is not None:
            return _VI.unpack(raw)
        if not create:
            raise errors.NoSuchVolume(f"store {self.dir} has no volume {name!r}")
        with self.txn(write=True) as txn:
            vol = self.create_volume(txn, name)
        return vol, ROOT_INO

    def create_volume(self, txn, name: str, *, run: str | None = None,
                      with_root: bool = True) -> int:
        """Add a volume (with an empty root directory unless told otherwise); its id."""
        db = self.db
        key = name.encode()
        if txn.get(key, db=db["volume"]) is not None:
            raise errors.Exists(f"volume {name!r} exists")
        if txn.get(b"schema", db=db["meta"]) is None:
            txn.put(b"schema", _U32.pack(SCHEMA_VERSION), db=db["meta"])
        vol = _get_u64(txn, db["meta"], b"next_vol", 1)
        txn.put(b"next_vol", _u64(vol + 1), db=db["meta"])
        vp = b"v" + _U32.pack(vol) + b":"
        txn.put(vp + b"name", key, db=db["meta"])
        txn.put(vp + b"run", (run or os.urandom(16).hex()).encode(), db=db["meta"])
        txn.put(vp + b"next_ino", _u64(ROOT_INO + 1), db=db["meta"])
        if with_root:
            t = now_ns()
            root = Inode(ROOT_INO, vol, stat.S_IFDIR | 0o755, nlink=2, uid=os.getuid(),
                         gid=os.getgid(), atime_ns=t, mtime_ns=t, ctime_ns=t,
                         gen=int.from_bytes(os.urandom(4), "big"))
            txn.put(_VI.pack(vol, ROOT_INO), root.pack(), db=db["inode"])
        txn.put(key, _VI.pack(vol, ROOT_INO), db=db["volume"])
        return vol

    def rename_volume(self, old: str, new: str) -> None:
        """Give volume `old` the name `new` (its id, files and snapshots stay)."""
        with self.txn(write=True) as txn:
            raw = txn.get(old.encode(), db=self.db["volume"])
            if raw is None:
                raise errors.NoSuchVolume(f"store {self.dir} has no volume {old!r}")
            if txn.get(new.encode(), db=self.db["volume"]) is not None:
                raise errors.Exists(f"volume {new!r} exists")
            vol = _VI.unpack(raw)[0]
            txn.delete(old.encode(), db=self.db["volume"])
            txn.put(new.encode(), raw, db=self.db["volume"])
            txn.put(b"v" + _U32.pack(vol) + b":name", new.encode(), db=self.db["meta"])

    def volumes(self) -> dict[str, int]:
        """Every volume of the store: name -> vol id."""
        with self.txn() as txn:
            return {bytes(k).decode(): _VI.unpack(v)[0]
                    for k, v in txn.cursor(db=self.db["volume"])}

    #: tables whose keys start with the volume id
    _PER_VOLUME = ("inode", "dentry", "dirlist", "backlink", "link", "block", "xattr",
                   "bystep", "agestep", "donestep", "orphan", "evicted", "evictino", "removed",
                   "snap", "sgone", "sver", "sgen", "sdirty", "hotino", "published", "steplog")

    def drop_volume(self, name: str, entry_refs: Callable[[bytes, bytes], list[bytes]]) -> None:
        """Delete a volume and its snapshots, releasing the content they held.

        `entry_refs(okey, value)` names the content a snapshot entry holds: the
        entry format belongs to `vfsd.snapshots`, which calls this through
        `snapshots.drop_volume`.
        """
        self._empty_volume(self.view(name), entry_refs, keep=False)

    def clear_volume(self, entry_refs: Callable[[bytes, bytes], list[bytes]]) -> None:
        """Empty this handle's volume down to what a new one holds, minus its
        root directory (an import writes its own); it keeps its id and name
        and gets a new run id. For an import that must start over."""
        self._empty_volume(self, entry_refs, keep=True)
        self.reload_snapshot_state()

    def _empty_volume(self, view: Store, entry_refs, *, keep: bool) -> None:
        vb = view._vb
        name = view.volume
        refs: Counter = Counter()
        with self.txn(write=True) as txn:
            for table in self._PER_VOLUME:
                if self.db[table] is None:
                    continue
                self._delete_rows(txn, table, vb, refs, entry_refs)
            cur = txn.cursor(db=self.db["meta"])
            prefix = view._vp
            if cur.set_range(prefix):
                while cur.key()[:len(prefix)] == prefix:
                    if not cur.delete() or not cur.key():
                        break
            if keep:
                txn.put(prefix + b"name", name.encode(), db=self.db["meta"])
                txn.put(prefix + b"run", os.urandom(16).hex().encode(), db=self.db["meta"])
                txn.put(prefix + b"next_ino", _u64(ROOT_INO + 1), db=self.db["meta"])
            else:
                txn.delete(name.encode(), db=self.db["volume"])
            freed = self.content.apply(txn, refs)
        self._delete_unreferenced(freed)
        shutil.rmtree(self.hot.root / str(view.vol), ignore_errors=True)

    #: seconds of work per transaction of a volume dropped in steps
    DROP_STEP_S = 0.005

    def drop_volume_in_steps(self, name: str, entry_refs: Callable[[bytes, bytes], list[bytes]]):
        """`drop_volume` in short transactions (a generator: yields between
        them). The first takes the name away (nothing can open the volume from
        then on) and notes the drop under way in `meta` (`dropping:` + vol
        u32); `pending_drops` lists those a crash cut short, and
        `finish_drop_in_steps` ends them."""
        with self.txn(write=True) as txn:
            raw = txn.get(name.encode(), db=self.db["volume"])
            if raw is None:
                raise errors.NoSuchVolume(f"store {self.dir} has no volume {name!r}")
            vol = _VI.unpack(raw)[0]
            txn.delete(name.encode(), db=self.db["volume"])
            txn.put(b"dropping:" + _U32.pack(vol), name.encode(), db=self.db["meta"])
        yield from self.finish_drop_in_steps(vol, entry_refs)

    def pending_drops(self) -> list[int]:
        """Volume ids whose drop a crash cut short (see `drop_volume_in_steps`)."""
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["meta"])
            out = []
            if cur.set_range(b"dropping:"):
                for key in cur.iternext(values=False):
                    if not bytes(key).startswith(b"dropping:"):
                        break
                    out.append(_U32.unpack(bytes(key)[9:13])[0])
            return out

    def finish_drop_in_steps(self, vol: int, entry_refs):
        """Delete every record of volume `vol` (whose name is gone already),
        a short transaction per step, then its meta keys and the drop's note."""
        vb = _U32.pack(vol)
        for table in self._PER_VOLUME:
            if self.db[table] is None:
                continue
            while True:
                deadline = time.perf_counter() + self.DROP_STEP_S
                refs: Counter = Counter()
                with self.txn(write=True) as txn:
                    more = self._delete_rows(txn, table, vb, refs, entry_refs, deadline)
                    freed = self.content.apply(txn, refs)
                self._delete_unreferenced(freed)
                yield table
                if not more:
                    break
        prefix = b"v" + vb + b":"
        with self.txn(write=True) as txn:
            cur = txn.cursor(db=self.db["meta"])
            if cur.set_range(prefix):
                while cur.key()[:len(prefix)] == prefix:
                    if not cur.delete() or not cur.key():
                        break
            txn.delete(b"dropping:" + vb, db=self.db["meta"])
        shutil.rmtree(self.hot.root / str(vol), ignore_errors=True)

    def _delete_rows(self, txn, table: str, vb: bytes, refs: Counter, entry_refs,
                     deadline: float | None = None) -> bool:
        """Delete volume `vb`'s rows of `table`, counting in `refs` the content
        they held (blocks, snapshot entries); past `deadline` (perf_counter),
        stop. True when rows are left."""
        cur = txn.cursor(db=self.db[table])
        if not cur.set_range(vb):
            return False
        while cur.key()[:4] == vb:
            if table == "block":
                refs[bytes(cur.value())] -= 1
            elif table == "sver":
                for ref in entry_refs(bytes(cur.key()[4:-8]), bytes(cur.value())):
                    refs[ref] -= 1
            if not cur.delete() or not cur.key():
                return False
            if deadline is not None and time.perf_counter() > deadline:
                return cur.key()[:4] == vb
        return False

    def view(self, name: str) -> Store:
        """A handle on another volume of this store (same environment).

        For store-wide work (fsck, forks); never close it: the environment
        belongs to this handle.
        """
        other = copy.copy(self)
        other._marked, other._pending_marks, other._deltas = set(), set(), None
        other._base_touched, other.dirty_since, other._hot_gone = False, None, []
        other.commits = 0
        other.volume = name
        other.vol, other.root_ino = self._open_volume(name, create=False)
        other._vp = b"v" + _U32.pack(other.vol) + b":"
        other._vb = _U32.pack(other.vol)
        other.logs = EventLog(other)
        other.reload_snapshot_state()
        return other

    def reload_snapshot_state(self) -> None:
        """Read again whether snapshots track this volume, and whether the live
        tree still equals its base (after an import rewrote the volume)."""
        self.tracking = self.meta_u64(b"snap_seq") > 0
        self.base_clean = self.tracking and not self.meta_u64(b"base_changed")
        self._marked.clear()
        self._pending_marks.clear()

    @property
    def run_id(self) -> str:
        """The run this volume holds (what travels with its snapshots)."""
        with self.txn() as txn:
            raw = txn.get(self._vp + b"run", db=self.db["meta"])
        return bytes(raw).decode() if raw is not None else ""

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
        with self.txn() as txn:
            raw = txn.get(b"chunk_size", db=self.db["meta"])
        if raw is not None:
            return _U64.unpack(raw)[0]
        if wanted is not None and not self.readonly:
            with self.txn(write=True) as txn:
                txn.put(b"chunk_size", _u64(wanted), db=self.db["meta"])
        return wanted

    @property
    def inline_max(self) -> int:
        return self.content.inline_max

    @inline_max.setter
    def inline_max(self, value: int) -> None:
        self.content.inline_max = value

    def flush_group(self) -> None:
        """Commit the open group of requests, if any (on its thread only)."""
        g = self.group
        txn = g.txn
        if txn is None:
            return
        try:
            txn.commit()
        except lmdb.Error as exc:
            # Answered requests are lost: nobody can be told but the owner.
            g.txn, g.children = None, 0
            g.enabled = False
            if g.on_failure is not None:
                g.on_failure(exc)
            raise translate(exc) from exc
        # Only now: the commit lets go of the GIL, and a worker thread that saw
        # no group while it ran would read without waiting, from before it.
        g.txn, g.children = None, 0
        g.commits += 1

    def _flush_before_sync(self) -> None:
        g = self.group
        if g.txn is not None:
            if g.owner():
                self.flush_group()
            elif g.request_flush is not None:
                g.request_flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.group.owner():
            self.flush_group()
        self.group.enabled = False
        if self.defer_deletes and not self.readonly:
            self.sync()
            self.delete_synced()
        self.chunks.close()
        self.env.close()
        self._release_hold()

    def _release_hold(self) -> None:
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None

    def sync(self, chunks=(), hot=()) -> None:
        """Make committed transactions durable, after the files they name
        (safe in a worker thread; see `durability`). `chunks` (digests) and
        `hot` ((vol, ino)) are files to make durable too: what an fsync()ed
        file names that this store's ledger may not hold (a chunk another
        daemon wrote, a hot file's own writes)."""
        self._flush_before_sync()  # what requests committed together is in LMDB's file
        led = self.durability
        with led.sync_lock:
            batch = led.take()
            batch.chunks.update(chunks)
            batch.hot.update(hot)
            try:
                self._sync_files(batch)
                for _ in range(3):  # what commits made meanwhile, a few rounds
                    late = led.take()
                    batch.merge(late)
                    if not late.has_files():
                        break
                    self._sync_files(late)
                try:
                    self.env.sync(True)
                except lmdb.Error as exc:
                    raise translate(exc) from exc
            except BaseException:
                led.give_back(batch)
                raise
            # Commits that landed during LMDB's sync may be durable now: their
            # files follow at once; what they freed waits for the next sync.
            after = led.take()
            self._sync_files(after)
            led.give_back(Batch(doomed=after.doomed, doomed_hot=after.doomed_hot,
                                commits=after.commits))
        led.synced(batch)

    def retire_hot_file(self, vol: int, ino: int) -> None:
        """A hot file no record names any more: deleted now, or in the daemon
        once that change is durable."""
        if self.defer_deletes:
            self.durability.doom_hot(vol, ino)
        else:
            self.hot.delete(vol, ino)

    def finish_deletes(self) -> int:
        """At start: delete what a crash left waiting for a sync (chunk
        tombstones, this volume's hot files no record names). The sync first
        makes the records that stopped naming them durable."""
        self.sync()
        with self.txn() as txn:
            tombs = self.content.tombstones(txn)
        gone = 0
        if tombs:
            with self.txn(write=True) as txn:
                gone += self.content.delete_unreferenced(txn, tombs)
        hot = set(self.hot_inodes())
        for ino in self.hot.inodes(self.vol):
            if ino not in hot:
                self.hot.delete(self.vol, ino)
                gone += 1
        return gone

    def _sync_files(self, batch: Batch) -> None:
        if batch.chunks:
            self.chunks.fsync(sorted(batch.chunks))
        for vol, ino in batch.hot:
            self.hot.fsync(vol, ino)

    def delete_synced(self, in_use=None) -> int:
        """Delete the chunk and hot files that durable records no longer name
        (on the thread that commits). `in_use(vol, ino)`: an open inode (of
        any volume the caller serves), whose hot file stays. Returns how many
        files went."""
        doomed, doomed_hot = self.durability.take_ready()
        gone = 0
        if doomed:
            with self.txn(write=True) as txn:
                gone += self.content.delete_unreferenced(txn, doomed)
        for vol, ino in doomed_hot:
            if in_use is not None and in_use(vol, ino):
                continue  # open again: its hot file is its own business
            with self.txn() as txn:
                if txn.get(_VI.pack(vol, ino), db=self.db["hotino"]) is not None:
                    continue  # hot again
            self.hot.delete(vol, ino)
            gone += 1
        return gone

    # -------------------------------------------------------------- counters

    def _key(self, ino: int) -> bytes:
        return _VI.pack(self.vol, ino)

    def _alloc_ino(self, txn) -> int:
        k = self._vp + b"next_ino"
        ino = _get_u64(txn, self.db["meta"], k, ROOT_INO + 1)
        if ino >= MAX_INO:
            raise errors.NoSpace("the volume has used every inode number")
        txn.put(k, _u64(ino + 1), db=self.db["meta"])
        return ino

    def _alloc_cookie(self, txn) -> int:
        # Offset 0 is "from the start"; real cookies begin at 1.
        k = self._vp + b"next_cookie"
        c = _get_u64(txn, self.db["meta"], k, 1)
        txn.put(k, _u64(c + 1), db=self.db["meta"])
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

    @contextlib.contextmanager
    def batched_counters(self, txn):
        """Counter changes inside the block are written once, at its end."""
        self._deltas = {}
        try:
            yield
            deltas, self._deltas = self._deltas, None
            for k, delta in deltas.items():
                val = _get_u64(txn, self.db["meta"], k) + delta
                txn.put(k, _u64(max(val, 0)), db=self.db["meta"])
        finally:
            self._deltas = None  # an aborted batch leaves no pending counts behind

    def meta_bytes(self, key: bytes) -> bytes | None:
        """A per-volume value from `meta` (None: not set)."""
        with self.txn() as txn:
            raw = txn.get(self._vp + key, db=self.db["meta"])
        return bytes(raw) if raw is not None else None

    def set_meta_bytes(self, key: bytes, value: bytes) -> None:
        with self.txn(write=True) as txn:
            txn.put(self._vp + key, value, db=self.db["meta"])

    def meta_u64(self, key: bytes, default: int = 0) -> int:
        """A per-volume u64 from `meta`."""
        with self.txn() as txn:
            return _get_u64(txn, self.db["meta"], self._vp + key, default)

    def bump_meta(self, key: bytes) -> int:
        """Add one to a per-volume u64 of `meta`; the new value."""
        with self.txn(write=True) as txn:
            value = _get_u64(txn, self.db["meta"], self._vp + key) + 1
            txn.put(self._vp + key, _u64(value), db=self.db["meta"])
        return value

    def counters(self) -> dict[str, int]:
        """Volume and store counters (files, bytes per tier, objects)."""
        m = self.db["meta"]
        with self.txn() as txn:
            out = {k: _get_u64(txn, m, self._vp + k.encode())
                   for k in ("files", "logical_bytes", "inline_bytes", "xattr_bytes",
                             "orphan_bytes", "step", "unbound_checkpoints")}
            for k in ("chunk_count", "chunk_bytes", "blob_count", "blob_bytes"):
                out[k] = _get_u64(txn, m, k.encode())
            out["inodes_allocated"] = _get_u64(txn, m, self._vp + b"next_ino", 2) - 1
        return out

    # ------------------------------------------------------------------ step

    def get_step(self) -> int:
        with self.txn() as txn:
            return self._step(txn)

    def _step(self, txn) -> int:
        return _get_u64(txn, self.db["meta"], self._vp + b"step")

    def set_step(self, step: int) -> None:
        with self.txn(write=True) as txn:
            txn.put(self._vp + b"step", _u64(step), db=self.db["meta"])

    # ------------------------------------------------------- change tracking

    def _mark(self, txn, key: bytes) -> None:
        """Note that an object changed since the last snapshot (see `snapshots`)."""
        if not self.tracking:
            return
        if self.base_clean and not self._base_touched:
            txn.put(self._vp + b"base_changed", _u64(1), db=self.db["meta"])
            self._base_touched = True
        if key in self._marked or key in self._pending_marks:
            return
        txn.put(self._vb + key, b"", db=self.db["sdirty"])
        self._pending_marks.add(key)

    def forget_marks(self) -> None:
        """The in-memory copy of the marks, after a snapshot consumed them."""
        self._marked.clear()
        self.dirty_since = None

    def set_base(self, txn) -> None:
        """The live tree now equals a snapshot (just taken or restored); call
        last in that transaction, then `base_set()` after it commits."""
        txn.delete(self._vp + b"base_changed", db=self.db["meta"])
        self._base_touched = False

    def base_set(self) -> None:
        self.base_clean = True

    # ---------------------------------------------------------------- inodes

    def get_inode(self, ino: int) -> Inode:
        return self._read(self._get_inode, ino)

    def _get_inode(self, txn, ino: int) -> Inode:
        raw = txn.get(self._key(ino), db=self.db["inode"])
        if raw is None:
            raise errors.NotFound(f"inode {ino}")
        try:
            return Inode.unpack(ino, raw)
        except struct.error:
            raise errors.Corrupt(f"inode {ino}: record does not decode") from None

    def _put_inode(self, txn, inode: Inode) -> None:
        txn.put(self._key(inode.ino), inode.pack(), db=self.db["inode"])
        self._mark(txn, inode_key(inode.ino))

    def inode_exists(self, ino: int) -> bool:
        with self.txn() as txn:
            return txn.get(self._key(ino), db=self.db["inode"]) is not None

    #: attributes `set_attrs` may change (content fields go through commit_content)
    SETTABLE = frozenset({"mode", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns",
                          "status", "pinned", "step", "rdev", "changed_by", "used"})

    def set_attrs(self, ino: int, **changes) -> Inode:
        """Change some attributes in one transaction; the new record.

        Only the named fields change, so a caller holding newer buffered
        content (an open file) never writes stale sizes back. Step, status
        and pin move the file between the step indexes.
        """
        bad = set(changes) - self.SETTABLE
        if bad:
            raise ValueError(f"not settable: {sorted(bad)}")
        with self.txn(write=True) as txn:
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
        keys = [("bystep", _VOL_STEP_INO.pack(inode.vol, inode.step, inode.ino))]
        if not inode.pinned:
            used = _VOL_STEP_INO.pack(inode.vol, inode.use_step, inode.ino)
            keys.append(("agestep", used))
            if inode.status == STATUS_DONE:
                keys.append(("donestep", used))
        return keys

    def mark_used(self, marks: dict[int, int]) -> list[Inode]:
        """Record that files were opened: ino -> step, in one transaction; the
        records that changed.

        Not a change of the tree: snapshots and the remote tier never see it
        (a snapshot entry keeps the use it had), so reading files costs no
        snapshot work.
        """
        out = []
        inodes, agestep, donestep = self.db["inode"], self.db["agestep"], self.db["donestep"]
        with self.txn(write=True) as txn:
            for ino, step in marks.items():
                key = self._key(ino)
                raw = txn.get(key, db=inodes)
                if raw is None:
                    continue
                inode = Inode.unpack(ino, raw)
                if not inode.is_reg or inode.nlink == 0 or inode.used >= step:
                    continue
                if len(raw) < _INODE_V3_SIZE:  # a schema 2 record: written whole
                    new = inode.copy()
                    new.used = step
                    self._reindex(txn, inode, new)
                    txn.put(key, new.pack(), db=inodes)
                    out.append(new)
                    continue
                before = inode.use_step
                inode.used = step
                if inode.use_step != before and not inode.pinned:
                    # Only the use-keyed indexes move (`_index_keys`); the
                    # counters and `bystep` stay as they are.
                    old = _VOL_STEP_INO.pack(inode.vol, before, ino)
                    new = _VOL_STEP_INO.pack(inode.vol, inode.use_step, ino)
                    txn.delete(old, db=agestep)
                    txn.put(new, b"", db=agestep)
                    if inode.status == STATUS_DONE:
                        txn.delete(old, db=donestep)
                        txn.put(new, b"", db=donestep)
                txn.put(key, with_used(raw, step), db=inodes)
                out.append(inode)
        return out

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
        # An inode whose last name went stays until nothing holds it (an open
        # descriptor, the kernel): its content counts in `orphan_bytes`, which
        # the quota counts too, until `_free_inode`.
        old_gone = old.size if old is not None and old.is_reg and old.nlink == 0 else 0
        new_gone = new.size if new is not None and new.is_reg and new.nlink == 0 else 0
        self._bump(txn, b"orphan_bytes", new_gone - old_gone)
        # xattrs count while their inode has a name (any type), then as the
        # orphan's until it is freed.
        if old is not None and new is not None and (old.nlink > 0) != (new.nlink > 0):
            held = self._xattr_totals(txn, new.ino)[0]
            self._bump(txn, b"xattr_bytes", held if new.nlink > 0 else -held)
            self._bump(txn, b"orphan_bytes", -held if new.nlink > 0 else held)

    def scan_index(self, index: str, before_step: int | None = None,
                   since_step: int = 0, limit: int | None = None,
                   after_ino: int = -1) -> list[tuple[int, int]]:
        """(step, ino) from a step index, oldest first, at most `limit`.

        `index` is "bystep", "agestep" or "donestep". Cost is proportional to
        what is returned, not to the size of the index. A list, not a
        generator: a read transaction held open across the caller's writes
        would keep LMDB from reusing pages, and the file would grow.
        """
        out: list[tuple[int, int]] = []
        db = self.db[index]
        with self.txn() as txn:
            cur = txn.cursor(db=db)
            if not cur.set_range(_VOL_STEP_INO.pack(self.vol, since_step, after_ino + 1)):
                return out
            for key in cur.iternext(values=False):
                vol, step, ino = _VOL_STEP_INO.unpack(key)
                if vol != self.vol or (before_step is not None and step >= before_step):
                    break
                out.append((step, ino))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def iter_index(self, index: str, since_step: int = 0):
        """(step, ino) from a step index, oldest first, read in growing pages.

        For callers that stop early (the quota planner): each page is its own
        short read transaction, so writes in between never face a long
        reader, and the cost follows what the caller consumes.
        """
        after = (since_step, -1)
        page = 4
        while True:
            got = self.scan_index(index, since_step=after[0], limit=page, after_ino=after[1])
            yield from got
            if len(got) < page:
                return
            after = got[-1]
            page = min(page * 4, 1024)

    # -------------------------------------------------------------- content

    def block_map(self, ino: int) -> dict[int, bytes]:
        """All block references of a regular file, by block index."""
        return self._read(self._block_map, ino)

    def _block_map(self, txn, ino: int) -> dict[int, bytes]:
        out = {}
        prefix = self._key(ino)
        cur = txn.cursor(db=self.db["block"])
        if cur.set_range(prefix):
            for key, val in cur:
                if key[:12] != prefix:
                    break
                out[_U64.unpack(key[12:])[0]] = bytes(val)
        return out

    def read_block(self, ref: bytes, offset: int = 0, length: int = 1 << 62) -> bytes:
        """Bytes of one stored block, verified against its digest."""
        return self.content.read(self.txn, ref, offset, length)

    def file_hash(self, size: int, blocks: dict[int, bytes], ino: int | None = None) -> bytes:
        """The content hash of a file with these block references (see `filehash`);
        hot blocks (of inode `ino`) are read from its hot file and hashed."""
        cs = self.chunk_size
        digests = {}
        for i, r in blocks.items():
            if is_hot(r):
                n = min(cs, size - i * cs)
                if n <= 0:
                    continue
                data = self.hot.read(self.vol, ino, i * cs, n)
                if not content_all_zero(data):
                    digests[i] = chunk_hash(data)
            else:
                digests[i] = ref_digest(r)
        return filehash.file_hash(size, digests, cs)

    def hashed_inode(self, ino: int) -> tuple[Inode, bytes] | None:
        """(inode, content hash) of a regular file from one read transaction,
        for a worker thread; None if it has hot blocks (the hot file belongs
        to the loop: hash it there, `file_hash`)."""
        with self.txn() as txn:
            inode = self._get_inode(txn, ino)
            blocks = self._block_map(txn, ino)
        if not inode.is_reg:
            raise errors.InvalidArgument("not a regular file")
        if any(is_hot(r) for r in blocks.values()):
            return None
        return inode, filehash.file_hash(inode.size, {i: ref_digest(r) for i, r in blocks.items()},
                                         self.chunk_size)

    def commit_content(
        self,
        inode: Inode,
        *,
        blocks: dict[int, bytes | bytearray | None] | None = None,
        drop_blocks_from: int | None = None,
        stamp_step: bool = True,
        hot: list[int] | None = None,
        settled: dict[int, tuple] | None = None,
        hot_after: bool | None = None,
    ) -> tuple[Inode, dict[int, bytes | None]]:
        """Commit new content and attributes of a regular file in one transaction.

        `blocks` maps block index -> new block bytes (None or all zeros make a
        hole); `drop_blocks_from` drops every block at or past that index
        (truncate). `hot` lists blocks whose bytes now live in the inode's hot
        file (their objects are released); `settled` maps hot blocks back to
        content: index -> (digest or None for a hole, size, small bytes or
        None, temporary chunk file or None), skipped for a block no longer hot.
        `hot_after` says whether the file keeps hot blocks (the `hotino`
        index). Returns the committed inode and the new block references by
        index (None for holes).
        """
        new_refs: dict[int, bytes | None] = {}
        freed: list[bytes] = []
        with self.txn(write=True) as txn:
            old = self._get_inode(txn, inode.ino)
            new = inode.copy()
            # Names are not content: link count comes from the store, whatever
            # the caller's copy says (an unlinked open file must stay unlinked).
            new.nlink = old.nlink
            new.nblocks = old.nblocks
            new.used = max(old.used, inode.used)  # opens are recorded apart (`mark_used`)
            if stamp_step:
                new.step = self._step(txn)
            if drop_blocks_from is not None:
                dropped, n = self._drop_blocks(txn, inode.ino, drop_blocks_from)
                freed += dropped
                new.nblocks -= n
            for idx, data in (blocks or {}).items():
                bkey = self._key(inode.ino) + _u64(idx)
                prev = txn.get(bkey, db=self.db["block"])
                prev = bytes(prev) if prev is not None else None
                ref = self.content.put(txn, data) if data else None
                if ref is None:
                    if prev is not None:
                        txn.delete(bkey, db=self.db["block"])
                else:
                    txn.put(bkey, ref, db=self.db["block"])
                new.nblocks += (ref is not None) - (prev is not None)
                if prev is not None:
                    digest = self.content.decref(txn, prev)
                    if digest is not None:
                        freed.append(digest)
                new_refs[idx] = ref
            for idx in hot or ():
                bkey = self._key(inode.ino) + _u64(idx)
                prev = txn.get(bkey, db=self.db["block"])
                prev = bytes(prev) if prev is not None else None
                txn.put(bkey, HOT_REF, db=self.db["block"])
                new.nblocks += prev is None
                if prev is not None:
                    digest = self.content.decref(txn, prev)
                    if digest is not None:
                        freed.append(digest)
            for idx, (digest, size, data, tmp) in (settled or {}).items():
                bkey = self._key(inode.ino) + _u64(idx)
                if txn.get(bkey, db=self.db["block"]) != HOT_REF:
                    if tmp is not None:
                        tmp.unlink(missing_ok=True)
                    continue  # truncated or rewritten meanwhile
                if digest is None:
                    txn.delete(bkey, db=self.db["block"])
                    new.nblocks -= 1
                    ref = None
                else:
                    ref = self.content.put_settled(txn, digest, size, data=data, tmp=tmp)
                    txn.put(bkey, ref, db=self.db["block"])
                new_refs[idx] = ref
            if hot_after is not None:
                if hot_after:
                    txn.put(self._key(inode.ino), b"", db=self.db["hotino"])
                else:
                    txn.delete(self._key(inode.ino), db=self.db["hotino"])
            new.inline = new.size <= self.inline_max
            self._reindex(txn, old, new)
            self._put_inode(txn, new)
        self._delete_unreferenced(freed)
        return new, new_refs

    def hot_inodes(self) -> list[int]:
        """Inodes of this volume that have hot blocks."""
        return self._inodes_in("hotino")

    def _inodes_in(self, table: str) -> list[int]:
        """Inode numbers of this volume in a (vol, ino) -> b"" table."""
        out = []
        with self.txn() as txn:
            cur = txn.cursor(db=self.db[table])
            if cur.set_range(self._vb):
                for k in cur.iternext(values=False):
                    if k[:4] != self._vb:
                        break
                    out.append(_VI.unpack(k)[1])
        return out

    def _drop_blocks(self, txn, ino: int, first: int) -> tuple[list[bytes], int]:
        """Drop blocks from index `first` on: (chunk digests freed, blocks dropped)."""
        freed = []
        n = 0
        prefix = self._key(ino)
        cur = txn.cursor(db=self.db["block"])
        if not cur.set_range(prefix + _u64(first)):
            return freed, n
        while cur.key()[:12] == prefix:
            digest = self.content.decref(txn, bytes(cur.value()))
            if digest is not None:
                freed.append(digest)
            n += 1
            if not cur.delete() or not cur.key():
                break
        return freed, n

    def _delete_block_records(self, txn, ino: int) -> None:
        """Delete an inode's block records; the caller handles the references."""
        prefix = self._key(ino)
        cur = txn.cursor(db=self.db["block"])
        if cur.set_range(prefix):
            while cur.key()[:12] == prefix:
                if not cur.delete() or not cur.key():
                    break

    def _delete_unreferenced(self, digests: list[bytes]) -> None:
        """Delete chunk files whose refcount is still zero (tombstones): at
        once in one-shot tools, after the next sync in the daemon."""
        if not digests:
            return
        if self.defer_deletes:
            self.durability.doom_chunks(digests)
            return
        with self.txn(write=True) as txn:
            self.content.delete_unreferenced(txn, digests)

    # ------------------------------------------------------------- freeing

    def free_inodes(self, inos: list[int]) -> None:
        """Free nameless, unused inodes and their content, in one transaction."""
        freed: list[bytes] = []
        self._hot_gone = []
        with self.txn(write=True) as txn:
            for ino in inos:
                freed += self._free_inode(txn, ino)
        for ino in self._hot_gone:
            self.hot.delete(self.vol, ino)
        self._delete_unreferenced(freed)

    def free_inode(self, ino: int) -> None:
        self.free_inodes([ino])

    def _free_inode(self, txn, ino: int) -> list[bytes]:
        key = self._key(ino)
        raw = txn.get(key, db=self.db["inode"])
        txn.delete(key, db=self.db["orphan"])
        inode = Inode.unpack(ino, raw) if raw is not None else None
        if inode is None or inode.nlink > 0:
            return []
        freed, _ = self._drop_blocks(txn, ino, 0)
        if txn.get(key, db=self.db["hotino"]) is not None:
            txn.delete(key, db=self.db["hotino"])
            self._hot_gone.append(ino)
        txn.delete(key, db=self.db["link"])
        held = self._drop_xattrs(txn, ino)  # counted as the orphan's since the last name went
        self._bump(txn, b"orphan_bytes", -(held + (inode.size if inode.is_reg else 0)))
        # Not marked for snapshots: it left the tree when its last name went.
        txn.delete(key, db=self.db["inode"])
        return freed

    def orphans(self) -> list[int]:
        """Nameless inodes of this volume waiting to be freed."""
        return self._inodes_in("orphan")

    # ------------------------------------------------------------ logs

    def removed_since(self, step: int, limit: int = 100_000) -> list[dict]:
        with self.txn() as txn:
            return self.logs.removed_since(txn, step, limit)

    def eviction_log(self, limit: int = 100) -> list[dict]:
        """The newest `limit` eviction records, oldest first."""
        with self.txn() as txn:
            return self.logs.newest(txn, limit)

    def eviction_page(self, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Eviction records (seq, JSON bytes) after `after_seq`, oldest first."""
        with self.txn() as txn:
            return self.logs.page(txn, after_seq, limit)

    def eviction_record(self, ino: int) -> dict | None:
        with self.txn() as txn:
            return self.logs.record_of(txn, ino)

    # ----------------------------------------------------------- maintenance

    def gc_chunks(self, min_temp_age_s: float = 60.0) -> dict[str, int]:
        """Delete chunk files no record references, tombstones and old temporaries.

        Only records made durable by a sync may lose their files: the daemon
        syncs before it calls this; one-shot tools sync here.
        """
        from .content import LOC_FILE, unpack_record

        if not self.defer_deletes:
            self.sync()

        removed = tomb = temps = 0
        with self.txn(write=True) as txn:
            db = self.db["content"]
            for digest in list(self.chunks.iter_all()):
                raw = txn.get(digest, db=db)
                if raw is None or unpack_record(raw)[0] == 0:
                    self.chunks.delete(digest)
                    removed += 1
            dead = [bytes(k) for k, v in txn.cursor(db=db)
                    if unpack_record(v)[0] == 0 and unpack_record(v)[2] == LOC_FILE]
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

    def content_refs(self) -> dict[bytes, tuple[int, int, int]]:
        """Every content record: digest -> (refcount, size, location)."""
        from .content import unpack_record

        with self.txn() as txn:
            return {bytes(k): unpack_record(v) for k, v in txn.cursor(db=self.db["content"])}

    def apply_refs(self, txn, deltas: Counter) -> list[bytes]:
        """Apply net content reference changes (for snapshots); chunk digests freed."""
        return self.content.apply(txn, deltas)
