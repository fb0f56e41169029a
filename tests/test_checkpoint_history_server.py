"""Every checkpoint brings back exactly its files under LangGraph's server (`langgraph dev`).

The server compiles the graph itself and wraps the checkpointer in an adapter
of its own, which calls none of the wrapper's step-boundary methods; with
AsyncPostgresSaver a checkpoint's `aput` runs while the next step already
writes files. 10 threads at once, two turns each (files made, changed and
deleted by `write_file`, `edit_file` and `execute`) and a fork made by
`threads.update_state` on a past checkpoint, run, on AsyncPostgresSaver
(tests/pgserver.py) and on InMemorySaver; then every checkpoint of every
thread is run from, and the files the run lists are compared with the test's
model of the tool calls (tests/history_check.py). The two servers run at
once: a server starts a thread's runs about once a second, so the test is
mostly waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("langgraph_sdk")
pytest.importorskip("deepagents")

from history_agent import VERIFY, effects_of, plan_message  # noqa: E402
from history_check import Tally, check_server_thread  # noqa: E402
from lgserver import blocking_lines, langgraph_dev  # noqa: E402
from pgserver import pg_server  # noqa: E402, F401 - the fixture

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

TESTS = Path(__file__).resolve().parent
THREADS = 10


def turns(n: int) -> list[tuple[str, list]]:
    """Two turns of thread `n`: files made, changed and deleted by each tool."""
    return [
        (f"t{n}a", [
            ("write", "work/a.txt", f"alpha {n}\n"),
            ("sh", [("put", "work/b.txt", f"bee {n}\n"), ("mkdir", "work/d"),
                    ("put", "work/d/c.txt", f"sea {n}\n")]),
            ("edit", "work/a.txt", "alpha", "ALPHA"),
        ]),
        (f"t{n}b", [
            ("sh", [("rm", "work/b.txt"), ("append", "work/a.txt", f"more {n}\n")]),
            ("write", "work/d/c.txt", f"sea again {n}\n"),
            ("sh", [("rmtree", "work/d"), ("put", "work/e.txt", f"eee {n}\n")]),
        ]),
    ]


def app_dir(work: Path) -> Path:
    """A `langgraph dev` app serving tests/history_agent.py."""
    app = work / "app"
    app.mkdir()
    shutil.copy(TESTS / "history_agent.py", app / "history_agent.py")
    (app / "langgraph.json").write_text(json.dumps({
        "dependencies": ["."],
        "graphs": {"agent": "./history_agent.py:agent"},
        "checkpointer": {"path": "./history_agent.py:checkpointer"},
    }))
    return app


def fork_plan(n: int) -> tuple[str, list]:
    """The plan run on thread `n`'s fork."""
    return (f"t{n}f", [("sh", [("put", "work/fork.txt", f"fork {n}\n")]),
                       ("edit", "work/a.txt", "alpha", "FORKED")])


@pytest.fixture(scope="module")
def history_servers(tmp_path_factory, pg_server):  # noqa: F811
    """{saver kind: (url, server log)}: one `langgraph dev` with AsyncPostgresSaver,
    one with InMemorySaver."""
    servers = {}
    with contextlib.ExitStack() as stack:
        for kind, env in (("postgres", {"VFSD_POSTGRES": pg_server.dsn}), ("memory", {})):
            work = tmp_path_factory.mktemp(f"history-{kind}")
            log = work / "server.log"
            url = stack.enter_context(
                langgraph_dev(app_dir(work), work / "runs", log, env=env, jobs=20))
            servers[kind] = (url, log)
        asyncio.run(_first_threads([url for url, _ in servers.values()]))
        yield servers


async def _first_threads(urls: list[str]) -> None:
    """One thread runs first on each server and makes the threads' shared store:
    first mounts into a store that does not exist yet, at once, may race its
    creation (vfsd refuses a store whose LMDB file another daemon is still making)."""
    from langgraph_sdk import get_client

    async def first(url: str) -> None:
        client = get_client(url=url)
        thread = (await client.threads.create())["thread_id"]
        await client.runs.wait(thread, "agent", input={"messages": [
            {"role": "user", "content": VERIFY}]})

    await asyncio.gather(*(first(url) for url in urls))


async def threads_checked(url: str) -> Tally:
    """THREADS threads at once, two turns each; then every checkpoint of each, checked."""
    from langgraph_sdk import get_client

    client = get_client(url=url)

    async def thread_life(n: int) -> tuple[str, dict]:
        thread = (await client.threads.create())["thread_id"]
        effects: dict = {}
        for tag, ops in turns(n):
            out = await client.runs.wait(
                thread, "agent", input={"messages": [{"role": "user",
                                                      "content": plan_message(tag, ops)}]})
            assert out["messages"][-1]["content"] == f"{tag}: done", out["messages"][-1]
            effects.update(effects_of(tag, ops))
        # A fork (threads.update_state) of the checkpoint after the first tool
        # call, run with a plan of its own.
        tag, ops = fork_plan(n)
        history = await client.threads.get_history(thread, limit=1000)
        past = next(h for h in reversed(history)
                    if any(m["type"] == "tool" for m in h["values"]["messages"]))
        fork = await client.threads.update_state(
            thread, {"messages": [{"role": "user", "content": plan_message(tag, ops)}]},
            as_node="tools", checkpoint=past["checkpoint"])
        out = await client.runs.wait(thread, "agent", input=None,
                                     checkpoint=fork["checkpoint"])
        assert out["messages"][-1]["content"] == f"{tag}: done", out["messages"][-1]
        effects.update(effects_of(tag, ops))
        return thread, effects

    made = await asyncio.gather(*(thread_life(n) for n in range(THREADS)))
    tallies = await asyncio.gather(*(check_server_thread(client, thread, effects, copies=2)
                                     for thread, effects in made))
    total = Tally()
    for tally in tallies:
        total.add(tally)
    return total


def test_every_checkpoint_brings_back_its_files(history_servers):
    async def both() -> list[Tally]:
        return await asyncio.gather(*(threads_checked(url)
                                      for url, _ in history_servers.values()))

    totals = dict(zip(history_servers, asyncio.run(both()), strict=True))
    for kind, total in totals.items():
        print(f"\nunder langgraph dev with {kind}: {total}")
    for kind, total in totals.items():
        assert total.checked >= THREADS * 20, (kind, total)
        assert (total.wrong, total.unbound) == (0, 0), (
            f"{kind}: {total}\n" + "\n".join(p[:400] for p in total.problems[:10]))
    for _url, log in history_servers.values():
        assert not blocking_lines(log), blocking_lines(log)[:5]
