"""Model-based test of snapshots on a real store (no FUSE).

Random namespace and content operations, snapshots, restores, deletions and
retention run against the store and against a plain in-memory model of the
tree. After every step: every retained snapshot's tree, read back through the
snapshot API, equals what the model recorded when it was taken; after a
restore, the live tree equals the snapshot; fsck finds the store clean (so
refcounts, change lists and entries stay exact).
"""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from volume_trees import live_tree, snap_tree

from vfsd import errors
from vfsd.fsck import fsck
from vfsd.fuse.openfiles import OpenFiles
from vfsd.snapshots.snapshots import Snapshots, drop_volume
from vfsd.store.store import ROOT_INO, Store

CS = 64
INLINE = 16
LONG = bool(os.environ.get("VFSD_LONG"))
NAMES = st.sampled_from([b"a", b"b", b"c", b"dd"])
DATA = st.binary(max_size=3 * CS + 5) | st.sampled_from([b"", b"\0" * CS * 2, b"x" * CS])


class SnapshotMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.tmp = tempfile.mkdtemp(prefix="vfsd-snapmodel-")
        self.store = Store(os.path.join(self.tmp, "store"), chunk_size=CS)
        self.files = OpenFiles(self.store, chunk_size=CS, inline_max=INLINE)
        self.snaps = Snapshots(self.store, keep_last=3, keep_steps=0)
        self.recorded: dict[int, dict] = {}
        self.step = 0

    def teardown(self) -> None:
        import shutil

        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers

    def _dirs(self) -> list[int]:
        tree = live_tree(self.store, self.files)
        return [ROOT_INO] + [ino for kind, _, ino in tree.values() if kind == "dir"]

    def _pick_dir(self, i: int) -> int:
        dirs = self._dirs()
        return dirs[i % len(dirs)]

    def _write(self, ino: int, off: int, data: bytes, truncate: int | None) -> None:
        of = self.files.acquire(ino)
        try:
            if truncate is not None:
                self.files.truncate(of, truncate)
            if data:
                self.files.write(of, off, data)
        finally:
            self.files.release(of)

    # -- namespace and content

    @rule(d=st.integers(0, 10), name=NAMES, data=DATA)
    def create_file(self, d: int, name: bytes, data: bytes) -> None:
        parent = self._pick_dir(d)
        try:
            inode = self.store.create(parent, name, stat.S_IFREG | 0o644, 0, 0)
        except errors.Exists:
            return
        self._write(inode.ino, 0, data, None)

    @rule(d=st.integers(0, 10), name=NAMES)
    def mkdir(self, d: int, name: bytes) -> None:
        try:
            self.store.create(self._pick_dir(d), name, stat.S_IFDIR | 0o755, 0, 0)
        except errors.Exists:
            pass

    @rule(d=st.integers(0, 10), name=NAMES, dest=st.binary(min_size=1, max_size=20))
    def symlink(self, d: int, name: bytes, dest: bytes) -> None:
        try:
            self.store.create(self._pick_dir(d), name, stat.S_IFLNK | 0o777, 0, 0,
                              target=dest)
        except errors.Exists:
            pass
        except errors.InvalidArgument:
            assert b"\0" in dest  # refused, as fsck and an import refuse it

    @rule(d=st.integers(0, 10), name=NAMES, off=st.integers(0, 4 * CS), data=DATA,
          truncate=st.none() | st.integers(0, 4 * CS))
    def write(self, d: int, name: bytes, off: int, data: bytes, truncate) -> None:
        try:
            inode = self.store.lookup(self._pick_dir(d), name)
        except errors.NotFound:
            return
        if inode.is_reg:
            self._write(inode.ino, off, data, truncate)

    @rule(d=st.integers(0, 10), name=NAMES)
    def unlink(self, d: int, name: bytes) -> None:
        parent = self._pick_dir(d)
        try:
            inode = self.store.lookup(parent, name)
            child = self.store.unlink(parent, name, rmdir=inode.is_dir)
        except (errors.NotFound, errors.NotEmpty):
            return
        if child.nlink == 0:
            self.store.free_inode(child.ino)

    @rule(d1=st.integers(0, 10), n1=NAMES, d2=st.integers(0, 10), n2=NAMES,
          exchange=st.booleans())
    def rename(self, d1: int, n1: bytes, d2: int, n2: bytes, exchange: bool) -> None:
        try:
            replaced = self.store.rename(self._pick_dir(d1), n1, self._pick_dir(d2), n2,
                                         exchange=exchange)
        except (errors.NotFound, errors.InvalidArgument, errors.NotEmpty,
                errors.IsADirectory, errors.NotADirectory):
            return
        if replaced is not None and replaced.nlink == 0:
            self.store.free_inode(replaced.ino)

    @rule(d1=st.integers(0, 10), n1=NAMES, d2=st.integers(0, 10), n2=NAMES)
    def link(self, d1: int, n1: bytes, d2: int, n2: bytes) -> None:
        try:
            inode = self.store.lookup(self._pick_dir(d1), n1)
            if not inode.is_dir:
                self.store.link(inode.ino, self._pick_dir(d2), n2)
        except (errors.NotFound, errors.Exists):
            pass

    @rule(d=st.integers(0, 10), name=NAMES, key=st.sampled_from([b"user.x", b"user.y"]),
          value=st.binary(max_size=8))
    def setxattr(self, d: int, name: bytes, key: bytes, value: bytes) -> None:
        try:
            inode = self.store.lookup(self._pick_dir(d), name)
        except errors.NotFound:
            return
        self.store.set_xattr(inode.ino, key, value)

    # -- snapshots

    @rule()
    def snapshot(self) -> None:
        self.step += 1
        self.store.set_step(self.step)
        rec = self.snaps.create()
        assert not self.snaps.state()["changed"]
        self.recorded[rec["seq"]] = live_tree(self.store, self.files)
        for ident in self.snaps.apply_retention():
            del self.recorded[int(ident[1:])]

    @precondition(lambda self: self.recorded)
    @rule(cut=st.integers(0, 40))
    def snapshot_in_steps(self, cut: int) -> None:
        """A snapshot made one object per transaction; some cut short by a
        "crash" after `cut` steps and finished as a restarted daemon would."""
        self.step += 1
        self.store.set_step(self.step)
        tree = live_tree(self.store, self.files)
        self.snaps.STEP_BUDGET_S = 0.0
        steps = self.snaps.create_in_steps()
        rec = _run_steps(steps, cut)
        if rec is None:
            assert self.snaps.interrupted()[0] == "snapshot"
            rec = _run_steps(self.snaps.finish_interrupted(), None)
        assert self.snaps.interrupted() is None
        assert not self.snaps.state()["changed"]
        self.recorded[rec["seq"]] = tree
        assert live_tree(self.store, self.files) == tree
        for ident in self.snaps.apply_retention():
            del self.recorded[int(ident[1:])]

    @precondition(lambda self: self.recorded)
    @rule(i=st.integers(0, 10), cut=st.integers(0, 40))
    def restore_in_steps(self, i: int, cut: int) -> None:
        seqs = sorted(self.recorded)
        seq = seqs[i % len(seqs)]
        self.snaps.STEP_BUDGET_S = 0.0
        res = _run_steps(self.snaps.restore_in_steps(self.snaps.restore_plan(f"s{seq}")), cut)
        if res is None:
            assert self.snaps.interrupted() == ("restore", seq)
            res = _run_steps(self.snaps.finish_interrupted(), None)
            # A restarted daemon frees what has no name left (Volume.prepare).
            res["unlinked"] = self.store.orphans()
        assert self.snaps.interrupted() is None
        for ino in res["unlinked"]:
            self.store.free_inode(ino)
        assert live_tree(self.store, self.files) == self.recorded[seq]
        state = self.snaps.state()
        assert state == {"base": f"s{seq}", "last": state["last"], "changed": False,
                         "bytes": state["bytes"]}

    @precondition(lambda self: self.recorded)
    @rule(i=st.integers(0, 10))
    def restore(self, i: int) -> None:
        seqs = sorted(self.recorded)
        seq = seqs[i % len(seqs)]
        res = self.snaps.restore(f"s{seq}")
        for ino in res["unlinked"]:
            self.store.free_inode(ino)
        assert live_tree(self.store, self.files) == self.recorded[seq]
        state = self.snaps.state()
        assert state == {"base": f"s{seq}", "last": state["last"], "changed": False,
                         "bytes": state["bytes"]}

    @precondition(lambda self: self.recorded)
    @rule(i=st.integers(0, 10))
    def fork(self, i: int) -> None:
        seqs = sorted(self.recorded)
        seq = seqs[i % len(seqs)]
        with self.store.txn(write=True) as txn:
            self.store.create_volume(txn, "fork", with_root=False)
        dest = self.store.view("fork")
        with self.store.txn() as txn:
            okeys = self.snaps._visible_okeys(txn, seq)
        for _ in self.snaps.copy_into(seq, dest, okeys, batch=3):
            pass
        assert live_tree(dest, OpenFiles(dest, chunk_size=CS, inline_max=INLINE)) == \
            self.recorded[seq]
        assert fsck(self.store).clean
        drop_volume(self.store, "fork")

    @precondition(lambda self: self.recorded)
    @rule(i=st.integers(0, 10), j=st.integers(0, 10))
    def diff(self, i: int, j: int) -> None:
        seqs = sorted(self.recorded)
        a, b = seqs[i % len(seqs)], seqs[j % len(seqs)]
        changes = self.snaps.diff(f"s{a}", f"s{b}")
        got_paths = {c["path"] for c in changes} | {c.get("old_path") for c in changes}
        got_inos = {c["ino"] for c in changes}
        ta, tb = self.recorded[a], self.recorded[b]
        for p in set(ta) | set(tb):
            x, y = ta.get(p), tb.get(p)
            if x == y:
                continue
            name = p.decode(errors="surrogateescape")
            # A changed inode is reported once, under one of its names (hard
            # links share it); a name that came or went is reported by name.
            parts = name.split("/")
            ancestors = {"/".join(parts[:i]) for i in range(1, len(parts))}
            # ... and children of a renamed directory move with it.
            assert name in got_paths or {v[2] for v in (x, y) if v} & got_inos \
                or ancestors & got_paths, (name, x, y, changes)

    @precondition(lambda self: len(self.recorded) > 1)
    @rule(i=st.integers(0, 10))
    def delete(self, i: int) -> None:
        seqs = sorted(self.recorded)
        seq = seqs[i % len(seqs)]
        self.snaps.delete(f"s{seq}")
        del self.recorded[seq]

    @invariant()
    def snapshots_are_exact(self) -> None:
        for seq, tree in self.recorded.items():
            assert snap_tree(self.store, self.snaps, seq) == tree, f"snapshot s{seq} changed"

    @invariant()
    def store_is_consistent(self) -> None:
        rep = fsck(self.store, verify=True)
        assert rep.clean, rep.problems


def _run_steps(steps, cut: int | None):
    """Run a change made in steps to its end (its result), or stop after `cut`
    steps as a crash would (None)."""
    n = 0
    try:
        while True:
            next(steps)
            n += 1
            if cut is not None and n >= cut:
                steps.close()
                return None
    except StopIteration as done:
        return done.value


SnapshotMachine.TestCase.settings = settings(
    max_examples=200 if LONG else 25, stateful_step_count=60 if LONG else 30, deadline=None,
    suppress_health_check=list(HealthCheck))
TestSnapshotModel = SnapshotMachine.TestCase


def test_snapshot_machine_runs() -> None:
    pytest.importorskip("hypothesis")


def test_first_snapshot_in_steps_is_the_tree_at_its_start(tmp_path) -> None:
    """The first snapshot of a large tree is built from one read view in
    batches while the tree keeps changing: it holds the tree as it was when it
    started; the changes made meanwhile go into the next snapshot; content the
    view named but the live tree dropped meanwhile stays until its entry
    holds it, then only what nothing needs is freed."""
    store = Store(tmp_path / "store", chunk_size=CS)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    snaps = Snapshots(store, keep_last=5, keep_steps=0)
    try:
        dirs = [store.create(ROOT_INO, b"d%d" % i, stat.S_IFDIR | 0o755, 0, 0).ino
                for i in range(5)]
        inos = []
        for i in range(60):
            ino = store.create(dirs[i % 5], b"f%02d" % i, stat.S_IFREG | 0o644, 0, 0).ino
            of = files.acquire(ino)
            files.write(of, 0, os.urandom(3 * CS if i % 2 else 100))
            files.release(of)
            inos.append(ino)
        before = live_tree(store, files)
        view = snaps.first_begin()
        after = None
        n = 0
        written = 0
        while True:
            items, after = snaps.first_read(view, after, 7)
            snaps.first_write(items)
            written += len(items)
            # The tree changes between batches: rewrite, delete, create.
            victim = inos[n]
            of = files.acquire(victim)
            files.truncate(of, 0)
            files.write(of, 0, os.urandom(2 * CS))
            files.release(of)
            d, name = dirs[(n + 1) % 5], b"f%02d" % (n + 1)
            gone = store.unlink(d, name)
            store.free_inode(gone.ino)
            store.create(dirs[0], b"new%d" % n, stat.S_IFREG | 0o644, 0, 0)
            n += 2
            if after is None:
                break
        rec = snaps.first_finish(view, written=written, pinned=False, label="")
        assert rec["seq"] == 1
        assert snap_tree(store, snaps, 1) == before
        assert snaps.state()["changed"] is True
        now = live_tree(store, files)
        rec2 = snaps.create()
        assert snap_tree(store, snaps, 1) == before
        assert snap_tree(store, snaps, rec2["seq"]) == now
        rep = fsck(store, verify=True)
        assert rep.clean, rep.problems
        for ino in snaps.restore("s1")["unlinked"]:
            store.free_inode(ino)
        assert live_tree(store, files) == before
        assert fsck(store, verify=True).clean
    finally:
        store.close()


def leave_an_interrupted_first_snapshot(store: Store, files: OpenFiles,
                                        snaps: Snapshots) -> None:
    """A file of four chunks, the entries of a first snapshot that a crash cut
    short (they stay and hold its content), then the file deleted."""
    ino = store.create(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0).ino
    of = files.acquire(ino)
    files.write(of, 0, os.urandom(4 * CS))
    files.release(of)
    view = snaps.first_begin()
    items, _ = snaps.first_read(view, None, 1000)
    snaps.first_write(items)
    snaps.first_abort(view)
    store.free_inode(store.unlink(ROOT_INO, b"f").ino)


@pytest.mark.parametrize("defer", [False, True], ids=["one-shot", "daemon"])
def test_entries_of_an_interrupted_first_snapshot_free_their_content(tmp_path, defer):
    """A first snapshot cut short leaves entries that hold references; the
    next first snapshot drops them, and content only they held must go
    (it used to stay until the next start)."""
    store = Store(tmp_path / "store", chunk_size=CS, defer_deletes=defer)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    snaps = Snapshots(store, keep_last=5, keep_steps=0)
    try:
        leave_an_interrupted_first_snapshot(store, files, snaps)
        assert len(list(store.chunks.iter_all())) == 4  # the stale entries hold them

        view = snaps.first_begin()
        items, _ = snaps.first_read(view, None, 1000)
        snaps.first_write(items)
        snaps.first_finish(view, written=len(items), pinned=False, label="")
        store.sync()
        store.delete_synced()
        assert list(store.chunks.iter_all()) == []
        assert fsck(store).clean
    finally:
        store.close()


def test_fsck_repair_of_an_unneeded_entry_keeps_shared_content_counted(tmp_path):
    """An entry no snapshot needs (its snapshot record lost) is dropped by
    `fsck --repair`; content it shares with live files and other entries must
    keep every remaining reference (the repair used to take its references
    off twice, leaving a count one short: a later release would free content
    still in use)."""
    store = Store(tmp_path / "store", chunk_size=CS)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    snaps = Snapshots(store, keep_last=5, keep_steps=0)
    try:
        ino = store.create(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0).ino
        shared = os.urandom(CS)
        for _ in range(2):  # two versions whose first block is the same
            of = files.acquire(ino)
            files.truncate(of, 0)
            files.write(of, 0, shared + os.urandom(CS))
            files.release(of)
            snaps.create()
        with store.txn(write=True) as txn:  # the damage: s1's record is gone
            first = next(iter(txn.cursor(db=store.db["snap"])))[0]
            txn.delete(bytes(first), db=store.db["snap"])
        rep = fsck(store)
        assert any("needed by no snapshot" in p for p in rep.problems), rep.problems
        fsck(store, repair=True)
        rep = fsck(store, verify=True)
        assert rep.clean, rep.problems
    finally:
        store.close()


def test_fsck_notes_an_unfinished_first_snapshot_and_repair_drops_it(tmp_path):
    """The entries a crash left mid-way through a first snapshot are not
    damage (fsck stays clean and says what they are); `--repair` drops them
    and the content only they held."""
    store = Store(tmp_path / "store", chunk_size=CS)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    snaps = Snapshots(store, keep_last=5, keep_steps=0)
    try:
        leave_an_interrupted_first_snapshot(store, files, snaps)

        rep = fsck(store)
        assert rep.clean, rep.problems
        assert len(rep.notes) == 1 and "first snapshot that did not finish" in rep.notes[0]
        rep = fsck(store, repair=True)
        assert any("unfinished first snapshot" in r for r in rep.repaired), rep.repaired
        assert list(store.chunks.iter_all()) == []
        rep = fsck(store, verify=True)
        assert rep.clean and not rep.notes, (rep.problems, rep.notes)
        assert snaps.create()["seq"] == 1
    finally:
        store.close()
