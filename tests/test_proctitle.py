"""Processes named for what they serve: what `ps` and `top` show of real daemons.

Read from /proc/PID/cmdline (what `ps` shows) and /proc/PID/comm (`top`'s
name) of daemons started every way vfsd starts them: `vfsd mount` (a new
process), the shards of a Runs root (forked by mount_tool's warm spawner),
`vfsd mount --shard` outside a Runs root. The environment next to a title
stays readable (/proc/PID/environ).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import daemons_under, vfsd_cli

import mount_tool

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]


def cmdline(pid: int) -> str:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode()


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")


def environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def test_a_run_dir_daemon_names_its_run_dir(tmp_path):
    run = tmp_path / "r" / "with space\tand tab"
    vfsd_cli("mount", run)
    try:
        pid = int((run / ".vfsd" / "vfsd.pid").read_text())
        assert cmdline(pid) == f"vfsd daemon of {tmp_path}/r/with space\\x09and tab"
        assert comm(pid) == "vfsd with space"
    finally:
        vfsd_cli("umount", run)


def intact(env: list[bytes]) -> bool:
    """Whether an environment still reads as one (a title written over it would not)."""
    return any(e.startswith(b"PATH=") for e in env) and all(b"vfsd " not in e for e in env)


def test_shards_and_the_spawner_say_what_they_serve(tmp_path):
    # A long root: the title of a daemon forked by the spawner has room for it.
    root = tmp_path / ("runs-" + "x" * 150)
    with mount_tool.runs(root, shards=2) as runs:
        for thread in ("a", "b", "c", "d", "e"):
            with runs.use(thread) as m:
                m.write("f", thread)
        shards = {s["name"]: s["pid"] for s in runs.shards()}
        assert sorted(shards) == ["0", "1"] and sorted(daemons_under(root)) == \
            sorted(shards.values())
        for name, pid in shards.items():
            assert cmdline(pid) == f"vfsd shard {name} of {root}"
            assert comm(pid) == f"vfsd shard {name}"
            assert intact(environ(pid))  # the title left it alone
        spawners = [int(p) for p in os.listdir("/proc") if p.isdigit()
                    and _parent(int(p)) == os.getpid() and comm(int(p)) == "vfsd spawner"]
        assert [cmdline(p) for p in spawners] == [f"vfsd spawner for pid {os.getpid()}"]
        assert intact(environ(spawners[0]))


def test_a_shard_outside_a_runs_root(tmp_path):
    run = tmp_path / "lone"
    vfsd_cli("mount", "--shard", run)
    try:
        pid = int((run / ".vfsd" / "vfsd.pid").read_text())
        assert cmdline(pid) == f"vfsd shard of {run}"
        assert comm(pid) == "vfsd shard lone"
    finally:
        vfsd_cli("umount", run)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
