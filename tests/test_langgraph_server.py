"""examples/langgraph-server under LangGraph's own server (`langgraph dev`), driven by langgraph-sdk.

One server for the module: `langgraph dev --no-browser --no-reload` on a free
127.0.0.1 port, without `--allow-blocking` (the server then fails any call
that blocks its event loop), with the example's `langgraph.json` as it is in
the checkout, from a working directory elsewhere (its graph and checkpointer
are named by module): its graph (a Deep Agents agent on a Runs) and its
custom checkpointer (VfsdCheckpointer over the SQLite saver in the Runs root). Threads are created, run at once, replayed from an old
checkpoint, copied and deleted through the server's API; their files are
looked at where the server's shard daemons serve them (`ROOT/threads/t<hex>/fs`
leads there). A server of its own runs 60 threads at once (200 with
VFSD_LONG=1), two turns each, then gets SIGTERM: it must leave no mount and no
daemon behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

pytest.importorskip("langgraph_sdk")

from conftest import daemons_under, mounts_under, tree  # noqa: E402
from lgserver import blocking_lines, serving, stop_server  # noqa: E402

from mount_tool.runs import thread_dir_name  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "langgraph-server"
LONG = bool(os.environ.get("VFSD_LONG"))
#: threads run at once by test_many_threads_at_once_then_sigterm
AT_ONCE = 200 if LONG else 60
#: seconds a server has after SIGTERM to be gone with its shards
SIGTERM_WITHIN = 30.0


@contextlib.contextmanager
def langgraph_dev(work: Path, *extra: str, **env_extra: str):
    """A `langgraph dev` serving the example, run from `work` (where the server
    keeps its `.langgraph_api/`): yields (url, runs root, log path, process)."""
    root, log = work / "runs", work / "server.log"
    with serving(EXAMPLE / "langgraph.json", root, log, cwd=work, env=env_extra,
                 extra=extra) as (url, proc):
        yield url, root, log, proc


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, runs root, log path) of a `langgraph dev` serving the example."""
    with langgraph_dev(tmp_path_factory.mktemp("server")) as (url, root, log, _proc):
        yield url, root, log


def files_of(root: Path, thread_id: str) -> dict:
    """A thread's files, but for the empty `tmp/` its first execute makes (the
    sandbox's persistent /tmp; what a command leaves there would show)."""
    files = tree(root / "threads" / thread_dir_name(thread_id) / "fs")
    if files.get("tmp/") == "dir" and not any(k.startswith("tmp/") and k != "tmp/"
                                                for k in files):
        del files["tmp/"]
    return files


def user(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def job_files(n: int) -> dict:
    return {"work/": "dir", "work/job.py": f"print('job of task {n}')\n".encode(),
            "work/out.txt": f"job of task {n}\n".encode()}


def test_threads_through_the_server(server):
    from langgraph_sdk import get_client

    url, root, log = server
    client = get_client(url=url)

    async def first_run(n: int) -> str:
        thread = (await client.threads.create())["thread_id"]
        out = await client.runs.wait(thread, "agent", input=user(f"task {n}"))
        assert out["messages"][-1]["content"] == f"task {n}: done"
        return thread

    async def scenario() -> None:
        ns = list(range(6))
        threads = await asyncio.gather(*(first_run(n) for n in ns))
        for n, thread in zip(ns, threads, strict=True):
            assert files_of(root, thread) == job_files(n)
        # Every thread's files, through its next turn.
        again = await asyncio.gather(*(client.runs.wait(t, "agent", input=user("again"))
                                       for t in threads))
        for n, out in zip(ns, again, strict=True):
            listing = [m for m in out["messages"] if m["type"] == "tool"][-1]["content"]
            assert listing.startswith(f"job.py\nout.txt\njob of task {n}\n"), listing

        # A run from an old checkpoint gets that checkpoint's files back: the
        # one after write_file, before execute made out.txt (and a stray file).
        thread, n = threads[0], ns[0]
        await client.runs.wait(thread, "agent", input=user("again"))
        work = root / "threads" / thread_dir_name(thread) / "fs" / "work"
        (work / "stray.txt").write_text("not in any checkpoint")
        history = await client.threads.get_history(thread, limit=100)
        past = next(h for h in history if h["next"] == ["model"] and
                    [m["type"] for m in h["values"]["messages"]][-1] == "tool" and
                    sum(m["type"] == "tool" for m in h["values"]["messages"]) == 1)
        out = await client.runs.wait(thread, "agent", input=None,
                                     checkpoint_id=past["checkpoint"]["checkpoint_id"])
        execute = [m for m in out["messages"] if m["type"] == "tool"][-1]["content"]
        assert execute.startswith("job.py\njob of task 0")  # ls saw job.py alone
        assert files_of(root, thread) == job_files(n)

        # A copied thread has the files and the history: time travel works on it.
        copied = await client.threads.copy(thread)
        copy_id = copied["thread_id"]
        assert files_of(root, copy_id) == files_of(root, thread)
        (root / "threads" / thread_dir_name(copy_id) / "fs" / "work" / "stray.txt").write_text("x")
        history = await client.threads.get_history(copy_id, limit=100)
        past = next(h for h in history if h["checkpoint"]["checkpoint_id"] ==
                    past["checkpoint"]["checkpoint_id"])
        out = await client.runs.wait(copy_id, "agent", input=None,
                                     checkpoint_id=past["checkpoint"]["checkpoint_id"])
        assert files_of(root, copy_id) == job_files(n)
        out = await client.runs.wait(copy_id, "agent", input=user("again"))
        assert [m for m in out["messages"] if m["type"] == "tool"][-1]["content"].startswith(
            "job.py\nout.txt\njob of task 0")
        assert files_of(root, thread) == job_files(n)  # the source's files are its own

        # Deleting a thread deletes its files; its copy keeps its own.
        await client.threads.delete(thread)
        assert not (root / "threads" / thread_dir_name(thread)).exists()
        assert files_of(root, copy_id) == job_files(n)
        for n, other in zip(ns[1:], threads[1:], strict=True):  # the others, untouched
            assert files_of(root, other) == job_files(n)

    asyncio.run(scenario())
    assert not blocking_lines(log), blocking_lines(log)[:5]


def test_many_threads_at_once_then_sigterm(tmp_path):
    """AT_ONCE threads run at once on one server (as many jobs as threads),
    two turns each (write a script and run it; then list and read back what it
    wrote): no run fails, every thread's files are its own, exactly. SIGTERM
    then stops the server, and its shards with it: no mount, no daemon."""
    from langgraph_sdk import get_client

    with langgraph_dev(tmp_path, "--n-jobs-per-worker", str(AT_ONCE)) as (url, root, log, proc):
        client = get_client(url=url, timeout=600)

        async def two_turns(n: int) -> tuple[str, list[str]]:
            thread = (await client.threads.create())["thread_id"]
            out = await client.runs.wait(thread, "agent", input=user(f"task {n}"))
            again = await client.runs.wait(thread, "agent", input=user("again"))
            statuses = [r["status"] for r in await client.runs.list(thread)]
            assert out["messages"][-1]["content"] == f"task {n}: done", (n, out)
            listing = [m for m in again["messages"] if m["type"] == "tool"][-1]["content"]
            assert listing.startswith(f"job.py\nout.txt\njob of task {n}\n"), (n, listing)
            return thread, statuses

        async def everything() -> list[tuple[str, list[str]]]:
            return await asyncio.gather(*(two_turns(n) for n in range(AT_ONCE)))

        done = asyncio.run(everything())
        failed = [(t, s) for t, s in done if s != ["success", "success"]]
        assert failed == [], failed[:5]
        for n, (thread, _) in enumerate(done):
            assert files_of(root, thread) == job_files(n), n
        assert mounts_under(root) != [] and daemons_under(root) != []
        assert stop_server(proc, within=SIGTERM_WITHIN), \
            f"langgraph dev hung: still running {SIGTERM_WITHIN:g} s after SIGTERM"
        # What the server left, once it is gone: nothing.
        assert mounts_under(root) == [] and daemons_under(root) == [], \
            (mounts_under(root), daemons_under(root), log.read_text(errors="replace")[-3000:])
    assert not blocking_lines(log), blocking_lines(log)[:5]
