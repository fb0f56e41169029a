"""LangGraph's checkpointer conformance suite (langgraph-checkpoint-conformance)
against VfsdCheckpointer on a Runs, over InMemorySaver, over PrunableSqliteSaver
(LangGraph's AsyncSqliteSaver with prune and delete_for_runs added) on a SQLite
file, and over AsyncPostgresSaver on a PostgreSQL server started here.

The contract: every capability the bare saver passes, the wrapper passes; every
capability the wrapper claims (the suite detects one by the method being
overridden on the class) passes. The wrapper claims copy_thread on any saver
(it copies through the saver's own list/put/put_writes) and prune or
delete_for_runs only when the saver has them.

The suite writes its checkpoints outside graph runs on new threads, which the
wrapper records as "no files" without mounting anything; with VFSD_LONG=1 the
suite runs again with every thread mounted (each put snapshots a real mount).
"""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from pgserver import pg_server  # noqa: E402, F401 - the fixture

import mount_tool  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

LONG = os.environ.get("VFSD_LONG") == "1"


class EveryThreadMounted(VfsdCheckpointer):
    """The wrapper with a mount (and a snapshot) behind every checkpoint."""

    def _has_no_files(self, plan) -> bool:
        return False


def saver_factory(kind: str, request):
    """An async context manager factory of fresh bare savers of `kind`."""
    import contextlib

    if kind == "memory":

        @contextlib.asynccontextmanager
        async def memory():
            yield InMemorySaver()

        return memory
    if kind == "sqlite":
        pytest.importorskip("langgraph.checkpoint.sqlite")
        from mount_tool.langgraph.sqlite import PrunableSqliteSaver

        files = iter(range(1_000_000))

        @contextlib.asynccontextmanager
        async def sqlite():
            path = request.getfixturevalue("tmp_path") / f"checkpoints-{next(files)}.sqlite"
            async with PrunableSqliteSaver.from_conn_string(str(path)) as saver:
                await saver.setup()
                yield saver

        return sqlite
    pytest.importorskip("psycopg")
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg import AsyncConnection
    from psycopg.rows import dict_row

    server = request.getfixturevalue("pg_server")

    @contextlib.asynccontextmanager
    async def postgres():
        async with await AsyncConnection.connect(
            server.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            saver = AsyncPostgresSaver(conn)
            await saver.setup()
            yield saver

    return postgres


def outcome(report) -> dict[str, tuple[bool, bool | None, list[str]]]:
    """capability -> (detected, passed, failures)."""
    return {cap: (r.detected, r.passed, list(r.failures or ()))
            for cap, r in report.results.items()}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
@pytest.mark.parametrize("wrapper", [VfsdCheckpointer] + ([EveryThreadMounted] if LONG else []),
                         ids=lambda w: w.__name__)
def test_conformance(kind, wrapper, request, tmp_path):
    bare_saver = saver_factory(kind, request)

    @checkpointer_test(name=f"{kind}")
    async def bare():
        async with bare_saver() as saver:
            yield saver

    @checkpointer_test(name=f"vfsd-{kind}")
    async def wrapped():
        async with bare_saver() as saver, mount_tool.runs(tmp_path / "runs",
                                                          max_mounted=8) as runs:
            yield wrapper(saver, runs)

    async def main():
        return outcome(await validate(bare)), outcome(await validate(wrapped))

    base, ours = asyncio.run(main())
    for cap, (_detected, passed, _failures) in base.items():
        if passed:
            assert ours[cap][0] and ours[cap][1], f"{cap}: the bare saver passes, ours: {ours[cap]}"
    for cap, (detected, passed, failures) in ours.items():
        if detected:
            assert passed, f"{cap} is claimed and fails: {failures[:3]}"
        if not base[cap][0] and cap != "copy_thread":
            assert not detected, f"{cap} is claimed though the saver lacks it"
    assert ours["copy_thread"][:2] == (True, True)  # on every saver
    assert {cap for cap, r in ours.items() if r[0]} >= {"put", "put_writes", "get_tuple", "list",
                                                         "delete_thread"}
    if kind == "sqlite":  # what the subclass adds, claimed and passed through the wrapper
        assert ours["prune"][:2] == (True, True) and ours["delete_for_runs"][:2] == (True, True)


def test_langgraph_sqlite_saver_lacks_what_the_subclass_adds():
    """The reason for PrunableSqliteSaver: LangGraph's own AsyncSqliteSaver has no
    prune and no delete_for_runs (the server then warns), so a wrapper of it
    claims neither."""
    pytest.importorskip("langgraph.checkpoint.sqlite")
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from mount_tool.langgraph.sqlite import PrunableSqliteSaver

    for name in ("aprune", "adelete_for_runs"):
        assert getattr(AsyncSqliteSaver, name) is getattr(BaseCheckpointSaver, name)
        assert getattr(PrunableSqliteSaver, name) is not getattr(BaseCheckpointSaver, name)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_prune_releases_the_snapshots_of_dropped_checkpoints(kind, request, tmp_path):
    from test_runs import loop_graph

    bare_saver = saver_factory(kind, request)

    async def main():
        async with bare_saver() as inner, mount_tool.runs(tmp_path / "runs") as runs:
            saver = VfsdCheckpointer(inner, runs)
            assert hasattr(type(saver), "aprune")  # the saver has it, so we do
            app = loop_graph(runs, 6).compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "pruned"}}
            await app.ainvoke({}, config)
            m = runs.get("pruned")
            before = [s["id"] for s in m.snapshots()]
            await saver.aprune(["pruned"], strategy="keep_latest")
            left = [t async for t in inner.alist(config)]
            named = {t.metadata["vfsd"]["snapshot"] for t in left}
            after = [s["id"] for s in m.snapshots()]
            assert len(before) >= 6 and set(after) == named | {before[-1]}
            assert await asyncio.to_thread(saver.restorable, left[0].config)

    asyncio.run(main())
