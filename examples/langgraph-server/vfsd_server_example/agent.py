"""A Deep Agents agent served by the LangGraph server, every thread's files in vfsd.

    langgraph dev --config examples/langgraph-server/langgraph.json

One graph and one checkpointer serve every thread (that is how the LangGraph
server deploys a graph): `mount_tool.runs(ROOT)` serves every thread from a
few shard daemons under ROOT (one per CPU, mounted on first use), each thread
a directory of one of them. The server takes the checkpointer from
`langgraph.json` (`checkpointer.path`, an async context manager yielding a
saver), whose exit (the server's shutdown, SIGTERM) unmounts the shards, and
calls its `adelete_thread` and `acopy_thread` when threads are deleted or
copied: the thread's files and snapshots follow.

Settings (environment):
    VFSD_RUNS    the root of the threads' files [~/.local/state/vfsd/langgraph-runs];
                 keep it out of the directory `langgraph dev` watches for reloads
    VFSD_SHARDS  how many shard daemons serve the threads [the number of CPUs]
    VFSD_MODEL   a LangChain model name ("anthropic:claude-sonnet-4-6"); without
                 it a scripted stand-in model plays a short deterministic task
    VFSD_POSTGRES  a PostgreSQL connection string: checkpoints go there
                 (AsyncPostgresSaver) instead of the server's memory
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

import mount_tool
from mount_tool.deepagents import create_vfsd_deep_agent
from mount_tool.demo import conversation_model
from mount_tool.langgraph import VfsdCheckpointer

ROOT = Path(os.environ.get("VFSD_RUNS") or
            Path.home() / ".local" / "state" / "vfsd" / "langgraph-runs")

# One Runs for the graph and the checkpointer (nothing is mounted before a
# thread first uses its files).
runs = mount_tool.runs(ROOT, shards=int(os.environ.get("VFSD_SHARDS") or os.cpu_count() or 1))


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
        if not dsn:
            yield VfsdCheckpointer(InMemorySaver(), runs)
            return
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            await saver.setup()
            yield VfsdCheckpointer(saver, runs)
