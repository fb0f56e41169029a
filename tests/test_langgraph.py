"""mount_tool.langgraph: the files reducer, and real StateGraphs on a real vfsd mount."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TypedDict

import pytest
from conftest import unmount_quietly
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

import mount_tool
from mount_tool.langgraph import (
    FilesChannel,
    files_reducer,
    make_step_node,
    make_sync_node,
    write_artifact,
)


def _ref(ino: int, path: str) -> dict:
    return {"ino": ino, "gen": 1, "path": path, "size": 1, "hash": "0" * 32, "step": 0,
            "status": "active"}  # fmt: skip


def test_files_reducer_merges_and_deletes() -> None:
    a, b, c = _ref(1, "a"), _ref(2, "b"), _ref(3, "c")
    left = {"a": a, "b": b}
    merged = files_reducer(left, {"b": None, "c": c, "missing": None})
    assert merged == {"a": a, "c": c}
    assert left == {"a": a, "b": b}, "the reducer must not mutate its inputs"
    assert files_reducer(None, {"a": a}) == {"a": a}
    assert files_reducer({"a": a}, None) == {"a": a}
    assert files_reducer({}, {"x": None}) == {}


def test_files_channel_in_a_graph_without_mount() -> None:
    class State(TypedDict):
        files: FilesChannel

    def add(state: State) -> dict:
        return {"files": {"a": _ref(1, "a"), "b": _ref(2, "b")}}

    def drop(state: State) -> dict:
        return {"files": {"a": None}}

    g = StateGraph(State)
    g.add_node("add", add)
    g.add_node("drop", drop)
    g.add_edge(START, "add")
    g.add_edge("add", "drop")
    g.add_edge("drop", END)
    out = g.compile().invoke({"files": {}})
    assert out["files"] == {"b": _ref(2, "b")}


@pytest.fixture
def mnt(tmp_path: Path):
    pytest.importorskip("vfsd.cli")
    m = mount_tool.mount(tmp_path / "run", done_retention_steps=3, max_age_steps=1000)
    try:
        yield m
    finally:
        unmount_quietly(m)


class ArtifactState(TypedDict):
    files: FilesChannel
    iteration: int


STEPS = 50
MB = 1 << 20


def _payload(i: int) -> bytes:
    # Every 10th artifact is 1 MiB, the others 100 KiB: ~9 MiB over the run.
    size = MB if i % 10 == 9 else 100 * 1024
    return (f"artifact {i}\n".encode() * (size // 12 + 1))[:size]


def test_fifty_step_graph_keeps_state_small(mnt: mount_tool.Mount) -> None:
    written: dict[str, dict] = {}
    evicted_seen: set[str] = set()

    def work(state: ArtifactState) -> dict:
        i = state["iteration"]
        # Odd iterations write scratch files marked done: evicted 3 steps later.
        update = write_artifact(
            mnt, f"artifacts/step-{i:03d}.txt", _payload(i), status="done" if i % 2 else None
        )
        written.update(update["files"])
        return {**update, "iteration": i + 1}

    step_node = make_step_node(mnt)

    def step(state: ArtifactState, config) -> dict:
        update = step_node(state, config)
        evicted_seen.update(k for k, v in update.get("files", {}).items() if v is None)
        return update

    g = StateGraph(ArtifactState)
    g.add_node("work", work)
    g.add_node("vfsd_step", step)
    g.add_edge(START, "work")
    g.add_edge("work", "vfsd_step")
    g.add_conditional_edges("vfsd_step", lambda s: END if s["iteration"] >= STEPS else "work")
    saver = InMemorySaver()
    graph = g.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "t1"}, "recursion_limit": 4 * STEPS}
    final = graph.invoke({"files": {}, "iteration": 0}, config)

    assert final["iteration"] == STEPS
    total_bytes = sum(ref["size"] for ref in written.values())
    assert total_bytes > 8 * MB
    # Done files were evicted and their refs left the state; active ones stayed.
    done_keys = {k for k, ref in written.items() if ref["status"] == "done"}
    assert evicted_seen, "eviction should have removed some refs"
    assert evicted_seen <= done_keys
    assert set(final["files"]).isdisjoint(evicted_seen)
    assert {k for k in written if k not in done_keys} <= set(final["files"])
    for key in evicted_seen:
        with pytest.raises(mount_tool.Evicted):
            mnt.read(written[key])
    for key, ref in final["files"].items():
        assert mnt.read(ref) == _payload(int(key.split("-")[1][:3]))

    # The checkpoint holds refs, not contents.
    checkpoint = saver.get_tuple(config).checkpoint
    _, blob = saver.serde.dumps_typed(checkpoint)
    assert len(blob) < 500 * 1024, f"checkpoint is {len(blob)} bytes"
    assert len(blob) < total_bytes / 100
    assert mnt.get_step() >= 2 * STEPS - 1


def test_sync_node_tracks_shell_writes(mnt: mount_tool.Mount) -> None:
    scripts = [
        "mkdir -p out && seq 1 100 > out/numbers.txt && echo hi > out/hello.txt",
        "mv out/hello.txt out/greeting.txt && echo more >> out/numbers.txt",
        "rm out/numbers.txt",
    ]
    files_before_shell: list[dict] = []

    def shell(state: ArtifactState) -> dict:
        files_before_shell.append(state["files"])
        subprocess.run(["sh", "-c", scripts[state["iteration"]]], cwd=mnt.root, check=True)
        return {"iteration": state["iteration"] + 1}

    g = StateGraph(ArtifactState)
    g.add_node("shell", shell)
    g.add_node("vfsd_sync", make_sync_node(mnt))
    g.add_node("vfsd_step", make_step_node(mnt))
    g.add_edge(START, "shell")
    g.add_edge("shell", "vfsd_sync")
    g.add_edge("vfsd_sync", "vfsd_step")
    g.add_conditional_edges(
        "vfsd_step", lambda s: END if s["iteration"] >= len(scripts) else "shell"
    )
    graph = g.compile(checkpointer=InMemorySaver())
    final = graph.invoke({"files": {}, "iteration": 0}, {"configurable": {"thread_id": "sync"}})
    _, after_first, after_second = files_before_shell

    assert set(after_first) == {"out/numbers.txt", "out/hello.txt"}
    assert mnt.read_text(after_first["out/hello.txt"]) == "hi\n"
    assert set(after_second) == {"out/numbers.txt", "out/greeting.txt"}
    assert after_second["out/greeting.txt"]["ino"] == after_first["out/hello.txt"]["ino"]
    numbers = "".join(f"{i}\n" for i in range(1, 101)) + "more\n"
    assert after_second["out/numbers.txt"]["hash"] == mount_tool.content_hash(numbers.encode())
    assert after_second["out/numbers.txt"]["ino"] == after_first["out/numbers.txt"]["ino"]
    with pytest.raises(mount_tool.Missing):
        mnt.read(after_first["out/numbers.txt"])
    assert set(final["files"]) == {"out/greeting.txt"}


def test_step_node_never_moves_the_daemon_backwards(mnt: mount_tool.Mount) -> None:
    """A subgraph or a second thread restarts LangGraph's counter; the daemon keeps its step."""
    mnt.set_step(500)
    old = mnt.write("old-done.txt", "x")
    mnt.set_status(old, "done")
    mnt.set_step(504)  # past done_retention_steps=3: evicted here, between graph steps

    def work(state: ArtifactState) -> dict:
        return {**write_artifact(mnt, "new.txt", "y"), "iteration": state["iteration"] + 1}

    g = StateGraph(ArtifactState)
    g.add_node("work", work)
    g.add_node("vfsd_step", make_step_node(mnt))
    g.add_edge(START, "work")
    g.add_edge("work", "vfsd_step")
    g.add_edge("vfsd_step", END)
    final = g.compile().invoke({"files": {"old-done.txt": old}, "iteration": 0})
    assert mnt.get_step() == 504
    # The ref evicted before the node ran is pruned too (found in the eviction log).
    assert set(final["files"]) == {"new.txt"}
    assert final["files"]["new.txt"]["step"] == 504
