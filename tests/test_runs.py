"""Runs: every graph thread a directory of a few shard daemons, on real mounts and real graphs.

One Runs (two shards) serves the whole module, as one serves a LangGraph
server: every test uses threads of its own in it. Graphs are tests/ckpt_graph.py's
(what a node "sees" is what `cat`/`ls` print in the thread's mount); the saver is
InMemorySaver.
"""

from __future__ import annotations

import json
import operator
import os
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("langgraph")

from ckpt_graph import AFTER_V2, MOUNT_OPTIONS, at_step, build, observe  # noqa: E402
from conftest import daemons_under, mounts_under, open_files_under, tree  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool import SnapshotUnavailable, ThreadIdError  # noqa: E402
from mount_tool.langgraph import FilesChannel, write_artifact  # noqa: E402
from mount_tool.langgraph.checkpointer import BadFilesMetadata, VfsdCheckpointer  # noqa: E402
from mount_tool.runs import THREAD_RECORD, ThreadRecord, thread_dir_name, write_record  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

ORIGINAL = ["0:a=;ls=", "1:a=v1;ls=a.txt,c.txt", "2:a=v2;ls=a.txt,c.txt", "3:a=v3;ls=a.txt"]
HOSTILE_IDS = ["../x", "../../etc", "/etc/passwd", "x" * 2000, "a\x00b", "\n\t\x1b[31mred",
               "", ".", "..", "é/ü", "\ud800", " spaced "]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    with mount_tool.runs(root, shards=2, **MOUNT_OPTIONS) as r:
        yield r


def config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_hostile_thread_ids_get_runs_of_their_own(runs):
    # Every id maps to a name made of its hash, directly under ROOT/threads.
    dirs = {runs.run_dir(thread) for thread in HOSTILE_IDS}
    assert len(dirs) == len(HOSTILE_IDS)
    for thread in HOSTILE_IDS:
        run_dir = runs.run_dir(thread)
        assert run_dir.parent == runs.root / "threads"
        assert run_dir.name == thread_dir_name(thread) and run_dir.name.startswith("t")
    # Real files for the worst of them: each its own volume, its id recorded.
    mounted = ["../x", "", "a\x00b", "x" * 2000, "\ud800"]
    for i, thread in enumerate(mounted):
        with runs.use(thread) as m:
            m.write("id.txt", f"{i}")
            doc = json.loads((runs.run_dir(thread) / THREAD_RECORD).read_text())
            assert doc["thread_id"] == thread  # the id as given
            shard = runs.root / "shards" / doc["shard"]
            assert m.root == shard / "fs" / thread_dir_name(thread)
            assert os.path.realpath(runs.run_dir(thread) / "fs") == str(m.root)
    assert set(mounted) <= set(runs.threads())
    for i, thread in enumerate(mounted):
        with runs.use(thread) as m:
            assert (m.root / "id.txt").read_text() == f"{i}"
    # Nothing was made outside ROOT/threads and ROOT/shards.
    assert sorted(p.name for p in runs.root.iterdir()) == ["shards", "threads"]
    for bad in (None, 1.5, b"bytes", ["x"], True):
        with pytest.raises(ThreadIdError):
            runs.use(bad).__enter__()
    with pytest.raises(ThreadIdError, match="at most"):
        runs.use("x" * (64 * 1024 + 1)).__enter__()
    # A record that names another thread is refused, never shared; one that
    # names no shard, or cannot be read, is refused too.
    victim = runs.run_dir("victim")
    victim.mkdir(parents=True)
    for doc in ({"version": 2, "thread_id": "someone", "shard": "0"},
                {"version": 1, "thread_id": "someone"}):
        (victim / THREAD_RECORD).write_text(json.dumps(doc))
        with pytest.raises(mount_tool.MountToolError, match="refusing to mix"):
            runs.get("victim")
    for text, why in ((json.dumps({"version": 2, "thread_id": "victim", "shard": "../x"}),
                       "names no shard"), ("{not json", "unreadable"),
                      ("[1]", "no JSON object"),
                      (json.dumps({"version": 2, "thread_id": "victim", "shard": "0",
                                   "pad": "x" * (1 << 20)}), "over 1,048,576 bytes")):
        (victim / THREAD_RECORD).write_text(text)
        with pytest.raises(mount_tool.MountToolError, match=why):
            runs.get("victim")
    with pytest.raises(ThreadIdError, match="no thread_id"):
        runs.thread_of({"configurable": {}})


def test_one_graph_serves_many_threads(runs):
    saver = VfsdCheckpointer(InMemorySaver(), runs)
    app = build(runs).compile(checkpointer=saver)
    threads = [fresh("t"), "../escape", fresh("t")]
    for thread in threads:
        assert app.invoke({"i": 0}, config(thread))["seen"] == ORIGINAL
        assert observe(runs.get(thread)) == "a=v3;ls=a.txt,b.txt"
    # Time travel in each thread brings back its own files, whatever the others did.
    for thread in threads:
        past = at_step(app, config(thread), AFTER_V2)
        assert app.invoke(None, past.config)["seen"][2] == "2:a=v2;ls=a.txt,c.txt"
    labels = [s["label"] for s in runs.get(threads[0]).snapshots()]
    assert any(label.startswith(threads[0]) and " ckpt " in label for label in labels), labels


def test_threads_hold_no_descriptors_between_checkpoints(runs):
    """Each thread's checkpoints rewrite its position file: a descriptor kept
    per thread ran a server of ~1,000 threads into the usual limit of 1,024
    open files (bench/threads_bench.py counted 301 held after 300 threads)."""
    app = build(runs).compile(checkpointer=VfsdCheckpointer(InMemorySaver(), runs))
    for _ in range(12):
        assert app.invoke({"i": 0}, config(fresh("fd")))["seen"] == ORIGINAL
    assert open_files_under(runs.root) == []


async def test_async_threads_at_once(runs):
    import asyncio

    app = build(runs).compile(checkpointer=VfsdCheckpointer(InMemorySaver(), runs))
    threads = [fresh("async") for _ in range(6)]

    async def one(thread: str) -> None:
        out = await app.ainvoke({"i": 0}, config(thread))
        assert out["seen"] == ORIGINAL
        past = None
        async for state in app.aget_state_history(config(thread)):
            if state.metadata.get("step") == AFTER_V2:
                past = state
        replay = await app.ainvoke(None, past.config)
        assert replay["seen"][2] == "2:a=v2;ls=a.txt,c.txt"

    await asyncio.gather(*(one(t) for t in threads))
    for thread in threads:  # the replays ran on to the end
        assert observe(runs.get(thread)) == "a=v3;ls=a.txt,b.txt"


def test_copy_and_delete_thread(runs):
    saver = VfsdCheckpointer(InMemorySaver(), runs)
    app = build(runs).compile(checkpointer=saver)
    source, copy = fresh("src"), fresh("copy")
    app.invoke({"i": 0}, config(source))
    big = os.urandom(3 << 20)  # chunked content: shared by the copy, never copied
    with runs.use(source) as m:
        m.write("big.bin", big)
        chunks_before = m.stats()
    saver.copy_thread(source, copy)
    # The copy has the checkpoints, the files and the history.
    assert [s.values for s in app.get_state_history(config(copy))] == \
        [s.values for s in app.get_state_history(config(source))]
    assert tree(runs.get(copy).root) == tree(runs.get(source).root)
    assert [s["id"] for s in runs.get(copy).snapshots()] == \
        [s["id"] for s in runs.get(source).snapshots()]
    copied = runs.get(copy).snapshot_state()["base"]  # the files as they were copied
    with runs.use(copy) as m:
        assert m.read_bytes("big.bin") == big
        chunks_after = m.stats()
    assert (chunks_after["chunk_count"], chunks_after["chunk_bytes"]) == \
        (chunks_before["chunk_count"], chunks_before["chunk_bytes"])  # the shard's, shared
    # The copy lives on its source's shard (one store shares content).
    records = [json.loads((runs.run_dir(t) / THREAD_RECORD).read_text()) for t in (source, copy)]
    assert records[0]["shard"] == records[1]["shard"]
    # Time travel on the copy, and the copy diverges without touching the source.
    past = at_step(app, config(copy), AFTER_V2)
    assert app.invoke(None, past.config)["seen"][2] == "2:a=v2;ls=a.txt,c.txt"
    assert observe(runs.get(source)) == "a=v3;ls=a.txt,b.txt,big.bin"
    # Deleting the source removes its run dir, files and volume; the copy stays whole.
    saver.delete_thread(source)
    assert not runs.run_dir(source).exists() and source not in runs.threads()
    assert list(saver.list(config(source))) == []
    past = at_step(app, config(copy), AFTER_V2)
    assert app.invoke(None, past.config)["seen"][2] == "2:a=v2;ls=a.txt,c.txt"
    with runs.use(copy) as m:  # content the source held too is still there
        m.restore(copied)
        assert m.read_bytes("big.bin") == big
    # A thread copied onto one that has files is refused; copying nothing gives nothing.
    occupied = fresh("occupied")
    runs.get(occupied)
    with pytest.raises(mount_tool.MountToolError, match="already has files"):
        runs.copy(copy, occupied)
    assert runs.copy(fresh("nobody"), fresh("x")) is None


def test_a_copy_deletes_nothing_it_did_not_make(runs):
    """Where the copy would go there is already a directory without a record,
    or a volume no record names: refused, both left as they are. A copy that
    died half way says so (its record is written first): neither used nor
    copied onto, until it is deleted; then the copy goes through."""
    source = fresh("src")
    with runs.use(source) as m:
        m.write("a.txt", "a")
    target = fresh("dst")
    taken = runs.run_dir(target)
    taken.mkdir(parents=True)
    (taken / "x").write_text("mine")
    with pytest.raises(mount_tool.MountToolError, match="has no thread.json"):
        runs.copy(source, target)
    assert os.listdir(taken) == ["x"]
    target = fresh("dst")
    name = thread_dir_name(target)
    m.shard.call("volume_create", volume=name, thread=target)
    with pytest.raises(mount_tool.MountToolError, match="holds a volume"):
        runs.copy(source, target)
    assert not os.path.lexists(runs.run_dir(target))
    assert name in [v["volume"] for v in m.shard.call("volumes")["volumes"]]
    target = fresh("dst")
    write_record(runs.run_dir(target), ThreadRecord(target, m.shard.name, copying=True))
    for attempt in (lambda: runs.get(target), lambda: runs.copy(source, target)):
        with pytest.raises(mount_tool.MountToolError, match="did not finish"):
            attempt()
    assert runs.delete(target)
    assert runs.copy(source, target).read_bytes("a.txt") == b"a"


def test_a_copy_calls_before_done_before_it_is_complete(runs):
    """`Runs.copy(..., before_done=)` is called with both threads' record
    directories once the files are copied and while the target still says
    it is a copy being made; one that raises leaves a copy that did not
    finish. VfsdCheckpointer.copy_thread passes one that copies its record:
    bound to the target, with the source's interrupt pins."""
    source = fresh("src")
    with runs.use(source) as m:
        m.write("a.txt", "a")
    seen = []

    def before_done(source_state: Path, target_state: Path) -> None:
        record = json.loads((target_state.parent / THREAD_RECORD).read_text())
        seen.append((source_state, target_state, record.get("copying")))

    target = fresh("dst")
    assert runs.copy(source, target, before_done=before_done).read_bytes("a.txt") == b"a"
    assert seen == [(runs.run_dir(source) / ".vfsd", runs.run_dir(target) / ".vfsd", True)]
    assert "copying" not in json.loads((runs.run_dir(target) / THREAD_RECORD).read_text())

    def fails(source_state: Path, target_state: Path) -> None:
        raise OSError("no room for the record")

    target = fresh("dst")
    with pytest.raises(OSError, match="no room"):
        runs.copy(source, target, before_done=fails)
    with pytest.raises(mount_tool.MountToolError, match="did not finish"):
        runs.get(target)
    assert runs.delete(target)
    # The checkpointer's own record travels with the copy.
    saver = VfsdCheckpointer(InMemorySaver(), runs)
    app = build(runs).compile(checkpointer=saver)
    source, target = fresh("src"), fresh("dst")
    app.invoke({"i": 0}, config(source))
    record_path = runs.run_dir(source) / ".vfsd" / "langgraph.json"
    record = json.loads(record_path.read_text())
    assert record["thread"] == source
    pins = {"some-checkpoint": {"snapshot": "s1", "was_pinned": True}}  # as an interrupt leaves
    record_path.write_text(json.dumps({**record, "pins": pins}))
    saver.copy_thread(source, target)
    copied = json.loads((runs.run_dir(target) / ".vfsd" / "langgraph.json").read_text())
    assert (copied["thread"], copied["pins"]) == (target, pins)


def test_a_copy_never_deletes_a_thread_it_does_not_recognise(runs):
    """Issue 28, item 5: a copy onto a thread whose thread.json was missing
    took it for a copy that died half way and deleted it, files and
    snapshots, without a word."""
    source, victim = fresh("src"), fresh("victim")
    with runs.use(source) as m:
        m.write("a.txt", "source\n")
    with runs.use(victim) as m:
        m.write("precious.txt", "the victim's own\n")
        m.snapshot()
    record = runs.run_dir(victim) / "thread.json"
    saved = record.read_bytes()
    record.unlink()
    with pytest.raises(mount_tool.MountToolError, match="thread.json"):
        runs.copy(source, victim)
    record.write_bytes(saved)
    with runs.use(victim) as m:
        assert (m.root / "precious.txt").read_text() == "the victim's own\n"
        assert len(m.snapshots()) == 1


def test_threads_are_directories_of_a_few_daemons(tmp_path):
    """Twelve threads (or more, until both shards have one), two shard daemons
    and two mounts; nothing else. A Runs
    opened again with another shard count finds every thread on the shard
    its record names, and puts new ones on the new count's."""
    root = tmp_path / "few"

    def shard_of(thread: str, count: int) -> int:
        return int(thread_dir_name(thread)[1:9], 16) % count

    threads: list[str] = []
    while len(threads) < 12 or {shard_of(t, 2) for t in threads} != {0, 1}:
        threads.append(fresh("few"))
    with mount_tool.runs(root, shards=2) as few:
        for i, thread in enumerate(threads):
            with few.use(thread) as m:
                m.write("n.txt", str(i))
        shards = few.shards()
        assert sorted(s["name"] for s in shards) == ["0", "1"]
        assert sorted(daemons_under(root)) == sorted(s["pid"] for s in shards)
        assert mounts_under(root) == [str(root / "shards" / n / "fs") for n in ("0", "1")]
        assert sorted(os.listdir(root / "shards" / "0" / "fs") +
                      os.listdir(root / "shards" / "1" / "fs")) == \
            sorted(thread_dir_name(t) for t in threads)
        placed = {t: json.loads((few.run_dir(t) / THREAD_RECORD).read_text())["shard"]
                  for t in threads}
    assert daemons_under(root) == [] and mounts_under(root) == []
    with mount_tool.runs(root, shards=3) as more:
        for i, thread in enumerate(threads):
            with more.use(thread) as m:
                assert (m.root / "n.txt").read_text() == str(i)
                assert m.shard.name == placed[thread]
        # New threads until each of the three shards has one (random ids alone
        # left shard 2 without any 1 time in 40).
        new: list[str] = []
        while len(new) < 9 or {shard_of(t, 3) for t in new} != {0, 1, 2}:
            new.append(fresh("more"))
        for thread in new:
            with more.use(thread) as m:
                assert m.shard.name == str(shard_of(thread, 3))
        assert len(daemons_under(root)) == 3
    assert daemons_under(root) == [] and mounts_under(root) == []


def test_delete_takes_only_what_a_runs_made(runs):
    """A thread directory without a readable record of its thread is never
    deleted; a thread whose file a program holds open is refused, naming it;
    files a Runs did not make stay where they are."""
    stray = runs.run_dir("stray")
    stray.mkdir(parents=True)
    (stray / "mine.txt").write_text("not a thread")
    with pytest.raises(mount_tool.MountToolError, match="holds no thread.json"):
        runs.delete("stray")
    (stray / THREAD_RECORD).write_text("{garbage")
    with pytest.raises(mount_tool.MountToolError, match="unreadable"):
        runs.delete("stray")
    (stray / THREAD_RECORD).write_text(json.dumps({"version": 2, "thread_id": "other",
                                                   "shard": "0"}))
    with pytest.raises(mount_tool.MountToolError, match="records thread 'other'"):
        runs.delete("stray")
    assert (stray / "mine.txt").read_text() == "not a thread"
    assert not runs.delete(fresh("never-used"))

    thread = fresh("held")
    with runs.use(thread) as m:
        m.write("f.txt", "x")
        with pytest.raises(mount_tool.MountToolError, match="in use"):
            runs.delete(thread)
        root = m.root
    with open(root / "f.txt") as held:
        with pytest.raises(mount_tool.MountError, match=f"pid {os.getpid()}"):
            runs.delete(thread)
        assert held.read() == "x"
    assert runs.get(thread).read_bytes("f.txt") == b"x"
    (runs.run_dir(thread) / "notes.txt").write_text("someone's")
    assert runs.delete(thread)
    assert not runs.exists(thread) and thread not in runs.threads()
    assert os.listdir(runs.run_dir(thread)) == ["notes.txt"]  # left as it was
    with runs.use(thread) as m:  # a new thread of that id starts from nothing
        assert tree(m.root) == {}


def test_hostile_checkpoint_metadata(runs):
    """A checkpoint store is input: metadata naming another thread's run, a
    snapshot that does not exist, or garbage never restores anyone's files."""
    inner = InMemorySaver()
    saver = VfsdCheckpointer(inner, runs)
    app = build(runs).compile(checkpointer=saver)
    victim, attacker = fresh("victim"), fresh("attacker")
    app.invoke({"i": 0}, config(victim))
    app.invoke({"i": 0}, config(attacker))
    victim_run = runs.get(victim).snapshot_state()["run"]
    victim_files = tree(runs.get(victim).root)
    attacker_files = tree(runs.get(attacker).root)
    past = at_step(app, config(attacker), AFTER_V2)
    tup = inner.get_tuple(past.config)
    forged = {
        "another thread's run": {"run": victim_run, "snapshot": "s2", "step": 2},
        "a snapshot that does not exist": {**tup.metadata["vfsd"], "snapshot": "s999999"},
    }
    for what, vfsd in forged.items():
        stored = inner.put(tup.parent_config, tup.checkpoint | {"id": str(uuid.uuid4())},
                           {**tup.metadata, "vfsd": vfsd}, {})
        with pytest.raises(SnapshotUnavailable) as err:
            app.invoke(None, stored)
        assert "cannot be restored" in str(err.value), what
        assert tree(runs.get(attacker).root) == attacker_files, what  # nothing changed
    for garbage in ({"run": "../../x", "snapshot": "s1"}, {"snapshot": "../s1"},
                    {"snapshot": "s1", "step": "many"}, "s1", ["s1"]):
        stored = inner.put(tup.parent_config, tup.checkpoint | {"id": str(uuid.uuid4())},
                           {**tup.metadata, "vfsd": garbage}, {})
        with pytest.raises(BadFilesMetadata):
            app.invoke(None, stored)
        assert tree(runs.get(attacker).root) == attacker_files
    assert tree(runs.get(victim).root) == victim_files


def test_checkpoints_from_before_a_thread_had_files(runs):
    """update_state on a new thread needs no daemon: its checkpoint records
    "no files" (s0); a run from it later starts from no files again."""
    app = build(runs).compile(checkpointer=VfsdCheckpointer(InMemorySaver(), runs))
    thread = fresh("early")
    early = app.update_state(config(thread), {"i": 3}, as_node="step")
    assert not runs.exists(thread)  # nothing mounted, no run dir
    assert app.get_state(early).metadata["vfsd"]["snapshot"] == "s0"
    assert app.invoke(None, config(thread))["seen"] == ["3:a=;ls="]
    assert observe(runs.get(thread)) == "a=;ls=b.txt"
    before = runs.get(thread).snapshot_state()["base"]
    # A run from the early checkpoint finds no files, and nothing is lost.
    assert app.invoke(None, early)["seen"] == ["3:a=;ls="]  # b.txt was gone again
    m = runs.get(thread)
    assert before in {s["id"] for s in m.snapshots()}
    assert (m.root / ".vfsd" / "snapshots" / before / "b.txt").read_text() == "late"


class LoopState(TypedDict, total=False):
    files: FilesChannel
    n: int
    seen: Annotated[list[str], operator.add]


def loop_graph(runs, turns: int):
    """A graph writing a new version of log.txt (~24 KB) and one more file per
    turn; `seen` keeps the first line of log.txt each turn found."""
    def turn(state: LoopState) -> dict:
        n = state.get("n", 0) + 1
        with runs.use(runs.thread_of()) as m:
            log = m.root / "log.txt"
            seen = log.read_text().split("\n", 1)[0] if log.exists() else ""
        update = write_artifact(runs, "log.txt", f"turn {n}\n" * 3000)
        update["files"].update(write_artifact(runs, f"t/{n}.txt", str(n))["files"])
        return {**update, "n": n, "seen": [seen]}

    g = StateGraph(LoopState)
    g.add_node("turn", turn)
    g.add_edge(START, "turn")
    g.add_conditional_edges("turn", lambda s: END if s["n"] >= turns else "turn")
    return g


def test_files_live_as_long_as_their_checkpoints(runs):
    """Beyond the daemon's default retention (32 snapshots, 20 steps), every
    checkpoint a saver keeps still brings its files back."""
    saver = VfsdCheckpointer(InMemorySaver(), runs)
    app = loop_graph(runs, 45).compile(checkpointer=saver)
    thread = fresh("long")
    app.invoke({}, config(thread))
    history = list(app.get_state_history(config(thread)))
    assert len(history) > 45 and all(saver.restorable(s.config) for s in history)
    first = next(s for s in history if s.values.get("n") == 1)
    replay = app.invoke(None, first.config)  # from turn 1, 44 turns and snapshots ago
    assert replay["seen"][:2] == ["", "turn 1"]  # turn 2 found turn 1's files
    assert sorted(int(p.stem) for p in (runs.get(thread).root / "t").iterdir()) == \
        list(range(1, 46))


def test_byte_budget_drops_the_oldest_and_says_so(tmp_path):
    with mount_tool.runs(tmp_path / "budget", snapshot_keep_bytes="150KiB") as few:
        saver = VfsdCheckpointer(InMemorySaver(), few)
        app = loop_graph(few, 12).compile(checkpointer=saver)
        thread = fresh("budget")
        app.invoke({}, config(thread))
        history = list(app.get_state_history(config(thread)))
        kept = [saver.restorable(s.config) for s in history]  # newest first
        assert kept[0] and not kept[-2]  # the newest stays, the oldest went
        m = few.get(thread)
        assert m.snapshot_state()["bytes"] <= 150 * 1024
        early = next(s for s in history if s.values.get("n") == 1)
        with pytest.raises(SnapshotUnavailable, match="byte budget"):
            app.invoke(None, early.config)
        assert "snapshot_budget" in (m.shard.run_dir / ".vfsd" / "vfsd.log").read_text()


def test_a_killed_shard_fails_the_calls_in_flight_and_comes_back(tmp_path):
    """SIGKILL of a shard daemon serving three threads: the call in flight
    fails naming the shard, a file call on a thread's mount says the shard
    is gone, and the next use starts it again; every thread's files and
    every checkpoint's files are there (a replay from the past restores them)."""
    import signal
    import threading

    from conftest import wait_for

    with mount_tool.runs(tmp_path / "crash", shards=1, **MOUNT_OPTIONS) as runs:
        saver = VfsdCheckpointer(InMemorySaver(), runs)
        app = build(runs).compile(checkpointer=saver)
        threads = [fresh("k") for _ in range(3)]
        for thread in threads:
            assert app.invoke({"i": 0}, config(thread))["seen"] == ORIGINAL
        m = runs.get(threads[0])
        [shard] = runs.shards()
        pid = shard["pid"]
        os.kill(pid, signal.SIGSTOP)  # the next request waits for it: in flight at the kill
        failed: list[BaseException] = []

        def in_flight() -> None:
            try:
                m.snapshot(label="in flight")
            except BaseException as exc:  # noqa: BLE001 - what the test looks at
                failed.append(exc)

        caller = threading.Thread(target=in_flight)
        caller.start()
        # Sent, and waiting for the answer (a socket's timeout waits in poll).
        wait_for(lambda: "poll" in Path(f"/proc/self/task/{caller.native_id}/wchan").read_text(),
                 "the request to be in flight")
        os.kill(pid, signal.SIGKILL)
        caller.join(timeout=60)
        [exc] = failed
        assert isinstance(exc, mount_tool.ControlError) and exc.code == "connection"
        assert "shard 0" in str(exc) and "died" in str(exc), exc
        wait_for(lambda: not m.shard.alive(), "the daemon to be gone")
        with pytest.raises(OSError, match="shard 0") as gone:
            m.read_bytes("a.txt")
        assert "started again on the next use" in str(gone.value)
        for thread in threads:  # the next use starts the shard again
            assert observe(runs.get(thread)) == "a=v3;ls=a.txt,b.txt"
        assert runs.shards()[0]["starts"] == 2 and runs.shards()[0]["pid"] != pid
        for thread in threads:
            past = at_step(app, config(thread), AFTER_V2)
            assert app.invoke(None, past.config)["seen"][2] == "2:a=v2;ls=a.txt,c.txt"
