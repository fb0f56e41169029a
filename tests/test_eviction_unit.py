"""Unit tests of eviction at the storage level (Evictor on a real Store), no FUSE.

The Evictor needs three things from the FUSE layer: the open files, the FUSE
inode numbering and "free this inode if nothing uses it". `StorageOnlyOps`
provides them with the same rules as fs.py minus the kernel: no lookup counts
are held, so an inode is freed as soon as it has no names and no open handle.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_store import CountingEnv

from vfsd import errors
from vfsd.config import Config
from vfsd.eviction import Evictor
from vfsd.fuse.journal import StepJournal
from vfsd.fuse.openfiles import OpenFiles
from vfsd.store.filehash import bytes_hash
from vfsd.store.inode import STATUS_DONE
from vfsd.store.store import Store

CS = 4096
INLINE = 1024
REG = stat.S_IFREG | 0o644


class StorageOnlyOps:
    """The hooks Evictor calls on the FUSE operations, with no kernel behind them."""

    def __init__(self, files: OpenFiles) -> None:
        self.files = files
        self.store = files.store
        self.journal = StepJournal(self.store)  # the timeline's record of each step

    @staticmethod
    def _fuse_ino(ino: int) -> int:
        return ino

    def _maybe_free(self, *inos: int) -> None:
        for ino in inos:  # as fs.py: one call for every inode a pass removed
            if ino in self.files.files:
                continue
            try:
                inode = self.store.get_inode(ino)
            except errors.NotFound:
                continue
            if inode.nlink == 0:
                self.store.free_inode(ino)


class Volume:
    """A store, its OpenFiles and an Evictor with a given policy."""

    def __init__(self, path: Path, **policy) -> None:
        self.store = Store(path)
        self.files = OpenFiles(self.store, chunk_size=CS, inline_max=INLINE)
        self.ops = StorageOnlyOps(self.files)
        self.evictor = Evictor(self.store, self.ops, Config(
            chunk_size=CS, inline_max=INLINE, **policy).validate())

    def file(self, name: bytes, data: bytes = b"", *, step: int | None = None,
             parent: int | None = None) -> int:
        """Create (or rewrite) a file at `step` with `data`."""
        if step is not None:
            self.store.set_step(step)
        parent = self.store.root_ino if parent is None else parent
        try:
            ino = self.store.lookup(parent, name).ino
        except errors.NotFound:
            ino = self.store.create(parent, name, REG, os.getuid(), os.getgid()).ino
        if data:
            of = self.files.acquire(ino)
            self.files.write(of, 0, data)
            self.files.release(of)
        return ino

    def set(self, ino: int, *, done: bool | None = None, pinned: bool | None = None) -> None:
        changes = {}
        if done is not None:
            changes["status"] = STATUS_DONE if done else 0
        if pinned is not None:
            changes["pinned"] = pinned
        self.store.set_attrs(ino, **changes)

    def plan(self, step: int, **kw) -> list[tuple[int, str]]:
        return self.evictor.plan(step, **kw)

    def chunk_files(self) -> set[bytes]:
        return set(self.store.chunks.iter_all())


@pytest.fixture
def make(tmp_path: Path):
    made: list[Volume] = []

    def factory(**policy) -> Volume:
        v = Volume(tmp_path / f"store{len(made)}", **policy)
        made.append(v)
        return v

    yield factory
    for v in made:
        v.store.close()


# ---------------------------------------------------------------------- plan


def test_done_files_leave_after_retention(make) -> None:
    v = make(done_retention_steps=3, max_age_steps=20)
    done = v.file(b"done", b"x", step=5)
    active = v.file(b"active", b"y", step=5)
    v.set(done, done=True)
    assert v.plan(8) == []  # age 3: kept
    assert v.plan(9) == [(done, "done")]  # age 4: older than the retention
    assert v.plan(25) == [(done, "done")]  # active, age 20: kept
    assert v.plan(26) == [(done, "done"), (active, "max_age")]


def test_a_change_restamps_the_age(make) -> None:
    v = make(done_retention_steps=3, max_age_steps=20)
    f = v.file(b"f", b"old", step=1)
    v.set(f, done=True)
    v.file(b"f", b"new", step=10)  # rewritten at step 10
    assert v.store.get_inode(f).step == 10
    assert v.plan(13) == [] and v.plan(14) == [(f, "done")]


def test_pinned_files_are_never_evicted(make) -> None:
    v = make(done_retention_steps=0, max_age_steps=1, quota_bytes=0, max_files=0)
    pinned = v.file(b"pinned", b"p" * 500, step=0)
    v.set(pinned, done=True, pinned=True)
    other = v.file(b"other", b"o" * 500, step=0)
    plan = dict(v.plan(100, extra_bytes=10_000, extra_files=5))
    assert pinned not in plan and plan == {other: "max_age"}
    v.set(pinned, pinned=False)  # unpinning makes it evictable again
    assert dict(v.plan(100))[pinned] == "done"


def test_quota_evicts_oldest_unpinned_first(make) -> None:
    v = make(quota_bytes=3500)
    pinned = v.file(b"p", b"P" * 1000, step=0)
    v.set(pinned, pinned=True)
    files = [v.file(b"f%d" % i, b"%d" % i * 1000, step=i) for i in range(1, 7)]
    assert v.store.counters()["logical_bytes"] == 7000
    # 7000 bytes, 3500 allowed: the four oldest unpinned go, the pinned stays.
    assert v.plan(6) == [(ino, "quota") for ino in files[:4]]
    # Room for a pending write of 1000 more bytes costs one more file.
    assert v.plan(6, extra_bytes=1000) == [(ino, "quota") for ino in files[:5]]
    # A file being written is never its own victim.
    assert v.plan(6, exclude=files[0]) == [(ino, "quota") for ino in files[1:5]]


def test_quota_counts_writes_still_buffered(make) -> None:
    v = make(quota_bytes=2000)
    old = v.file(b"old", b"o" * 1000, step=1)
    new = v.file(b"new", step=2)
    of = v.files.acquire(new)
    v.files.truncate(of, 1500)  # grown in the buffers, not committed yet
    assert v.store.counters()["logical_bytes"] == 1000
    assert v.evictor.usage() == 2500
    assert v.plan(2) == [(old, "quota")]
    v.files.release(of)


def test_quota_and_age_victims_are_counted_once(make) -> None:
    v = make(max_age_steps=5, quota_bytes=2500)
    aged = v.file(b"aged", b"a" * 1000, step=0)
    mid = v.file(b"mid", b"m" * 1000, step=8)
    v.file(b"new", b"n" * 1000, step=9)
    # aged leaves for its age, which already brings usage under the quota.
    assert v.plan(9) == [(aged, "max_age")]
    assert v.plan(9, extra_bytes=500) == [(aged, "max_age")]  # exactly at the quota
    assert v.plan(9, extra_bytes=501) == [(aged, "max_age"), (mid, "quota")]


def test_max_files(make) -> None:
    v = make(max_files=3)
    files = [v.file(b"f%d" % i, b"x", step=i) for i in range(5)]
    v.store.link(files[4], v.store.root_ino, b"second-name")  # still one file
    assert v.store.counters()["files"] == 5
    assert v.plan(5) == [(ino, "max_files") for ino in files[:2]]
    assert v.plan(5, extra_files=1) == [(ino, "max_files") for ino in files[:3]]


def test_plan_cost_follows_what_it_evicts(make) -> None:
    v = make(done_retention_steps=3, max_age_steps=20)
    old = [v.file(b"old%d" % i, step=1) for i in range(4)]
    for i in range(2000):
        v.file(b"new%04d" % i, step=100)
    v.set(old[0], done=True)
    counting = CountingEnv(v.store.env)
    v.store.env = counting
    try:
        assert v.plan(3) == []
        nothing = counting.visited
        counting.visited = 0
        assert sorted(v.plan(22)) == sorted([(old[0], "done")] + [(i, "max_age") for i in old[1:]])
        some = counting.visited
    finally:
        v.store.env = counting._env
    # One key per index scan to find nothing; the victims plus those to evict four.
    assert nothing <= 2
    assert some <= 1 + 1 + 4 + 1


def test_quota_plan_cost_follows_what_it_evicts(make) -> None:
    v = make(quota_bytes=2000 * 10)
    old = [v.file(b"old%d" % i, b"o" * 10, step=1) for i in range(3)]
    for i in range(2000):
        v.file(b"new%04d" % i, b"n" * 10, step=20)
    counting = CountingEnv(v.store.env)
    v.store.env = counting
    try:
        assert v.plan(20) == [(ino, "quota") for ino in old]
    finally:
        v.store.env = counting._env
    assert counting.visited <= 2 + len(old)


# ----------------------------------------------------------------------- run


def test_run_removes_names_logs_and_frees_chunks(make) -> None:
    v = make(done_retention_steps=3)
    root = v.store.root_ino
    d = v.store.create(root, b"tools", stat.S_IFDIR | 0o755, os.getuid(), os.getgid()).ino
    data = os.urandom(3 * CS + 10)
    victim = v.file(b"output.txt", data, step=2, parent=d)
    v.store.link(victim, root, b"alias")
    keep = v.file(b"keep", b"k" * 2000, step=2)
    v.set(victim, done=True)
    gen = v.store.get_inode(victim).gen
    assert len(v.chunk_files()) == 3 + 1  # its 10-byte tail is a small object in LMDB
    v.store.set_step(6)

    report = v.evictor.run()
    assert report["step"] == 6 and not report["dry_run"]
    assert report["files"] == 1 and report["bytes"] == len(data)
    (rec,) = report["evicted"]
    assert rec == {
        "path": rec["path"], "ino": victim, "gen": gen,
        "hash": bytes_hash(data, CS).hex(), "size": len(data), "step": 2,
        "evicted_step": 6, "reason": "done", "status": "done", "used_step": 2,
    }
    assert rec["path"] in ("tools/output.txt", "alias")
    # Every name is gone, the emptied directory stays, and so does the other file.
    for parent, name in ((d, b"output.txt"), (root, b"alias")):
        with pytest.raises(errors.NotFound):
            v.store.lookup(parent, name)
    assert v.store.readdir(d, 0) == [] and v.store.lookup(root, b"tools").ino == d
    assert v.store.lookup(root, b"keep").ino == keep
    # Nothing held it: freed, with its chunks deleted from disk.
    assert not v.store.inode_exists(victim) and v.store.orphans() == []
    assert len(v.chunk_files()) == 1
    c = v.store.counters()
    assert (c["files"], c["logical_bytes"], c["chunk_count"]) == (1, 2000, 1)
    # The log answers for it, and the kernel is told about both names.
    assert v.store.eviction_record(victim) == rec
    assert v.store.eviction_log() == [rec]
    assert sorted(v.evictor.take_invalidations()) == sorted(
        [(d, b"output.txt", victim), (root, b"alias", victim)])
    assert v.evictor.take_invalidations() == []
    assert v.evictor.evicted_total == 1
    assert v.evictor.run()["files"] == 0  # nothing left to do


def test_dry_run_changes_nothing(make) -> None:
    v = make(max_age_steps=2)
    f = v.file(b"f", os.urandom(2 * CS), step=0)
    chunks_before = v.chunk_files()
    dry = v.evictor.run(5, dry_run=True)
    assert dry["dry_run"] and [r["ino"] for r in dry["evicted"]] == [f]
    assert v.store.lookup(v.store.root_ino, b"f").ino == f
    assert v.chunk_files() == chunks_before
    assert v.store.eviction_log() == [] and v.evictor.take_invalidations() == []
    real = v.evictor.run(5)
    assert real["evicted"] == dry["evicted"]


def test_open_file_is_deferred_then_evicted_after_its_last_close(make) -> None:
    v = make(max_age_steps=2)
    data = os.urandom(2 * CS + 1)
    f = v.file(b"f", data, step=0)
    reader = v.files.acquire(f)
    v.store.set_step(5)
    report = v.evictor.run()
    assert report["evicted"] == [] and report["files"] == 0
    assert [(d["ino"], d["path"], d["reason"], d["why"], d["handles"])
            for d in report["deferred"]] == [(f, "f", "max_age", "open", 1)]
    assert v.store.lookup(v.store.root_ino, b"f").ino == f
    assert v.files.read(reader, 0, len(data)) == data
    assert v.evictor.recheck({f})["evicted"] == []  # still open: nothing yet
    v.files.release(reader)
    records = v.evictor.recheck({f})["evicted"]
    assert [(r["ino"], r["reason"], r["hash"]) for r in records] == [
        (f, "max_age", bytes_hash(data, CS).hex())]
    with pytest.raises(errors.NotFound):
        v.store.lookup(v.store.root_ino, b"f")
    assert v.evictor.deferred == {}
    assert v.chunk_files() == set() and v.store.counters()["chunk_count"] == 0


def test_file_written_while_deferred_is_young_at_its_close(make) -> None:
    v = make(max_age_steps=2)
    f = v.file(b"log", b"line 0\n", step=0)
    writer = v.files.acquire(f)
    v.store.set_step(5)
    assert [d["ino"] for d in v.evictor.run()["deferred"]] == [f]
    v.files.write(writer, 7, b"line 1\n")  # buffered, committed at release: step 5
    v.files.release(writer)
    assert v.evictor.recheck({f})["evicted"] == []
    assert v.store.lookup(v.store.root_ino, b"log").step == 5
    assert v.files.read(v.files.acquire(f), 0, 100) == b"line 0\nline 1\n"


def test_quota_passes_over_open_files(make) -> None:
    v = make(quota_bytes=3000)
    held = v.file(b"held", b"h" * 1500, step=0)
    other = v.file(b"other", b"o" * 1000, step=1)
    writing = v.file(b"writing", step=2)
    of = v.files.acquire(held)
    v.evictor.reserve(1000, writing)  # the oldest is open: the next one goes
    assert v.store.inode_exists(held) and not v.store.inode_exists(other)
    v.evictor.take_invalidations()
    with pytest.raises(errors.NoSpace):
        v.evictor.reserve(2000, writing)  # only the open file could make room
    v.files.release(of)


def test_set_step_runs_eviction_and_refuses_going_back(make) -> None:
    v = make(max_age_steps=3)
    f = v.file(b"f", b"x", step=0)
    assert v.evictor.set_step(3)["files"] == 0
    report = v.evictor.set_step(4)
    assert v.store.get_step() == 4 and [r["ino"] for r in report["evicted"]] == [f]
    with pytest.raises(errors.InvalidArgument):
        v.evictor.set_step(2)
    assert v.store.get_step() == 4


# --------------------------------------------------------------------- quota


def test_reserve_evicts_to_make_room_or_fails(make) -> None:
    v = make(quota_bytes=3000)
    pinned = v.file(b"pinned", b"p" * 2000, step=0)
    v.set(pinned, pinned=True)
    old = v.file(b"old", b"o" * 800, step=1)
    writing = v.file(b"writing", step=2)
    v.evictor.reserve(200, writing)  # fits: nothing evicted
    assert v.store.inode_exists(old)
    v.evictor.reserve(500, writing)  # 2800 + 500 > 3000: old goes
    assert not v.store.inode_exists(old)
    v.evictor.take_invalidations()
    with pytest.raises(errors.NoSpace):
        v.evictor.reserve(1500, writing)  # only the pinned file and the writer left
    assert v.evictor.enospc_total == 1
    assert v.store.inode_exists(pinned) and v.store.inode_exists(writing)


def test_reserve_file_under_max_files(make) -> None:
    v = make(max_files=2)
    a = v.file(b"a", b"x", step=0)
    b = v.file(b"b", b"x", step=1)
    v.set(b, pinned=True)
    v.evictor.reserve_file()  # 2 files, one more needs room: a goes
    assert not v.store.inode_exists(a)
    v.file(b"c", b"x", step=2)
    v.set(v.store.lookup(v.store.root_ino, b"c").ino, pinned=True)
    with pytest.raises(errors.NoSpace):
        v.evictor.reserve_file()
    assert v.evictor.enospc_total == 1


# ------------------------------------------------- units, rules, last use


DIR = stat.S_IFDIR | 0o755


def test_quota_takes_a_unit_whole_or_not_at_all(make) -> None:
    v = make(quota_bytes=3500)
    root = v.store.root_ino
    repo = v.store.create(root, b"repo", DIR, os.getuid(), os.getgid()).ino
    git = v.store.create(repo, b".git", DIR, os.getuid(), os.getgid()).ino
    head = v.file(b"HEAD", b"h" * 1000, step=0, parent=git)
    src = v.file(b"src.py", b"s" * 1000, step=5, parent=repo)
    loose = [v.file(b"f%d" % i, b"%d" % i * 1000, step=i) for i in (1, 2)]
    # 4000 bytes, 3500 allowed: the oldest file is the repo's HEAD, so the
    # whole repo goes (2000 bytes), not HEAD alone, and nothing more.
    plan = v.plan(6)
    assert sorted(plan) == sorted([(head, "quota"), (src, "quota")])
    # Pinned inside, the repo stays whole: the loose files go instead.
    v.set(src, pinned=True)
    assert v.plan(6) == [(loose[0], "quota")]
    v.set(src, pinned=False)
    # One file of it open: the quota passes over the whole unit.
    of = v.files.acquire(src)
    try:
        assert v.plan(6) == [(loose[0], "quota")]
    finally:
        v.files.release(of)


def test_opens_are_folded_into_the_next_pass(make) -> None:
    v = make(max_age_steps=2)
    f = v.file(b"f", b"data", step=0)
    v.store.set_step(2)
    v.evictor.opened(f)  # what the FUSE layer calls on open
    assert v.store.get_inode(f).used == 0  # no transaction per open
    assert v.evictor.used_step(v.store.get_inode(f)) == 2
    assert v.plan(3) == []  # the pass writes the open first: age 1
    assert v.store.get_inode(f).used == 2 and v.store.get_inode(f).step == 0
    assert v.plan(5) == [(f, "max_age")]


def test_a_schema_3_store_reads_as_never_opened_and_upgrades(tmp_path: Path) -> None:
    from conftest import as_old_schema

    from vfsd.store import store as store_mod
    from vfsd.store.inode import _FORMAT_V3

    st = Store(tmp_path / "s")
    ino = st.create(st.root_ino, b"old.txt", REG, 0, 0).ino
    st.set_attrs(ino, step=4)
    st.close()
    as_old_schema(tmp_path / "s", 3, _FORMAT_V3.size)
    st = Store(tmp_path / "s")
    inode = st.get_inode(ino)
    assert (inode.step, inode.used, inode.use_step) == (4, 0, 4)
    assert st.scan_index("agestep") == [(4, ino)]  # the index it had still holds
    with st.txn() as txn:
        assert int.from_bytes(txn.get(b"schema", db=st.db["meta"]), "big") == \
            store_mod.SCHEMA_VERSION == 4
    assert st.mark_used({ino: 9})[0].used == 9
    assert st.scan_index("agestep") == [(9, ino)] and st.scan_index("bystep") == [(4, ino)]
    st.close()


@pytest.mark.parametrize("glob, yes, no", [
    ("tool_outputs/**", ["tool_outputs", "tool_outputs/a", "tool_outputs/a/b.json"],
     ["tool_outputs2/a", "x/tool_outputs/a"]),
    ("**/*.log", ["a.log", "x/y/a.log"], ["a.log/x", "alog"]),
    ("src/*.py", ["src/a.py"], ["src/a/b.py", "src/a.pyc"]),
    ("a/**/b", ["a/b", "a/x/y/b"], ["a/xb"]),
    ("s/[!x]?", ["s/ab"], ["s/xb", "s/a"]),
])
def test_rule_globs(glob: str, yes: list[str], no: list[str]) -> None:
    from vfsd.evictrules import compile_glob

    rx = compile_glob(glob)
    assert all(rx.fullmatch(p) for p in yes) and not any(rx.fullmatch(p) for p in no)


@pytest.mark.timeout(30)
def test_rule_globs_match_in_time_linear_in_the_name() -> None:
    """Issue 28, item 7: `**/*_*_*_*_*.json` against three names the agent
    chose froze the daemon 18-21 s in one step (the glob was a backtracking
    regex). Each of these took minutes or more; now each is a few thousand
    comparisons per name."""
    from vfsd.evictrules import compile_glob

    rx = compile_glob("**/*_*_*_*_*.json")
    hostile = ["_" * 250 + ".jsox", "a_" * 120 + "b.jso", "/".join(["x_" * 100] * 40)]
    assert not any(rx.fullmatch(p) for p in hostile)
    assert rx.fullmatch("deep/" * 1000 + "a_b_c_d_e.json")
    assert rx.fullmatch("_" * 250 + ".json")
    rx = compile_glob("**/*a*a*a*a*a*a*a*b/**/*c*c*c*d")
    assert not rx.fullmatch("/".join(["a" * 200] * 200) + "/" + "c" * 250)
    assert rx.fullmatch("x/aaaaaaab/y/z/ccccd")


def test_rules_keep_their_order_whatever_their_first_name() -> None:
    """A rule whose glob starts with a plain name is only tried for paths
    under that name; the order (the user's first, then the built-in ones)
    decides all the same."""
    from vfsd.evictrules import RuleSet, volume_rules

    rules = RuleSet(volume_rules([{"path": "**/*.log", "max_age_steps": 3},
                                  {"path": "conversation_history/**", "pin": False},
                                  {"path": "d*/x", "pin": True}]))
    assert [r.path for r in rules.rules] == ["**/*.log", "conversation_history/**", "d*/x",
                                             "conversation_history/**", "blobs/*"]
    assert rules.match("conversation_history/a.log").index == 1
    assert rules.match("conversation_history/a.md").index == 2  # the user's, not rule 4
    assert rules.match("data/x").index == 3
    assert rules.match("blobs/x").index == 5 and rules.match("blobs/x").builtin
    assert rules.match("blobs/x/y") is None and rules.match("other/x") is None
    assert RuleSet(volume_rules([], builtins=False)).match("blobs/x") is None


def test_a_refusal_names_the_records_that_hold_the_room(make) -> None:
    v = make(quota_bytes=3000)
    root = v.store.root_ino
    history = v.store.create(root, b"conversation_history", DIR, os.getuid(), os.getgid()).ino
    record = v.file(b"session_1.md", b"r" * 2000, step=0, parent=history)
    old = v.file(b"old", b"o" * 500, step=1)
    writing = v.file(b"writing", step=2)
    with pytest.raises(errors.QuotaExceeded) as info:
        v.evictor.reserve(1100, writing)  # old goes; the record stays, so no room
    assert not v.store.inode_exists(old) and v.store.inode_exists(record)
    refusal = v.evictor.refusal
    assert refusal["records"] == [{"rule_index": 1, "rule_path": "conversation_history/**",
                                   "files": 1, "bytes": 2000}]
    assert str(info.value) == refusal["message"]
    assert "1 record file(s) of 2,000 bytes under built-in rule 1" in refusal["message"]
    v.evictor.take_invalidations()
    v.evictor.reserve(900, writing)  # fits without eviction: the refusal is still the last
    assert v.evictor.refusal is refusal
    more = v.file(b"more", b"m" * 300, step=3)
    v.evictor.reserve(800, writing)  # room made by eviction: the refusal no longer holds
    assert not v.store.inode_exists(more) and v.evictor.refusal is None
