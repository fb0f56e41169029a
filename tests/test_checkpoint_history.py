"""Every checkpoint brings back exactly its files, in-process: every saver, every durability.

A Deep Agents agent (tests/history_agent.py) on a Runs, 5 threads at once
(8 with `VFSD_LONG=1`) per durability,
each with: a turn whose plan writes, edits and runs commands and hands a
sub-plan to a subagent (`task`: a subgraph); a turn that first waits at an
interrupt (a tool calling `interrupt()`), resumed with `Command(resume=...)`;
a fork made by `update_state` on a past checkpoint, run with a plan of its
own. The savers are InMemorySaver (async API),
PostgresSaver (sync API, the threads at once in worker threads) and
AsyncPostgresSaver, each behind a wrapper that sleeps 50-200 ms in every
put (a network round trip, a loaded database); durability "sync", "async"
and "exit". Then every checkpoint's snapshot of every thread, and a run from
every checkpoint of one thread per durability, are compared with the test's
model of the tool calls (tests/history_check.py).

`VFSD_LONG=1` runs more turns per thread, and from every thread's checkpoints.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("deepagents")

from history_agent import MOUNT_OPTIONS, effects_of, make_agent, plan_message  # noqa: E402
from history_check import (  # noqa: E402
    Tally,
    acheck_snapshots,
    acheck_thread,
    check_snapshots,
    check_thread,
)
from langchain_core.messages import HumanMessage  # noqa: E402
from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.types import Command  # noqa: E402
from pgserver import pg_server  # noqa: E402, F401 - the fixture

import mount_tool  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

LONG = bool(os.environ.get("VFSD_LONG"))
THREADS = 8 if LONG else 5
DURABILITIES = ("sync", "async", "exit")
# Threads per durability whose every checkpoint is also run from.
RUN_FROM = THREADS if LONG else 1
APPROVE = Command(resume="yes")
# Checkpoints a thread has at least (with "exit": one per run and per interrupt).
MIN_CHECKPOINTS = {"sync": 20, "async": 20, "exit": 6}


class SlowSaver(BaseCheckpointSaver):
    """A saver whose put takes 50-200 ms, as over a network or on a loaded database."""

    def __init__(self, saver: BaseCheckpointSaver, seed: int = 0) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def _delay(self) -> float:
        with self.lock:
            return self.rng.uniform(0.05, 0.2)

    def put(self, config, checkpoint, metadata, new_versions):
        time.sleep(self._delay())
        return self.saver.put(config, checkpoint, metadata, new_versions)

    async def aput(self, config, checkpoint, metadata, new_versions):
        await asyncio.sleep(self._delay())
        return await self.saver.aput(config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        self.saver.put_writes(config, writes, task_id, task_path)

    async def aput_writes(self, config, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await self.saver.aput_writes(config, writes, task_id, task_path)

    def get_tuple(self, config):
        return self.saver.get_tuple(config)

    async def aget_tuple(self, config):
        return await self.saver.aget_tuple(config)

    def list(self, config, *, filter=None, before=None, limit=None) -> Iterator:
        return self.saver.list(config, filter=filter, before=before, limit=limit)

    async def alist(self, config, *, filter=None, before=None, limit=None) -> AsyncIterator:
        async for item in self.saver.alist(config, filter=filter, before=before, limit=limit):
            yield item

    def get_delta_channel_history(self, *, config, channels):
        return self.saver.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(self, *, config, channels):
        return await self.saver.aget_delta_channel_history(config=config, channels=channels)

    def get_next_version(self, current, channel):
        return self.saver.get_next_version(current, channel)

    def delete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.saver.adelete_thread(thread_id)


# -- what each thread does ------------------------------------------------------------------


def turns(n: int) -> list[tuple[str, list]]:
    """The turns of thread `n` (the second waits at an interrupt first)."""
    first = (f"t{n}a", [
        ("write", "work/a.txt", f"alpha {n}\n"),
        ("task", f"t{n}s", [("write", "work/s/sub.txt", f"sub {n}\n"),
                            ("edit", "work/a.txt", "alpha", "Alpha")]),
        ("sh", [("put", "work/b.txt", f"bee {n}\n"), ("mkdir", "work/d"),
                ("put", "work/d/c.txt", f"sea {n}\n")]),
    ])
    second = (f"t{n}b", [
        ("ask", "go on?"),
        ("sh", [("rm", "work/b.txt"), ("append", "work/a.txt", f"more {n}\n")]),
        ("write", "work/d/c.txt", f"sea again {n}\n"),
        ("sh", [("rmtree", "work/d"), ("put", "work/e.txt", f"eee {n}\n")]),
    ])
    more = [(f"t{n}x{k}", [("edit", "work/a.txt", "more", f"more{k}"),
                           ("sh", [("put", f"work/x{k}.txt", f"x {k}\n")])]) for k in range(4)]
    return [first, second, *(more if LONG else [])]


def fork_plan(n: int) -> tuple[str, list]:
    """The plan run on the fork `update_state` makes after the first tool call."""
    return (f"t{n}f", [("sh", [("put", "work/fork.txt", f"fork {n}\n")]),
                       ("edit", "work/a.txt", "alpha", "FORKED")])


def user(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def the_fork_point(history: list) -> Any:
    """The oldest checkpoint with a tool call's result: right after the first
    one (durability "sync", "async"), or the first interrupt ("exit")."""
    return next(s for s in reversed(history)
                if any(m.type == "tool" for m in s.values.get("messages", [])))


def thread_life(agent: Any, n: int, durability: str) -> tuple[str, dict]:
    thread = f"h{n}-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": thread}}
    effects: dict = {}
    for tag, ops in turns(n):
        out = agent.invoke(user(plan_message(tag, ops)), config, durability=durability)
        while "__interrupt__" in out:
            out = agent.invoke(APPROVE, config, durability=durability)
        assert out["messages"][-1].content == f"{tag}: done"
        effects.update(effects_of(tag, ops))
    tag, ops = fork_plan(n)
    past = the_fork_point(list(agent.get_state_history(config)))
    fork = agent.update_state(past.config, {"messages": [HumanMessage(plan_message(tag, ops))]},
                              as_node="tools")
    out = agent.invoke(None, fork, durability=durability)
    while "__interrupt__" in out:
        out = agent.invoke(APPROVE, config, durability=durability)
    assert out["messages"][-1].content == f"{tag}: done"
    effects.update(effects_of(tag, ops))
    return thread, effects


async def athread_life(agent: Any, n: int, durability: str) -> tuple[str, dict]:
    thread = f"h{n}-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": thread}}
    effects: dict = {}
    for tag, ops in turns(n):
        out = await agent.ainvoke(user(plan_message(tag, ops)), config, durability=durability)
        while "__interrupt__" in out:
            out = await agent.ainvoke(APPROVE, config, durability=durability)
        assert out["messages"][-1].content == f"{tag}: done"
        effects.update(effects_of(tag, ops))
    tag, ops = fork_plan(n)
    past = the_fork_point([s async for s in agent.aget_state_history(config)])
    fork = await agent.aupdate_state(past.config,
                                     {"messages": [HumanMessage(plan_message(tag, ops))]},
                                     as_node="tools")
    out = await agent.ainvoke(None, fork, durability=durability)
    while "__interrupt__" in out:
        out = await agent.ainvoke(APPROVE, config, durability=durability)
    assert out["messages"][-1].content == f"{tag}: done"
    effects.update(effects_of(tag, ops))
    return thread, effects


# -- savers ----------------------------------------------------------------------------------


def pg_connect(dsn: str):
    import psycopg
    from psycopg.rows import dict_row

    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)


async def apg_connect(dsn: str):
    import psycopg
    from psycopg.rows import dict_row

    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0,
                                                 row_factory=dict_row)


@pytest.fixture
def runs(tmp_path):
    with mount_tool.runs(tmp_path / "runs", **MOUNT_OPTIONS) as r:
        yield r


def report(kind: str, tallies: dict[str, Tally]) -> None:
    """Print the counts per durability and assert none is wrong or unbound."""
    for durability, total in tallies.items():
        print(f"\n{kind} durability={durability}: {total}")
    for durability, total in tallies.items():
        least = (THREADS + RUN_FROM) * MIN_CHECKPOINTS[durability]
        assert total.checked >= least, (durability, total)
        assert (total.wrong, total.unbound) == (0, 0), (
            f"{kind} durability={durability}: {total}\n"
            + "\n".join(p[:400] for p in total.problems[:10]))


def lives(durability: str) -> list[tuple[int, str]]:
    return [(n, durability) for n in range(THREADS)]


def sync_matrix(runs: Any, saver: BaseCheckpointSaver) -> dict[str, Tally]:
    """Every durability's threads at once in worker threads, then the checks."""
    agent = make_agent(runs, checkpointer=VfsdCheckpointer(SlowSaver(saver), runs))
    checker = make_agent(runs, checkpointer=VfsdCheckpointer(saver, runs))
    jobs = [job for d in DURABILITIES for job in lives(d)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        made = list(pool.map(lambda job: thread_life(agent, *job), jobs))
        snapshots = list(pool.map(lambda m: check_snapshots(checker, runs, *m), made))
        picked = [m for i, m in enumerate(made) if i % THREADS < RUN_FROM]
        runs_from = list(pool.map(lambda m: check_thread(checker, *m), picked))
    return tally_by_durability(jobs, made, snapshots, picked, runs_from)


async def async_matrix(runs: Any, saver: BaseCheckpointSaver) -> dict[str, Tally]:
    """`sync_matrix` through the async API, on the event loop."""
    agent = make_agent(runs, checkpointer=VfsdCheckpointer(SlowSaver(saver), runs))
    checker = make_agent(runs, checkpointer=VfsdCheckpointer(saver, runs))
    jobs = [job for d in DURABILITIES for job in lives(d)]
    made = await asyncio.gather(*(athread_life(agent, *job) for job in jobs))
    snapshots = await asyncio.gather(*(acheck_snapshots(checker, runs, *m) for m in made))
    picked = [m for i, m in enumerate(made) if i % THREADS < RUN_FROM]
    runs_from = await asyncio.gather(*(acheck_thread(checker, *m) for m in picked))
    return tally_by_durability(jobs, made, snapshots, picked, runs_from)


def tally_by_durability(jobs: list, made: list, snapshots: list[Tally], picked: list,
                        runs_from: list[Tally]) -> dict[str, Tally]:
    totals = {d: Tally() for d in DURABILITIES}
    durability_of = {thread: d for (_, d), (thread, _) in zip(jobs, made, strict=True)}
    for (thread, _), tally in zip(made, snapshots, strict=True):
        totals[durability_of[thread]].add(tally)
    for (thread, _), tally in zip(picked, runs_from, strict=True):
        totals[durability_of[thread]].add(tally)
    return totals


# -- the matrix ------------------------------------------------------------------------------


def test_in_memory_saver_async(runs):
    report("InMemorySaver", asyncio.run(async_matrix(runs, InMemorySaver())))


def test_postgres_saver_sync(runs, pg_server):  # noqa: F811
    pytest.importorskip("psycopg")
    from langgraph.checkpoint.postgres import PostgresSaver

    with pg_connect(pg_server.dsn) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        report("PostgresSaver", sync_matrix(runs, saver))


def test_async_postgres_saver(runs, pg_server):  # noqa: F811
    pytest.importorskip("psycopg")
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async def scenario() -> dict[str, Tally]:
        async with await apg_connect(pg_server.dsn) as conn:
            saver = AsyncPostgresSaver(conn)
            await saver.setup()
            return await async_matrix(runs, saver)

    report("AsyncPostgresSaver", asyncio.run(scenario()))
