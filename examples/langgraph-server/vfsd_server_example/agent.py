"""A Deep Agents agent served by the LangGraph server, every thread's files in vfsd.

    make serve      # from the checkout root: installs what it needs, serves on 127.0.0.1:2024
    .venv/bin/langgraph dev --config examples/langgraph-server/langgraph.json   # from anywhere

One graph and one checkpointer serve every thread (that is how the LangGraph
server deploys a graph): `mount_tool.runs(ROOT)` serves every thread from a
few shard daemons under ROOT (one per CPU, mounted on first use), each thread
a directory of one of them. The server takes the checkpointer from
`langgraph.json` (`checkpointer.path`, an async context manager yielding a
saver), whose exit (the server's shutdown, SIGTERM) unmounts the shards, and
calls its `adelete_thread`, `acopy_thread`, `aprune` and `adelete_for_runs`:
the thread's files and snapshots follow.

Checkpoints go to ROOT/checkpoints.sqlite (LangGraph's SQLite saver, with
prune and delete_for_runs added: mount_tool.langgraph.sqlite), so a restart
of the server on the same ROOT brings every thread back with its history and
its files; with VFSD_POSTGRES, to PostgreSQL instead (several server
processes or replicas).

`langgraph.json` names this module (`vfsd_server_example.agent`), not a file:
the server resolves file paths there against its working directory, a module
from any (`make serve` installs the example: pip install -e
examples/langgraph-server).

Settings, all from the environment (one table in the docs, "The example's
settings" in docs/server.md, says each one's default and use): VFSD_RUNS,
VFSD_CONFIG, VFSD_POSTGRES, VFSD_SHARDS, VFSD_MODEL; `make serve` adds PORT
and JOBS. A bad VFSD_CONFIG (an unknown key, a bad value) stops the server
as it starts, naming the key, before any thread runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

import mount_tool
from mount_tool.deepagents import create_vfsd_deep_agent
from mount_tool.demo import conversation_model
from mount_tool.langgraph import VfsdCheckpointer

ROOT = Path(os.path.abspath(os.environ.get("VFSD_RUNS") or
                            Path.home() / ".local" / "state" / "vfsd" / "langgraph-runs"))
#: the embedded saver's file (without VFSD_POSTGRES)
CHECKPOINTS = ROOT / "checkpoints.sqlite"


def shards_setting() -> int | None:
    """VFSD_SHARDS, else None (the config file's [runs] shards, else one per CPU)."""
    value = os.environ.get("VFSD_SHARDS") or None
    if value is not None and not value.isdigit():
        raise ValueError(f"VFSD_SHARDS must be a whole number of shard daemons, not {value!r}")
    return int(value) if value is not None else None


# One Runs for the graph and the checkpointer (nothing is mounted before a
# thread first uses its files). It reads VFSD_CONFIG, which vfsd checks here.
runs = mount_tool.runs(ROOT, shards=shards_setting())


def scripted_turn(messages: list) -> AIMessage:
    """The stand-in model: for "task N", write a script, run it, report; for any
    later message, show what the thread's files hold now."""
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    done = sum(1 for m in messages[last_human:] if isinstance(m, ToolMessage))
    words = str(humans[0].content).split()
    n = words[-1] if words else "0"
    if len(humans) == 1:
        turns = [
            ("write_file", {"file_path": "/work/job.py",
                            "content": f"print('job of task {n}')\n"}),
            ("execute", {"command": "ls /work; python3 /work/job.py | tee /work/out.txt"}),
        ]
    else:
        turns = [("execute", {"command": "ls /work; cat /work/out.txt"})]
    if done < len(turns):
        name, args = turns[done]
        call_id = f"call_{len(humans)}_{done}"
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])
    return AIMessage(f"task {n}: done")


def make_model():
    name = os.environ.get("VFSD_MODEL")
    if name:
        from langchain.chat_models import init_chat_model

        return init_chat_model(name)
    return conversation_model(scripted_turn)


# The server supplies the checkpointer (the one below) to this graph.
agent = create_vfsd_deep_agent(runs, make_model())


@contextlib.asynccontextmanager
async def checkpointer():
    """The checkpointer the server uses for every graph and thread."""
    async with runs:  # leaving unmounts every shard (the files stay)
        dsn = os.environ.get("VFSD_POSTGRES")
        if dsn:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
                await saver.setup()
                yield VfsdCheckpointer(saver, runs)
            return
        from mount_tool.langgraph.sqlite import PrunableSqliteSaver

        await asyncio.to_thread(ROOT.mkdir, parents=True, exist_ok=True)
        async with PrunableSqliteSaver.from_conn_string(str(CHECKPOINTS)) as saver:
            await saver.setup()
            yield VfsdCheckpointer(saver, runs)
