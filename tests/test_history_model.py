"""Model-based test of a shard thread's catch-up (`vfsd.remote.history`), no FUSE.

Two replicas, each a real store, take turns running one thread: random file
operations, snapshots, local time travel and deletions on the replica that
runs it, publications of its snapshots (manifests and a head, kept in
memory as the bucket would, with the publisher's own manifest builder and
the head's retention), crashes that leave an unpublished tail, and hand-offs
to either replica (itself included), which make its history exactly the
head's. After every hand-off: the replica's snapshots are exactly the
head's, each one's tree (inode numbers included) is what the replica that
took it saw, the live tree is the latest one's, and fsck finds the store
clean. Imports cut short by a "crash" are cleaned up by the next catch-up.
"""

from __future__ import annotations

import os
import stat

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from volume_trees import live_tree, snap_tree

from vfsd import errors
from vfsd.fsck import fsck
from vfsd.fuse.openfiles import OpenFiles
from vfsd.remote import history
from vfsd.remote.head import Head
from vfsd.remote.manifest import decode
from vfsd.remote.publisher import build_manifest
from vfsd.snapshots.snapshots import Snapshots, drop_volume
from vfsd.store import remotestate
from vfsd.store.content import LOC_FILE
from vfsd.store.store import ROOT_INO, Store

LONG = bool(os.environ.get("VFSD_LONG"))
CS = 4096  # the smallest chunk a manifest accepts
INLINE = 64
NAMES = st.sampled_from([b"a", b"b", b"c", b"dd"])
DATA = st.binary(max_size=80) | st.sampled_from(
    [b"", b"x" * CS, b"\0" * (2 * CS + 7), b"y" * 5000, bytes(range(256)) * 20])
RUN = "r1"
FULL_EVERY = 3
HEAD_KEEP = 3


class _Crash(Exception):
    """A catch-up cut short."""


class Replica:
    def __init__(self, root: str, name: str) -> None:
        self.dir = os.path.join(root, name)
        self.store = Store(self.dir, "t1", chunk_size=CS)
        with self.store.txn(write=True) as txn:
            remotestate.set_remote_url(txn, self.store, "s3://bucket/p")
        self.open()
        self.recorded: dict[int, dict] = {}  # local retained snapshots' trees

    def open(self) -> None:
        self.files = OpenFiles(self.store, chunk_size=CS, inline_max=INLINE)
        self.snaps = Snapshots(self.store, keep_last=4, keep_steps=0)
        self.base = 0

    def set_base(self, seq: int) -> None:
        """The publisher's base: held, as `Publisher` holds it, so retention keeps
        the parent of the next delta (and the entries the delta needs)."""
        if seq:
            self.snaps.held[seq] += 1
        if self.base:
            self.snaps.held[self.base] -= 1
            if not self.snaps.held[self.base]:
                del self.snaps.held[self.base]
        self.base = seq

    def fresh_volume(self) -> None:
        """A rebuild: the volume dropped and made again, empty."""
        drop_volume(self.store, "t1")
        self.store.close()
        self.store = Store(self.dir, "t1", chunk_size=CS)
        self.open()
        self.recorded = {}


class HandoffMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.tmp = tempfile.mkdtemp(prefix="vfsd-handoff-")
        self.replicas = [Replica(self.tmp, "a"), Replica(self.tmp, "b")]
        self.active = 0
        self.head = Head(RUN, 1)
        self.manifests: dict[int, bytes] = {}
        self.chunks: dict[bytes, bytes] = {}  # the bucket's chunks
        self.trees: dict[int, dict] = {}  # head snapshots' trees
        self.step = 0
        self.ran = False  # whether the active replica caught up since it got the thread

    def teardown(self) -> None:
        import shutil

        for r in self.replicas:
            r.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def r(self) -> Replica:
        return self.replicas[self.active]

    # -- files (on the replica that runs the thread)

    def _dirs(self) -> list[int]:
        tree = live_tree(self.r.store, self.r.files)
        return [ROOT_INO] + [ino for kind, _, ino in tree.values() if kind == "dir"]

    def _pick_dir(self, i: int) -> int:
        dirs = self._dirs()
        return dirs[i % len(dirs)]

    @rule(d=st.integers(0, 10), name=NAMES, data=DATA)
    def create_file(self, d: int, name: bytes, data: bytes) -> None:
        try:
            inode = self.r.store.create(self._pick_dir(d), name, stat.S_IFREG | 0o644, 0, 0)
        except errors.Exists:
            return
        of = self.r.files.acquire(inode.ino)
        try:
            self.r.files.write(of, 0, data)
        finally:
            self.r.files.release(of)

    @rule(d=st.integers(0, 10), name=NAMES)
    def mkdir(self, d: int, name: bytes) -> None:
        try:
            self.r.store.create(self._pick_dir(d), name, stat.S_IFDIR | 0o755, 0, 0)
        except errors.Exists:
            pass

    @rule(d=st.integers(0, 10), name=NAMES, off=st.integers(0, 3 * CS), data=DATA)
    def write(self, d: int, name: bytes, off: int, data: bytes) -> None:
        try:
            inode = self.r.store.lookup(self._pick_dir(d), name)
        except errors.NotFound:
            return
        if inode.is_reg:
            of = self.r.files.acquire(inode.ino)
            try:
                self.r.files.write(of, off, data)
            finally:
                self.r.files.release(of)

    @rule(d=st.integers(0, 10), name=NAMES)
    def unlink(self, d: int, name: bytes) -> None:
        parent = self._pick_dir(d)
        try:
            inode = self.r.store.lookup(parent, name)
            child = self.r.store.unlink(parent, name, rmdir=inode.is_dir)
        except (errors.NotFound, errors.NotEmpty):
            return
        if child.nlink == 0:
            self.r.store.free_inode(child.ino)

    @rule(d1=st.integers(0, 10), n1=NAMES, d2=st.integers(0, 10), n2=NAMES)
    def rename(self, d1: int, n1: bytes, d2: int, n2: bytes) -> None:
        try:
            replaced = self.r.store.rename(self._pick_dir(d1), n1, self._pick_dir(d2), n2)
        except (errors.NotFound, errors.InvalidArgument, errors.NotEmpty,
                errors.IsADirectory, errors.NotADirectory):
            return
        if replaced is not None and replaced.nlink == 0:
            self.r.store.free_inode(replaced.ino)

    # -- snapshots on the replica that runs the thread

    @rule()
    def snapshot(self) -> None:
        r = self.r
        self.step += 1
        r.store.set_step(self.step)
        rec = r.snaps.create()
        r.recorded[rec["seq"]] = live_tree(r.store, r.files)
        for ident in r.snaps.apply_retention():
            r.recorded.pop(int(ident[1:]), None)

    @precondition(lambda self: len(self.r.recorded) > 1)
    @rule(i=st.integers(0, 10))
    def delete_local(self, i: int) -> None:
        """A snapshot deleted here only (the head may keep it: a later catch-up
        here imports it again, between the snapshots kept)."""
        r = self.r
        seqs = [s for s in sorted(r.recorded)[:-1] if not r.snaps.held[s]]
        if not seqs:
            return
        seq = seqs[i % len(seqs)]
        r.snaps.delete(f"s{seq}")
        del r.recorded[seq]

    @precondition(lambda self: self.r.recorded)
    @rule(i=st.integers(0, 10))
    def restore(self, i: int) -> None:
        r = self.r
        seqs = sorted(r.recorded)
        seq = seqs[i % len(seqs)]
        res = r.snaps.restore(f"s{seq}")
        for ino in res["unlinked"]:
            r.store.free_inode(ino)
        assert live_tree(r.store, r.files) == r.recorded[seq]

    @rule(follow=st.booleans())
    def publish(self, follow: bool) -> None:
        """Publish every unpublished snapshot, oldest first, as the publisher does:
        the head keeps the last few (`follow` False, a policy of its own) or what
        the replica keeps (`follow`, a shard run's), with the ancestors kept
        deltas need (marked retired when `follow`)."""
        r = self.r
        published = remotestate.published(r.store)
        for seq in sorted(r.recorded):
            if seq <= r.base or seq in published:
                continue
            parent = r.base if r.base and self.head.entry(r.base) else 0
            full = not parent or self.head.chain_length(parent) + 1 >= FULL_EVERY
            built = build_manifest(r.store, r.snaps, RUN, seq, parent, full, 1)
            self.manifests[seq] = built.data
            for digest in built.all_chunks:
                self.chunks.setdefault(digest, r.store.chunks.read_all(digest))
            m = built.manifest
            entry = {"seq": seq, "parent": m.parent, "full": m.full, "step": m.step,
                     "created_ns": m.created_ns, "pinned": False,
                     "entries": len(m.entries), "bytes": len(built.data), "generation": 1}
            snaps = sorted([e for e in self.head.snapshots if e["seq"] != seq] + [entry],
                           key=lambda e: e["seq"])
            new = self.head.successor(1, max(self.head.latest, seq), snaps)
            if follow:
                wanted = {s for s in r.recorded if s in {e["seq"] for e in snaps}}
            else:
                wanted = {e["seq"] for e in snaps[-HEAD_KEEP:]}
            keep = new.with_ancestors(wanted)
            new.snapshots = [e for e in snaps if e["seq"] in keep]
            for e in new.snapshots:
                e.pop("retired", None)
                if follow and e["seq"] not in wanted:
                    e["retired"] = True
            doomed = {e["seq"] for e in snaps} - keep
            self.head = new
            self.trees[seq] = r.recorded[seq]
            for s in doomed:
                self.manifests.pop(s, None)
                self.trees.pop(s, None)
            with r.store.txn(write=True) as txn:
                remotestate.record_published(txn, r.store, seq, {
                    "seq": seq, "parent": m.parent, "full": m.full, "generation": 1,
                    "entries": len(m.entries), "bytes": len(built.data),
                    "published_ns": 0, "imported": False})
                remotestate.forget_published(txn, r.store, doomed)
            r.set_base(seq)

    # -- hand-offs

    @rule(to=st.integers(0, 1), cut=st.none() | st.integers(0, 30), ahead=st.integers(0, 3))
    def handoff(self, to: int, cut, ahead: int) -> None:
        """The next run on replica `to`: its history made the head's. With `cut`, a
        first catch-up is cut short after that many transactions, as by a crash,
        and the catch-up is done again from the start. `ahead`: ids the previous holder
        announced beyond what it published (the next snapshot comes after them)."""
        r = self.replicas[to]
        if cut is not None:
            self._catch_up(r, cut, 0)
        self._catch_up(r, None, self.head.latest + ahead)
        self.active = to
        self.ran = True
        current = sorted(e["seq"] for e in self.head.current())
        assert sorted(s["seq"] for s in r.snaps.list()) == current
        for seq in current:
            assert snap_tree(r.store, r.snaps, seq) == self.trees[seq], f"s{seq} on {to}"
        latest = max((e["seq"] for e in self.head.current()), default=0)
        if latest:
            assert live_tree(r.store, r.files) == self.trees[latest]
        else:
            assert live_tree(r.store, r.files) == {}
        rep = fsck(r.store, verify=True)
        assert rep.clean, rep.problems

    def _catch_up(self, r: Replica, cut: int | None, floor: int) -> None:
        """A catch-up, or (with `cut`) one cut short after `cut` transactions of
        its truncation and imports, as by a crash."""
        history.STEP_BUDGET_S = 0.0 if cut is not None else 0.02
        try:
            self._catch_up_steps(r, cut, floor)
        except _Crash:
            return
        finally:
            history.STEP_BUDGET_S = 0.02

    def _catch_up_steps(self, r: Replica, cut: int | None, floor: int) -> None:
        done = [0]

        def run(steps) -> None:
            for _ in steps:
                done[0] += 1
                if cut is not None and done[0] > cut:
                    raise _Crash

        r.set_base(0)  # the run before ended: its publisher holds nothing
        head = self.head
        plan = history.plan(r.store, r.snaps, head)
        if plan.rebuild or (not head.snapshots and live_tree(r.store, r.files)):
            r.fresh_volume()
            plan = history.plan(r.store, r.snaps, head)
        run(history.clean_pending(r.store, r.snaps))
        if plan.truncate or plan.dropped:
            run(history.truncate(r.store, r.snaps, plan.above, plan.dropped))
        run(history.retire(r.snaps, plan.retired))

        def fetch(seq: int):
            return decode(self.manifests[seq], run=RUN, seq=seq)

        source = history.ManifestSource(fetch)
        imp = history.Importer(r.store, r.snaps, head, source, plan.same)
        for seq in plan.imports:
            run(imp.apply(imp.prepare(seq)))
        if cut is not None:
            return  # nothing was cut: the next catch-up finds nothing to do
        history.finish(r.store, r.snaps, head, floor)
        self._fetch_all(r)
        latest = max((e["seq"] for e in head.current()), default=0)
        if latest:
            res = r.snaps.restore(f"s{latest}")
            for ino in res["unlinked"]:
                r.store.free_inode(ino)
        r.recorded = {e["seq"]: self.trees[e["seq"]] for e in head.current()}
        r.set_base(latest)

    def _fetch_all(self, r: Replica) -> None:
        """What first reads would fetch: every chunk the volume names and lacks."""
        with r.store.txn() as txn:
            for k, v in txn.cursor(db=r.store.db["content"]):
                digest = bytes(k)
                if v[:8] != bytes(8) and v[-1] == LOC_FILE and \
                        not r.store.chunks.exists(digest):
                    r.store.chunks.put(digest, self.chunks[digest])

    @invariant()
    def local_snapshots_are_exact(self) -> None:
        r = self.r
        for seq, tree in r.recorded.items():
            if any(s["seq"] == seq for s in r.snaps.list()):
                assert snap_tree(r.store, r.snaps, seq) == tree, f"local s{seq} changed"


HandoffMachine.TestCase.settings = settings(
    max_examples=150 if LONG else 25, stateful_step_count=40 if LONG else 25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_handoffs = HandoffMachine.TestCase
