"""`langgraph dev` for tests: one server on a free 127.0.0.1 port, stopped (and its
shards unmounted) on the way out.

Started without `--allow-blocking`, so the server fails any call that blocks its
event loop (the tests look for BLOCKING in its log).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BLOCKING = ("BlockingError", "synchronous blocking call")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def langgraph_dev(app: Path, runs_root: Path, log: Path, *, env: dict[str, str] | None = None,
                  jobs: int | None = None) -> Iterator[str]:
    """The URL of a `langgraph dev` serving `app/langgraph.json`, its threads'
    files under `runs_root` (VFSD_RUNS)."""
    port = free_port()
    environ = {**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false",
               "VFSD_RUNS": str(runs_root), **(env or {})}
    langgraph = Path(sys.executable).parent / "langgraph"
    args = [str(langgraph), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
            "--port", str(port), "--config", str(app / "langgraph.json")]
    if jobs is not None:
        args += ["--n-jobs-per-worker", str(jobs)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=app, env=environ, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # The server unmounts its shards on the way out; a killed one would not.
        for fs in runs_root.glob("shards/*/fs"):
            subprocess.run(["fusermount3", "-u", "-z", str(fs)], capture_output=True)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"langgraph dev exited {proc.returncode}:\n"
                                 f"{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/ok", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"langgraph dev did not answer on {url}:\n{log.read_text()[-4000:]}")


def blocking_lines(log: Path) -> list[str]:
    """Lines of the server log that report a blocking call on its event loop."""
    text = log.read_text(errors="replace")
    return [line for line in text.splitlines() if any(b in line for b in BLOCKING)]
