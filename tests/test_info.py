"""`vfsd info` on a real mount and on the unmounted run dir."""

from __future__ import annotations

import json
import os

import pytest
from conftest import vfsd_cli

import mount_tool
from mount_tool.daemon import toolcalls

pytestmark = pytest.mark.fuse


def info(run, path: str) -> dict:
    return json.loads(vfsd_cli("info", run.run_dir, path, "--json").stdout)


def test_info_mounted_and_unmounted(run):
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        with toolcalls.running("write_file", "w7", "thread-9"):
            m.write("notes/plan.md", "plan\n")
        m.write("big.bin", os.urandom(3 << 20))  # three chunks, outside any tool call
    finally:
        m.detach()
    sid = vfsd_cli("snapshot", run.run_dir, "--label", "checkpoint-1").stdout.strip()
    with open(run.root / "notes" / "plan.md", "a") as f:
        f.write("more\n")
    os.setxattr(run.root / "notes" / "plan.md", "user.vfsd.status", b"done")
    vfsd_cli("step", run.run_dir, "2")

    doc = info(run, "notes/plan.md")
    assert doc["mounted"] is True
    assert doc["made_by"] == {"tool": "write_file", "id": "w7", "thread": "thread-9", "step": 0}
    assert doc["changed_by"] is None  # the shell appended
    assert doc["tier"] == "inline" and doc["content"]["inline"] == 1
    assert doc["snapshots"] == [{"id": sid, "step": 0, "label": "checkpoint-1",
                                 "same_content": False,
                                 "changed_by": doc["made_by"]}]
    assert doc["eviction"]["rule"] == "done" and doc["eviction"]["due_step"] == 4
    big = info(run, str(run.root / "big.bin"))  # an absolute path inside the mount
    assert big["tier"] == "chunked" and big["content"]["local"] == 3
    assert big["content"]["pending_upload"] == 0  # no bucket
    assert big["snapshots"][0]["same_content"] is True
    assert big["eviction"]["rule"] == "max_age" and big["eviction"]["due_step"] == 21
    text = vfsd_cli("info", run.run_dir, "notes/plan.md").stdout
    assert "write_file w7, thread thread-9, step 0" in text and "no tool call" in text

    run.umount()
    offline = info(run, "notes/plan.md")
    assert offline["mounted"] is False
    for key in ("made_by", "changed_by", "tier", "content", "snapshots", "eviction", "hash"):
        assert offline[key] == doc[key], key
    missing = vfsd_cli("info", run.run_dir, "nope.txt", check=False)
    assert missing.returncode == 1 and "not found" in missing.stderr
    outside = vfsd_cli("info", run.run_dir, "/etc/passwd", check=False)
    assert outside.returncode == 2
    run.mount()
