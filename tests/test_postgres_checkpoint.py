"""vfsd references under LangGraph's PostgresSaver, on a PostgreSQL server started here.

The server is private to the test module (tests/pgserver.py: initdb into a
temporary directory, a free port on 127.0.0.1, stopped in teardown). The tests
check that graphs keeping FileRefs run, persist and resume through Postgres, and
that what Postgres stores stays independent of the file bodies.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("deepagents")
psycopg = pytest.importorskip("psycopg")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from pgserver import pg_server  # noqa: E402, F401 - the fixture
from psycopg.rows import dict_row  # noqa: E402
from test_deepagents import (  # noqa: E402
    MiB,
    file_body,
    scripted_model,
    serialized_size,
    tool_call,
    turn,
)

import mount_tool  # noqa: E402
from mount_tool.deepagents import create_vfsd_deep_agent  # noqa: E402
from mount_tool.langgraph import FilesChannel, make_step_node, write_artifact  # noqa: E402
from mount_tool.refs import content_hash  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]


def connect(dsn: str):
    """A connection set up the way PostgresSaver expects."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)


def stored_bytes(conn, thread_id: str) -> int:
    """Bytes of checkpoint payload Postgres holds for one thread."""
    total = 0
    for query in (
        "select coalesce(sum(octet_length(blob)), 0) as n from checkpoint_blobs where thread_id = %s",
        "select coalesce(sum(octet_length(blob)), 0) as n from checkpoint_writes where thread_id = %s",
        "select coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)), 0) as n"
        " from checkpoints where thread_id = %s",
    ):
        total += int(conn.execute(query, (thread_id,)).fetchone()["n"])
    return total


@pytest.fixture
def mnt(run):
    m = mount_tool.Mount.attach(run.run_dir)
    yield m
    m.detach()


def test_deep_agent_persists_and_resumes_through_postgres(mnt, pg_server):  # noqa: F811
    bodies = {
        f"/out/f{i}.txt": file_body(f"/out/f{i}.txt", MiB if i == 2 else 50_000) for i in range(6)
    }
    first_line = bodies["/out/f0.txt"].split("\n")[0] + "\n"
    first = [
        *[
            turn(tool_call("write_file", f"w{i}", file_path=p, content=b))
            for i, (p, b) in enumerate(bodies.items())
        ],
        turn(tool_call("execute", "x1", command="cat out/*.txt | wc -c > out/total.txt")),
        AIMessage(content="paused"),
    ]
    second = [
        turn(tool_call("read_file", "r1", file_path="/out/total.txt")),
        turn(
            tool_call(
                "edit_file",
                "e1",
                file_path="/out/f0.txt",
                old_string=first_line,
                new_string="EDITED\n",
            )
        ),
        AIMessage(content="done"),
    ]
    config = {"configurable": {"thread_id": "pg-deep"}}
    payload = sum(len(b) for b in bodies.values())

    with connect(pg_server.dsn) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        agent = create_vfsd_deep_agent(mnt, scripted_model(first), checkpointer=saver)
        agent.invoke({"messages": [HumanMessage("go")]}, config)

    # A new process would start like this: fresh connection, saver and graph.
    with connect(pg_server.dsn) as conn:
        saver = PostgresSaver(conn)
        agent = create_vfsd_deep_agent(mnt, scripted_model(second), checkpointer=saver)
        restored = agent.get_state(config).values
        assert set(restored["files"]) == {*bodies, "/out/total.txt"}
        for path, body in bodies.items():
            assert restored["files"][path]["hash"] == content_hash(body.encode())
            assert restored["files"][path] == mnt.ref(path.lstrip("/"))

        state = agent.invoke({"messages": [HumanMessage("continue")]}, config)
        total = next(
            m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "r1"
        )
        assert str(payload) in total.content
        edit = next(
            m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "e1"
        )
        assert edit.status == "success", edit.content
        assert state["files"]["/out/f0.txt"] == mnt.ref("out/f0.txt")
        assert (mnt.root / "out/f0.txt").read_text().startswith("EDITED")

        # Postgres holds references and markers, not the 1.25 MB of bodies.
        assert serialized_size(state) < 50_000
        assert stored_bytes(conn, "pg-deep") < payload // 10


class ArtifactState(TypedDict):
    files: FilesChannel
    log: Annotated[list[str], operator.add]


def test_state_graph_with_refs_runs_fifty_steps_on_postgres(mnt, pg_server):  # noqa: F811
    """A plain StateGraph: each step writes a 100 KB artifact and keeps only its ref."""

    def work(state: ArtifactState) -> dict[str, Any]:
        n = len(state.get("log", []))
        path = f"artifacts/step_{n:02d}.txt"
        update = write_artifact(mnt, path, file_body(path, 100_000))
        return {**update, "log": [path]}

    def again(state: ArtifactState) -> str:
        return "vfsd_step" if len(state["log"]) < 50 else END

    builder = StateGraph(ArtifactState)
    builder.add_node("vfsd_step", make_step_node(mnt))
    builder.add_node("work", work)
    builder.add_edge(START, "vfsd_step")
    builder.add_edge("vfsd_step", "work")
    builder.add_conditional_edges("work", again)
    config = {"configurable": {"thread_id": "pg-graph"}, "recursion_limit": 500}

    with connect(pg_server.dsn) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"log": []}, config)
        values = graph.get_state(config).values
        assert len(values["log"]) == 50
        # Old artifacts aged out (max_age_steps, default 20) and left state with the files.
        assert 0 < len(values["files"]) < 50
        for ref in values["files"].values():
            assert mnt.read(ref) == file_body(ref["path"], 100_000).encode()
        assert serialized_size(values) < 500_000
        # 50 x 100 KB written; Postgres keeps refs only.
        assert stored_bytes(conn, "pg-graph") < 5_000_000 // 10

    with connect(pg_server.dsn) as conn:
        reloaded = builder.compile(checkpointer=PostgresSaver(conn)).get_state(config).values
        assert reloaded["files"] == values["files"]
