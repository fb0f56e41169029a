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
def serving(config: Path, runs_root: Path, log: Path, *, cwd: Path | None = None,
            env: dict[str, str] | None = None,
            extra: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """(URL, process) of a `langgraph dev` serving `config` (a langgraph.json),
    run from `cwd` (default: the config's folder, where the server keeps its
    `.langgraph_api/`), its threads' files under `runs_root` (VFSD_RUNS).
    Stopped with SIGTERM on the way out (killed if it does not go within 60 s),
    and whatever it left mounted under `runs_root` lazily unmounted."""
    port = free_port()
    environ = {**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false",
               "VFSD_RUNS": str(runs_root), **(env or {})}
    langgraph = Path(sys.executable).parent / "langgraph"
    args = [str(langgraph), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
            "--port", str(port), "--config", str(config), *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=cwd or config.parent, env=environ, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield url, proc
    finally:
        stop_server(proc)
        # The server unmounts its shards on the way out; a killed one would not.
        for fs in runs_root.glob("shards/*/fs"):
            subprocess.run(["fusermount3", "-u", "-z", str(fs)], capture_output=True)


@contextlib.contextmanager
def langgraph_dev(app: Path, runs_root: Path, log: Path, *, env: dict[str, str] | None = None,
                  jobs: int | None = None) -> Iterator[str]:
    """The URL of a `langgraph dev` serving `app/langgraph.json` from `app`."""
    extra = ("--n-jobs-per-worker", str(jobs)) if jobs is not None else ()
    with serving(app / "langgraph.json", runs_root, log, env=env, extra=extra) as (url, _proc):
        yield url


def stop_server(proc: subprocess.Popen, within: float = 60.0) -> bool:
    """SIGTERM, as a supervisor stops a server: whether it exited of it (False:
    still running after `within` seconds, a hang, and killed)."""
    if proc.poll() is not None:
        return True
    proc.terminate()
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    return True


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
