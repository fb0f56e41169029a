"""Freeze a process for a test: SIGSTOP, and return only once it is stopped.

kill() only queues SIGSTOP. The group stop reaches a process's other threads
after one of them has taken the signal, so on a busy machine a server went on
answering for a few milliseconds after the kill, and a request sent right
behind it got its reply (a test that expected a hang saw an answer).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (state T or t)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        # The state follows the command name, which may hold ") ".
        if stat.rpartition(")")[2].split()[0] not in ("T", "t"):
            return False
    return True


def freeze(pid: int, *, group: bool = False, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` (its process group with `group`) and wait until its threads
    are stopped; SIGCONT undoes it."""
    (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not all_threads_stopped(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"pid {pid} did not stop within {timeout:g} s of SIGSTOP")
        time.sleep(0.002)
