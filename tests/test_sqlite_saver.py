"""PrunableSqliteSaver (mount_tool.langgraph.sqlite): what the conformance suite
does not look at. A subgraph call's namespace goes with its root checkpoint,
DeltaChannel threads are refused whole, the sync forms work from a worker
thread, a reopened file has every checkpoint, and delete_for_runs through
VfsdCheckpointer releases the snapshots of the checkpoints it drops.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite")

from langgraph.checkpoint.conformance.test_utils import (  # noqa: E402
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.serde.types import TASKS  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer  # noqa: E402
from mount_tool.langgraph.sqlite import PrunableSqliteSaver  # noqa: E402


async def chain(saver, thread: str, n: int, ns: str = "", **metadata) -> list[str]:
    """n checkpoints of `thread` in namespace `ns`, each the next's parent: their ids."""
    ids: list[str] = []
    for step in range(n):
        config = generate_config(thread, checkpoint_ns=ns)
        if ids:
            config["configurable"]["checkpoint_id"] = ids[-1]
        stored = await saver.aput(config, generate_checkpoint(),
                                  generate_metadata(step=step, **metadata), {})
        ids.append(stored["configurable"]["checkpoint_id"])
    return ids


async def ids_of(saver, thread: str, ns: str = "") -> list[str]:
    return [t.config["configurable"]["checkpoint_id"]
            async for t in saver.alist(generate_config(thread, checkpoint_ns=ns))]


def test_keep_latest_drops_a_subgraph_call_with_the_root_checkpoint_it_started_from(tmp_path):
    async def main():
        async with PrunableSqliteSaver.from_conn_string(str(tmp_path / "c.sqlite")) as saver:
            root = await chain(saver, "t", 3)
            # A call started from the first root checkpoint (goes with it), one
            # from the latest (kept: its latest only), and a `checkpointer=True`
            # subgraph's namespace, with no task id (kept: its latest).
            old_call = await chain(saver, "t", 2, "sub:task-a", parents={"": root[0]})
            new_call = await chain(saver, "t", 2, "sub:task-b", parents={"": root[-1]})
            durable = await chain(saver, "t", 3, "memory")
            await saver.aput_writes({"configurable": {"thread_id": "t", "checkpoint_ns":
                                                      "sub:task-a", "checkpoint_id": old_call[0]}},
                                    [("x", 1)], "task")
            await saver.aprune(["t"], strategy="keep_latest")
            assert await ids_of(saver, "t") == [root[-1]]
            assert await ids_of(saver, "t", "sub:task-a") == []
            assert await ids_of(saver, "t", "sub:task-b") == [new_call[-1]]
            assert await ids_of(saver, "t", "memory") == [durable[-1]]
            async with saver.conn.execute("SELECT COUNT(*) FROM writes WHERE checkpoint_ns = ?",
                                          ("sub:task-a",)) as cur:
                assert (await cur.fetchone())[0] == 0
            # A kept checkpoint whose parent went has none.
            tup = await saver.aget_tuple(generate_config("t"))
            assert tup.parent_config is None

    asyncio.run(main())


def test_keep_latest_keeps_the_parent_an_old_checkpoint_reads_its_sends_from(tmp_path):
    async def main():
        async with PrunableSqliteSaver.from_conn_string(str(tmp_path / "c.sqlite")) as saver:
            ids = await chain(saver, "t", 4)  # format 1 checkpoints (before 4)
            await saver.aput_writes({"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                                      "checkpoint_id": ids[-2]}},
                                    [(TASKS, "send")], "task")
            await saver.aprune(["t"], strategy="keep_latest")
            assert await ids_of(saver, "t") == [ids[-1], ids[-2]]

    asyncio.run(main())


def test_delta_channel_threads_are_refused_and_nothing_is_pruned(tmp_path):
    async def main():
        async with PrunableSqliteSaver.from_conn_string(str(tmp_path / "c.sqlite")) as saver:
            plain = await chain(saver, "plain", 3)
            delta = await chain(saver, "delta", 3,
                                counters_since_delta_snapshot={"messages": [1, 1]})
            with pytest.raises(NotImplementedError, match="DeltaChannel: delta"):
                await saver.aprune(["plain", "delta"], strategy="keep_latest")
            assert len(await ids_of(saver, "plain")) == len(plain)
            assert len(await ids_of(saver, "delta")) == len(delta)
            await saver.aprune(["delta"], strategy="delete")  # deleting needs no rebuild
            assert await ids_of(saver, "delta") == []
            with pytest.raises(ValueError, match="Unknown prune strategy"):
                await saver.aprune(["plain"], strategy="delete_all")
            with pytest.raises(TypeError):
                await saver.aprune("plain")

    asyncio.run(main())


def test_sync_forms_from_a_worker_thread_and_a_reopened_file(tmp_path):
    path = str(tmp_path / "c.sqlite")

    async def main():
        async with PrunableSqliteSaver.from_conn_string(path) as saver:
            ids = await chain(saver, "t", 3, run_id="r1")
            more = await chain(saver, "u", 2, run_id="r2")
            await asyncio.to_thread(saver.prune, ["t"], strategy="keep_latest")
            await asyncio.to_thread(saver.delete_for_runs, ["r2"])
            with pytest.raises(asyncio.InvalidStateError):
                saver.prune(["t"])  # on the saver's own loop: refused, not a deadlock
            assert more
        async with PrunableSqliteSaver.from_conn_string(path) as saver:  # what a restart finds
            assert await ids_of(saver, "t") == [ids[-1]]
            assert await ids_of(saver, "u") == []

    asyncio.run(main())


def test_delete_for_runs_through_the_wrapper_releases_their_snapshots(tmp_path):
    from test_runs import loop_graph

    async def main():
        async with PrunableSqliteSaver.from_conn_string(str(tmp_path / "c.sqlite")) as inner, \
                mount_tool.runs(tmp_path / "runs", shards=1) as runs:
            saver = VfsdCheckpointer(inner, runs)
            assert hasattr(type(saver), "adelete_for_runs")
            app = loop_graph(runs, 3).compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "rolled-back"}}
            await app.ainvoke({}, {**config, "metadata": {"run_id": "run-1"}})
            m = runs.get("rolled-back")
            first = {s["id"] for s in m.snapshots()}
            await app.ainvoke({"n": 0}, {**config, "metadata": {"run_id": "run-2"}})
            both = {s["id"] for s in m.snapshots()}
            await saver.adelete_for_runs(["run-2"])
            left = [t async for t in inner.alist(config)]
            assert left and {t.metadata["run_id"] for t in left} == {"run-1"}
            named = {t.metadata["vfsd"]["snapshot"] for t in left}
            after = {s["id"] for s in m.snapshots()}
            assert both > first and after <= named | {max(both, key=lambda s: int(s[1:]))}
            assert named <= after
            assert all([await asyncio.to_thread(saver.restorable, t.config) for t in left])

    asyncio.run(main())
