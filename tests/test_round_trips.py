"""Control round trips per agent step, counted on a real Runs and a real agent.

Every control request mount_tool sends goes through `ControlClient.call`; the
test counts them (by op) around one Deep Agents turn of file tool calls, one
per model call, and around `VfsdBackend.write` calls: a model call's start
(its changes, the step advance and the eviction report) is one `batch`, a file
tool's write asks the daemon nothing, and no `get_step` or `ref` is sent at all
once the thread's step is known (bench/threads_bench.py --only turn gives the
figures).
"""

from __future__ import annotations

import contextlib
import threading

import pytest

pytest.importorskip("deepagents")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langchain_core.runnables.config import var_child_runnable_config  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.daemon import toolcalls  # noqa: E402
from mount_tool.daemon.client import ControlClient  # noqa: E402
from mount_tool.deepagents import VfsdBackend, create_vfsd_deep_agent  # noqa: E402
from mount_tool.demo import conversation_model  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

CALLS = [
    ("write_file", {"file_path": "/notes/a.md", "content": "line 1\nline 2\n"}),
    ("read_file", {"file_path": "/notes/a.md"}),
    ("edit_file", {"file_path": "/notes/a.md", "old_string": "line 1", "new_string": "LINE 1"}),
    ("ls", {"path": "/notes"}),
    ("glob", {"pattern": "**/*.md"}),
    ("grep", {"pattern": "LINE"}),
]


def script(messages):
    last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    turn = sum(isinstance(m, HumanMessage) for m in messages)
    done = (len(messages) - last - 1) // 2
    if done < len(CALLS):
        name, args = CALLS[done]
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"c{turn}_{done}"}])
    return AIMessage(f"turn {turn} done")


@contextlib.contextmanager
def counted():
    """{op: requests sent} while the block runs."""
    ops: dict[str, int] = {}
    lock = threading.Lock()
    original = ControlClient.call

    def call(client, op, **args):
        with lock:
            ops[op] = ops.get(op, 0) + 1
        return original(client, op, **args)

    ControlClient.call = call
    try:
        yield ops
    finally:
        ControlClient.call = original


def test_a_turn_of_file_tool_calls(tmp_path):
    with mount_tool.runs(tmp_path / "runs", shards=1) as runs:
        agent = create_vfsd_deep_agent(runs, conversation_model(script),
                                       checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "counted"}}
        agent.invoke({"messages": [HumanMessage("turn 1")]}, config)  # the thread is made
        with counted() as ops:
            out = agent.invoke({"messages": [HumanMessage("turn 2")]}, config)
        assert out["messages"][-1].content == "turn 2 done"
        model_calls = len(CALLS) + 1
        # One batch per model call; no step asked, no ref taken.
        assert ops.get("batch") == model_calls, ops
        assert not {"get_step", "set_step", "ref"} & set(ops), ops
        # What remains: a snapshot per superstep (the checkpoints'), the run
        # start's state, and the files changed by the two writing tools.
        assert ops.get("changes") == 2, ops
        assert sum(ops.values()) <= 4 * model_calls, ops
        with runs.use("counted") as m:
            assert (m.root / "notes/a.md").read_text() == "LINE 1\nline 2\n"


def test_a_file_tool_write_asks_the_daemon_nothing(tmp_path):
    with mount_tool.runs(tmp_path / "runs", shards=1) as runs:
        backend = VfsdBackend(runs)
        runs.get("writer")
        got: dict = {}

        def in_a_tool_call() -> None:
            var_child_runnable_config.set({"configurable": {"thread_id": "writer"}})
            with toolcalls.running("write_file", "call-1", "writer"), counted() as ops:
                for i in range(20):
                    assert backend.write(f"/w/f{i}.md", f"file {i}\n").error is None
                got.update(ops)

        worker = threading.Thread(target=in_a_tool_call)
        worker.start()
        worker.join()
        assert got == {}
        with runs.use("writer") as m:
            assert (m.root / "w" / "f7.md").read_text() == "file 7\n"
            # Written by the tool call (its tag reached the daemon through the mount).
            assert m.ref("w/f7.md") and m.client.call("info", path="w/f7.md")[
                "made_by"]["id"] == "call-1"
