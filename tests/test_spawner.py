"""mount_tool's warm helper (`vfsd.cli.spawner`): commands and daemons forked
from one process behave as the processes `vfsd` would start.

Each test runs an agent-like program in its own interpreter, so the helper's
life (started by the first mount, gone with the program) is the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import is_mounted, vfsd_cli

PROGRAM = r"""
import json, os, sys, threading
import mount_tool
from mount_tool.daemon import spawn

runs = sys.argv[1:]
os.environ["VFSD_TEST_MARK"] = "seen-by-the-daemon"
mounts, errors = [], []

def mount(rd):
    try:
        mounts.append(mount_tool.mount(rd))
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")

# Two at once through one helper, then the rest one by one.
threads = [threading.Thread(target=mount, args=(rd,)) for rd in runs[:2]]
for t in threads: t.start()
for t in threads: t.join()
for rd in runs[2:]:
    mount(rd)
for m in mounts:
    m.write("hello.txt", b"from " + m.run_dir.name.encode())
helper = spawn._helper.proc.pid if spawn._helper is not None else None
print(json.dumps({"helper": helper, "errors": errors,
                  "daemons": {str(m.run_dir): int((m.state_dir / "vfsd.pid").read_text())
                              for m in mounts}}))
"""


def run_program(tmp_path: Path, runs: list[Path], spawner: str = "1") -> dict:
    env = {**os.environ, "MOUNT_TOOL_SPAWNER": spawner}
    proc = subprocess.run([sys.executable, "-c", PROGRAM, *map(str, runs)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive (nothing reaps what init has not collected yet).
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(cond, what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("spawner", ["1", "0"])
def test_daemons_outlive_the_program_and_its_helper(tmp_path, spawner):
    runs = [tmp_path / f"r{i}" for i in range(3)]
    try:
        out = run_program(tmp_path, runs, spawner)
        assert out["errors"] == []
        assert (out["helper"] is not None) == (spawner == "1")
        if out["helper"] is not None:
            # The program exited: its helper follows (end of file on its socket).
            wait_until(lambda: not alive(out["helper"]), "the helper to exit")
        for rd in runs:
            pid = out["daemons"][str(rd)]
            assert alive(pid)
            assert (rd / "fs" / "hello.txt").read_bytes() == b"from " + rd.name.encode()
            # The daemon runs with the program's environment (AWS_* credentials
            # for a remote store come that way), in a session of its own.
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"VFSD_TEST_MARK=seen-by-the-daemon" in environ
            assert os.getsid(pid) == pid
            vfsd_cli("umount", rd)
            wait_until(lambda pid=pid: not alive(pid), "the daemon to exit")
    finally:
        for rd in runs:
            if is_mounted(rd / "fs"):
                vfsd_cli("umount", rd, check=False)


def test_a_refused_mount_says_what_the_command_says(tmp_path):
    import mount_tool
    from mount_tool.errors import MountError

    rd = tmp_path / "busy"
    (rd / "fs").mkdir(parents=True)
    (rd / "fs" / "left-over").write_text("x")
    proc = vfsd_cli("mount", rd, check=False)
    assert proc.returncode != 0 and "is not empty" in proc.stderr
    with pytest.raises(MountError) as info:
        mount_tool.mount(rd)
    assert proc.stderr.strip() in str(info.value)
    assert (rd / "fs" / "left-over").read_text() == "x"
