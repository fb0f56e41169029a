"""Where VfsdCheckpointer binds a checkpoint to its files, and what it does when it cannot.

The graphs run behind `ServerLikeAdapter`, a checkpointer wrapped the way
LangGraph's server wraps a custom one (langgraph_api's adapter: the async
methods delegated, a `get_next_version` of its own, so the wrapper's is
never called) whose `aput` takes 100 ms: the next superstep runs while the
previous checkpoint is stored. tests/test_checkpoint_history_server.py runs
the real server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import random
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from ckpt_graph import MOUNT_OPTIONS, build  # noqa: E402
from conftest import unmount_quietly, vfsd_cli  # noqa: E402
from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool import SnapshotUnavailable  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer, files_reducer, write_artifact  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240)]

#: what each `work` of tests/ckpt_graph.py sees (as in test_checkpointer.py)
ORIGINAL = ["0:a=;ls=", "1:a=v1;ls=a.txt,c.txt", "2:a=v2;ls=a.txt,c.txt", "3:a=v3;ls=a.txt"]


class ServerLikeAdapter(BaseCheckpointSaver):
    """A checkpointer wrapped as LangGraph's server wraps a custom one."""

    def __init__(self, inner: BaseCheckpointSaver, put_seconds: float = 0.1) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner
        self.put_seconds = put_seconds

    async def aget_tuple(self, config):
        return await self.inner.aget_tuple(config)

    async def aput(self, config, checkpoint, metadata, new_versions):
        await asyncio.sleep(self.put_seconds)
        return await self.inner.aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path=""):
        await self.inner.aput_writes(config, writes, task_id, task_path)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        async for item in self.inner.alist(config, filter=filter, before=before, limit=limit):
            yield item

    def get_next_version(self, current, channel):
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():.16f}"


@pytest.fixture
def mnt(tmp_path: Path):
    m = mount_tool.mount(tmp_path / "run", **MOUNT_OPTIONS)
    try:
        yield m
    finally:
        unmount_quietly(m)


def snapshot_names(m: mount_tool.Mount, snapshot: str) -> dict[str, str]:
    top = m.root / ".vfsd" / "snapshots" / snapshot
    return {p.name: p.read_text() for p in sorted(top.iterdir()) if p.is_file()}


def thread(name: str) -> dict:
    return {"configurable": {"thread_id": name}}


def test_a_files_channel_graph_binds_every_checkpoint_behind_the_server_adapter(mnt):
    """FilesChannel's channel is the step boundary: no get_next_version needed."""
    saver = VfsdCheckpointer(InMemorySaver(), mnt)
    app = build(mnt).compile(checkpointer=ServerLikeAdapter(saver))
    config = thread("adapted")

    async def scenario() -> list:
        final = await app.ainvoke({"i": 0}, config)
        assert final["seen"] == ORIGINAL
        return [s async for s in app.aget_state_history(config)]

    history = asyncio.run(scenario())
    assert len(history) == 10
    for state in history:
        version = state.metadata["vfsd"]
        assert "unbound" not in version, version
        held = snapshot_names(mnt, version["snapshot"])
        refs = state.values.get("files", {})
        assert set(held) == set(refs), (state.metadata["step"], held, refs)
        for name, ref in refs.items():
            assert mnt.hash_of(held[name].encode()) == ref["hash"]
    # Every snapshot taken is one a checkpoint names: nothing captured in the
    # middle of a step (LangGraph copies channels to read state there).
    named = {s.metadata["vfsd"]["snapshot"] for s in history}
    assert {s["id"] for s in mnt.snapshots()} <= named


class BareState(TypedDict, total=False):
    files: Annotated[dict, files_reducer]  # a reducer of its own: no boundary channel
    log: Annotated[list[str], operator.add]


def bare_graph(m: mount_tool.Mount) -> StateGraph:
    def work(state: BareState) -> dict[str, Any]:
        n = len(state.get("log", []))
        return {**write_artifact(m, f"f{n}.txt", f"file {n}"), "log": [str(n)]}

    builder = StateGraph(BareState)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", lambda s: END if len(s["log"]) >= 3 else "work")
    return builder


def test_a_graph_without_a_boundary_channel_behind_the_adapter_is_unbound_not_guessed(
        mnt, caplog):
    """Nothing tells the wrapper where the steps end: its checkpoints say so,
    a run from one refuses, and `vfsd status` counts them."""
    saver = VfsdCheckpointer(InMemorySaver(), mnt)
    app = bare_graph(mnt).compile(checkpointer=ServerLikeAdapter(saver))
    config = thread("bare")

    async def history() -> list:
        return [s async for s in app.aget_state_history(config)]

    with caplog.at_level(logging.WARNING, logger="mount_tool.langgraph.threadfiles"):
        asyncio.run(app.ainvoke({"log": []}, config))
    states = asyncio.run(history())
    by_step = {s.metadata["step"]: s for s in states}
    # The input checkpoint is written before any task: the files at the run's start.
    assert by_step[-1].metadata["vfsd"]["snapshot"]
    # After LangGraph's input step (step 0) and each `work`: no capture.
    unbound = [s for s in states if "unbound" in s.metadata["vfsd"]]
    assert [s.metadata["step"] for s in unbound] == [3, 2, 1, 0]
    for s in unbound:
        assert s.metadata["vfsd"]["snapshot"] is None
        assert "boundary channel" in s.metadata["vfsd"]["unbound"]
    warnings = [r.getMessage() for r in caplog.records if "has no snapshot" in r.getMessage()]
    assert len(warnings) == 4 and "FilesChannel" in warnings[0]
    status = json.loads(vfsd_cli("status", mnt.run_dir, "--json").stdout)
    assert status["unbound_checkpoints"] == 4
    assert "unbound checkpoints" in vfsd_cli("status", mnt.run_dir).stdout

    # A run from a past unbound checkpoint refuses before anything changes.
    live = sorted(p.name for p in mnt.root.iterdir() if p.name != ".vfsd")
    past = by_step[2]
    with pytest.raises(SnapshotUnavailable) as caught:
        asyncio.run(app.ainvoke(None, past.config))
    assert caught.value.checkpoint_id == past.config["configurable"]["checkpoint_id"]
    assert "not bound" in str(caught.value) and "boundary channel" in caught.value.reason
    assert sorted(p.name for p in mnt.root.iterdir() if p.name != ".vfsd") == live
    assert not saver.restorable(past.config)
    # The thread goes on from its newest checkpoint: the live files follow it.
    assert saver.restorable(by_step[3].config)
    asyncio.run(app.ainvoke({"log": []}, config))


def test_update_state_on_an_unbound_checkpoint(mnt):
    """A fork of the checkpoint the files follow takes a snapshot; of a past
    unbound one, it is unbound too (its files are not known)."""
    saver = VfsdCheckpointer(InMemorySaver(), mnt)
    app = bare_graph(mnt).compile(checkpointer=ServerLikeAdapter(saver))
    config = thread("bare-fork")
    asyncio.run(app.ainvoke({"log": []}, config))

    async def fork(state: Any) -> Any:
        forked = await app.aupdate_state(state.config, {"log": ["x"]})
        return (await app.aget_state(forked)).metadata["vfsd"]

    states = asyncio.run(_history(app, config))
    newest, past = states[0], next(s for s in states if s.metadata["step"] == 2)
    assert asyncio.run(fork(newest))["snapshot"]
    forked = asyncio.run(fork(past))
    assert forked["snapshot"] is None and "whose files were not bound" in forked["unbound"]


async def _history(app: Any, config: dict) -> list:
    return [s async for s in app.aget_state_history(config)]


def test_the_boundary_channel_is_out_of_sight(run_factory):
    """VfsdMiddleware's vfsd_boundary: no node reads it as a trigger, no input
    or output has it, a thread's state past its first checkpoint lacks it."""
    pytest.importorskip("deepagents")
    from langchain_core.messages import AIMessage, HumanMessage
    from test_deepagents import scripted_model, tool_call, turn

    from mount_tool.deepagents import create_vfsd_deep_agent

    run = run_factory("agent")
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        agent = create_vfsd_deep_agent(m, scripted_model([
            turn(tool_call("write_file", "w1", file_path="/a.txt", content="a")),
            AIMessage(content="done"),
        ]), checkpointer=InMemorySaver())
        assert "vfsd_boundary" in agent.builder.channels
        assert "vfsd_boundary" not in agent.trigger_to_nodes
        for schema in (agent.builder.input_schema, agent.builder.output_schema):
            assert "vfsd_boundary" not in agent.builder.schemas[schema]
        config = thread("sight")
        out = agent.invoke({"messages": [HumanMessage("go")]}, config)
        assert "vfsd_boundary" not in out
        history = list(agent.get_state_history(config))
        # Only the new thread's input checkpoint has it (as None): it takes a
        # version at the thread's first superstep, and is empty from then on.
        assert [s.metadata["step"] for s in history if "vfsd_boundary" in s.values] == [-1]
        assert all(s.metadata["vfsd"]["snapshot"] for s in history)
        named = {s.metadata["vfsd"]["snapshot"] for s in history}
        assert {s["id"] for s in m.snapshots()} <= named
    finally:
        m.detach()
