"""Every checkpoint brings back exactly its files under LangGraph's server (`langgraph dev`).

The server compiles the graph itself and wraps the checkpointer in an adapter
of its own, which calls none of the wrapper's step-boundary methods; with
AsyncPostgresSaver a checkpoint's `aput` runs while the next step already
writes files. 10 threads at once, two turns each (files made, changed and
deleted by `write_file`, `edit_file` and `execute`), on AsyncPostgresSaver
(tests/pgserver.py) and on InMemorySaver; then every checkpoint of every
thread is run from, and the files the run lists are compared with the test's
model of the tool calls (tests/history_check.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("langgraph_sdk")
pytest.importorskip("deepagents")

from history_agent import effects_of, plan_message  # noqa: E402
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


@pytest.fixture(scope="module", params=["postgres", "memory"])
def history_server(request, tmp_path_factory):
    """(saver kind, url, server log) of a `langgraph dev` serving tests/history_agent.py."""
    kind = request.param
    work = tmp_path_factory.mktemp(f"history-{kind}")
    app = work / "app"
    app.mkdir()
    shutil.copy(TESTS / "history_agent.py", app / "history_agent.py")
    (app / "langgraph.json").write_text(json.dumps({
        "dependencies": ["."],
        "graphs": {"agent": "./history_agent.py:agent"},
        "checkpointer": {"path": "./history_agent.py:checkpointer"},
    }))
    env = {}
    if kind == "postgres":
        env["VFSD_POSTGRES"] = request.getfixturevalue("pg_server").dsn
    log = work / "server.log"
    with langgraph_dev(app, work / "runs", log, env=env, jobs=20) as url:
        yield kind, url, log


def test_every_checkpoint_brings_back_its_files(history_server):
    from langgraph_sdk import get_client

    kind, url, log = history_server
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
        return thread, effects

    async def scenario() -> Tally:
        made = await asyncio.gather(*(thread_life(n) for n in range(THREADS)))
        tallies = await asyncio.gather(*(check_server_thread(client, thread, effects, copies=2)
                                         for thread, effects in made))
        total = Tally()
        for tally in tallies:
            total.add(tally)
        return total

    total = asyncio.run(scenario())
    print(f"\nunder langgraph dev with {kind}: {total}")
    assert total.checked >= THREADS * 20
    assert (total.wrong, total.unbound) == (0, 0), (
        f"{kind}: {total}\n" + "\n".join(p[:400] for p in total.problems[:10]))
    assert not blocking_lines(log), blocking_lines(log)[:5]
