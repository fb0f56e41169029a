"""`Snapshots`: take, list, retain, delete, diff, restore and copy out snapshots
of a volume, and the entry format of the `sver` table (see `vfsd.snapshots`
for the model and the tables)."""

from __future__ import annotations

import json
import re
import struct
import time
from collections import Counter
from dataclasses import dataclass

from vfsd import errors
from vfsd.store.content import is_hot
from vfsd.store.inode import INODE_SIZE, Inode
from vfsd.store.keys import dentry_key, inode_key
from vfsd.store.store import ROOT_INO, Store

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_VS = struct.Struct(">IQ")
_ENTRY_HEAD = struct.Struct(">BH")
_BLOCK = struct.Struct(">Q17s")
ENTRY_VERSION = 1
SGONE_MAX = 10_000

_ID = re.compile(r"s([1-9][0-9]{0,18})")


class SnapshotError(errors.StoreError):
    """A snapshot request that cannot be done; the message says why."""


class SnapshotNotFound(SnapshotError):
    errno = 2  # ENOENT


class FilesOpenForWriting(SnapshotError):
    """A restore would change files that processes hold open for writing."""

    errno = 16  # EBUSY


def snapshot_id(seq: int) -> str:
    return f"s{seq}"


def parse_id(text: str) -> int:
    """The seq of a snapshot id ("s12"); SnapshotError if it is not one."""
    m = _ID.fullmatch(text) if isinstance(text, str) else None
    if m is None or int(m[1]) >= 1 << 63:
        shown = text if isinstance(text, str) and len(text) <= 40 else repr(text)[:40]
        raise SnapshotError(f"{shown!r} is not a snapshot id (ids look like s12)")
    return int(m[1])


# --------------------------------------------------------------- entries


@dataclass
class InodeEntry:
    """An inode as a snapshot recorded it."""

    inode: Inode
    parent: int
    name: bytes
    blocks: dict[int, bytes]
    target: bytes
    xattrs: list[tuple[bytes, bytes]]


def pack_inode_entry(e: InodeEntry) -> bytes:
    # The step of last use is left out (zero): it is no change of the tree, so
    # reading files makes no snapshot work (`Store.mark_used`).
    out = [_ENTRY_HEAD.pack(ENTRY_VERSION, INODE_SIZE), e.inode.pack()[:-8] + bytes(8),
           _U64.pack(e.parent), bytes((len(e.name),)), e.name,
           _U32.pack(len(e.blocks))]
    out += [_BLOCK.pack(idx, ref) for idx, ref in sorted(e.blocks.items())]
    out.append(struct.pack(">H", len(e.target)))
    out.append(e.target)
    out.append(struct.pack(">H", len(e.xattrs)))
    for name, value in e.xattrs:
        out += [bytes((len(name),)), name, _U32.pack(len(value)), value]
    return b"".join(out)


def unpack_inode_entry(ino: int, raw: bytes) -> InodeEntry:
    try:
        version, isize = _ENTRY_HEAD.unpack_from(raw)
        if version != ENTRY_VERSION:
            raise errors.Corrupt(f"snapshot entry of inode {ino}: version {version}")
        pos = _ENTRY_HEAD.size
        inode = Inode.unpack(ino, raw[pos:pos + isize])
        pos += isize
        parent = _U64.unpack_from(raw, pos)[0]
        nlen = raw[pos + 8]
        name = bytes(raw[pos + 9:pos + 9 + nlen])
        pos += 9 + nlen
        nblocks = _U32.unpack_from(raw, pos)[0]
        pos += 4
        blocks = {}
        for _ in range(nblocks):
            idx, ref = _BLOCK.unpack_from(raw, pos)
            blocks[idx] = ref
            pos += _BLOCK.size
        tlen = struct.unpack_from(">H", raw, pos)[0]
        target = bytes(raw[pos + 2:pos + 2 + tlen])
        pos += 2 + tlen
        nx = struct.unpack_from(">H", raw, pos)[0]
        pos += 2
        xattrs = []
        for _ in range(nx):
            klen = raw[pos]
            key = bytes(raw[pos + 1:pos + 1 + klen])
            pos += 1 + klen
            vlen = _U32.unpack_from(raw, pos)[0]
            xattrs.append((key, bytes(raw[pos + 4:pos + 4 + vlen])))
            pos += 4 + vlen
    except (struct.error, IndexError):
        raise errors.Corrupt(f"snapshot entry of inode {ino} does not decode") from None
    return InodeEntry(inode, parent, name, blocks, target, xattrs)


def put_inode_entry(txn, dest: Store, ino: int, value: bytes, refs: Counter) -> None:
    """Make inode entry `value` a live inode of `dest`'s volume (a fork, a
    resume): blocks, link target, xattrs, indexes; the references its blocks
    take are added to `refs`. An inode already there (the root a new volume
    starts with) is replaced."""
    e = unpack_inode_entry(ino, value)
    inode = e.inode
    inode.vol = dest.vol
    key = dest._key(ino)
    for idx, ref in e.blocks.items():
        txn.put(key + _U64.pack(idx), ref, db=dest.db["block"])
        refs[ref] += 1
    if e.target:
        txn.put(key, e.target, db=dest.db["link"])
    for name, val in e.xattrs:
        txn.put(key + name, val, db=dest.db["xattr"])
        dest._bump(txn, b"xattr_bytes", len(name) + len(val))
    raw = txn.get(key, db=dest.db["inode"])
    dest._reindex(txn, Inode.unpack(ino, raw) if raw is not None else None, inode)
    dest._put_inode(txn, inode)


def entry_bytes(okey: bytes, value: bytes) -> int:
    """The file bytes an entry records: a regular file's size, else 0."""
    if not value or okey[:1] != b"i":
        return 0
    _version, isize = _ENTRY_HEAD.unpack_from(value)
    inode = Inode.unpack(_U64.unpack(okey[1:9])[0],
                         value[_ENTRY_HEAD.size:_ENTRY_HEAD.size + isize])
    return inode.size if inode.is_reg else 0


def entry_refs(okey: bytes, value: bytes) -> list[bytes]:
    """Content references an entry holds."""
    if not value or okey[:1] != b"i":
        return []
    return list(unpack_inode_entry(_U64.unpack(okey[1:9])[0], value).blocks.values())


def drop_volume(store: Store, name: str) -> None:
    """Delete volume `name` of `store` with its snapshots, releasing their content."""
    store.drop_volume(name, entry_refs)


def drop_volume_in_steps(store: Store, name: str):
    """`drop_volume` in short transactions (a generator, see `Store.drop_volume_in_steps`)."""
    return store.drop_volume_in_steps(name, entry_refs)


def finish_drops_in_steps(store: Store):
    """Finish every drop a crash cut short (a generator)."""
    for vol in store.pending_drops():
        yield from store.finish_drop_in_steps(vol, entry_refs)


def clear_volume(store: Store) -> None:
    """Empty the volume of `store` (no root, no snapshots), keeping the volume itself."""
    store.clear_volume(entry_refs)


def okey_len(buf: bytes, pos: int) -> int:
    """Length of the object key starting at `pos`."""
    if buf[pos:pos + 1] == b"i":
        return 9
    return 10 + buf[pos + 9]


# ------------------------------------------------------------- snapshots


class Snapshots:
    """The snapshots of the store's volume."""

    def __init__(self, store: Store, *, keep_last: int = 32, keep_steps: int = 20,
                 keep_bytes: int | None = None) -> None:
        if keep_last < 0:
            raise ValueError("keep_last must be at least 0 (0: no count rule)")
        self.store = store
        self.db = store.db
        self.keep_last = keep_last
        self.keep_steps = keep_steps
        #: bound on the file bytes the snapshots record (`bytes`); None: none
        self.keep_bytes = keep_bytes
        #: what the byte budget deleted in the last `apply_retention`
        self.budget_deleted: list[str] = []
        #: seqs that must survive retention for now (a fork reading them)
        self.held: Counter = Counter()

    @property
    def _vb(self) -> bytes:
        return _U32.pack(self.store.vol)

    def _meta(self, txn, key: bytes) -> int:
        raw = txn.get(self.store._vp + key, db=self.db["meta"])
        return _U64.unpack(raw)[0] if raw is not None else 0

    def _set_meta(self, txn, key: bytes, value: int) -> None:
        txn.put(self.store._vp + key, _U64.pack(value), db=self.db["meta"])

    # ------------------------------------------------------ live objects

    def live_value(self, txn, okey: bytes, *, allow_hot: bool = False) -> bytes:
        """The entry value of a live object (b"" when it does not exist).

        Hot blocks (not content objects) make it an error unless `allow_hot`
        (a diff may compare them: they differ from any snapshot's)."""
        st = self.store
        if okey[:1] == b"d":
            parent = _U64.unpack(okey[1:9])[0]
            name = okey[10:]
            raw = txn.get(st._key(parent) + name, db=self.db["dentry"])
            return bytes(raw[:8]) if raw is not None else b""
        ino = _U64.unpack(okey[1:9])[0]
        raw = txn.get(st._key(ino), db=self.db["inode"])
        if raw is None:
            return b""
        inode = Inode.unpack(ino, raw)
        if inode.nlink == 0 and ino != ROOT_INO:
            return b""  # an orphan: unreachable, so not part of the tree
        up = st._parent_of(txn, ino) or (0, b"")
        target = txn.get(st._key(ino), db=self.db["link"])
        blocks = st._block_map(txn, ino) if inode.is_reg else {}
        if not allow_hot and any(is_hot(r) for r in blocks.values()):
            # Entries name content objects only: the caller settles hot blocks first.
            raise errors.StoreError(f"inode {ino} has hot blocks: settle them first")
        return pack_inode_entry(InodeEntry(
            inode, up[0], up[1], blocks,
            bytes(target) if target is not None else b"", st._xattrs_of(txn, ino)))

    def _live_okeys(self, txn, after: tuple[str, bytes] | None = None):
        """Every object of the live tree (for the first snapshot), in table
        order; `after` = (table, key) resumes after that key."""
        for table, make in (("inode", lambda k: inode_key(_U64.unpack(k[4:12])[0])),
                            ("dentry", lambda k: dentry_key(_U64.unpack(k[4:12])[0],
                                                            bytes(k[12:])))):
            if after is not None and after[0] == "dentry" and table == "inode":
                continue
            cur = txn.cursor(db=self.db[table])
            start = after[1] if after is not None and after[0] == table else self._vb
            if not cur.set_range(start):
                continue
            if after is not None and after[0] == table and cur.key() == after[1]:
                if not cur.next():
                    continue
            for k in cur.iternext(values=False):
                if k[:4] != self._vb:
                    break
                yield table, bytes(k), make(k)

    # -------------------------------------------- a first snapshot, in steps

    # The first snapshot records the whole tree. On a large tree that is
    # seconds of work, which must not stall the FUSE loop: it is read from
    # one read-only view (a consistent moment) in a worker thread, written
    # in short transactions, and published last. Changes made meanwhile are
    # tracked from the moment of the view on, for the next snapshot; content
    # the view names stays alive (`ContentStore` hold) until its entries
    # hold their own references.

    def first_begin(self):
        """Start tracking and open the view (on the loop); the view's txn."""
        st = self.store
        with st.txn(write=True) as txn:
            if self._meta(txn, b"snap_seq"):
                raise SnapshotError("the volume already has snapshots")
            freed = self._drop_stale_entries(txn)
            self._clear_dirty(txn)
            st.set_base(txn)
        st._delete_unreferenced(freed)
        st.forget_marks()
        st.tracking = True
        st.base_set()  # the first change from here on says so (`base_changed`)
        st.content.holding += 1
        return st.env.begin()

    def _drop_stale_entries(self, txn) -> list[bytes]:
        """Entries of a first snapshot that a crash interrupted: nobody reads
        them. Returns the chunks only they held."""
        refs: Counter = Counter()
        vb = self._vb
        cur = txn.cursor(db=self.db["sver"])
        if cur.set_range(vb):
            while cur.key()[:4] == vb:
                for ref in entry_refs(bytes(cur.key()[4:-8]), bytes(cur.value())):
                    refs[ref] -= 1
                if not cur.delete() or not cur.key():
                    break
        cur = txn.cursor(db=self.db["sgen"])
        if cur.set_range(vb):
            while cur.key()[:4] == vb:
                if not cur.delete() or not cur.key():
                    break
        self._set_meta(txn, b"snap_bytes", 0)
        return self.store.content.apply(txn, refs)

    def first_read(self, view, after, limit: int):
        """Up to `limit` (okey, value) of the view, and where to resume (None:
        done). Safe in a worker thread (the view is used by one thread at a time)."""
        out = []
        last = None
        for table, key, okey in self._live_okeys(view, after):
            value = self.live_value(view, okey)
            if value:
                out.append((okey, value))
            last = (table, key)
            if len(out) >= limit:
                return out, last
        return out, None

    def first_write(self, items: list[tuple[bytes, bytes]]) -> None:
        """Write a batch of the first snapshot's entries (on the loop)."""
        st = self.store
        refs: Counter = Counter()
        with st.txn(write=True) as txn:
            for okey, value in items:
                self._put_entry(txn, okey, 1, value, refs)
            st.apply_refs(txn, refs)

    def first_finish(self, view, *, written: int, pinned: bool, label: str) -> dict:
        """Publish the first snapshot (on the loop); its record."""
        st = self.store
        view.abort()
        with st.txn(write=True) as txn:
            record = {"seq": 1, "id": snapshot_id(1), "step": st._step(txn),
                      "created_ns": time.time_ns(), "pinned": bool(pinned), "label": label,
                      "parent": 0, "entries": written, "run": self._run(txn)}
            txn.put(self._vb + _U64.pack(1), json.dumps(record).encode(), db=self.db["snap"])
            self._set_meta(txn, b"snap_seq", 1)
            self._set_meta(txn, b"snap_base", 1)
        st.content.release_hold(st.txn)
        return record

    def first_abort(self, view) -> None:
        """A first snapshot that failed half way: nothing of it is visible."""
        st = self.store
        view.abort()
        st.tracking = False
        st.content.release_hold(st.txn)

    # ----------------------------------------------------------- versions

    def _sver_key(self, okey: bytes, seq: int) -> bytes:
        return self._vb + okey + _U64.pack(seq)

    def value_at(self, txn, okey: bytes, seq: int) -> tuple[int, bytes] | None:
        """(entry seq, value) of the object's newest entry at or before `seq`."""
        prefix = self._vb + okey
        cur = txn.cursor(db=self.db["sver"])
        if cur.set_range(prefix + _U64.pack(min(seq + 1, (1 << 64) - 1))):
            if not cur.prev():
                return None
        elif not cur.last():
            return None
        key = cur.key()
        if len(key) != len(prefix) + 8 or key[:-8] != prefix:
            return None
        return _U64.unpack(key[-8:])[0], bytes(cur.value())

    def _entry_before(self, txn, okey: bytes, seq: int) -> tuple[int, bytes] | None:
        return self.value_at(txn, okey, seq - 1) if seq > 0 else None

    def _retained_in(self, txn, lo: int, hi: int | None) -> bool:
        """True if a retained snapshot (or a held one) has lo <= seq < hi."""
        if any(lo <= s and (hi is None or s < hi) for s in self.held):
            return True
        cur = txn.cursor(db=self.db["snap"])
        if not cur.set_range(self._vb + _U64.pack(lo)):
            return False
        vol, s = _VS.unpack(cur.key())
        return vol == self.store.vol and (hi is None or s < hi)

    def _put_entry(self, txn, okey: bytes, seq: int, value: bytes, refs: Counter) -> None:
        txn.put(self._sver_key(okey, seq), value, db=self.db["sver"])
        txn.put(self._vb + _U64.pack(seq) + okey, b"", db=self.db["sgen"])
        for ref in entry_refs(okey, value):
            refs[ref] += 1
        self._count_bytes(txn, entry_bytes(okey, value))

    def _drop_entry(self, txn, okey: bytes, seq: int, value: bytes, refs: Counter) -> None:
        txn.delete(self._sver_key(okey, seq), db=self.db["sver"])
        txn.delete(self._vb + _U64.pack(seq) + okey, db=self.db["sgen"])
        for ref in entry_refs(okey, value):
            refs[ref] -= 1
        self._count_bytes(txn, -entry_bytes(okey, value))

    def _count_bytes(self, txn, delta: int) -> None:
        if delta:
            self._set_meta(txn, b"snap_bytes", max(0, self._meta(txn, b"snap_bytes") + delta))

    def _next_entry_seq(self, txn, okey: bytes, seq: int) -> int | None:
        prefix = self._vb + okey
        cur = txn.cursor(db=self.db["sver"])
        if not cur.set_range(prefix + _U64.pack(seq + 1)):
            return None
        key = cur.key()
        if len(key) != len(prefix) + 8 or key[:-8] != prefix:
            return None
        return _U64.unpack(key[-8:])[0]

    # ------------------------------------------------------------ create

    def create(self, *, pinned: bool = False, label: str = "") -> dict:
        """Take a snapshot of the live tree; its record.

        The caller has committed every buffered write first (open files).
        """
        if not isinstance(label, str) or len(label) > 200:
            raise SnapshotError("a snapshot label is a string of at most 200 characters")
        st = self.store
        t0 = time.perf_counter()
        refs: Counter = Counter()
        written = 0
        with st.txn(write=True) as txn:
            last = self._meta(txn, b"snap_seq")
            seq = last + 1
            if last == 0:
                okeys = [okey for _, _, okey in self._live_okeys(txn)]
                st.tracking = True
            else:
                okeys = self._dirty_okeys(txn)
            for okey in okeys:
                written += self._record(txn, okey, seq, refs)
            self._clear_dirty(txn)
            record = self._write_record(txn, seq, pinned, label, written)
            freed = st.apply_refs(txn, refs)
            st.set_base(txn)
        st.forget_marks()
        st.base_set()
        st._delete_unreferenced(freed)
        record["duration_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        return record

    # ------------------------------------------------- long changes in steps

    # A snapshot of many changed objects, or a restore of many, is seconds of
    # work. In one write transaction it would hold every other volume of the
    # store (a shard's other threads) for as long. Both are also made in steps
    # instead, each a short transaction, while the caller holds the volume
    # (`volume.Volume.hold`: its own requests wait, so the tree does not change
    # under the steps) and yields to the loop between them. A meta key says one
    # is under way (`snap_pending`, `restore_pending`: the seq); a volume found
    # with one after a crash finishes it before it serves anything
    # (`interrupted`), so a crash still leaves the state before or after.

    #: seconds of work per transaction of a change made in steps
    STEP_BUDGET_S = 0.005

    def dirty_count(self) -> int:
        """How many objects the next snapshot records at most (changed since the last)."""
        with self.store.txn() as txn:
            return len(self._dirty_okeys(txn))

    def create_in_steps(self, *, pinned: bool = False, label: str = ""):
        """`create`, one short transaction per step: a generator that yields
        between transactions and returns the record (StopIteration.value).
        Not for a first snapshot (`first_begin`)."""
        if not isinstance(label, str) or len(label) > 200:
            raise SnapshotError("a snapshot label is a string of at most 200 characters")
        st = self.store
        t0 = time.perf_counter()
        with st.txn(write=True) as txn:
            last = self._meta(txn, b"snap_seq")
            if last == 0:
                raise SnapshotError("the first snapshot records the whole tree: use create")
            seq = last + 1
            self._set_meta(txn, b"snap_pending", seq)
        written = yield from self._record_dirty(seq)
        record = self._publish(seq, pinned, label, written)
        record["duration_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        record["in_steps"] = True
        return record

    def _record_dirty(self, seq: int):
        """Record every object changed since the last snapshot at `seq`, a
        transaction per step; returns how many entries were written."""
        st = self.store
        with st.txn() as txn:
            okeys = self._dirty_okeys(txn)
        written = 0
        i = 0
        while i < len(okeys):
            deadline = time.perf_counter() + self.STEP_BUDGET_S
            refs: Counter = Counter()
            with st.txn(write=True) as txn:
                while i < len(okeys):
                    okey = okeys[i]
                    written += self._record(txn, okey, seq, refs)
                    txn.delete(self._vb + okey, db=self.db["sdirty"])
                    i += 1
                    if time.perf_counter() > deadline:
                        break
                freed = st.apply_refs(txn, refs)
            st._delete_unreferenced(freed)
            yield i, len(okeys)
        return written

    def _write_record(self, txn, seq: int, pinned: bool, label: str, written: int) -> dict:
        """Snapshot `seq`'s record, written in `txn`, and the volume's newest
        snapshot and base set to it."""
        record = {"seq": seq, "id": snapshot_id(seq), "step": self.store._step(txn),
                  "created_ns": time.time_ns(), "pinned": bool(pinned), "label": label,
                  "parent": self._meta(txn, b"snap_base"), "entries": written,
                  "run": self._run(txn)}
        txn.put(self._vb + _U64.pack(seq), json.dumps(record).encode(), db=self.db["snap"])
        self._set_meta(txn, b"snap_seq", seq)
        self._set_meta(txn, b"snap_base", seq)
        return record

    def _publish(self, seq: int, pinned: bool, label: str, written: int) -> dict:
        """The last step of a snapshot made in steps: its record, visible."""
        st = self.store
        with st.txn(write=True) as txn:
            record = self._write_record(txn, seq, pinned, label, written)
            txn.delete(self.store._vp + b"snap_pending", db=self.db["meta"])
            st.set_base(txn)
        st.forget_marks()
        st.base_set()
        return record

    def restore_plan(self, ident: str) -> dict:
        """What `restore_in_steps(plan)` changes: the objects changed since the
        snapshot and their states there (reads only; fine in a worker thread)."""
        seq = parse_id(ident)
        with self.store.txn() as txn:
            rec = self._get(txn, seq)
            okeys = self.changed_since(txn, seq)
            targets = {}
            for okey in okeys:
                got = self.value_at(txn, okey, seq)
                targets[okey] = got[1] if got else b""
        return {"seq": seq, "record": rec, "targets": targets}

    def restore_in_steps(self, plan: dict):
        """`restore`, one short transaction per step (a generator like
        `create_in_steps`, returning what `restore` returns). `plan` comes from
        `restore_plan`, made with the volume held and nothing changed since."""
        st = self.store
        t0 = time.perf_counter()
        seq, rec, targets = plan["seq"], plan["record"], plan["targets"]
        dentries = [k for k in targets if k[:1] == b"d"]
        inodes = [k for k in targets if k[:1] == b"i"]
        touched_dentries: list[tuple[int, bytes]] = []
        touched_inodes: list[int] = []
        kernel_names: dict[tuple[int, bytes], None] = {}
        unlinked: list[int] = []
        self.hot_reset = []
        with st.txn(write=True) as txn:
            self._set_meta(txn, b"restore_pending", seq)

        def drop_names(txn, okey) -> None:
            # Names that must go or change first, so inodes can be set freely.
            parent, name = _U64.unpack(okey[1:9])[0], okey[10:]
            current = self.live_value(txn, okey)
            if current != targets[okey] and current:
                st._del_entry(txn, parent, name)
                touched_dentries.append((parent, name))

        def set_inode(txn, okey) -> list[bytes]:
            ino = _U64.unpack(okey[1:9])[0]
            target = targets[okey]
            if self.live_value(txn, okey) == target:
                return []
            # Under the writeback cache the kernel keeps its own size of a file
            # it has in memory: only dropping every name of a changed inode
            # makes it look the inode up afresh.
            kernel_names.update(dict.fromkeys(st._names_of(txn, ino)))
            freed = self._set_live_inode(txn, ino, target, unlinked)
            touched_inodes.append(ino)
            if target:  # an evicted file among them is back: its record says so
                st.logs.mark_restored(txn, ino, unpack_inode_entry(ino, target).inode.gen,
                                      rec["step"], snapshot_id(seq))
            return freed

        def add_names(txn, okey) -> None:
            parent, name = _U64.unpack(okey[1:9])[0], okey[10:]
            target = targets[okey]
            if target and self.live_value(txn, okey) != target:
                st._add_entry(txn, parent, name, _U64.unpack(target)[0])
                touched_dentries.append((parent, name))

        for okeys, apply in ((dentries, drop_names), (inodes, set_inode),
                             (dentries, add_names)):
            i = 0
            while i < len(okeys):
                deadline = time.perf_counter() + self.STEP_BUDGET_S
                freed: list[bytes] = []
                with st.txn(write=True) as txn, st.batched_counters(txn):
                    while i < len(okeys):
                        freed += apply(txn, okeys[i]) or []
                        i += 1
                        if time.perf_counter() > deadline:
                            break
                st._delete_unreferenced(freed)
                yield i, len(okeys)
        with st.txn(write=True) as txn:
            kernel_names.update(dict.fromkeys(touched_dentries))
            for ino in touched_inodes:
                kernel_names.update(dict.fromkeys(st._names_of(txn, ino)))
            txn.put(st._vp + b"step", _U64.pack(rec["step"]), db=self.db["meta"])
            self._set_meta(txn, b"snap_base", seq)
            txn.delete(st._vp + b"restore_pending", db=self.db["meta"])
            st.set_base(txn)
        st.base_set()
        for ino in self.hot_reset:
            st.hot.delete(st.vol, ino)
        return {"id": snapshot_id(seq), "step": rec["step"], "dentries": list(kernel_names),
                "inodes": touched_inodes, "unlinked": unlinked,
                "changed": len(touched_inodes) + len(set(touched_dentries)),
                "duration_ms": round((time.perf_counter() - t0) * 1000, 3), "in_steps": True}

    def interrupted(self) -> tuple[str, int] | None:
        """("snapshot" | "restore", seq) of a change in steps a crash cut short, or None."""
        with self.store.txn() as txn:
            for kind, key in (("snapshot", b"snap_pending"), ("restore", b"restore_pending")):
                seq = self._meta(txn, key)
                if seq:
                    return kind, seq
        return None

    def finish_interrupted(self):
        """Finish what `interrupted` names (a generator, as the steps are)."""
        found = self.interrupted()
        if found is None:
            return None
        kind, seq = found
        if kind == "snapshot":
            written = yield from self._record_dirty(seq)
            return self._publish(seq, False, "finished after a crash", written)
        return (yield from self.restore_in_steps(self.restore_plan(snapshot_id(seq))))

    def _run(self, txn) -> str:
        raw = txn.get(self.store._vp + b"run", db=self.db["meta"])
        return bytes(raw).decode() if raw is not None else ""

    def _dirty_okeys(self, txn) -> list[bytes]:
        out = []
        vb = self._vb
        cur = txn.cursor(db=self.db["sdirty"])
        if cur.set_range(vb):
            for k in cur.iternext(values=False):
                if k[:4] != vb:
                    break
                out.append(bytes(k[4:]))
        return out

    def _clear_dirty(self, txn) -> None:
        vb = self._vb
        cur = txn.cursor(db=self.db["sdirty"])
        if cur.set_range(vb):
            while cur.key()[:4] == vb:
                if not cur.delete() or not cur.key():
                    break

    def _record(self, txn, okey: bytes, seq: int, refs: Counter) -> int:
        """Write the entry of one changed object at `seq`; 1 if written."""
        value = self.live_value(txn, okey)
        prev = self.value_at(txn, okey, seq)
        if prev is not None and prev[1] == value:
            return 0  # changed and changed back
        if prev is None and not value:
            return 0  # created and gone between two snapshots
        if prev is not None and not self._retained_in(txn, prev[0], seq):
            self._drop_entry(txn, okey, prev[0], prev[1], refs)
            if not value and self.value_at(txn, okey, seq) is None:
                return 0  # nothing older remains: a tombstone would say nothing
        self._put_entry(txn, okey, seq, value, refs)
        return 1

    # ------------------------------------------------------------ listing

    def list(self) -> list[dict]:
        """Retained snapshots, oldest first."""
        out = []
        with self.store.txn() as txn:
            cur = txn.cursor(db=self.db["snap"])
            if cur.set_range(self._vb):
                for k, v in cur:
                    if k[:4] != self._vb:
                        break
                    out.append(json.loads(bytes(v)))
        return out

    def count_and_newest(self) -> tuple[int, dict | None]:
        """How many snapshots are retained, and the newest one's record (None:
        none): the keys alone are counted, one record is decoded."""
        count, newest, vb = 0, None, self._vb
        with self.store.txn() as txn:
            cur = txn.cursor(db=self.db["snap"])
            if cur.set_range(vb):
                for k in cur.iternext(keys=True, values=False):
                    if k[:4] != vb:
                        break
                    count += 1
                    newest = bytes(k)
            if newest is not None:
                newest = json.loads(bytes(txn.get(newest, db=self.db["snap"])))
        return count, newest

    def get(self, ident: str) -> dict:
        seq = parse_id(ident)
        with self.store.txn() as txn:
            return self._get(txn, seq)

    def _get(self, txn, seq: int) -> dict:
        raw = txn.get(self._vb + _U64.pack(seq), db=self.db["snap"])
        if raw is None:
            gone = txn.get(self._vb + _U64.pack(seq), db=self.db["sgone"])
            if gone is not None:
                g = json.loads(bytes(gone))
                raise SnapshotNotFound(
                    f"snapshot {snapshot_id(seq)} was deleted at step {g['deleted_step']} "
                    f"({g['reason']}); its files are no longer kept")
            raise SnapshotNotFound(f"no snapshot {snapshot_id(seq)}")
        return json.loads(bytes(raw))

    def state(self) -> dict:
        """Which snapshot the live tree comes from, and whether it changed since."""
        with self.store.txn() as txn:
            base = self._meta(txn, b"snap_base")
            last = self._meta(txn, b"snap_seq")
            changed = self._meta(txn, b"base_changed")
            recorded = self._meta(txn, b"snap_bytes")
        return {"base": snapshot_id(base) if base else None,
                "last": snapshot_id(last) if last else None,
                "changed": bool(changed) or not base,
                "bytes": recorded}

    # ---------------------------------------------------------- retention

    def set_pinned(self, ident: str, pinned: bool) -> dict:
        seq = parse_id(ident)
        with self.store.txn(write=True) as txn:
            rec = self._get(txn, seq)
            rec["pinned"] = bool(pinned)
            txn.put(self._vb + _U64.pack(seq), json.dumps(rec).encode(), db=self.db["snap"])
        return rec

    def apply_retention(self) -> list[str]:
        """Delete snapshots that policy no longer keeps; their ids.

        The count rule (`keep_last`; 0: none) and the age rule (`keep_steps`;
        0: none) keep a snapshot if either does; pinned and held ones always
        stay. Then the byte budget (`keep_bytes`): while the file bytes the
        snapshots record exceed it, the oldest unpinned one goes, never the
        newest."""
        snaps = self.list()
        step = self.store.get_step()
        if self.keep_last or self.keep_steps:
            keep = {s["seq"] for s in snaps[-self.keep_last:]} if self.keep_last else set()
            doomed = [s["seq"] for s in snaps
                      if s["seq"] not in keep and not s["pinned"] and not self.held[s["seq"]]
                      and not (self.keep_steps and step - s["step"] < self.keep_steps)]
        else:
            doomed = []
        for seq in doomed:
            self._delete(seq, "retention")
        return [snapshot_id(s) for s in doomed] + self._apply_budget()

    def _apply_budget(self) -> list[str]:
        self.budget_deleted: list[str] = []
        if self.keep_bytes is None:
            return []
        gone = self.budget_deleted
        while self.store.meta_u64(b"snap_bytes") > self.keep_bytes:
            snaps = self.list()
            victims = [s for s in snaps[:-1] if not s["pinned"] and not self.held[s["seq"]]]
            if not victims:
                break
            self._delete(victims[0]["seq"],
                         f"byte budget (snapshot_keep_bytes {self.keep_bytes})")
            gone.append(snapshot_id(victims[0]["seq"]))
        return gone

    def delete(self, ident: str) -> dict:
        seq = parse_id(ident)
        if self.held[seq]:
            raise SnapshotError(f"snapshot {ident} is in use by a fork in progress")
        return self._delete(seq, "deleted by request")

    def _delete(self, seq: int, reason: str) -> dict:
        """Drop a snapshot and every entry only it needed (cost: what changed
        between it and the next retained snapshot)."""
        st = self.store
        refs: Counter = Counter()
        dropped = 0
        with st.txn(write=True) as txn:
            rec = self._get(txn, seq)
            txn.delete(self._vb + _U64.pack(seq), db=self.db["snap"])
            prev_kept = self._neighbor(txn, seq, before=True)
            next_kept = self._neighbor(txn, seq, before=False)
            last = self._meta(txn, b"snap_seq")
            hi = next_kept if next_kept is not None else last
            # An entry loses its last reader iff its window [p, n) held `seq`
            # and no other retained snapshot: p > prev_kept and n <= next_kept.
            # Every such n is the seq of an entry written in (seq, hi].
            for gseq, okey in self._written_between(txn, seq, hi):
                before = self._entry_before(txn, okey, gseq)
                if before is None or before[0] > seq or before[0] <= prev_kept:
                    continue
                if self._retained_in(txn, before[0], gseq):
                    continue
                self._drop_entry(txn, okey, before[0], before[1], refs)
                dropped += 1
                self._drop_lone_tombstone(txn, okey, gseq, refs)
            gone = {"seq": seq, "id": snapshot_id(seq), "step": rec["step"],
                    "deleted_step": st._step(txn), "reason": reason}
            txn.put(self._vb + _U64.pack(seq), json.dumps(gone).encode(), db=self.db["sgone"])
            self._trim_gone(txn)
            freed = st.apply_refs(txn, refs)
        st._delete_unreferenced(freed)
        return {**gone, "entries_dropped": dropped}

    def _drop_lone_tombstone(self, txn, okey: bytes, seq: int, refs: Counter) -> None:
        """An object's entry at `seq` that says "absent" with nothing before it
        tells no snapshot anything: drop it."""
        got = self.value_at(txn, okey, seq)
        if got is None or got[0] != seq or got[1]:
            return
        if self._entry_before(txn, okey, seq) is None:
            self._drop_entry(txn, okey, seq, b"", refs)

    def _neighbor(self, txn, seq: int, *, before: bool) -> int | None:
        """The retained (or held) snapshot just before `seq` (0 if none) or
        just after it (None if none)."""
        vol = self.store.vol
        cur = txn.cursor(db=self.db["snap"])
        found = None
        if before:
            ok = cur.prev() if cur.set_range(self._vb + _U64.pack(seq)) else cur.last()
            if ok:
                v, s = _VS.unpack(cur.key())
                if v == vol and s < seq:
                    found = s
            cands = [s for s in self.held if s < seq] + ([found] if found else [])
            return max(cands, default=0)
        if cur.set_range(self._vb + _U64.pack(seq + 1)):
            v, s = _VS.unpack(cur.key())
            if v == vol:
                found = s
        cands = [s for s in self.held if s > seq] + ([found] if found else [])
        return min(cands, default=None)

    def _written_between(self, txn, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """(seq, okey) of entries written by snapshots lo < seq <= hi."""
        out = []
        vb = self._vb
        cur = txn.cursor(db=self.db["sgen"])
        if cur.set_range(vb + _U64.pack(lo + 1)):
            for k in cur.iternext(values=False):
                if k[:4] != vb:
                    break
                s = _U64.unpack(k[4:12])[0]
                if s > hi:
                    break
                out.append((s, bytes(k[12:])))
        return out

    def _trim_gone(self, txn) -> None:
        vb = self._vb
        cur = txn.cursor(db=self.db["sgone"])
        n = 0
        if cur.set_range(vb):
            for k in cur.iternext(values=False):
                if k[:4] != vb:
                    break
                n += 1
        if n > SGONE_MAX and cur.set_range(vb):
            cur.delete()

    # -------------------------------------------------------- reading one

    def lookup(self, seq: int, parent: int, name: bytes) -> int | None:
        with self.store.txn() as txn:
            return self.lookup_in(txn, seq, parent, name)

    def lookup_in(self, txn, seq: int, parent: int, name: bytes) -> int | None:
        """`lookup` inside the caller's transaction."""
        got = self.value_at(txn, dentry_key(parent, name), seq)
        return _U64.unpack(got[1])[0] if got and got[1] else None

    def inode_at(self, seq: int, ino: int) -> InodeEntry | None:
        with self.store.txn() as txn:
            return self._inode_at(txn, seq, ino)

    def _inode_at(self, txn, seq: int, ino: int) -> InodeEntry | None:
        got = self.value_at(txn, inode_key(ino), seq)
        return unpack_inode_entry(ino, got[1]) if got and got[1] else None

    def readdir(self, seq: int, parent: int) -> list[tuple[bytes, int]]:
        """(name, child) of a directory at snapshot `seq`, in name order."""
        with self.store.txn() as txn:
            return self.readdir_in(txn, seq, parent)

    def readdir_in(self, txn, seq: int, parent: int) -> list[tuple[bytes, int]]:
        """`readdir` inside the caller's transaction."""
        out = []
        prefix = self._vb + b"d" + _U64.pack(parent)
        cur = txn.cursor(db=self.db["sver"])
        if not cur.set_range(prefix):
            return out
        best: tuple[bytes, bytes] | None = None  # (name, value) of the current name
        current = None
        for k, v in cur:
            if k[:len(prefix)] != prefix:
                break
            nlen = k[len(prefix)]
            name = bytes(k[len(prefix) + 1:len(prefix) + 1 + nlen])
            s = _U64.unpack(k[-8:])[0]
            if name != current:
                if best is not None and best[1]:
                    out.append((best[0], _U64.unpack(best[1])[0]))
                current, best = name, None
            if s <= seq:
                best = (name, bytes(v))
        if best is not None and best[1]:
            out.append((best[0], _U64.unpack(best[1])[0]))
        return out

    def path_at(self, txn, seq: int, ino: int) -> str | None:
        parts = []
        while ino != ROOT_INO:
            e = self._inode_at(txn, seq, ino)
            if e is None or not e.parent or len(parts) > 4096:
                return None
            parts.append(e.name)
            ino = e.parent
        return "/".join(p.decode(errors="surrogateescape") for p in reversed(parts))

    # ------------------------------------------------------ what changed

    def changed_since(self, txn, seq: int) -> list[bytes]:
        """Every object whose live state may differ from its state at `seq`."""
        last = self._meta(txn, b"snap_seq")
        okeys = {okey for _, okey in self._written_between(txn, seq, last)}
        okeys.update(self._dirty_okeys(txn))
        return sorted(okeys)

    def diff(self, a: str, b: str | None) -> list[dict]:
        """What differs between snapshot `a` and snapshot `b` (None: the live tree)."""
        sa = parse_id(a)
        sb = parse_id(b) if b is not None else None
        st = self.store
        out = []
        with st.txn() as txn:
            self._get(txn, sa)
            if sb is not None:
                self._get(txn, sb)
            lo, hi = (sa, sb) if sb is None or sa <= sb else (sb, sa)
            if sb is None:
                okeys = self.changed_since(txn, sa)
            else:
                okeys = sorted({k for _, k in self._written_between(txn, lo, hi)})
            for okey in okeys:
                if okey[:1] != b"i":
                    continue
                ino = _U64.unpack(okey[1:9])[0]
                old = self._inode_at(txn, sa, ino)
                if sb is None:
                    raw = self.live_value(txn, okey, allow_hot=True)
                    new = unpack_inode_entry(ino, raw) if raw else None
                    new_path = st._path_in(txn, ino) if new else None
                else:
                    new = self._inode_at(txn, sb, ino)
                    new_path = self.path_at(txn, sb, ino) if new else None
                old_path = self.path_at(txn, sa, ino) if old else None
                change = _classify(old, new, old_path, new_path)
                if change is None or ino == ROOT_INO:
                    continue
                e = new or old
                rec = {"path": new_path if new else old_path, "change": change, "ino": ino,
                       "type": _type_name(e.inode), "size": e.inode.size}
                if change == "renamed" or (old and new and old_path != new_path):
                    rec["old_path"] = old_path
                out.append(rec)
            # Names that came or went without their inode doing so (hard links).
            seen = {r["path"] for r in out} | {r.get("old_path") for r in out}
            for okey in okeys:
                if okey[:1] != b"d":
                    continue
                parent, name = _U64.unpack(okey[1:9])[0], okey[10:]
                before = self.value_at(txn, okey, sa)
                after = (self.live_value(txn, okey) if sb is None
                         else (self.value_at(txn, okey, sb) or (0, b""))[1])
                before = before[1] if before else b""
                if before == after:
                    continue
                for value, seq, change in ((before, sa, "removed"), (after, sb, "added")):
                    if not value:
                        continue
                    if seq is None:
                        dir_path = st._path_in(txn, parent) if parent != ROOT_INO else ""
                    else:
                        dir_path = self.path_at(txn, seq, parent) if parent != ROOT_INO else ""
                    if dir_path is None:
                        continue
                    nm = name.decode(errors="surrogateescape")
                    path = f"{dir_path}/{nm}" if dir_path else nm
                    if path in seen:
                        continue
                    seen.add(path)
                    ino = _U64.unpack(value)[0]
                    e = (self._inode_at(txn, seq, ino) if seq is not None else None)
                    out.append({"path": path, "change": change, "ino": ino,
                                "type": _type_name(e.inode) if e else "link",
                                "size": e.inode.size if e else 0})
        out.sort(key=lambda r: r["path"] or "")
        return out

    # ------------------------------------------------------------ restore

    def restore_changes(self, ident: str) -> set[int]:
        """The inodes `restore(ident)` would change (reads only: call it in the
        same loop turn as the restore, after buffered writes are committed)."""
        seq = parse_id(ident)
        out = set()
        with self.store.txn() as txn:
            self._get(txn, seq)
            for okey in self.changed_since(txn, seq):
                if okey[:1] != b"i":
                    continue
                got = self.value_at(txn, okey, seq)
                if self.live_value(txn, okey) != (got[1] if got else b""):
                    out.add(_U64.unpack(okey[1:9])[0])
        return out

    def restore(self, ident: str) -> dict:
        """Make the live tree exactly snapshot `ident`, in one transaction.

        Returns what the caller must tell the kernel and the open files:
        {"dentries": [(parent, name)], "inodes": [ino], "unlinked": [ino], ...}.
        The caller has committed every buffered write first.
        """
        seq = parse_id(ident)
        st = self.store
        t0 = time.perf_counter()
        touched_dentries: list[tuple[int, bytes]] = []
        touched_inodes: list[int] = []
        unlinked: list[int] = []
        freed: list[bytes] = []
        self.hot_reset: list[int] = []
        with st.txn(write=True) as txn, st.batched_counters(txn):
            rec = self._get(txn, seq)
            okeys = self.changed_since(txn, seq)
            targets = {}
            for okey in okeys:
                got = self.value_at(txn, okey, seq)
                targets[okey] = got[1] if got else b""
            dentries = [k for k in okeys if k[:1] == b"d"]
            inodes = [k for k in okeys if k[:1] == b"i"]
            # Under the writeback cache the kernel keeps its own size of a file
            # it has in memory: the only way to make it forget is to drop every
            # name of a changed inode, so it looks the inode up afresh.
            names_before = {ino: st._names_of(txn, ino)
                            for ino in (_U64.unpack(k[1:9])[0] for k in inodes)}
            # Names that must go or change first, so inodes can be set freely.
            for okey in dentries:
                parent, name = _U64.unpack(okey[1:9])[0], okey[10:]
                current = self.live_value(txn, okey)
                if current != targets[okey] and current:
                    st._del_entry(txn, parent, name)
                    touched_dentries.append((parent, name))
            for okey in inodes:
                ino = _U64.unpack(okey[1:9])[0]
                target = targets[okey]
                if self.live_value(txn, okey) == target:
                    continue
                freed += self._set_live_inode(txn, ino, target, unlinked)
                touched_inodes.append(ino)
                if target:  # an evicted file among them is back: its record says so
                    st.logs.mark_restored(txn, ino, unpack_inode_entry(ino, target).inode.gen,
                                          rec["step"], snapshot_id(seq))
            for okey in dentries:
                parent, name = _U64.unpack(okey[1:9])[0], okey[10:]
                target = targets[okey]
                if target and self.live_value(txn, okey) != target:
                    st._add_entry(txn, parent, name, _U64.unpack(target)[0])
                    if (parent, name) not in touched_dentries:
                        touched_dentries.append((parent, name))
            kernel_names = dict.fromkeys(touched_dentries)
            for ino in touched_inodes:
                kernel_names.update(dict.fromkeys(names_before[ino]))
                kernel_names.update(dict.fromkeys(st._names_of(txn, ino)))
            txn.put(st._vp + b"step", _U64.pack(rec["step"]), db=self.db["meta"])
            self._set_meta(txn, b"snap_base", seq)
            st.set_base(txn)
        st.base_set()
        st._delete_unreferenced(freed)
        for ino in self.hot_reset:
            st.hot.delete(st.vol, ino)
        return {"id": snapshot_id(seq), "step": rec["step"], "dentries": list(kernel_names),
                "inodes": touched_inodes, "unlinked": unlinked,
                "changed": len(touched_inodes) + len(touched_dentries),
                "duration_ms": round((time.perf_counter() - t0) * 1000, 3)}

    def _set_live_inode(self, txn, ino: int, target: bytes, unlinked: list[int]) -> list[bytes]:
        """Make the live inode what `target` says (b"": not in the tree)."""
        st = self.store
        key = st._key(ino)
        raw = txn.get(key, db=self.db["inode"])
        old = Inode.unpack(ino, raw) if raw is not None else None
        refs: Counter = Counter()
        if not target:
            if old is None or old.nlink == 0:
                return []
            new = old.copy()
            new.nlink = 0
            st._reindex(txn, old, new)
            st._put_inode(txn, new)
            txn.put(key, b"", db=self.db["orphan"])
            unlinked.append(ino)
            return []
        e = unpack_inode_entry(ino, target)
        if txn.get(key, db=self.db["hotino"]) is not None:
            # The hot file belongs to the content being replaced.
            txn.delete(key, db=self.db["hotino"])
            self.hot_reset.append(ino)
        new = e.inode
        new.vol = st.vol
        if old is not None and old.is_reg:
            for ref in st._block_map(txn, ino).values():
                refs[ref] -= 1
        st._delete_block_records(txn, ino)
        for idx, ref in e.blocks.items():
            txn.put(key + _U64.pack(idx), ref, db=self.db["block"])
            refs[ref] += 1
        if e.target:
            txn.put(key, e.target, db=self.db["link"])
        else:
            txn.delete(key, db=self.db["link"])
        dropped = st._drop_xattrs(txn, ino)
        if old is not None and old.nlink > 0:
            st._bump(txn, b"xattr_bytes", -dropped)
        elif old is not None:  # an orphan brought back: it stops counting as one
            st._bump(txn, b"orphan_bytes", -(dropped + (old.size if old.is_reg else 0)))
        for name, value in e.xattrs:
            txn.put(key + name, value, db=self.db["xattr"])
            if new.nlink > 0:
                st._bump(txn, b"xattr_bytes", len(name) + len(value))
        st._reindex(txn, old if old is not None and old.nlink > 0 else None, new)
        st._put_inode(txn, new)
        txn.delete(key, db=self.db["orphan"])
        return st.apply_refs(txn, refs)

    # --------------------------------------------------------------- fork

    def copy_into(self, seq: int, dest: Store, okeys: list[bytes], *, batch: int = 200):
        """Copy the objects `okeys` of snapshot `seq` into the empty volume `dest`
        (same store); `okeys` come from `_visible_okeys`.

        A generator: each step commits one batch, so a caller on the trio
        loop can yield between batches. The snapshot must be held (`held`)
        for the whole copy. Content is shared, never copied.
        """
        st = self.store
        with st.txn() as txn:
            next_ino = self._meta(txn, b"next_ino") or ROOT_INO + 1
        # Inodes first, so every entry added later names an existing inode.
        okeys = sorted(okeys, key=lambda k: (k[:1] != b"i", k))
        for start in range(0, len(okeys), batch):
            part = okeys[start:start + batch]
            with st.txn() as txn:
                values = [(k, self.value_at(txn, k, seq)) for k in part]
            with dest.txn(write=True) as txn, dest.batched_counters(txn):
                refs: Counter = Counter()
                for okey, got in values:
                    if not got or not got[1]:
                        continue
                    if okey[:1] == b"i":
                        put_inode_entry(txn, dest, _U64.unpack(okey[1:9])[0], got[1], refs)
                    else:
                        dest._add_entry(txn, _U64.unpack(okey[1:9])[0], okey[10:],
                                        _U64.unpack(got[1])[0])
                dest.apply_refs(txn, refs)
            yield min(start + batch, len(okeys)), len(okeys)
        with dest.txn(write=True) as txn:
            txn.put(dest._vp + b"next_ino", _U64.pack(next_ino), db=dest.db["meta"])

    #: the tables of a volume's snapshot history, and where each key holds its seq
    _HISTORY = {"snap": "head", "sgone": "head", "sgen": "head", "sver": "tail"}

    def copy_history(self, dest: Store, upto: int, *, batch: int = 500):
        """Copy this volume's snapshot history (records, deletion notes, version
        entries of every snapshot up to `upto`) into volume `dest` of the same
        store, which then has the same snapshots under the same ids (a copied
        thread). Each entry copied takes a reference on the content it names;
        no content is copied.

        A generator (one batch per step), like `copy_into`: the caller holds
        every retained snapshot (`held`) and takes no snapshot meanwhile.
        Run it after `copy_into` has made the live tree (snapshot `upto`).
        """
        st = self.store
        src, dst = self._vb, _U32.pack(dest.vol)
        for table, where in self._HISTORY.items():
            db = self.db[table]
            after = src
            while True:
                with st.txn() as txn:
                    rows = []
                    cur = txn.cursor(db=db)
                    found = cur.set_range(after)
                    while found and len(rows) < batch:
                        key = bytes(cur.key())
                        if key[:4] != src:
                            break
                        if key != after:
                            rows.append((key, bytes(cur.value())))
                        found = cur.next()
                if not rows:
                    break
                with dest.txn(write=True) as txn:
                    refs: Counter = Counter()
                    recorded = 0
                    for key, value in rows:
                        seq_raw = key[4:12] if where == "head" else key[-8:]
                        if _U64.unpack(seq_raw)[0] > upto:
                            continue
                        txn.put(dst + key[4:], value, db=db)
                        if table == "sver":
                            for ref in entry_refs(key[4:-8], value):
                                refs[ref] += 1
                            recorded += entry_bytes(key[4:-8], value)
                    dest.apply_refs(txn, refs)
                    if recorded:
                        key = dest._vp + b"snap_bytes"
                        raw = txn.get(key, db=self.db["meta"])
                        txn.put(key, _U64.pack((_U64.unpack(raw)[0] if raw else 0) + recorded),
                                db=self.db["meta"])
                after = rows[-1][0]
                yield table, len(rows)

    def _visible_okeys(self, txn, seq: int) -> list[bytes]:
        """Objects that exist at snapshot `seq`."""
        out = []
        vb = self._vb
        cur = txn.cursor(db=self.db["sver"])
        best: dict = {}
        if cur.set_range(vb):
            for k, v in cur:
                if k[:4] != vb:
                    break
                s = _U64.unpack(k[-8:])[0]
                if s <= seq:
                    best[bytes(k[4:-8])] = bool(len(v))
        out = [k for k, present in best.items() if present]
        return out

    # ------------------------------------------------------------- locate

    def locate(self, ino: int, gen: int, digest: bytes) -> dict | None:
        """A retained snapshot holding this exact version of inode `ino`:
        {"id", "path"}, newest first; None if no retained snapshot has it."""
        st = self.store
        prefix = self._vb + inode_key(ino)
        with st.txn() as txn:
            versions = []
            cur = txn.cursor(db=self.db["sver"])
            if cur.set_range(prefix):
                for k, v in cur:
                    if len(k) != len(prefix) + 8 or k[:-8] != prefix:
                        break
                    versions.append((_U64.unpack(k[-8:])[0], bytes(v)))
            for i in range(len(versions) - 1, -1, -1):
                seq, value = versions[i]
                if not value:
                    continue
                e = unpack_inode_entry(ino, value)
                if e.inode.gen != gen or st.file_hash(e.inode.size, e.blocks) != digest:
                    continue
                hi = versions[i + 1][0] if i + 1 < len(versions) else None
                for snap in self._retained_from(txn, seq, hi):
                    path = self.path_at(txn, snap, ino)
                    if path is not None:
                        return {"id": snapshot_id(snap), "path": path}
        return None

    def _retained_from(self, txn, lo: int, hi: int | None) -> list[int]:
        out = []
        cur = txn.cursor(db=self.db["snap"])
        if cur.set_range(self._vb + _U64.pack(lo)):
            for k in cur.iternext(values=False):
                vol, s = _VS.unpack(k)
                if vol != self.store.vol or (hi is not None and s >= hi):
                    break
                out.append(s)
        return out


def _type_name(inode: Inode) -> str:
    if inode.is_dir:
        return "dir"
    if inode.is_link:
        return "symlink"
    return "file" if inode.is_reg else "other"


def _classify(old: InodeEntry | None, new: InodeEntry | None,
              old_path: str | None, new_path: str | None) -> str | None:
    if old is None and new is None:
        return None
    if old is None:
        return "added"
    if new is None:
        return "removed"
    if old.blocks != new.blocks or old.inode.size != new.inode.size or old.target != new.target:
        return "modified"
    if old_path != new_path:
        return "renamed"
    a, b = old.inode, new.inode
    if (a.mode, a.uid, a.gid, a.mtime_ns, a.status, a.pinned) != \
            (b.mode, b.uid, b.gid, b.mtime_ns, b.status, b.pinned) or old.xattrs != new.xattrs:
        return "attributes"
    return None
