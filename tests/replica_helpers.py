"""Helpers for tests of replicas: shard daemons with a remote, one bucket prefix.

A *replica* is a shard daemon (`vfsd mount --shard DIR --remote URL`) with a
store of its own, as a separate machine would have. The runs of a thread are
driven through the control socket as a checkpointer does: `remote_begin`,
files written in the mount, `snapshot`, `remote_end`.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import is_mounted, tree, vfsd_cli
from ctl import connect
from remote_run import FAST

#: seconds a control request may take (a begin waits for leases)
TIMEOUT = 120.0


def tkey(thread: str) -> str:
    """The volume (and record) name a Runs gives a thread."""
    return "t" + hashlib.sha256(thread.encode()).hexdigest()[:32]


class Replica:
    """One shard daemon with a remote; see the module docstring."""

    def __init__(self, run_dir: Path, url: str, *args: str) -> None:
        self.dir = Path(run_dir)
        self.url = url
        self.args = (*FAST, *args)

    def start(self) -> Replica:
        vfsd_cli("mount", "--shard", self.dir, "--remote", self.url, *self.args)
        assert is_mounted(self.fs)
        return self

    @property
    def fs(self) -> Path:
        return self.dir / "fs"

    def files(self, thread: str) -> dict:
        return tree(self.fs / tkey(thread))

    def path(self, thread: str, rel: str = "") -> Path:
        return self.fs / tkey(thread) / rel

    def request(self, op: str, **args) -> dict:
        with connect(self.dir, TIMEOUT) as c:
            return c.request(op, **args)

    def call(self, op: str, **args) -> dict:
        with connect(self.dir, TIMEOUT) as c:
            return c.call(op, **args)

    def error(self, op: str, **args) -> dict:
        with connect(self.dir, TIMEOUT) as c:
            return c.error(op, **args)

    def begin(self, thread: str, **args) -> dict:
        args.setdefault("wait", 30)
        return self.call("remote_begin", volume=tkey(thread), thread=thread, **args)

    def end(self, thread: str, **args) -> dict:
        return self.call("remote_end", volume=tkey(thread), **args)

    def snapshot(self, thread: str) -> str:
        return self.call("snapshot", volume=tkey(thread))["id"]

    def snapshots(self, thread: str) -> list[str]:
        return [s["id"] for s in self.call("snapshots", volume=tkey(thread))["snapshots"]]

    def pid(self) -> int:
        return int((self.dir / ".vfsd" / "vfsd.pid").read_text())

    def kill(self) -> None:
        """SIGKILL the daemon (a crash), and remove its dead mount."""
        os.kill(self.pid(), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.pid()}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(["fusermount3", "-u", "-z", str(self.fs)], capture_output=True)

    def log_errors(self) -> list[str]:
        log = self.dir / ".vfsd" / "vfsd.log"
        text = log.read_text() if log.exists() else ""
        return [ln for ln in text.splitlines()
                if '"level": "error"' in ln or "Traceback" in ln]

    def log_events(self, event: str) -> list[dict]:
        log = self.dir / ".vfsd" / "vfsd.log"
        out = []
        for ln in (log.read_text() if log.exists() else "").splitlines():
            if f'"{event}"' in ln:
                try:
                    out.append(json.loads(ln))
                except ValueError:
                    pass
        return out

    def stop(self) -> None:
        if is_mounted(self.fs):
            proc = vfsd_cli("umount", self.dir, check=False)
            if proc.returncode != 0 and is_mounted(self.fs):
                subprocess.run(["fusermount3", "-u", "-z", str(self.fs)], capture_output=True)
        pidfile = self.dir / ".vfsd" / "vfsd.pid"
        if pidfile.exists():
            try:
                pid = int(pidfile.read_text())
                deadline = time.monotonic() + 10
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                if Path(f"/proc/{pid}").exists():
                    os.kill(pid, signal.SIGKILL)
            except (ValueError, ProcessLookupError, FileNotFoundError):
                pass
