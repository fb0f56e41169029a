"""What every verb shares: the `vfsd` group, failing with a message, control calls."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir, pid_alive


def fail(msg: str, code: int = 1):
    click.echo(f"vfsd: {msg}", err=True)
    sys.exit(code)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vfsd")
def cli() -> None:
    """vfsd: a FUSE filesystem for LLM agent artifacts."""


def unreachable(run: RunDir, exc: DaemonUnreachable) -> str:
    """What to tell the user when the daemon did not answer."""
    pid = run.read_pid()
    # A killed process closes its sockets a moment before it is gone.
    deadline = time.monotonic() + 2.0
    while pid is not None and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid is not None and not pid_alive(pid):
        return (f"{exc}: the daemon (pid {pid}) has exited; see {run.log}. "
                f"`vfsd mount {run.path}` removes the dead mount and mounts again")
    if pid is None:
        return f"{exc}; is {run.path} mounted?"
    return f"{exc}; see {run.log}"


def control_failure(run: RunDir, exc: ControlError) -> str:
    if exc.code == "not_found":
        return f"not found: {exc.message}"
    if exc.code == "busy":
        return (f"the daemon of {run.path} is saturated ({exc.message}); "
                "retry in a moment")
    return exc.message


def call(run_path: Path, op: str, /, client_timeout: float = 60.0, **args) -> dict:
    """One control request; any failure ends the command with a clear message."""
    run = RunDir(run_path)
    try:
        with ControlClient(run.sock, timeout=client_timeout) as c:
            return c.call(op, **args)
    except DaemonUnreachable as exc:
        fail(unreachable(run, exc))
    except ControlError as exc:
        fail(control_failure(run, exc))
