"""The Runs example run by whoever runs this script (tests/test_nonroot.py: a
user it made): a few threads of examples/langgraph-server's agent at once,
through create_vfsd_deep_agent with its checkpointer (VfsdCheckpointer over
the SQLite saver in VFSD_RUNS), two turns each (write_file, then `execute`
runs the script; then `execute` lists and reads back). Prints one JSON
report: who ran, each thread's answers and files, what `execute`'s sandbox
enforces and by what means, and what was left mounted or running under
VFSD_RUNS once the Runs closed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from langchain_core.messages import HumanMessage

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def left_under(root: Path) -> tuple[list[str], list[int]]:
    """Mount points under `root`, and processes holding its stores open."""
    prefix = os.path.realpath(root) + "/"
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" ")[4] for line in f if line.split(" ")[4].startswith(prefix)]
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            fds = [os.readlink(f"/proc/{name}/fd/{fd}") for fd in os.listdir(f"/proc/{name}/fd")]
        except OSError:
            continue
        if any(t.startswith(prefix) and "/lmdb/" in t for t in fds):
            pids.append(int(name))
    return mounts, pids


async def main() -> dict:
    from vfsd_server_example import agent as example

    from mount_tool.deepagents import VfsdBackend, create_vfsd_deep_agent
    from mount_tool.demo import conversation_model

    report: dict = {"uid": os.getuid(), "euid": os.geteuid()}
    async with example.checkpointer() as saver:
        graph = create_vfsd_deep_agent(example.runs, conversation_model(example.scripted_turn),
                                       checkpointer=saver)

        async def two_turns(n: int) -> dict:
            config = {"configurable": {"thread_id": f"user thread {n}"}}
            first = await graph.ainvoke({"messages": [HumanMessage(f"task {n}")]}, config)
            again = await graph.ainvoke({"messages": [HumanMessage("again")]}, config)
            files = example.runs.get(config["configurable"]["thread_id"]).root
            return {"answer": first["messages"][-1].content,
                    "listing": [m.content for m in again["messages"]
                                if m.type == "tool"][-1],
                    "files": sorted(str(p.relative_to(files)) for p in files.rglob("*")
                                    if p.is_file()),
                    "owner": os.stat(files / "work" / "out.txt").st_uid,
                    "history": len([s async for s in graph.aget_state_history(config)])}

        report["threads"] = await asyncio.gather(*(two_turns(n) for n in range(THREADS)))
        report["sandbox"] = await asyncio.to_thread(
            lambda: VfsdBackend(example.runs.get("user thread 0")).sandbox_info())
        report["mounted"] = len(left_under(example.ROOT)[0])
    report["left_mounted"], report["left_running"] = left_under(example.ROOT)
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
