"""A shard daemon: one mount, one store, every volume a directory of the mount.

Real `vfsd mount --shard`, real shell tools; volumes made and dropped through
the control socket, as mount_tool's Runs does.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import is_mounted, tree, vfsd_cli, wait_for
from ctl import connect

pytestmark = pytest.mark.fuse


@pytest.fixture
def shard(tmp_path):
    run = tmp_path / "shard"
    vfsd_cli("mount", "--shard", run)
    try:
        yield run
    finally:
        if is_mounted(run / "fs"):
            proc = vfsd_cli("umount", run, check=False)
            if proc.returncode != 0:
                subprocess.run(["fusermount3", "-u", "-z", str(run / "fs")], capture_output=True)


def call(run: Path, op: str, **args):
    with connect(run) as c:
        return c.call(op, **args)


def error(run: Path, op: str, **args) -> dict:
    with connect(run) as c:
        return c.error(op, **args)


def test_volumes_are_directories_with_their_own_trees(shard):
    assert call(shard, "volume_create", volume="t1", thread="alice")["created"]
    assert call(shard, "volume_create", volume="t2", thread="bob")["created"]
    assert not call(shard, "volume_create", volume="t1", thread="alice")["created"]
    fs = shard / "fs"
    assert sorted(os.listdir(fs)) == ["t1", "t2"]
    (fs / "t1" / "notes").mkdir()
    (fs / "t1" / "notes" / "a.md").write_text("alice\n")
    (fs / "t2" / "a.md").write_text("bob\n")
    assert tree(fs / "t1") == {"notes/": "dir", "notes/a.md": b"alice\n"}
    assert tree(fs / "t2") == {"a.md": b"bob\n"}
    # Each volume has its own step, snapshots and .vfsd/ views.
    call(shard, "set_step", volume="t1", step=5)
    assert call(shard, "get_step", volume="t1")["step"] == 5
    assert call(shard, "get_step", volume="t2")["step"] == 0
    assert (fs / "t1" / ".vfsd" / "status.json").read_text().count('"volume": "t1"') == 1
    snap = call(shard, "snapshot", volume="t2")["id"]
    (fs / "t2" / "a.md").write_text("changed\n")
    call(shard, "restore", volume="t2", snapshot=snap)
    assert (fs / "t2" / "a.md").read_text() == "bob\n"
    assert (fs / "t1" / "notes" / "a.md").read_text() == "alice\n"
    # A ref names the volume's own inode, read back through the volume.
    ref = call(shard, "ref", volume="t1", path="notes/a.md")
    assert ref["path"] == "notes/a.md" and ref["size"] == 6


def test_the_root_is_read_only_and_volumes_do_not_mix(shard):
    call(shard, "volume_create", volume="t1")
    call(shard, "volume_create", volume="t2")
    fs = shard / "fs"
    (fs / "t1" / "f").write_text("x")
    for attempt in (lambda: (fs / "new").mkdir(), lambda: (fs / "new").write_text("x"),
                    lambda: os.rename(fs / "t1", fs / "t3"), lambda: os.rmdir(fs / "t2"),
                    lambda: os.symlink("t1", fs / "l")):
        with pytest.raises(PermissionError):
            attempt()
    with pytest.raises(OSError) as exc:
        os.rename(fs / "t1" / "f", fs / "t2" / "f")
    assert exc.value.errno == errno.EXDEV
    with pytest.raises(OSError) as exc:
        os.link(fs / "t1" / "f", fs / "t2" / "f")
    assert exc.value.errno == errno.EXDEV
    # `mv` copies across volumes, as across filesystems.
    subprocess.run(["mv", str(fs / "t1" / "f"), str(fs / "t2" / "g")], check=True)
    assert tree(fs / "t1") == {} and tree(fs / "t2") == {"g": b"x"}
    # `..` of a volume's root is the shard's root.
    out = subprocess.run(["ls", "-ai", str(fs / "t1")], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    dotdot = next(line for line in out if line.endswith(" .."))
    assert int(dotdot.split()[0]) == os.stat(fs).st_ino


def test_requests_name_their_volume_and_thread(shard):
    call(shard, "volume_create", volume="t1", thread="alice")
    assert error(shard, "get_step")["code"] == "bad_request"
    assert error(shard, "get_step", volume="t9")["code"] == "no_such_volume"
    assert error(shard, "get_step", volume="../t1")["code"] == "bad_request"
    assert error(shard, "get_step", volume="t1", thread="mallory")["code"] == "wrong_thread"
    assert error(shard, "volume_create", volume="t1", thread="mallory")["code"] == \
        "wrong_thread"
    assert call(shard, "get_step", volume="t1", thread="alice") == {"step": 0}
    names = {v["volume"]: v["thread"] for v in call(shard, "volumes")["volumes"]}
    assert names == {"t1": "alice"}


def test_batch_answers_each_request_in_one_round_trip(shard):
    call(shard, "volume_create", volume="t1")
    (shard / "fs" / "t1" / "a").write_text("a")
    res = call(shard, "batch", volume="t1", requests=[
        {"op": "set_step", "step": 3}, {"op": "snapshot", "reuse": True},
        {"op": "changes", "since": 0}, {"op": "no_such"}, {"op": "batch", "requests": []}])
    ok = [r["ok"] for r in res["results"]]
    assert ok == [True, True, True, False, False]
    assert res["results"][0]["result"]["step"] == 3
    assert [c["path"] for c in res["results"][2]["result"]["changed"]] == ["a"]


def test_drop_and_copy(shard):
    call(shard, "volume_create", volume="t1", thread="alice")
    fs = shard / "fs"
    (fs / "t1" / "a").write_text("v1")
    s1 = call(shard, "snapshot", volume="t1")["id"]
    (fs / "t1" / "a").write_text("v2")
    res = call(shard, "volume_copy", volume="t1", thread="alice", target="t2",
               target_thread="carol")
    assert res["volume"] == "t2"
    assert tree(fs / "t2") == {"a": b"v2"}
    call(shard, "restore", volume="t2", snapshot=s1)
    assert tree(fs / "t2") == {"a": b"v1"} and tree(fs / "t1") == {"a": b"v2"}
    assert {v["volume"]: v["thread"] for v in call(shard, "volumes")["volumes"]} == \
        {"t1": "alice", "t2": "carol"}
    # A program holding a file open keeps the volume from being dropped.
    with open(fs / "t1" / "a") as held:
        assert error(shard, "volume_drop", volume="t1")["code"] == "busy"
        assert held.read() == "v2"
    assert call(shard, "volume_drop", volume="t1", thread="alice")["dropped"]
    wait_for(lambda: not (fs / "t1").exists(), "t1 gone from the mount")
    assert sorted(os.listdir(fs)) == ["t2"]
    assert not call(shard, "volume_drop", volume="t1")["dropped"]
    assert tree(fs / "t2") == {"a": b"v1"}


def test_a_killed_shard_keeps_what_was_synced(shard):
    call(shard, "volume_create", volume="t1")
    call(shard, "volume_create", volume="t2")
    fs = shard / "fs"
    for name in ("t1", "t2"):
        with open(fs / name / "kept", "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
    pid = int((shard / ".vfsd" / "vfsd.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}/stat")
             or open(f"/proc/{pid}/stat").read().split()[2] == "Z", "the shard to die",
             timeout=20)
    time.sleep(0.1)
    vfsd_cli("mount", "--shard", shard)
    assert tree(fs / "t1") == {"kept": b"t1"} and tree(fs / "t2") == {"kept": b"t2"}
