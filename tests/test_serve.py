"""`make serve`, as the README says: the example under `langgraph dev`, from the
checkout root, driven by langgraph-sdk.

`make serve PORT=... JOBS=...` (its setup step finds the test venv ready)
serves examples/langgraph-server with JOBS runs at once; threads run two turns
each at once; SIGTERM to its process group (what a terminal's Ctrl-C or a
supervisor sends) stops it, and `make` returns once nothing is mounted and no
daemon is left. Started again on the same VFSD_RUNS, the server has every
thread back: the same history (the SQLite saver in the Runs root), the same
files, runs go on from the last checkpoint and from an old one. A bad
VFSD_CONFIG stops the server as it starts, naming the key, before any thread
runs. The server's own records go to VFSD_RUNS/langgraph-server, not into the
checkout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("langgraph_sdk")

from conftest import daemons_under, mounts_under  # noqa: E402
from lgserver import blocking_lines, free_port  # noqa: E402
from test_langgraph_server import files_of, job_files, user  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(900)]

CHECKOUT = Path(__file__).resolve().parent.parent
#: runs at once, and threads run at once through them
JOBS = 6


class Serve:
    """One `make serve` in a process group of its own."""

    def __init__(self, root: Path, log: Path, port: int | None = None, **env: str) -> None:
        self.root, self.log = root, log
        self.port = port if port is not None else free_port()
        environ = {**os.environ, "VFSD_RUNS": str(root), "VFSD_SHARDS": "2",
                   "LANGSMITH_TRACING": "false", **env}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                ["make", "-s", "serve", f"PORT={self.port}", f"JOBS={JOBS}"], cwd=CHECKOUT,
                env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        import urllib.request

        deadline = time.monotonic() + 300  # its setup step, then the server's start
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"make serve exited {self.proc.returncode}:\n{self.text()}")
            try:
                with urllib.request.urlopen(self.url + "/ok", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"make serve did not answer on {self.url}:\n{self.text()}")

    def stop(self, within: float = 60.0) -> bool:
        """SIGTERM to the group, as Ctrl-C or a supervisor: whether `make`
        returned within `within` seconds (else everything is killed)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=within)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return False
        finally:
            for fs in mounts_under(self.root):
                subprocess.run(["fusermount3", "-u", "-z", fs], capture_output=True)

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]


def test_make_serve_threads_at_once_sigterm_and_a_restart_keeps_everything(tmp_path):
    from langgraph_sdk import get_client

    root, log = tmp_path / "runs", tmp_path / "serve.log"
    checkout_state = CHECKOUT / ".langgraph_api"
    had_checkout_state = checkout_state.exists()

    server = Serve(root, log)
    try:
        server.wait_ready()
        client = get_client(url=server.url, timeout=600)

        async def two_turns(n: int) -> str:
            thread = (await client.threads.create())["thread_id"]
            out = await client.runs.wait(thread, "agent", input=user(f"task {n}"))
            assert out["messages"][-1]["content"] == f"task {n}: done", (n, out)
            again = await client.runs.wait(thread, "agent", input=user("again"))
            listing = [m for m in again["messages"] if m["type"] == "tool"][-1]["content"]
            assert listing.startswith(f"job.py\nout.txt\njob of task {n}\n"), (n, listing)
            return thread

        async def first_server() -> tuple[list[str], dict[str, list[str]]]:
            threads = await asyncio.gather(*(two_turns(n) for n in range(JOBS)))
            history = {t: [h["checkpoint"]["checkpoint_id"] for h in
                           await client.threads.get_history(t, limit=1000)] for t in threads}
            return threads, history

        threads, history = asyncio.run(first_server())
        for n, thread in enumerate(threads):
            assert files_of(root, thread) == job_files(n)
        assert f"Starting {JOBS} background workers" in log.read_text(errors="replace")
        assert mounts_under(root) != [] and daemons_under(root) != []
    finally:
        stopped = server.stop()
    assert stopped, f"make serve still ran 60 s after SIGTERM:\n{server.text()}"
    assert not server.group_alive()
    assert mounts_under(root) == [] and daemons_under(root) == [], server.text()
    text = log.read_text(errors="replace")
    # The saver has every optional method the server asks for (no warning), and
    # nothing blocked the server's event loop.
    assert "Custom checkpointer missing" not in text, text[-3000:]
    assert blocking_lines(log) == []
    # The server's records are in VFSD_RUNS, none in the checkout.
    assert (root / "langgraph-server" / ".langgraph_api").is_dir()
    assert checkout_state.exists() == had_checkout_state

    # Started again on the same root: every thread, its history, its files.
    server = Serve(root, log)
    try:
        server.wait_ready()
        client = get_client(url=server.url, timeout=600)

        async def second_server() -> None:
            found = {t["thread_id"] for t in await client.threads.search(limit=100)}
            assert found >= set(threads)
            for n, thread in enumerate(threads):
                got = [h["checkpoint"]["checkpoint_id"] for h in
                       await client.threads.get_history(thread, limit=1000)]
                assert got == history[thread], n

            # Every thread goes on from its last checkpoint (all its messages
            # there) on its files (the shards mount on first use).
            async def third_turn(n: int, thread: str) -> None:
                out = await client.runs.wait(thread, "agent", input=user("again"))
                assert [m["type"] for m in out["messages"]].count("human") == 3, n
                listing = [m for m in out["messages"] if m["type"] == "tool"][-1]["content"]
                assert listing.startswith(f"job.py\nout.txt\njob of task {n}\n"), listing

            await asyncio.gather(*(third_turn(n, t) for n, t in enumerate(threads)))
            for n, thread in enumerate(threads):
                assert files_of(root, thread) == job_files(n)
            thread = threads[0]
            # And from an old one, made before the restart: its files come back
            # (only job.py: before execute made out.txt).
            past = next(h for h in await client.threads.get_history(thread, limit=1000)
                        if h["next"] == ["model"] and
                        sum(m["type"] == "tool" for m in h["values"]["messages"]) == 1)
            out = await client.runs.wait(thread, "agent", input=None,
                                         checkpoint_id=past["checkpoint"]["checkpoint_id"])
            execute = [m for m in out["messages"] if m["type"] == "tool"][-1]["content"]
            assert execute.startswith("job.py\njob of task 0"), execute

        asyncio.run(second_server())
    finally:
        stopped = server.stop()
    assert stopped, server.text()
    assert mounts_under(root) == [] and daemons_under(root) == []
    assert blocking_lines(log) == []


def test_a_bad_vfsd_config_stops_the_server_at_start_naming_the_key(tmp_path):
    root, log = tmp_path / "runs", tmp_path / "serve.log"
    bad = tmp_path / "vfsd.toml"
    bad.write_text("done_retention_steps = 3\nevict_after_steps = 5\n")
    server = Serve(root, log, VFSD_CONFIG=str(bad))
    try:
        code = server.proc.wait(timeout=300)  # on its own: no signal
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    assert code != 0
    assert "unknown option(s) in" in text and "'evict_after_steps'" in text, text[-3000:]
    assert str(bad) in text
    assert not (root / "shards").exists() and not (root / "threads").exists()
    assert mounts_under(root) == [] and daemons_under(root) == []


def test_a_taken_port_is_refused_naming_it(tmp_path):
    """langgraph dev would serve on another port, saying so in its log only:
    `make serve` refuses, naming the port."""
    import socket

    root, log = tmp_path / "runs", tmp_path / "serve.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Serve(root, log, port=port)
        try:
            code = server.proc.wait(timeout=300)  # on its own: no signal
        finally:
            server.stop()
    text = log.read_text(errors="replace")
    assert code != 0
    assert f"port {port} of 127.0.0.1 is taken" in text and "PORT=" in text, text[-3000:]
    assert not (root / "shards").exists()
