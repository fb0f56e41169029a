"""Run `vfsd` commands through one warm helper process (`python -m vfsd.cli.spawner`).

A `vfsd mount` started as a new process pays for two interpreters and their
imports before the mount answers (half a second on a busy machine); the
helper has imported them once and forks per command, so a mount costs tens
of milliseconds. The helper is started by the first command of this
process, talks only to it (a socketpair, no socket in the filesystem), and
exits when this process closes its end or exits. Daemons it started do not
depend on it.

`run_vfsd(args)` gives what `subprocess.run([python, -m, vfsd.cli, *args])`
would: the exit code, stdout and stderr. Where the helper cannot be used
(MOUNT_TOOL_SPAWNER=0, it failed to start, or died), commands run as
processes, with the same results. `mount_flags` turns a Mount's or a Runs'
keyword options into `vfsd mount` flags.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import MountError

VFSD_CLI = [sys.executable, "-m", "vfsd.cli"]
#: seconds the helper may take to import everything and say it is ready
START_TIMEOUT_S = 60.0

_lock = threading.Lock()
_helper: _Helper | None = None
_broken = False


class _Helper:
    """The helper process and our end of its socketpair."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                # The spaces are room for the process titles of the daemons it
                # forks (vfsd.cli.spawner.TITLE_ROOM): they share its arguments' room.
                [sys.executable, "-m", "vfsd.cli.spawner", str(theirs.fileno()), " " * 2048],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)  # the terminal's ^C is not for it
        finally:
            theirs.close()
        self.sock = ours
        self._send_lock = threading.Lock()
        # It runs one command before it is trusted with real ones: its imports
        # must have worked (a broken installation falls back to processes).
        ours.settimeout(START_TIMEOUT_S)
        if self._send(["--version"], timeout=START_TIMEOUT_S)[0] != 0:
            self.close()
            raise OSError("vfsd.cli.spawner did not start")
        ours.settimeout(None)

    def _send(self, args: list[str], timeout: float) -> tuple[int, str, str]:
        mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with mine:
            try:
                with self._send_lock:
                    socket.send_fds(self.sock, [b"R"], [child.fileno()])
            finally:
                child.close()
            mine.settimeout(timeout)
            request = {"argv": args, "env": dict(os.environ), "cwd": os.getcwd(),
                       "umask": _umask()}
            mine.sendall(json.dumps(request).encode() + b"\n")
            reader = mine.makefile("rb")
            pid = None
            try:
                first = reader.readline()
                if not first:
                    return 1, "", "vfsd: the command's process ended without an answer\n"
                pid = json.loads(first)["pid"]
                last = reader.readline()
                if not last:
                    return 1, "", "vfsd: the command's process ended without an answer\n"
                reply = json.loads(last)
            except TimeoutError:
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                raise subprocess.TimeoutExpired(["vfsd", *args], timeout) from None
            except (ValueError, KeyError, TypeError) as exc:
                raise OSError(f"vfsd.cli.spawner answered nonsense: {exc}") from None
        return int(reply["code"]), str(reply["stdout"]), str(reply["stderr"])

    def close(self) -> None:
        self.sock.close()  # end of file: the helper exits
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _forget_after_fork() -> None:
    # A forked child must not share our helper (its requests would interleave
    # with ours on one socket): it starts its own when it needs one.
    global _helper, _lock
    _lock = threading.Lock()
    if _helper is not None:
        _helper.sock.close()
        _helper = None


os.register_at_fork(after_in_child=_forget_after_fork)


def _get_helper() -> _Helper | None:
    global _helper, _broken
    if _broken or os.environ.get("MOUNT_TOOL_SPAWNER", "1") == "0":
        return None
    with _lock:
        if _helper is not None and _helper.proc.poll() is not None:
            _helper = None  # it died: start another
        if _helper is None:
            try:
                _helper = _Helper()
            except OSError:
                _broken = True  # once: this process then runs commands as processes
                return None
        return _helper


def run_vfsd(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`vfsd ARGS...`: its exit code and output. Raises subprocess.TimeoutExpired
    after `timeout` seconds (the command is then killed)."""
    helper = _get_helper()
    if helper is not None:
        try:
            code, out, err = helper._send(list(args), timeout)
            return subprocess.CompletedProcess([*VFSD_CLI, *args], code, out, err)
        except (BrokenPipeError, ConnectionError):
            pass  # the helper died before it took the command: run it as a process
    return subprocess.run([*VFSD_CLI, *args], capture_output=True, text=True, timeout=timeout)


#: daemon options that are on unless turned off (`--no-...`)
ON_BY_DEFAULT = frozenset({"builtin_eviction_rules"})


def mount_flags(options: Mapping[str, Any]) -> list[str]:
    """Turn keyword options into `vfsd mount` flags.

    done_retention_steps=3 -> ["--done-retention-steps", "3"]; True -> bare flag
    (allow_other=True -> ["--allow-other"]); False -> the `--no-` flag of an
    option that is on by default (builtin_eviction_rules=False), else left out,
    as None is.
    """
    flags: list[str] = []
    for key, value in options.items():
        if key == "foreground":
            raise ValueError("foreground would block: mount_tool always runs vfsd detached")
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False and key in ON_BY_DEFAULT:
            flags.append("--no-" + flag[2:])
        elif value is False or value is None:
            continue
        elif isinstance(value, list | tuple | dict):  # eviction_rules: JSON
            flags += [flag, json.dumps(list(value) if isinstance(value, tuple) else value)]
        else:
            flags += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return flags


def vfsd_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`run_vfsd` for mount_tool's own commands: MountError when the command
    does not finish within `timeout` seconds."""
    try:
        return run_vfsd(list(args), timeout)
    except subprocess.TimeoutExpired as exc:
        raise MountError(f"vfsd {' '.join(args)} did not finish in {timeout} s") from exc
