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


def test_one_volume_s_long_restore_does_not_hold_the_others(shard):
    """A restore of many changes runs in short transactions: another volume's
    creates go on meanwhile (in one transaction they waited seconds)."""
    import threading

    call(shard, "volume_create", volume="big")
    call(shard, "volume_create", volume="small")
    fs = shard / "fs"
    n = 12_000
    subprocess.run(["python3", "-c", (
        "import os,sys\n"
        "d=sys.argv[1]\n"
        "for i in range(int(sys.argv[2])):\n"
        "    os.makedirs(f'{d}/{i // 500}', exist_ok=True)\n"
        "    open(f'{d}/{i // 500}/f{i}', 'w').write(str(i))\n"), str(fs / "big"), str(n)],
        check=True)
    snap = call(shard, "snapshot", volume="big")["id"]
    subprocess.run(["rm", "-rf", *[str(p) for p in (fs / "big").iterdir()]], check=True)
    done = threading.Event()
    result = {}

    def restore():
        with connect(shard, timeout=300) as c:
            result["res"] = c.call("restore", volume="big", snapshot=snap)
        done.set()

    worker = threading.Thread(target=restore)
    worker.start()
    made_during = 0
    i = 0
    while not done.is_set():
        (fs / "small" / f"f{i}").write_text("x")
        i += 1
        if not done.is_set():
            made_during += 1
    worker.join()
    assert result["res"]["changed"] >= n
    # Many short transactions (each at most Snapshots.STEP_BUDGET_S of work),
    # with the other volume's creates answered between them.
    assert result["res"]["steps"] >= 20, result["res"]
    assert made_during >= 10, f"only {made_during} creates while the restore ran"
    assert len(list((fs / "big").rglob("f*"))) == n
    assert (fs / "big" / "3" / "f1600").read_text() == "1600"
    assert len(list((fs / "small").iterdir())) == i


def _put_file(store, name: str, data: bytes) -> None:
    import stat as st_mod

    from vfsd.fuse.openfiles import OpenFiles

    inode = store.create(1, name.encode(), st_mod.S_IFREG | 0o644, 0, 0)
    files = OpenFiles(store, chunk_size=store.chunk_size, inline_max=4096)
    of = files.acquire(inode.ino)
    files.write(of, 0, data)
    files.release(of)


@pytest.mark.parametrize("cut", [0, 1, 3, 7, None])
def test_a_volume_dropped_in_steps_goes_whole_even_across_a_crash(tmp_path, cut):
    from vfsd.fsck import fsck
    from vfsd.snapshots.snapshots import Snapshots, drop_volume_in_steps, finish_drops_in_steps
    from vfsd.store.store import Store

    base = Store.base(tmp_path / "store", chunk_size=64 * 1024)
    try:
        with base.txn(write=True) as txn:
            base.create_volume(txn, "keep")
            base.create_volume(txn, "gone")
        shared = os.urandom(200_000)  # chunked content both volumes hold
        for name in ("keep", "gone"):
            view = base.view(name)
            _put_file(view, "shared", shared)
            for i in range(30):
                _put_file(view, f"f{i}", os.urandom(300 + i))
            snaps = Snapshots(view, keep_last=5, keep_steps=0)
            snaps.create()
            _put_file(view, "later", b"x" * 5000)
            snaps.create()
        base.DROP_STEP_S = 0.0  # one record per transaction: many places to stop
        steps = drop_volume_in_steps(base, "gone")
        n = 0
        for _ in steps:
            n += 1
            if cut is not None and n >= cut:
                steps.close()
                break
        assert "gone" not in base.volumes()  # the name goes first: nothing can open it
        if cut is not None:
            assert base.pending_drops()
            for _ in finish_drops_in_steps(base):
                pass
        assert base.pending_drops() == []
        keep = base.view("keep")
        report = fsck(keep, verify=True)
        assert report.clean, report.problems
        assert keep.counters()["files"] == 32
    finally:
        base.close()


def test_an_eviction_pass_over_thousands_of_files_does_not_hold_the_others(shard):
    import threading

    call(shard, "volume_create", volume="big")
    call(shard, "volume_create", volume="small")
    fs = shard / "fs"
    n = 6000
    subprocess.run(["python3", "-c", (
        "import os,sys\n"
        "d=sys.argv[1]\n"
        "for i in range(int(sys.argv[2])):\n"
        "    os.makedirs(f'{d}/{i // 500}', exist_ok=True)\n"
        "    open(f'{d}/{i // 500}/f{i}', 'w').write(str(i))\n"), str(fs / "big"), str(n)],
        check=True)
    done = threading.Event()
    result = {}

    def advance():
        with connect(shard, timeout=300) as c:
            result["res"] = c.call("set_step", volume="big", step=1000)  # past max_age_steps
        done.set()

    worker = threading.Thread(target=advance)
    worker.start()
    made_during = i = 0
    while not done.is_set():
        (fs / "small" / f"f{i}").write_text("x")
        i += 1
        if not done.is_set():
            made_during += 1
    worker.join()
    res = result["res"]
    assert res["files"] == n and res["steps"] >= 10, {k: res[k] for k in ("files", "steps")}
    # The reply (encoded off the loop, it is that big) names every file.
    assert sorted(r["path"] for r in res["evicted"]) == sorted(
        f"{i // 500}/f{i}" for i in range(n))
    assert made_during >= 10, f"only {made_during} creates while the pass ran"
    assert list((fs / "big").rglob("f*")) == []
    assert len(list((fs / "small").iterdir())) == i


def test_a_snapshot_takes_what_open_files_of_its_volume_wrote(shard):
    """A shard writes back only the snapshotted volume's open files (no syncfs
    of the whole mount): bytes a process wrote into the page cache, through a
    descriptor or a shared mapping, and has not closed are in the snapshot."""
    import mmap

    call(shard, "volume_create", volume="t1")
    call(shard, "volume_create", volume="t2")
    fs = shard / "fs"
    (fs / "t1" / "mapped").write_bytes(b"\0" * 8192)
    (fs / "t2" / "other").write_text("t2")
    f = open(fs / "t1" / "written", "wb")
    g = open(fs / "t1" / "mapped", "r+b")
    mapping = mmap.mmap(g.fileno(), 0)
    try:
        f.write(b"kept in the page cache " * 1000)
        f.flush()  # to the kernel, which writes it back when it likes
        mapping[:6] = b"mapped"
        snap = call(shard, "snapshot", volume="t1")["id"]
        view = fs / "t1" / ".vfsd" / "snapshots" / snap
        assert (view / "written").read_bytes() == b"kept in the page cache " * 1000
        assert (view / "mapped").read_bytes()[:6] == b"mapped"
        # A restore that would change a file a process writes is refused,
        # naming it (found among this volume's files only).
        f.write(b"more")
        f.flush()
        err = error(shard, "restore", volume="t1", snapshot=snap)
        assert err["code"] == "files_open" and "written" in err["message"]
        assert call(shard, "snapshot", volume="t2")["id"]
    finally:
        mapping.close()
        g.close()
        f.close()


def test_an_unevict_of_many_files_is_checked_whole_then_made_in_steps(shard):
    call(shard, "volume_create", volume="t1")
    fs = shard / "fs"
    n = 300
    (fs / "t1" / "d").mkdir()
    for i in range(n):
        (fs / "t1" / "d" / f"f{i}").write_text(f"v{i}")
    call(shard, "snapshot", volume="t1")
    assert call(shard, "set_step", volume="t1", step=1000)["files"] == n
    assert list((fs / "t1" / "d").iterdir()) == []
    # A file where a directory on the way was: nothing is brought back.
    (fs / "t1" / "d").rmdir()
    (fs / "t1" / "d").write_text("in the way")
    err = error(shard, "unevict", volume="t1", paths=[f"d/f{i}" for i in range(n)])
    assert err["code"] == "exists" and "not a directory" in err["message"]
    assert (fs / "t1" / "d").read_text() == "in the way"
    (fs / "t1" / "d").unlink()
    # Another thread writes meanwhile: its requests run between the steps
    # (and commit the open group under them).
    import threading

    call(shard, "volume_create", volume="t2")
    stop = threading.Event()

    def other() -> None:
        k = 0
        while not stop.is_set():
            k += 1
            (fs / "t2" / f"w{k % 50}").write_text("x" * k)

    writer = threading.Thread(target=other)
    writer.start()
    try:
        res = call(shard, "unevict", volume="t1", paths=[f"d/f{i}" for i in range(n)])
    finally:
        stop.set()
        writer.join()
    assert len(res["restored"]) == n and res["lost"] == []
    assert sorted(p.name for p in (fs / "t1" / "d").iterdir()) == sorted(f"f{i}" for i in range(n))
    assert (fs / "t1" / "d" / "f123").read_text() == "v123"


def test_a_volume_s_timeline_record_follows_its_own_writes_only(tmp_path):
    """Each served volume writes its timeline record while its own files
    change; the other volumes' writes (and their records) do not count, or an
    idle shard never stops writing (every record made the others due)."""
    from vfsd.fuse.journal import StepJournal
    from vfsd.store.store import Store

    base = Store.base(tmp_path / "store", chunk_size=1 << 20)
    try:
        with base.txn(write=True) as txn:
            base.create_volume(txn, "a")
            base.create_volume(txn, "b")
        a, b = base.view("a"), base.view("b")
        ja, jb = StepJournal(a), StepJournal(b)
        ja.flush()
        jb.flush()
        last = base.env.info()["last_txnid"]
        for _ in range(3):  # what a shard's journal task does, volume after volume
            ja.flush_if_changed()
            jb.flush_if_changed()
        assert base.env.info()["last_txnid"] == last
        _put_file(b, "f", b"x")
        last = base.env.info()["last_txnid"]
        ja.flush_if_changed()
        assert base.env.info()["last_txnid"] == last  # b's writes are not a's
        jb.flush_if_changed()
        assert base.env.info()["last_txnid"] == last + 1  # b's record
    finally:
        base.close()


@pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1", reason="VFSD_LONG=1: 30 s idle")
def test_an_idle_shard_writes_nothing(shard):
    """The same on a mounted shard of three served volumes."""
    from vfsd.fuse.journal import FLUSH_INTERVAL

    for name in ("t1", "t2", "t3"):
        call(shard, "volume_create", volume=name)
        (shard / "fs" / name / "f").write_text(name)

    def txns() -> int:
        return call(shard, "stats", volume="t1")["counters"]["lmdb_write_txns"]

    time.sleep(FLUSH_INTERVAL + 1)  # the records of the writes above
    before = txns()
    time.sleep(2 * FLUSH_INTERVAL + 1)
    assert txns() == before


def test_a_shard_refuses_a_metrics_port_it_would_not_serve(tmp_path):
    """--metrics-port on a shard was taken and ignored: no endpoint, no word."""
    run = tmp_path / "s"
    proc = vfsd_cli("mount", "--shard", run, "--metrics-port", "9100", check=False)
    assert proc.returncode == 2 and "no metrics endpoint" in proc.stderr, proc.stderr
    assert not is_mounted(run / "fs")


def test_a_volume_being_dropped_is_served_to_no_one(shard):
    """Listing the shard's root while volumes are dropped: a listing between
    letting a volume go and deleting its name served it again, over records
    being deleted (it stayed in the listing, served, after the drop)."""
    import threading

    fs = shard / "fs"
    stop = threading.Event()

    def look():
        while not stop.is_set():
            try:
                for name in os.listdir(fs):
                    os.stat(fs / name)
            except OSError:
                pass

    lookers = [threading.Thread(target=look) for _ in range(3)]
    for t in lookers:
        t.start()
    try:
        for i in range(30):
            name = f"t{i}"
            call(shard, "volume_create", volume=name)
            (fs / name / "f").write_text(name)
            assert call(shard, "volume_drop", volume=name)["dropped"]
            assert name not in {v["volume"] for v in call(shard, "volumes")["volumes"]}
    finally:
        stop.set()
        for t in lookers:
            t.join()
    wait_for(lambda: os.listdir(fs) == [], "every dropped volume gone from the mount")
    # Dropping a name again, or creating it anew, works on a clean slate.
    call(shard, "volume_create", volume="t0")
    assert os.listdir(fs / "t0") == [] or sorted(os.listdir(fs / "t0")) == [".vfsd"]
