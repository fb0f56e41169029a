"""A volume's snapshot history made equal to its run's head (a shard thread's catch-up).

A shard replica's volume is a cache of a thread: before a run, its local
snapshots are made exactly the head's (`vfsd.remote`), whatever this replica
held before, so snapshot ids (`s<seq>`, named by checkpoints) mean the same
files on every replica:

- a local snapshot is *the head's* when the head lists its seq (not as
  `retired`) with the same step and creation time and the volume recorded
  it as published (or imported). Let P be the newest of those.
- local snapshots newer than P go, with every version entry newer than P
  (`truncate`): the unpublished tail of an earlier run (a crash, a lost
  lease) that no other replica will ever see. Their seqs are not reused here.
- older local snapshots the head no longer lists go as retention deletes
  them (`Snapshots.delete`): retention retired them elsewhere.
- head snapshots the volume lacks are imported from their manifests
  (`Importer`): metadata now, chunk files by reference ("remote-only",
  fetched on first read). One newer than everything local is appended; one
  between local snapshots is inserted so that every other retained
  snapshot keeps exactly the files it had.

Snapshot model (`vfsd.snapshots`): the state of object K at snapshot S is its
entry with the greatest seq <= S. Importing snapshot k with state W (from the
manifests) writes, for each object whose local state at k differs from
W[K], an entry (K, k) = W[K]; if a retained snapshot s > k comes before K's
next entry, an entry (K, s) = the old state keeps what s sees; an entry
left with no retained snapshot in its window is dropped; an object whose
newest entry changed is marked changed (`sdirty`), so a restore and the
next snapshot see it. Candidate objects: the manifest delta's plus the
objects with local entries between the delta's base (a snapshot known to be
the head's) and k, or, for a full manifest over existing history, every
object visible locally at k.

Every imported snapshot's whole tree is checked first (`resume.check_tree`),
and its manifest must say what the head says of it (step, creation time).

Work is cut in two: `plan` and `prepare` read (worker threads), the
generators `truncate`, `retire` and `apply` write one short transaction per
step on the caller's thread (the trio loop, the volume held), so other
volumes are served between them. A crash leaves either a snapshot whole or
absent: a snapshot's record is written in the last transaction of its
import, and `import_pending` names one under way, whose stray entries the
next catch-up removes (`clean_pending`).
"""

from __future__ import annotations

import json
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from vfsd.snapshots.snapshots import Snapshots, entry_bytes, entry_refs, snapshot_id
from vfsd.store import remotestate
from vfsd.store.content import LOC_LMDB, ref_digest, ref_loc
from vfsd.store.store import Store

from .head import Head
from .manifest import Manifest, ManifestError
from .resume import check_tree

log = structlog.get_logger("vfsd.remote")

_U64 = struct.Struct(">Q")
#: seconds of work per write transaction
STEP_BUDGET_S = 0.02
#: meta key: the seq of an import under way (its entries without a record are stray)
IMPORT_PENDING = b"import_pending"


class HistoryError(Exception):
    """The head cannot be imported into this volume; the message says why."""


@dataclass
class Plan:
    """What a catch-up does to a volume's history (from `plan`)."""

    same: set[int]  # local snapshots that are the head's
    above: int  # version entries newer than this go (P)
    dropped: list[dict]  # local snapshots that go with them: {"id", "why"}
    retired: list[dict]  # older local snapshots the head no longer lists: {"id", "why"}
    imports: list[int]  # head snapshots to import, oldest first
    truncate: bool  # whether entries newer than `above` exist
    rebuild: str | None = None  # why the volume must be made again from scratch

    @property
    def nothing_to_do(self) -> bool:
        return not (self.dropped or self.retired or self.imports or self.truncate)


def _same(rec: dict, entry: dict, published: dict | None) -> bool:
    if published is None or rec.get("step") != entry.get("step"):
        return False
    if "created_ns" in entry:
        return rec.get("created_ns") == entry["created_ns"]
    return published.get("generation") == entry.get("generation")


def plan(st: Store, snaps: Snapshots, head: Head, *, keep_unpublished: bool = False) -> Plan:
    """Compare the volume's history with `head` (reads only: a worker thread is fine).

    `keep_unpublished`: the volume is where the thread's run starts (its record
    was just made from it): snapshots newer than everything the head lists
    that were never published stay, for the run to publish.
    """
    local = {s["seq"]: s for s in snaps.list()}
    published = remotestate.published(st)
    entries = {e["seq"]: e for e in head.current()}
    same = {s for s, rec in local.items()
            if s in entries and _same(rec, entries[s], published.get(s))}
    above = max(same, default=0)
    dropped, retired, rebuild = [], [], None
    tail = [s for s in local if s > above]
    if keep_unpublished and tail and all(s not in published and s > head.latest
                                         for s in tail):
        above = max(tail)  # this run's own, published by it
    for s in sorted(local):
        if s > above:
            why = ("unpublished (the tail of an earlier run that crashed or lost its lease)"
                   if s not in published else "published by a run the head no longer lists")
            dropped.append({"id": snapshot_id(s), "why": why})
        elif s not in same:
            if s in entries:
                rebuild = (f"local snapshot {snapshot_id(s)} is not the head's "
                           f"{snapshot_id(s)} (another step or time)")
            else:
                why = ("retired by the run's retention elsewhere" if s in published
                       else "never published")
                retired.append({"id": snapshot_id(s), "why": why})
    if st.meta_u64(b"incomplete"):
        rebuild = "the volume is incomplete (an import or copy that did not finish)"
    elif not st.meta_u64(b"snap_seq") and st.readdir(st.root_ino, 0, limit=1) and \
            (entries or not keep_unpublished):
        # Files never snapshotted are not tracked: no catch-up can tell them apart.
        rebuild = "the volume holds files that no snapshot recorded"
    elif not entries and not keep_unpublished and (local or truncate_needed(st, 0)):
        rebuild = "the head lists no snapshot: the thread starts empty"
    imports = sorted(s for s in entries if s not in same)
    return Plan(same, above, dropped, retired, imports, truncate_needed(st, above), rebuild)


def truncate_needed(st: Store, above: int) -> bool:
    """Whether the volume has version entries newer than `above`."""
    with st.txn() as txn:
        cur = txn.cursor(db=st.db["sgen"])
        return bool(cur.set_range(st._vb + _U64.pack(above + 1))) \
            and bytes(cur.key()[:4]) == st._vb


# ------------------------------------------------------------------ removing


def clean_pending(st: Store, snaps: Snapshots):
    """After an import a crash cut short (a generator of short transactions): drop
    the entries at its seq that no snapshot needs (those of an insertion between
    kept snapshots). Entries it wrote that are needed stay: an import of that
    snapshot again finds them right, and one newer than what the head lists
    goes with the truncation. Entries at that seq from this volume's own
    snapshot of the same id (deleted here since) are needed, and stay."""
    seq = st.meta_u64(IMPORT_PENDING)
    if not seq:
        return
    with st.txn() as txn:
        recorded = txn.get(st._vb + _U64.pack(seq), db=st.db["snap"]) is not None
        retained = sorted(s["seq"] for s in snaps.list())
        stray = []
        if not recorded:
            for _, okey in snaps._written_between(txn, seq - 1, seq):
                nxt = snaps._next_entry_seq(txn, okey, seq)
                if nxt is not None and not any(seq <= s < nxt for s in retained):
                    got = snaps.value_at(txn, okey, seq)
                    stray.append((okey, got[1] if got else b""))
    for i in range(0, len(stray), 256):
        refs: Counter = Counter()
        with st.txn(write=True) as txn:
            for okey, value in stray[i:i + 256]:
                snaps._drop_entry(txn, okey, seq, value, refs)
            freed = st.apply_refs(txn, refs)
        st._delete_unreferenced(freed)
        yield "stray", i
    with st.txn(write=True) as txn:
        txn.delete(st._vp + IMPORT_PENDING, db=st.db["meta"])
    log.info("import_cleaned", volume=st.volume, snapshot=snapshot_id(seq), stray=len(stray))


def truncate(st: Store, snaps: Snapshots, above: int, dropped: list[dict]):
    """Drop every snapshot and version entry newer than `above` (a generator of
    short transactions); objects whose newest entry changed are marked changed."""
    gone = [int(d["id"][1:]) for d in dropped]
    with st.txn(write=True) as txn:
        step = st._step(txn)
        for seq, d in zip(gone, dropped, strict=True):
            key = st._vb + _U64.pack(seq)
            raw = txn.get(key, db=st.db["snap"])
            if raw is None:
                continue
            rec = json.loads(bytes(raw))
            txn.delete(key, db=st.db["snap"])
            txn.put(key, json.dumps({"seq": seq, "id": snapshot_id(seq), "step": rec["step"],
                                     "deleted_step": step,
                                     "reason": f"dropped at catch-up: {d['why']}"}).encode(),
                    db=st.db["sgone"])
        remotestate.forget_published(txn, st, gone)
    yield "records", len(gone)
    yield from _drop_entries(st, snaps, above + 1, None)


def _drop_entries(st: Store, snaps: Snapshots, lo: int, hi: int | None):
    """Drop the version entries written at seqs lo..hi (None: no bound), marking
    their objects changed; one short transaction per step."""
    vb = st._vb
    while True:
        deadline = time.perf_counter() + STEP_BUDGET_S
        refs: Counter = Counter()
        n = 0
        more = False
        with st.txn(write=True) as txn:
            cur = txn.cursor(db=st.db["sgen"])
            found = cur.set_range(vb + _U64.pack(lo))
            keys = []
            while found:
                k = bytes(cur.key())
                if k[:4] != vb or (hi is not None and _U64.unpack(k[4:12])[0] > hi):
                    break
                keys.append(k)
                if len(keys) >= 256:
                    more = True
                    break
                found = cur.next()
            for k in keys:
                seq, okey = _U64.unpack(k[4:12])[0], k[12:]
                raw = txn.get(vb + okey + k[4:12], db=st.db["sver"])
                value = bytes(raw) if raw is not None else b""
                snaps._drop_entry(txn, okey, seq, value, refs)
                txn.delete(k, db=st.db["sgen"])  # even without its sver entry
                txn.put(vb + okey, b"", db=st.db["sdirty"])
                n += 1
                if time.perf_counter() > deadline:
                    more = True
                    break
            if n:
                txn.put(st._vp + b"base_changed", _U64.pack(1), db=st.db["meta"])
            freed = st.apply_refs(txn, refs)
        st._delete_unreferenced(freed)
        if n:
            st.base_clean = False
        yield "entries", n
        if not more:
            return


def retire(snaps: Snapshots, retired: list[dict]):
    """Delete local snapshots the head no longer lists (one transaction each)."""
    for d in retired:
        try:
            snaps._delete(int(d["id"][1:]), f"catch-up: {d['why']}")
        except Exception as exc:  # noqa: BLE001 - gone already is what was wanted
            log.debug("retire_skipped", snapshot=d["id"], error=str(exc))
        yield "retired", d["id"]


# ------------------------------------------------------------------ importing


class ManifestSource:
    """Manifests of one run, fetched once each (`fetch(seq) -> Manifest`, blocking)."""

    def __init__(self, fetch: Callable[[int], Manifest]) -> None:
        self.fetch = fetch
        self.cache: dict[int, Manifest] = {}
        self.fetched = 0

    def get(self, seq: int) -> Manifest:
        m = self.cache.get(seq)
        if m is None:
            m = self.cache[seq] = self.fetch(seq)
            self.fetched += 1
        return m

    def forget_below(self, seq: int) -> None:
        for s in [s for s in self.cache if s < seq]:
            del self.cache[s]


class _Blobs:
    """Small objects by digest: the manifests', else the store's own."""

    def __init__(self, manifest_blobs: dict[bytes, bytes], txn, db) -> None:
        self.m = manifest_blobs
        self.txn = txn
        self.db = db

    def get(self, digest: bytes) -> bytes | None:
        got = self.m.get(digest)
        if got is None:
            raw = self.txn.get(digest, db=self.db)
            got = bytes(raw) if raw is not None else None
        return got


@dataclass
class Prepared:
    """One snapshot's import, worked out (`Importer.prepare`), to `apply`."""

    seq: int
    record: dict
    published: dict
    # per object: [("put" | "drop" | "dirty", okey, seq, value)], applied in one
    # transaction, puts first
    ops: list[list[tuple[str, bytes, int, bytes]]] = field(default_factory=list)
    sizes: dict[bytes, int] = field(default_factory=dict)  # ref -> object size
    blobs: dict[bytes, bytes] = field(default_factory=dict)  # small objects of the puts
    max_ino: int = 0
    written: int = 0


class Importer:
    """Imports head snapshots into a volume's history, oldest first."""

    def __init__(self, st: Store, snaps: Snapshots, head: Head, source: ManifestSource,
                 known: set[int]) -> None:
        self.st = st
        self.snaps = snaps
        self.head = head
        self.source = source
        self.known = set(known)  # local snapshots whose state is the head's
        self._state: tuple[int, dict[bytes, bytes]] | None = None  # (seq, full state)

    # -------------------------------------------------------- the manifests

    def _delta(self, seq: int) -> tuple[int | None, dict[bytes, bytes], dict[bytes, bytes]]:
        """(base, delta, blobs): state(seq) = state(base) overlaid with delta, base
        a known local snapshot (None: the delta is the whole state)."""
        delta: dict[bytes, bytes] = {}
        blobs: dict[bytes, bytes] = {}
        want = seq
        for _ in range(100_000):
            m = self.source.get(want)
            if m.seq != want or m.run != self.head.run:
                raise ManifestError(f"manifest {self.head.run}/s{want} is another snapshot's")
            if m.chunk_size != self.st.chunk_size:
                raise HistoryError(f"the run's manifests cut files into {m.chunk_size}-byte "
                                   f"chunks, this store into {self.st.chunk_size}: replicas "
                                   "of a thread need one chunk size")
            for okey, value in m.entries:
                delta.setdefault(okey, value)
            for d, b in m.blobs.items():
                blobs.setdefault(d, b)
            if m.full:
                return None, {k: v for k, v in delta.items() if v}, blobs
            if m.parent in self.known:
                return m.parent, delta, blobs
            want = m.parent
        raise ManifestError(f"the manifest chain of {self.head.run}/s{seq} is too long")

    # ----------------------------------------------------------- preparing

    def prepare(self, seq: int) -> Prepared:
        """Work out the import of head snapshot `seq` (reads: a worker thread)."""
        st, snaps = self.st, self.snaps
        entry = self.head.entry(seq)
        base, delta, mblobs = self._delta(seq)
        top = self.source.get(seq)
        if entry is None or top.step != entry["step"] or \
                ("created_ns" in entry and top.created_ns != entry["created_ns"]):
            raise ManifestError(f"manifest {self.head.run}/s{seq} does not match what the "
                                "head says of that snapshot (step or time)")
        where = f"snapshot s{seq} of run {self.head.run}"
        retained = sorted(s["seq"] for s in snaps.list())
        later = [s for s in retained if s > seq]
        s_min = later[0] if later else None
        prep = Prepared(seq, {}, {})
        with st.txn() as txn:
            state = self._full_state(txn, base, delta)
            blobs = _Blobs(mblobs, txn, st.db["blob"])
            sizes = check_tree(state, blobs, st.chunk_size, where)
            if base is None:
                candidates = set(state) | set(snaps._visible_okeys(txn, seq))
            else:
                candidates = set(delta) | {k for _, k in snaps._written_between(txn, base, seq)}
            for okey in sorted(candidates):
                ops = self._ops_for(txn, okey, state.get(okey, b""), seq, s_min, retained,
                                    prep)
                if ops:
                    prep.ops.append(ops)
            for ops in prep.ops:
                for kind, okey, s, value in ops:
                    if kind != "put":
                        continue
                    if s == seq:
                        prep.written += 1
                    if okey[:1] == b"i":
                        prep.max_ino = max(prep.max_ino, _U64.unpack(okey[1:9])[0])
                    for ref in entry_refs(okey, value):
                        if ref in sizes:
                            prep.sizes[ref] = sizes[ref]
                        if ref_loc(ref) == LOC_LMDB and ref_digest(ref) not in prep.blobs:
                            blob = blobs.get(ref_digest(ref))
                            if blob is not None:
                                prep.blobs[ref_digest(ref)] = blob
        self._state = (seq, state)
        prep.record = {"seq": seq, "id": snapshot_id(seq), "step": top.step,
                       "created_ns": top.created_ns, "pinned": top.pinned, "label": top.label,
                       "parent": 0, "entries": len(state), "run": self.head.run,
                       "imported": {"from_run": self.head.run, "at_ns": time.time_ns()}}
        prep.published = {"seq": seq, "parent": top.parent, "full": top.full,
                          "generation": top.generation, "entries": len(top.entries),
                          "bytes": entry.get("bytes", 0), "published_ns": time.time_ns(),
                          "imported": True}
        return prep

    def _full_state(self, txn, base: int | None, delta: dict[bytes, bytes]) -> dict:
        """The whole state of the snapshot: base's (carried from the last import,
        or read locally) overlaid with the delta."""
        if base is None:
            return dict(delta)
        if self._state is not None and self._state[0] == base:
            state = self._state[1]
        else:
            snaps = self.snaps
            state = {}
            for okey in snaps._visible_okeys(txn, base):
                got = snaps.value_at(txn, okey, base)
                if got and got[1]:
                    state[okey] = got[1]
        state = dict(state)
        for okey, value in delta.items():
            if value:
                state[okey] = value
            else:
                state.pop(okey, None)
        return state

    def _ops_for(self, txn, okey: bytes, want: bytes, seq: int, s_min: int | None,
                 retained: list[int], prep: Prepared) -> list:
        snaps = self.snaps
        got = snaps.value_at(txn, okey, seq)
        cur = got[1] if got else b""
        if cur == want:
            return []
        ops: list[tuple[str, bytes, int, bytes]] = []
        nxt = snaps._next_entry_seq(txn, okey, seq)
        if s_min is not None and (nxt is None or s_min < nxt):
            # What the next retained snapshot sees stays what it saw.
            ops.append(("put", okey, s_min, cur))
        ops.append(("put", okey, seq, want))  # over an entry at `seq`, if there is one
        if got is not None and got[0] != seq and \
                not any(got[0] <= s < seq for s in retained):
            # The entry before now covers no retained snapshot: not needed any more.
            ops.append(("drop", okey, got[0], cur))
        if s_min is None and nxt is None:
            # Its newest entry changed: the live tree may differ. Marked in the
            # same transaction as the entry, so a crash leaves neither or both.
            ops.append(("dirty", okey, seq, b""))
        return ops

    # ------------------------------------------------------------ applying

    def apply(self, prep: Prepared):
        """Write a prepared import (a generator of short transactions); the
        snapshot's record comes last."""
        st, snaps = self.st, self.snaps
        meta = st.db["meta"]
        with st.txn(write=True) as txn:
            txn.put(st._vp + IMPORT_PENDING, _U64.pack(prep.seq), db=meta)
        i = 0
        ops = prep.ops
        while i < len(ops):
            deadline = time.perf_counter() + STEP_BUDGET_S
            with st.txn(write=True) as txn, st.batched_counters(txn):
                adopt: Counter = Counter()
                refs: Counter = Counter()  # references let go of (negative counts)
                while i < len(ops):
                    for kind, okey, s, value in ops[i]:
                        key = st._vb + okey + _U64.pack(s)
                        if kind == "drop":
                            snaps._drop_entry(txn, okey, s, value, refs)
                            continue
                        if kind == "dirty":
                            txn.put(st._vb + okey, b"", db=st.db["sdirty"])
                            txn.put(st._vp + b"base_changed", _U64.pack(1), db=meta)
                            st.base_clean = False
                            continue
                        old = txn.get(key, db=st.db["sver"])
                        if old is not None:  # written over: its references go
                            for ref in entry_refs(okey, bytes(old)):
                                refs[ref] -= 1
                            snaps._count_bytes(txn, -entry_bytes(okey, bytes(old)))
                        txn.put(key, value, db=st.db["sver"])
                        txn.put(st._vb + _U64.pack(s) + okey, b"", db=st.db["sgen"])
                        snaps._count_bytes(txn, entry_bytes(okey, value))
                        for ref in entry_refs(okey, value):
                            adopt[ref] += 1
                    i += 1
                    if time.perf_counter() > deadline:
                        break
                # Taken before any is let go: an object moving between entries stays.
                for ref, n in adopt.items():
                    st.content.adopt(txn, ref, prep.sizes.get(ref, 0), n,
                                     blob=prep.blobs.get(ref_digest(ref)))
                freed = st.apply_refs(txn, refs)
            st._delete_unreferenced(freed)
            yield "entries", i
        with st.txn(write=True) as txn:
            key = st._vb + _U64.pack(prep.seq)
            txn.put(key, json.dumps(prep.record).encode(), db=st.db["snap"])
            txn.delete(key, db=st.db["sgone"])
            remotestate.record_published(txn, st, prep.seq, prep.published)
            for mkey, value in ((b"snap_seq", prep.seq), (b"next_ino", prep.max_ino + 1)):
                raw = txn.get(st._vp + mkey, db=meta)
                if raw is None or _U64.unpack(raw)[0] < value:
                    txn.put(st._vp + mkey, _U64.pack(value), db=meta)
            txn.delete(st._vp + IMPORT_PENDING, db=meta)
        st.reload_snapshot_state()
        self.known.add(prep.seq)
        yield "record", prep.seq


def finish(st: Store, snaps: Snapshots, head: Head, floor: int = 0) -> None:
    """After a catch-up: the next snapshot's seq comes after everything the
    head lists, every seq this volume ever used, and `floor` (the ids an
    earlier holder of the run may have used without publishing them)."""
    with st.txn(write=True) as txn:
        key = st._vp + b"snap_seq"
        raw = txn.get(key, db=st.db["meta"])
        last = _U64.unpack(raw)[0] if raw is not None else 0
        want = max(head.latest, floor)
        if last < want:
            txn.put(key, _U64.pack(want), db=st.db["meta"])
            if not last:
                # Never snapshotted: the first snapshot must record the whole
                # tree, which a snapshot after the first finds marked changed.
                for _, _, okey in list(snaps._live_okeys(txn)):
                    txn.put(st._vb + okey, b"", db=st.db["sdirty"])
    st.reload_snapshot_state()
