"""`make demo` (`python -m mount_tool.demo`): the scripted agent run on a real mount.

The demo runs as a user would run it, in a subprocess, with its run dir in a
temporary directory (VFSD_DEMO_DIR). It must tell its story, leave the run dir
mounted, run again over a run dir that is still mounted, and fail with a clear
message when it cannot run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import is_mounted, vfsd_cli

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.timeout(240),
    pytest.mark.skipif(find_spec("deepagents") is None, reason="needs the agents extra"),
]

UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20}


def run_demo(run_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "VFSD_DEMO_DIR": str(run_dir)}
    return subprocess.run(
        [sys.executable, "-m", "mount_tool.demo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def size_in_bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


@pytest.fixture
def demo_dir(tmp_path: Path):
    """Where the demo puts its run dir; unmounted in teardown whatever happened."""
    run_dir = tmp_path / "demo-run"
    yield run_dir
    if is_mounted(run_dir / "fs"):
        vfsd_cli("umount", run_dir, check=False)
    if is_mounted(run_dir / "fs"):
        subprocess.run(["fusermount3", "-u", "-z", str(run_dir / "fs")], capture_output=True)


def check_story(out: str, run_dir: Path) -> int:
    """Check the story's key lines; return the last step."""
    # The large tool output was offloaded, then grepped from the shell.
    assert re.search(
        r"~[\d,]+ tokens, over 20k\): offloaded to large_tool_results/call_fetch_4182\.log", out
    )
    assert "agent  execute $ grep -n ERROR large_tool_results/call_fetch_4182.log" in out
    assert re.search(r"shell  \d+:\S+ ERROR \[shard \d\] \S+test_upload_retry FAILED", out)
    # Tool outputs written with write_file: bodies in the mount, small refs in state.
    assert re.search(
        r"mount  /tool_outputs/history/test_upload_retry\.json: 124,\d{3} bytes in the mount, a 1\d\d-byte ref in state",
        out,
    )
    # Scripts written into the mount and executed there.
    assert "agent  write_file /scripts/repro.sh" in out
    assert "shell  RESULT run 3: latency 75 ms, upload 30.0 s, timeout 30 s: TIMEOUT" in out
    assert "shell  RESULT run 8: latency 200 ms, upload 80.0 s, timeout 90 s: ok" in out
    # Files marked done, then evicted as the steps advanced; refs left the state.
    assert "setfattr -n user.vfsd.status -v done failures.csv history/*.json" in out
    assert re.search(
        r"evict  tool_outputs/history/test_upload_retry\.json \(done, .*\); ref dropped from state",
        out,
    )
    assert re.search(r"evict  large_tool_results/call_fetch_4182\.log \(max age, ", out)
    assert re.search(r"evict  tool_outputs/repro/run_1\.log \(done, ", out)
    # 30+ steps, each printed.
    steps = [int(n) for n in re.findall(r"^step +(\d+) ", out, re.M)]
    assert len(steps) >= 30 and steps == list(range(1, len(steps) + 1)), steps
    assert re.search(
        rf"^After {steps[-1]} steps: \d+ files live in the mount .*, \d+ evicted\.$", out, re.M
    )
    # The state sizes, vfsd against the in-state baseline, from the same run.
    vfsd = re.search(r"vfsd: refs in state +([\d.]+ [KM]?B) +\((\d+) refs", out)
    base = re.search(
        r"deepagents StateBackend: files in state +([\d.]+ [KM]?B) +\((\d+) files", out
    )
    assert vfsd and base, out
    assert size_in_bytes(vfsd.group(1)) * 10 < size_in_bytes(base.group(1))
    assert re.search(r"-> \d+x smaller state, \d+x fewer checkpoint bytes", out)
    # How to explore and unmount (paths relative to the working directory, as `make demo` shows).
    assert f"The run dir stays mounted at {run_dir.name}/fs;" in out
    assert re.search(rf"^Unmount it with: \S*vfsd umount {run_dir.name}$", out, re.M)
    return steps[-1]


def test_demo_tells_the_story_and_leaves_the_run_dir_mounted(demo_dir: Path, tmp_path: Path):
    first = run_demo(demo_dir, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    last_step = check_story(first.stdout, demo_dir)

    root = demo_dir / "fs"
    assert is_mounted(root)
    assert "Verification: runs 6 and 8 pass at 90 s" in (root / "report.md").read_text()
    assert not (root / "large_tool_results" / "call_fetch_4182.log").exists()
    assert json.loads((root / ".vfsd" / "status.json").read_text())["step"] == last_step
    attrs = subprocess.run(["cat", str(root / ".vfsd/attr/report.md")], capture_output=True,
                           text=True)
    assert json.loads(attrs.stdout)["pin"] is True

    # Again, over the run dir that is still mounted: a fresh run, the same story.
    (root / "left-from-before.txt").write_text("x")
    again = run_demo(demo_dir, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    check_story(again.stdout, demo_dir)
    assert is_mounted(root)
    assert not (root / "left-from-before.txt").exists()


def test_demo_refuses_a_dir_that_is_not_a_run_dir(tmp_path: Path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    proc = run_demo(precious, tmp_path)
    assert proc.returncode == 1
    assert "demo failed:" in proc.stderr and "is not a demo run dir" in proc.stderr
    assert (precious / "notes.txt").read_text() == "keep me"
    assert not is_mounted(precious / "fs")
