"""Snapshots on a real mount: the CLI, the read-only view, restore as the shell
sees it, forks, diffs, retention, bad input, and crashes in the middle.

Every check goes through real tools (`cat`, `ls`, `diff`, `grep -r`) on the
mount, so the kernel's caches are part of what is tested.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MountedRun, is_mounted, tree, vfsd_cli
from ctl import connect

pytestmark = pytest.mark.fuse


def sh(cmd: str, cwd: Path) -> str:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True,
                          check=True, timeout=60).stdout


def snap(run: MountedRun, *args: str) -> str:
    return vfsd_cli("snapshot", run.run_dir, *args).stdout.strip()


def test_snapshot_view_restore_as_the_shell_sees_it(run) -> None:
    root = run.root
    (root / "notes").mkdir()
    (root / "notes" / "plan.md").write_text("v1\n")
    (root / "big.bin").write_bytes(os.urandom(3 << 20))
    os.symlink("notes/plan.md", root / "plan")
    s1 = snap(run)
    assert s1 == "s1"
    before = tree(root)
    # Warm the kernel's caches with the old state, then change everything.
    assert sh("cat notes/plan.md; ls", root) == "v1\nbig.bin\nnotes\nplan\n"
    (root / "notes" / "plan.md").write_text("v2 is longer\n")
    with open(root / "big.bin", "r+b") as f:
        f.seek(1 << 20)
        f.write(b"X" * 100)
    (root / "late.txt").write_text("created after s1\n")
    os.unlink(root / "plan")
    (root / "notes" / "sub").mkdir()

    view = root / ".vfsd" / "snapshots"
    assert os.listdir(view) == ["s1"]
    assert tree(view / "s1") == before
    assert sh("diff .vfsd/snapshots/s1/notes/plan.md notes/plan.md || true", root).startswith(
        "1c1")
    assert sh("grep -rl --include='*.md' v1 .vfsd/snapshots/s1/", root).strip() == \
        ".vfsd/snapshots/s1/notes/plan.md"
    with pytest.raises(OSError):
        open(view / "s1" / "notes" / "plan.md", "w")

    changes = json.loads(vfsd_cli("diff", run.run_dir, "s1", "--json").stdout)["changes"]
    kinds = {c["path"]: c["change"] for c in changes}
    assert kinds["notes/plan.md"] == "modified" and kinds["big.bin"] == "modified"
    assert kinds["late.txt"] == "added" and kinds["plan"] == "removed"
    assert kinds["notes/sub"] == "added"

    out = vfsd_cli("restore", run.run_dir, "s1").stdout
    assert "restored s1" in out
    # Exactly the old tree, through the same (warm) kernel caches.
    assert tree(root) == before
    assert sh("cat notes/plan.md; cat plan; ls", root) == "v1\nv1\nbig.bin\nnotes\nplan\n"
    st = json.loads(vfsd_cli("snapshots", run.run_dir, "--json").stdout)
    assert st["base"] == "s1" and st["changed"] is False
    run.remount()
    assert tree(root) == before


def test_open_file_across_restore(run) -> None:
    """A file held open across a restore reads the restored bytes; the kernel
    keeps the size it had (writeback cache) until the file is closed, and the
    restore reply names such files. A fresh open sees exactly the snapshot.
    (This process holds it open for writing: only --force restores over it.)"""
    root = run.root
    (root / "f").write_text("old\n")
    snap(run)
    with open(root / "f", "r+") as f:
        f.write("new content\n")
        f.flush()
        res = json.loads(vfsd_cli("restore", run.run_dir, "s1", "--force", "--json").stdout)
        assert res["open_files"] == ["f"]
        f.seek(0)
        assert f.read(4) == "old\n"
    assert (root / "f").read_text() == "old\n"
    assert os.stat(root / "f").st_size == 4


def test_evicted_file_returns_and_step_goes_back(run) -> None:
    root = run.root
    (root / "done.txt").write_text("soon evicted\n")
    os.setxattr(root / "done.txt", "user.vfsd.status", b"done")
    vfsd_cli("step", run.run_dir, "2")
    s = snap(run)
    report = json.loads(vfsd_cli("step", run.run_dir, "6", "--json").stdout)
    assert [r["path"] for r in report["evicted"]] == ["done.txt"]
    assert not (root / "done.txt").exists()
    vfsd_cli("restore", run.run_dir, s)
    assert (root / "done.txt").read_text() == "soon evicted\n"
    with connect(run.run_dir) as c:
        assert c.call("get_step")["step"] == 2


def test_fork_diverges_and_shares_content(run, run_factory) -> None:
    root = run.root
    payload = os.urandom(2 << 20)
    (root / "data.bin").write_bytes(payload)
    (root / "a.txt").write_text("base\n")
    s = snap(run)
    chunks_before = run.status()["chunk_count"]
    other = run_factory("forked", mount=False)
    out = vfsd_cli("fork", run.run_dir, s, other.run_dir).stdout
    assert "starts from s1" in out
    try:
        assert is_mounted(other.root)
        assert (other.root / "data.bin").read_bytes() == payload
        assert other.status()["chunk_count"] == chunks_before  # no content copied
        (other.root / "a.txt").write_text("fork\n")
        (root / "a.txt").write_text("original\n")
        (other.root / "only-in-fork").write_text("x")
        assert (root / "a.txt").read_text() == "original\n"
        assert (other.root / "a.txt").read_text() == "fork\n"
        assert not (root / "only-in-fork").exists()
        # The fork's inode numbers are the snapshot's: refs stay valid there.
        assert os.stat(other.root / "data.bin").st_ino == os.stat(root / "data.bin").st_ino
    finally:
        other.umount()
    # Remounted alone (its store is the original's), it still has its files.
    other.mount()
    assert (other.root / "a.txt").read_text() == "fork\n"


@pytest.mark.parametrize("bad", ["s0", "x1", "s1 ", "s99999999999999999999", "", "../s1",
                                 "s" + "1" * 40])
def test_bad_snapshot_ids_get_clear_errors(run, bad: str) -> None:
    snap(run)
    proc = vfsd_cli("restore", run.run_dir, bad, check=False)
    assert proc.returncode == 1
    assert "snapshot" in proc.stderr and "Traceback" not in proc.stderr


def test_big_directories_list_right_in_every_snapshot(run) -> None:
    """Listings of snapshot directories are kept between readdir calls (a
    big directory takes many): interleaved across more snapshots than are
    kept, each must list exactly its own entries."""
    big = run.root / "big"
    big.mkdir()
    expected = {}
    names: set[str] = set()
    for round_ in range(6):
        for i in range(500):
            name = f"r{round_}-{i:04d}"
            (big / name).write_bytes(b"")
            names.add(name)
        if round_:
            gone = sorted(names)[::7]
            for name in gone:
                (big / name).unlink()
            names -= set(gone)
        expected[snap(run)] = set(names)
    view = run.root / ".vfsd" / "snapshots"
    for _ in range(2):
        for ident, want in expected.items():
            with os.scandir(view / ident / "big") as it:
                assert {e.name for e in it} == want, ident
    first = next(iter(expected))
    vfsd_cli("snapshot-delete", run.run_dir, first)
    assert not (view / first / "big").exists()


def test_deleted_snapshot_says_why(run) -> None:
    (run.root / "f").write_text("1")
    s = snap(run)
    vfsd_cli("snapshot-delete", run.run_dir, s)
    proc = vfsd_cli("restore", run.run_dir, s, check=False)
    assert proc.returncode == 1 and "was deleted at step 0" in proc.stderr
    assert not (run.root / ".vfsd" / "snapshots" / s).exists()


def test_fork_refuses_bad_targets(run, tmp_path: Path) -> None:
    s = snap(run)
    for target, why in ((run.root / "inside", "inside"), (run.run_dir, "inside"),
                        ("relative/dir", "absolute")):
        with connect(run.run_dir) as c:
            err = c.error("fork", snapshot=s, run_dir=str(target))
        assert why in err["message"], err


def test_fork_over_an_existing_run_dir_is_refused_and_hides_nothing(run, run_factory,
                                                                     tmp_path: Path) -> None:
    # Issue 20, item 2: B had its own store (the default, no store.json) and an
    # unmounted, empty fs/; the fork wrote B/.vfsd/store.json and from then on
    # `vfsd mount B` showed the fork, never B's own files.
    (run.root / "a.txt").write_text("from A\n")
    s = snap(run)
    b = run_factory("b")
    (b.root / "mine.txt").write_text("B's own\n")
    b.umount()
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "notes").write_text("not a run dir\n")
    for target in (b.run_dir, odd):
        proc = vfsd_cli("fork", run.run_dir, s, target, check=False)
        assert proc.returncode != 0 and "not empty" in proc.stderr, proc.stderr
    assert not (b.state_dir / "store.json").exists()
    assert sorted(os.listdir(odd)) == ["notes"]
    b.mount()
    assert sorted(os.listdir(b.root)) == ["mine.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    vfsd_cli("fork", run.run_dir, s, empty, "--no-mount")  # an empty directory will do


WRITER = """
import mmap, sys
f = open(sys.argv[1], "r+b")
f.seek(0)
f.write(b"changed by the writer")
f.flush()
if sys.argv[2] == "mmap":
    m = mmap.mmap(f.fileno(), 0)
    f.close()  # no descriptor left: only the shared writable mapping
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["fd", "mmap"])
def test_restore_refuses_files_open_for_writing_and_names_the_processes(run, how) -> None:
    # Issue 20: a restore while a process kept writing a database in the mount
    # corrupted it in every round; restore only listed the open files after.
    (run.root / "app.db").write_bytes(b"as in the snapshot".ljust(8192, b"."))
    (run.root / "log.txt").write_text("kept open, never changed\n")
    s = snap(run)
    reader = open(run.root / "log.txt", "a")  # open for writing, unchanged since s
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run.root / "app.db"), how],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
        proc = vfsd_cli("restore", run.run_dir, s, check=False)
        assert proc.returncode != 0, proc.stdout
        assert "app.db" in proc.stderr and f"pid {writer.pid} python" in proc.stderr, proc.stderr
        assert "log.txt" not in proc.stderr
        assert (run.root / "app.db").read_bytes().startswith(b"changed by the writer")
        with connect(run.run_dir) as c:
            assert c.error("restore", snapshot=s)["code"] == "files_open"
        vfsd_cli("restore", run.run_dir, s, "--force")
        assert (run.root / "app.db").read_bytes().startswith(b"as in the snapshot")
    finally:
        writer.communicate("")
        reader.close()
    vfsd_cli("restore", run.run_dir, s)  # nobody writes now: no refusal


def test_retention_keeps_last_n_and_pinned(run_factory) -> None:
    r = run_factory("ret", "--snapshot-keep-last", "2", "--snapshot-keep-steps", "0")
    (r.root / "f").write_text("0")
    pinned = snap(r, "--pin")
    ids = [pinned]
    for i in range(1, 5):
        (r.root / "f").write_text(str(i))
        ids.append(snap(r))
    kept = [s["id"] for s in json.loads(vfsd_cli("snapshots", r.run_dir, "--json").stdout)
            ["snapshots"]]
    assert kept == [pinned, ids[-2], ids[-1]]
    assert (r.root / ".vfsd" / "snapshots" / pinned / "f").read_text() == "0"
    vfsd_cli("restore", r.run_dir, pinned)
    assert (r.root / "f").read_text() == "0"


def _kill_daemon_during(run: MountedRun, op: str, args: dict) -> None:
    """Start `op` and SIGKILL the daemon as soon as the request is sent."""
    pid = int((run.state_dir / "vfsd.pid").read_text())
    with connect(run.run_dir) as c:
        c.send_raw(json.dumps({"op": op, **args}).encode() + b"\n")
        os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    subprocess.run(["fusermount3", "-u", "-z", str(run.root)], capture_output=True)


@pytest.mark.parametrize("op", ["snapshot", "restore"])
def test_crash_during_snapshot_or_restore_leaves_one_consistent_state(run, op: str) -> None:
    root = run.root
    for i in range(300):
        (root / f"f{i:03d}").write_text(f"old {i}\n")
    s1 = snap(run)
    old = tree(root)
    for i in range(0, 300, 2):
        (root / f"f{i:03d}").write_text(f"new {i}\n")
    for i in range(300, 400):
        (root / f"f{i:03d}").write_text(f"late {i}\n")
    new = tree(root)
    os.sync()
    run.expect_errors = True
    _kill_daemon_during(run, op, {"snapshot": s1} if op == "restore" else {})
    run.mount()
    got = tree(root)
    assert got in (old, new), "a mix of two states"
    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--json", check=False)
    assert json.loads(proc.stdout)["clean"], proc.stdout
    run.mount()
    # Whatever happened, the retained snapshot is still exact.
    assert tree(root / ".vfsd" / "snapshots" / s1) == old


def test_long_label_is_refused_on_the_first_snapshot_too(run) -> None:
    """A large tree's first snapshot is built in steps, by another path than
    later ones; a label over 200 characters is refused on both."""
    (run.root / "many").mkdir()
    subprocess.run("seq 5100 | xargs touch", shell=True, cwd=run.root / "many", check=True)
    with connect(run.run_dir) as c:
        err = c.error("snapshot", label="x" * 201)
        assert err["code"] == "bad_request" and "200" in err["message"]
        first = c.call("snapshot", label="y" * 200)
        assert first.get("in_steps") and first["label"] == "y" * 200
        err = c.error("snapshot", label="x" * 201)
        assert err["code"] == "bad_request" and "200" in err["message"]


@pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1", reason="VFSD_LONG=1: 20,000 files")
def test_a_diff_of_many_changes_holds_no_other_request(run):
    """Issue 20's probe (bench/stall_bench.py: a diff of 100,000 changes held every
    other request of the mount 10.5 s): the diff reads in a worker thread, so
    requests keep being answered while it runs. Counted, not timed: the mount
    answers many statfs calls during one diff, where before it answered none
    between the diff's start and its end."""
    s1 = run.cli("snapshot", run.run_dir).stdout.split()[-1]
    subprocess.run("for d in $(seq 40); do mkdir d$d; for f in $(seq 500); do "
                   ": > d$d/f$f; done; done", shell=True, cwd=run.root, check=True, timeout=900)
    import threading

    answered, done = [0, 0], threading.Event()

    def probe() -> None:
        while not done.is_set():
            os.statvfs(run.root)
            answered[0] += 1

    worker = threading.Thread(target=probe)
    worker.start()
    try:
        with connect(run.run_dir) as c:
            before = answered[0]
            reply = c.call("diff", a=s1)
            answered[1] = answered[0] - before
    finally:
        done.set()
        worker.join()
    assert len(reply["changes"]) >= 20_000
    assert answered[1] >= 50, answered
