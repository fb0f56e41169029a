"""VfsdCheckpointer: checkpoints that bring their files back, on real mounts and real graphs.

Graphs are real LangGraph graphs (tests/ckpt_graph.py) and a real
`create_deep_agent` driven by a scripted model; savers are InMemorySaver and
PostgresSaver/AsyncPostgresSaver on a PostgreSQL server started here
(tests/pgserver.py). What a node "sees" is what `cat`/`ls` print in a
subprocess with the mount as working directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

import pytest

pytest.importorskip("langgraph")

from ckpt_graph import AFTER_V2, AFTER_V3, MOUNT_OPTIONS, aat_step, at_step, build, observe  # noqa: E402
from conftest import unmount_quietly  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402
from pgserver import pg_server  # noqa: E402, F401 - the fixture

import mount_tool  # noqa: E402
from mount_tool import SnapshotUnavailable, StaleRef, ThreadBindingError  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240)]

TESTS = Path(__file__).parent
ORIGINAL = ["0:a=;ls=", "1:a=v1;ls=a.txt,c.txt", "2:a=v2;ls=a.txt,c.txt", "3:a=v3;ls=a.txt"]


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture
def mnt(tmp_path: Path):
    m = mount_tool.mount(tmp_path / "run", **MOUNT_OPTIONS)
    try:
        yield m
    finally:
        unmount_quietly(m)


def pg_connect(dsn: str):
    import psycopg
    from psycopg.rows import dict_row

    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)


@contextmanager
def make_saver(kind: str, request):
    """An empty-enough saver of `kind` (tests use fresh thread ids)."""
    if kind == "memory":
        yield InMemorySaver()
        return
    pytest.importorskip("psycopg")
    from langgraph.checkpoint.postgres import PostgresSaver

    server = request.getfixturevalue("pg_server")
    with pg_connect(server.dsn) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        yield saver


@pytest.fixture(params=["memory", "postgres"])
def saver(request):
    with make_saver(request.param, request) as s:
        yield s


def thread() -> dict:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}


def snapshot_files(mount: mount_tool.Mount, snapshot: str) -> dict[str, str]:
    """{name: text} of the regular files at the top of a snapshot."""
    top = mount.root / ".vfsd" / "snapshots" / snapshot
    return {p.name: p.read_text() for p in sorted(top.iterdir()) if p.is_file()}


# -- replay ---------------------------------------------------------------------------------


def test_each_checkpoint_holds_exactly_its_files(mnt, saver):
    """A checkpoint's snapshot has the files its state refers to, and no others.

    LangGraph stores checkpoints in the background while the next step runs;
    a snapshot taken then would catch the next step's files.
    """
    app = build(mnt).compile(checkpointer=VfsdCheckpointer(saver, mnt))
    config = thread()
    assert app.invoke({"i": 0}, config)["seen"] == ORIGINAL
    history = list(app.get_state_history(config))
    assert len(history) == 10
    for state in history:
        version = state.metadata["vfsd"]
        assert version["run"] == mnt.snapshot_state()["run"]
        held = snapshot_files(mnt, version["snapshot"])
        refs = state.values.get("files", {})
        assert set(held) == set(refs), (state.metadata["step"], held, refs)
        for name, ref in refs.items():
            assert mnt.hash_of(held[name].encode()) == ref["hash"]


def test_replay_restores_the_checkpoint_files_before_the_first_node(mnt, saver):
    checkpointer = VfsdCheckpointer(saver, mnt)
    app = build(mnt).compile(checkpointer=checkpointer)
    config = thread()
    app.invoke({"i": 0}, config)
    assert observe(mnt) == "a=v3;ls=a.txt,b.txt"  # c.txt was evicted at superstep 6

    past = at_step(app, config, AFTER_V2)
    assert past.next == ("work",)
    # Reading state never touches the files.
    assert observe(mnt) == "a=v3;ls=a.txt,b.txt"
    # Refs taken at a retained checkpoint read their own version.
    v2, evicted = past.values["files"]["a.txt"], past.values["files"]["c.txt"]
    assert mnt.read(v2) == b"v2"
    assert mnt.read(evicted) == b"evict me"
    assert checkpointer.snapshot_of(past.config) == past.metadata["vfsd"]["snapshot"]

    replay = app.invoke(None, past.config)
    first = replay["seen"][len(past.values["seen"])]
    assert first == "2:a=v2;ls=a.txt,c.txt"  # v2, the evicted file back, the late one gone
    assert replay["seen"][2:] == ORIGINAL[2:]
    assert observe(mnt) == "a=v3;ls=a.txt,b.txt"


def test_fork_by_update_state_diverges(mnt, saver):
    app = build(mnt).compile(checkpointer=VfsdCheckpointer(saver, mnt))
    config = thread()
    app.invoke({"i": 0}, config)
    snapshots_before = len(mnt.snapshots())

    past = at_step(app, config, AFTER_V2)
    fork_config = app.update_state(past.config, {"variant": "B"})
    fork = app.get_state(fork_config)
    # The fork's files are its parent's, as they were: recorded, not snapshotted
    # from a mount that shows another checkpoint's files.
    assert fork.metadata["vfsd"]["snapshot"] == past.metadata["vfsd"]["snapshot"]
    assert len(mnt.snapshots()) == snapshots_before
    assert observe(mnt) == "a=v3;ls=a.txt,b.txt"

    forked = app.invoke(None, fork_config)
    assert forked["seen"][2:] == ["2:a=v2;ls=a.txt,c.txt", "3:a=v3B;ls=a.txt"]
    assert (mnt.root / "b.txt").read_text() == "lateB"

    # Each branch, resumed from its own checkpoint after v3, finds its own files.
    original = app.invoke(None, at_step(app, config, AFTER_V3, variant=None).config)
    assert original["seen"][3] == "3:a=v3;ls=a.txt"
    assert (mnt.root / "b.txt").read_text() == "late"
    branch = app.invoke(None, at_step(app, config, AFTER_V3, variant="B").config)
    assert branch["seen"][3] == "3:a=v3B;ls=a.txt"
    assert (mnt.root / "b.txt").read_text() == "lateB"


def test_update_state_keeps_edits_made_through_the_shell(mnt):
    app = build(mnt).compile(checkpointer=VfsdCheckpointer(InMemorySaver(), mnt))
    config = thread()
    app.invoke({"i": 0}, config)
    latest = app.get_state(config)
    (mnt.root / "a.txt").write_text("edited by hand")
    edited_config = app.update_state(latest.config, {"variant": "H"})
    edited = app.get_state(edited_config).metadata["vfsd"]["snapshot"]
    assert edited != latest.metadata["vfsd"]["snapshot"]
    assert snapshot_files(mnt, edited)["a.txt"] == "edited by hand"

    app.invoke(None, at_step(app, config, AFTER_V2).config)  # the mount moves away...
    assert observe(mnt) == "a=v3;ls=a.txt,b.txt"
    app.invoke(None, edited_config)  # ...and a run from the edit brings it back
    assert (mnt.root / "a.txt").read_text() == "edited by hand"


# -- interrupts and a second process -------------------------------------------------------


def test_interrupt_pins_its_snapshot_and_resume_keeps_shell_edits(mnt):
    app = build(mnt).compile(checkpointer=VfsdCheckpointer(InMemorySaver(), mnt))
    config = thread()
    paused = app.invoke({"i": 0, "pause_at": 3}, config)
    assert "__interrupt__" in paused
    waiting = app.get_state(config)
    snapshot = waiting.metadata["vfsd"]["snapshot"]
    assert {s["id"]: s["pinned"] for s in mnt.snapshots()}[snapshot] is True

    # While the graph waits, a human fixes a file; resuming must not undo it.
    (mnt.root / "a.txt").write_text("fixed")
    done = app.invoke(Command(resume="go on"), config)
    assert done["seen"][-1] == "3:a=fixed;ls=a.txt"
    assert (mnt.root / "b.txt").read_text() == "late"
    # Past the interrupt, its snapshot is left to retention again.
    assert {s["id"]: s["pinned"] for s in mnt.snapshots()}[snapshot] is False


RESUME = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import psycopg
    from psycopg.rows import dict_row
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.types import Command
    import mount_tool
    from mount_tool.langgraph import VfsdCheckpointer
    from ckpt_graph import build, observe

    mount = mount_tool.Mount.attach({run_dir!r})
    with psycopg.connect({dsn!r}, autocommit=True, prepare_threshold=0,
                         row_factory=dict_row) as conn:
        app = build(mount).compile(checkpointer=VfsdCheckpointer(PostgresSaver(conn), mount))
        config = {{"configurable": {{"thread_id": {thread_id!r}}}}}
        before = app.get_state(config)
        result = app.invoke(Command(resume="go on"), config)
        print(json.dumps({{"seen": result["seen"], "files": sorted(before.values["files"]),
                           "now": observe(mount)}}))
    mount.detach()
    """
)


def test_new_process_resumes_a_thread_from_postgres(mnt, request):
    with make_saver("postgres", request) as saver:
        app = build(mnt).compile(checkpointer=VfsdCheckpointer(saver, mnt))
        config = thread()
        app.invoke({"i": 0, "pause_at": 3}, config)
        past = at_step(app, config, AFTER_V2)
    # The mount is moved to other files before the new process starts.
    mnt.restore(past.metadata["vfsd"]["snapshot"])
    assert observe(mnt) == "a=v2;ls=a.txt,c.txt"

    server = request.getfixturevalue("pg_server")
    code = RESUME.format(
        tests=str(TESTS),
        run_dir=str(mnt.run_dir),
        dsn=server.dsn,
        thread_id=config["configurable"]["thread_id"],
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["files"] == ["a.txt"]
    assert out["seen"][-1] == "3:a=v3;ls=a.txt"  # the checkpoint's files, restored
    assert out["now"] == "a=v3;ls=a.txt,b.txt"


# -- beyond retention -------------------------------------------------------------------------


def test_beyond_retention_says_which_files_cannot_come_back(tmp_path, caplog):
    m = mount_tool.mount(
        tmp_path / "short", snapshot_keep_last=2, snapshot_keep_steps=0, **MOUNT_OPTIONS
    )
    try:
        saver = InMemorySaver()
        app = build(m).compile(checkpointer=VfsdCheckpointer(saver, m))
        config = thread()
        app.invoke({"i": 0}, config)
        past = at_step(app, config, AFTER_V2)
        gone = past.metadata["vfsd"]["snapshot"]
        assert gone not in {s["id"] for s in m.snapshots()}

        with pytest.raises(SnapshotUnavailable) as info:
            app.invoke(None, past.config)
        err = info.value
        assert err.snapshot == gone and err.checkpoint_id == past.config["configurable"]["checkpoint_id"]
        assert "retention" in err.reason
        assert sorted(ref["path"] for ref in err.lost) == ["a.txt", "c.txt"]
        assert "a.txt" in str(err) and "c.txt" in str(err) and "on_missing" in str(err)
        assert observe(m) == "a=v3;ls=a.txt,b.txt"  # nothing changed, no mix
        with pytest.raises(StaleRef, match="no retained snapshot"):
            m.read(past.values["files"]["a.txt"])

        # Asked to, the run goes on with the live files, and says so.
        keep = build(m).compile(checkpointer=VfsdCheckpointer(saver, m, on_missing="keep"))
        with caplog.at_level(logging.WARNING, logger="mount_tool.langgraph.checkpointer"):
            replay = keep.invoke(None, past.config)
        assert replay["seen"][2] == "2:a=v3;ls=a.txt,b.txt"
        assert any(gone in rec.getMessage() for rec in caplog.records)
    finally:
        unmount_quietly(m)


# -- threads ------------------------------------------------------------------------------------


def test_one_run_dir_serves_one_thread(mnt, tmp_path):
    saver = InMemorySaver()
    checkpointer = VfsdCheckpointer(saver, mnt)
    app = build(mnt).compile(checkpointer=checkpointer)
    first, second = thread(), thread()
    app.invoke({"i": 0}, first)
    record = json.loads((mnt.state_dir / "langgraph.json").read_text())
    assert record["thread"] == first["configurable"]["thread_id"]

    with pytest.raises(ThreadBindingError, match="fork"):
        app.invoke({"i": 0}, second)
    with pytest.raises(ThreadBindingError):
        app.update_state(second, {"i": 1})
    assert app.get_state(second).values == {}  # reading another thread is fine
    # A fresh wrapper (a new process) finds the binding in the run dir.
    with pytest.raises(ThreadBindingError):
        build(mnt).compile(checkpointer=VfsdCheckpointer(saver, mnt)).invoke({"i": 0}, second)

    # The remedy the error gives: fork the run dir for the other thread.
    snapshot = checkpointer.snapshot_of(at_step(app, first, AFTER_V2).config)
    forked = mnt.fork(snapshot, tmp_path / "forked", **MOUNT_OPTIONS)
    try:
        assert observe(forked) == "a=v2;ls=a.txt,c.txt"
        other = build(forked).compile(checkpointer=VfsdCheckpointer(saver, forked))
        assert other.invoke({"i": 0}, second)["seen"][0] == "0:a=v2;ls=a.txt,c.txt"
        assert observe(mnt) == "a=v3;ls=a.txt,b.txt"  # the original run dir is untouched
    finally:
        unmount_quietly(forked)

    # Deleting the bound thread frees the run dir (its files stay)...
    checkpointer.delete_thread(first["configurable"]["thread_id"])
    third = thread()
    assert app.invoke({"i": 0}, third)["seen"][0] == "0:a=v3;ls=a.txt,b.txt"
    # ...and a thread whose files are in another run dir is refused, not mixed.
    checkpointer.delete_thread(third["configurable"]["thread_id"])
    with pytest.raises(SnapshotUnavailable, match="fork"):
        app.invoke(None, second)


# -- async ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "postgres"])
def test_async_replay_and_fork(mnt, kind, request):
    async def scenario(saver) -> None:
        app = build(mnt).compile(checkpointer=VfsdCheckpointer(saver, mnt))
        config = thread()
        assert (await app.ainvoke({"i": 0}, config))["seen"] == ORIGINAL
        past = await aat_step(app, config, AFTER_V2)
        replay = await app.ainvoke(None, past.config)
        assert replay["seen"][2] == "2:a=v2;ls=a.txt,c.txt"
        fork_config = await app.aupdate_state(past.config, {"variant": "B"})
        assert (await app.aget_state(fork_config)).metadata["vfsd"] == past.metadata["vfsd"]
        forked = await app.ainvoke(None, fork_config)
        assert forked["seen"][2:] == ["2:a=v2;ls=a.txt,c.txt", "3:a=v3B;ls=a.txt"]
        for state in [s async for s in app.aget_state_history(config)]:
            held = snapshot_files(mnt, state.metadata["vfsd"]["snapshot"])
            assert set(held) == set(state.values.get("files", {}))

    async def main() -> None:
        if kind == "memory":
            await scenario(InMemorySaver())
            return
        pytest.importorskip("psycopg")
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg import AsyncConnection
        from psycopg.rows import dict_row

        server = request.getfixturevalue("pg_server")
        async with await AsyncConnection.connect(
            server.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            saver = AsyncPostgresSaver(conn)
            await saver.setup()
            await scenario(saver)

    asyncio.run(main())


# -- Deep Agents ----------------------------------------------------------------------------------


def test_deep_agent_replay_sees_its_files(run_factory):
    pytest.importorskip("deepagents")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from test_deepagents import scripted_model, tool_call, turn

    from mount_tool.deepagents import create_vfsd_deep_agent

    run = run_factory("agent", "--max-age-steps", "4", "--done-retention-steps", "3")
    m = mount_tool.Mount.attach(run.run_dir)

    def write(path: str, content: str, call_id: str) -> AIMessage:
        return turn(tool_call("write_file", call_id, file_path=path, content=content))

    script = [
        write("/c.txt", "old notes", "w_c"),  # step 1; max age 4: gone at step 6
        write("/a.txt", "v1", "w1"),
        write("/a.txt", "v2", "w2"),
        write("/a.txt", "v3", "w3"),
        write("/b.txt", "late", "w_b"),
        AIMessage(content="done"),
    ]
    saver = InMemorySaver()
    config = thread()
    agent = create_vfsd_deep_agent(m, scripted_model(script), checkpointer=saver)
    assert isinstance(agent.checkpointer, VfsdCheckpointer)
    agent.invoke({"messages": [HumanMessage("go")]}, config)
    assert sorted(p.name for p in m.root.iterdir()) == ["a.txt", "b.txt"]

    def after_tool(state) -> bool:
        msgs = state.values.get("messages", [])
        return bool(msgs) and isinstance(msgs[-1], ToolMessage) and msgs[-1].tool_call_id == "w2"

    past = next(s for s in agent.get_state_history(config) if after_tool(s))
    assert m.read(past.values["files"]["/a.txt"]) == b"v2"

    # A new agent (new model script, the same saver) replays from there.
    look = turn(tool_call("execute", "look", command="cat a.txt; echo; ls"))
    replayer = create_vfsd_deep_agent(
        m, scripted_model([look, AIMessage(content="seen")]), checkpointer=saver
    )
    state = replayer.invoke(None, past.config)
    seen = next(
        msg
        for msg in state["messages"]
        if isinstance(msg, ToolMessage) and msg.tool_call_id == "look"
    )
    lines = seen.content.split()
    assert lines[0] == "v2"
    assert "c.txt" in lines and "b.txt" not in lines
    m.detach()


# -- Mount snapshot API ------------------------------------------------------------------------------


def test_mount_snapshot_api(mnt, tmp_path):
    ref1 = mnt.write("notes.md", "one")
    s1 = mnt.snapshot(label="first")
    assert s1["id"] == "s1" and s1["label"] == "first"
    assert mnt.snapshot(reuse=True)["id"] == "s1"  # nothing changed: the same one
    assert mnt.snapshot_state() == {
        "base": "s1",
        "last": "s1",
        "changed": False,
        "run": mnt.snapshot_state()["run"],
        "forked_from": None,
        "copied_from": [],
        "bytes": 3,  # the file bytes the snapshots record: notes.md's "one"
    }
    mnt.write("notes.md", "two")
    mnt.write("extra.txt", "x")
    assert mnt.snapshot_state()["changed"] is True
    assert {(c["path"], c["change"]) for c in mnt.diff("s1")} == {
        ("notes.md", "modified"),
        ("extra.txt", "added"),
    }
    s2 = mnt.snapshot(pin=True)
    assert [s["pinned"] for s in mnt.snapshots()] == [False, True]
    assert mnt.pin_snapshot(s2["id"], False)["pinned"] is False
    assert [c["path"] for c in mnt.diff("s1", s2["id"])] == ["extra.txt", "notes.md"]

    assert mnt.read(ref1) == b"one"  # from s1: the live file says "two"
    assert mnt.locate(ref1) == {"found": True, "id": "s1", "path": "notes.md"}
    mnt.restore("s1")
    assert sorted(os.listdir(mnt.root)) == ["notes.md"]
    assert (mnt.root / "notes.md").read_text() == "one"

    forked = mnt.fork(s2["id"], tmp_path / "fork")
    try:
        assert (forked.root / "notes.md").read_text() == "two"
        assert forked.snapshot_state()["forked_from"] == {
            "run": mnt.snapshot_state()["run"],
            "snapshot": s2["id"],
        }
        forked.write("notes.md", "three")
        assert (mnt.root / "notes.md").read_text() == "one"  # they diverge
    finally:
        unmount_quietly(forked)

    mnt.delete_snapshot("s1")
    with pytest.raises(mount_tool.ControlError, match="deleted"):
        mnt.restore("s1")
    assert mnt.read(ref1) == b"one"  # the live file holds that version again
    mnt.write("notes.md", "four")
    with pytest.raises(StaleRef, match="no retained snapshot"):
        mnt.read(ref1)
    with pytest.raises(TypeError):
        mnt.restore(1)  # type: ignore[arg-type]


def test_restore_shows_sizes_the_kernel_had_cached(mnt):
    """Under the writeback cache the kernel keeps its own size of a cached file
    and ignores the daemon's; a restore must make it forget the inode."""
    names = {"shrinks.txt": ("v3", "v3B"), "grows.txt": ("abcdef", "a")}
    for name, (old, _new) in names.items():
        mnt.write(name, old)
    snap = mnt.snapshot()["id"]
    for name, (_old, new) in names.items():
        path = mnt.root / name
        path.write_text(new)
        assert path.read_text() == new and path.stat().st_size == len(new)  # cached now
    mnt.restore(snap)
    for name, (old, _new) in names.items():
        path = mnt.root / name
        assert path.stat().st_size == len(old)
        assert path.read_text() == old
        shell = subprocess.run(["cat", name], cwd=mnt.root, capture_output=True)
        assert shell.stdout == old.encode()


def test_middleware_warns_when_the_checkpointer_is_not_wrapped(run_factory, caplog):
    pytest.importorskip("deepagents")
    from deepagents import create_deep_agent
    from langchain_core.messages import AIMessage, HumanMessage
    from test_deepagents import scripted_model

    from mount_tool.deepagents import VfsdBackend, VfsdMiddleware

    run = run_factory("bare")
    m = mount_tool.Mount.attach(run.run_dir)
    saver = InMemorySaver()
    agent = create_deep_agent(
        scripted_model([AIMessage(content="done")]),
        backend=VfsdBackend(m),
        middleware=[VfsdMiddleware(m)],
        checkpointer=saver,
    )
    with caplog.at_level(logging.WARNING, logger="mount_tool.langgraph.checkpointer"):
        agent.invoke({"messages": [HumanMessage("go")]}, thread())
    assert any("VfsdCheckpointer(saver, mount)" in r.getMessage() for r in caplog.records)
    m.detach()


class SlowSaver(InMemorySaver):
    """Stores a checkpoint late, as a remote saver may: LangGraph sends the
    next step's writes without waiting for it."""

    def put(self, *args, **kwargs):
        import time

        time.sleep(0.5)
        return super().put(*args, **kwargs)

    async def aput(self, *args, **kwargs):
        await asyncio.sleep(0.5)
        return await super().aput(*args, **kwargs)


def interrupt_at_once(mount: mount_tool.Mount) -> StateGraph:
    """`a` writes a file; `b` calls interrupt() before anything else."""

    class S(TypedDict, total=False):
        n: int

    def a(state: S) -> S:
        (mount.root / "a.txt").write_text("a")
        return {"n": 1}

    def b(state: S) -> S:
        interrupt("wait")
        return {"n": 2}

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_interrupt_at_once_pins_before_its_checkpoint_is_stored(mnt, mode):
    """The interrupt's writes come before the saver has stored the checkpoint
    they belong to; its snapshot is pinned all the same."""
    app = interrupt_at_once(mnt).compile(checkpointer=VfsdCheckpointer(SlowSaver(), mnt))
    config = thread()
    if mode == "sync":
        paused = app.invoke({"n": 0}, config)
        waiting = app.get_state(config)
    else:
        paused = asyncio.run(app.ainvoke({"n": 0}, config))
        waiting = asyncio.run(app.aget_state(config))
    assert "__interrupt__" in paused
    snapshot = waiting.metadata["vfsd"]["snapshot"]
    pins = json.loads((mnt.state_dir / "langgraph.json").read_text())["pins"]
    assert pins == {waiting.config["configurable"]["checkpoint_id"]:
                    {"snapshot": snapshot, "was_pinned": False}}
    assert {s["id"]: s["pinned"] for s in mnt.snapshots()}[snapshot] is True
    assert snapshot_files(mnt, snapshot) == {"a.txt": "a"}


def test_an_interrupt_right_after_pinning_leaves_no_unrecorded_pin(mnt, monkeypatch):
    """Ctrl-C (or a cancelled run) lands just after the daemon pinned an
    interrupt's snapshot: the run dir's record names the pin, so deleting the
    thread releases it; it used to stay pinned with nothing to release it."""
    real_pin = mnt.pin_snapshot
    hits: list[str] = []

    def pin_then_interrupted(snapshot_id: str, pin: bool = True):
        result = real_pin(snapshot_id, pin)
        if pin and not hits:
            hits.append(snapshot_id)
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(mnt, "pin_snapshot", pin_then_interrupted)
    cp = VfsdCheckpointer(InMemorySaver(), mnt)
    app = interrupt_at_once(mnt).compile(checkpointer=cp)
    config = thread()
    with pytest.raises(KeyboardInterrupt):
        app.invoke({"n": 0}, config)
    assert hits, "the interrupt was never pinned"
    pinned = {s["id"] for s in mnt.snapshots() if s["pinned"]}
    recorded = json.loads((mnt.state_dir / "langgraph.json").read_text())["pins"]
    assert pinned <= {pin["snapshot"] for pin in recorded.values()}, (pinned, recorded)
    cp.delete_thread(config["configurable"]["thread_id"])
    assert not any(s["pinned"] for s in mnt.snapshots())
