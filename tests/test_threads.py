"""Many threads in flight at once on one compiled graph, no cross-talk.

One Runs, one `create_vfsd_deep_agent` (VfsdBackend, VfsdMiddleware,
VfsdCheckpointer over InMemorySaver) and one scripted model serve 40 threads at
once: through `ainvoke`, `astream`, `abatch` and sync `invoke` (in worker
threads), all together. Each thread writes a script of its own, runs it with
`execute` in the sandbox (its output, over the offload threshold, goes to
large_tool_results/), and writes a note. Then every thread is replayed at once
from its checkpoint after the first tool call, whose files are restored before
the model's next turn. Every thread's files are checked exactly, through the
kernel, against what that thread alone wrote.
"""

from __future__ import annotations

import asyncio
import re

import pytest

pytest.importorskip("deepagents")

from conftest import tree  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.deepagents import create_vfsd_deep_agent  # noqa: E402
from mount_tool.demo import conversation_model  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

THREADS = 40
OFFLOAD_TOKENS = 500  # ~2,000 characters


def job(n: int) -> str:
    """Thread n's script: prints its number on 400 lines (over the offload threshold)."""
    return f"for i in range(400):\n    print('thread {n} line', i)\n"


def script(messages):
    """Each conversation's next model turn, from the conversation alone."""
    task = next(m.content for m in messages if isinstance(m, HumanMessage))
    n = int(task.split()[-1])
    done = sum(1 for m in messages if isinstance(m, ToolMessage))
    turns = [
        ("write_file", {"file_path": "/work/job.py", "content": job(n)}),
        ("execute", {"command": "ls /work; python3 /work/job.py"}),
        ("write_file", {"file_path": "/work/note.md", "content": f"thread {n} was here\n"}),
    ]
    if done < len(turns):
        name, args = turns[done]
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"c{n}_{done}"}])
    return AIMessage(f"thread {n} done")


def expected_files(n: int, root) -> dict:
    """The tree thread n must show: its own files and its offloaded outputs only."""
    got = tree(root)
    offloaded = {k: v for k, v in got.items() if k.startswith("large_tool_results/execute-")}
    want = {"work/": "dir", "work/job.py": job(n).encode(),
            "work/note.md": f"thread {n} was here\n".encode(), "large_tool_results/": "dir",
            "tmp/": "dir"}  # the sandbox's /tmp, made by the first execute
    return want, offloaded


def config(n: int) -> dict:
    return {"configurable": {"thread_id": f"thread-{n}"}}


def message(n: int) -> dict:
    return {"messages": [{"role": "user", "content": f"task {n}"}]}


def test_threads_at_once_see_their_own_files_only(tmp_path):
    with mount_tool.runs(tmp_path / "runs") as runs:
        agent = create_vfsd_deep_agent(
            runs, conversation_model(script), checkpointer=InMemorySaver(),
            backend_options={"offload_threshold_tokens": OFFLOAD_TOKENS})

        async def by_stream(n: int) -> None:
            async for _ in agent.astream(message(n), config(n), stream_mode="updates"):
                pass

        async def everything() -> None:
            ns = list(range(THREADS))
            quarter = THREADS // 4
            await asyncio.gather(
                *(agent.ainvoke(message(n), config(n)) for n in ns[:quarter]),
                *(by_stream(n) for n in ns[quarter:2 * quarter]),
                agent.abatch([message(n) for n in ns[2 * quarter:3 * quarter]],
                             [config(n) for n in ns[2 * quarter:3 * quarter]]),
                *(asyncio.to_thread(agent.invoke, message(n), config(n))
                  for n in ns[3 * quarter:]),
            )

        asyncio.run(everything())
        for n in range(THREADS):
            state = agent.get_state(config(n)).values
            execute = next(m for m in state["messages"]
                           if isinstance(m, ToolMessage) and m.name == "execute")
            assert "large_tool_results/execute-" in execute.content  # offloaded, a preview
            m = runs.get(f"thread-{n}")
            want, offloaded = expected_files(n, m.root)
            assert {k: v for k, v in tree(m.root).items() if k not in offloaded} == want
            assert list(offloaded.values()) == [
                b"job.py\n" + "".join(f"thread {n} line {i}\n" for i in range(400)).encode()]

        # Time travel in every thread at once: from the checkpoint after write_file,
        # the model's execute finds job.py alone again (note.md and the output go).
        async def replay(n: int) -> str:
            past = None
            async for s in agent.aget_state_history(config(n)):
                tools = [m for m in s.values.get("messages", []) if isinstance(m, ToolMessage)]
                if len(tools) == 1 and not s.next == ():
                    past = s
                    break
            out = await agent.ainvoke(None, past.config)
            tools = [m for m in out["messages"] if isinstance(m, ToolMessage)]
            return tools[1].content

        async def replays() -> list[str]:
            return await asyncio.gather(*(replay(n) for n in range(THREADS)))

        for n, seen in enumerate(asyncio.run(replays())):
            saved = re.search(r"/(large_tool_results/execute-\S+?\.txt)", seen).group(1)
            m = runs.get(f"thread-{n}")
            assert (m.root / saved).read_bytes().startswith(b"job.py\nthread"), n
            want, offloaded = expected_files(n, m.root)
            assert {k: v for k, v in tree(m.root).items() if k not in offloaded} == want
            assert len(offloaded) == 1  # the first run's output went with its checkpoint
