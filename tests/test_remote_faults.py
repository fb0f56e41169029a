"""The remote tier when the object store fails: a private SeaweedFS per test,
killed, paused and restarted under real daemons.

- The store dies mid-run: writes go on locally, the upload backlog grows and is
  visible, `vfsd sync` gives up with a clear message, reads of chunks not in the
  local cache fail with EIO after the bounded wait (no hang), the lease lapses
  without the mount turning read-only; when the store is back the backlog
  drains, the lease is taken again and the snapshots are published.
- A worker SIGKILLed in the middle of its uploads (the store frozen so they are
  really in flight) never leaves a published manifest that names a missing
  chunk; a fresh worker resumes the last published snapshot and takes the run
  over once the dead worker's lease expires; the dead worker's store, mounted
  again, learns that the run moved on and stays read-only.

`VFSD_LONG=1` repeats the SIGKILL round at several moments of the upload.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time

import pytest
from conftest import VFSD, is_mounted, vfsd_cli
from pagecache import drop_page_cache
from remote_run import FAST, Bucket, snapshot, status, sync, tree, use_server, wait_for
from s3server import s3_private_server  # noqa: F401 - fixture

from vfsd.remote.manifest import decode, encode

pytestmark = pytest.mark.fuse
MiB = 1 << 20
LONG = os.environ.get("VFSD_LONG") == "1"


@pytest.fixture
def s3(s3_private_server, monkeypatch):  # noqa: F811
    use_server(s3_private_server, monkeypatch)
    return s3_private_server


def test_object_store_down_then_back(s3, run_factory):
    url = s3.unique_url("down")
    a = run_factory("a", "--remote", url, *FAST)
    first = os.urandom(2 * MiB)
    (a.root / "first.bin").write_bytes(first)
    s1 = snapshot(a)
    sync(a)
    run = status(a)["run"]
    a.umount()
    # B resumed from s1: its chunks are in the bucket only, fetched on first read.
    b = run_factory("b", "--remote", url, "--from", f"{run}@{s1}", *FAST,
                    "--remote-cache-bytes", str(4 * MiB))
    b.expect_errors = True
    s3.kill()

    with pytest.raises(OSError) as info:  # not cached, store gone: EIO after ~3 s
        (b.root / "first.bin").read_bytes()
    assert info.value.errno == errno.EIO
    assert status(b)["remote"]["fetcher"]["timeouts"] + \
        status(b)["remote"]["fetcher"]["errors"] >= 1

    later = {f"later{i}.bin": os.urandom(3 * MiB) for i in range(3)}
    for name, data in later.items():  # writes go on locally
        (b.root / name).write_bytes(data)
    s2 = snapshot(b)
    st = status(b)["remote"]
    assert st["backlog"]["chunks"] >= 9 and st["backlog"]["bytes"] >= 9 * MiB
    assert st["oldest_unpublished_change_age_s"] is not None
    assert not st["read_only"]
    # Unpublished chunks stay local, whatever the cache bound says.
    assert st["cache"]["bytes"] >= 9 * MiB and st["cache"]["over_limit"]
    proc = sync(b, timeout=2, check=False)
    assert proc.returncode == 1 and "not published after 2 s" in proc.stderr
    assert "still to upload" in proc.stderr
    # The lease lapses (TTL 5 s) without the mount turning read-only.
    wait_for(lambda: status(b)["remote"]["state"] == "lapsed", "the lease to lapse", 30)
    (b.root / "during-lapse.txt").write_text("still writable\n")
    s3.restart()
    res = json.loads(sync(b, timeout=120).stdout)
    assert res["published"] == s2
    st = status(b)["remote"]
    assert st["state"] == "held" and st["backlog"]["chunks"] == 0
    drop_page_cache(b.root / "first.bin")
    assert (b.root / "first.bin").read_bytes() == first
    expected = tree(b.root)
    b.umount()
    c = run_factory("c", "--remote", url, "--from", f"{run}@{s2}", *FAST)
    got = tree(c.root)
    assert got == {k: v for k, v in expected.items() if k != "during-lapse.txt"}
    assert Bucket(s3, url).missing_chunks() == {}


def _kill_mid_upload(s3, run_factory, name: str, freeze_after: float) -> None:
    url = s3.unique_url(name)
    bucket = Bucket(s3, url)
    a = run_factory(name, "--remote", url, *FAST)
    a.expect_errors = True
    (a.root / "base.txt").write_text("published\n")
    base = os.urandom(MiB + 11)
    (a.root / "base.bin").write_bytes(base)
    s1 = snapshot(a)
    sync(a)
    run = status(a)["run"]
    published = tree(a.root)
    for i in range(6):
        (a.root / f"new{i}.bin").write_bytes(os.urandom(3 * MiB))
    time.sleep(freeze_after)
    s3.pause()  # uploads and the publication of s2 are now stuck in flight
    try:
        s2 = snapshot(a)
        assert s2 == "s2"
        time.sleep(0.3)
        pid = int((a.state_dir / "vfsd.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), "the daemon to die", 10)
    finally:
        s3.resume()
    subprocess.run(["fusermount3", "-u", "-z", str(a.root)], capture_output=True)
    # Whatever landed, no manifest names a chunk the bucket lacks.
    assert bucket.missing_chunks() == {}
    latest = bucket.head(run)["latest"]
    assert latest == 1
    # A stale writer's orphan: a manifest s2 that its head never listed (as if A
    # had got that far). The next writer's s2 must replace it, not be refused.
    orphan = decode(bucket.get(f"runs/{run}/snapshots/1"), run=run, seq=1)
    orphan.seq, orphan.label = 2, "orphan"
    if (run, 2) not in bucket.manifests(run):
        bucket.put(f"runs/{run}/snapshots/2", encode(orphan))
    # A fresh worker resumes the last published snapshot; it takes the run once
    # the dead worker's lease (TTL 5 s) has expired.
    f = run_factory(f"{name}-fresh", "--remote", url, "--from", f"{run}@{s1}", *FAST,
                    "--remote-lease-wait", "20")
    assert tree(f.root) == published
    assert status(f)["remote"]["state"] == "held"
    (f.root / "after.txt").write_text("the run goes on here\n")
    sf = snapshot(f)
    assert int(sf[1:]) > latest
    sync(f)
    assert bucket.missing_chunks() == {}
    mine = decode(bucket.get(f"runs/{run}/snapshots/{sf[1:]}"), run=run, seq=int(sf[1:]))
    assert mine.label != "orphan" and mine.generation == bucket.head(run)["generation"] == 2
    # The dead worker's store, mounted again: read-only while F holds the run...
    a.mount()
    st = status(a)["remote"]
    assert st["read_only"] and "held by another worker" in st["reason"], st
    a.umount()
    f.umount()
    # ...and once F is gone too, it sees from the head that the run moved on.
    a.mount()
    st = status(a)["remote"]
    assert st["read_only"] and "moved on elsewhere" in st["reason"], st
    with pytest.raises(OSError) as info:
        (a.root / "x").write_text("no")
    assert info.value.errno == errno.EROFS
    assert is_mounted(a.root)


def test_sigkill_mid_upload_never_publishes_a_missing_chunk(s3, run_factory):
    _kill_mid_upload(s3, run_factory, "kill", freeze_after=0.0)


@pytest.mark.skipif(not LONG, reason="longer fault rounds: VFSD_LONG=1")
@pytest.mark.parametrize("freeze_after", [0.05, 0.2, 0.5, 1.0])
def test_sigkill_mid_upload_at_several_moments(s3, run_factory, freeze_after):
    _kill_mid_upload(s3, run_factory, f"kill{int(freeze_after * 100)}", freeze_after)


def test_a_leftover_manifest_of_its_own_generation_is_replaced(s3, run_factory):
    """A manifest s2 an earlier attempt of this very lease wrote (its head CAS
    then failed) may differ from the retry's (a pin changed meanwhile): it is
    this worker's own orphan, replaced, not another worker's publication
    (which would turn the mount read-only)."""
    url = s3.unique_url("ownorphan")
    bucket = Bucket(s3, url)
    a = run_factory("a", "--remote", url, *FAST)
    (a.root / "one.txt").write_text("one\n")
    snapshot(a)
    sync(a)
    run = status(a)["run"]
    generation = bucket.head(run)["generation"]
    orphan = decode(bucket.get(f"runs/{run}/snapshots/1"), run=run, seq=1)
    orphan.seq, orphan.label = 2, "earlier attempt"
    assert orphan.generation == generation
    bucket.put(f"runs/{run}/snapshots/2", encode(orphan))
    (a.root / "two.txt").write_text("two\n")
    s2 = snapshot(a)
    assert s2 == "s2"
    assert json.loads(sync(a).stdout)["published"] == s2
    mine = decode(bucket.get(f"runs/{run}/snapshots/2"), run=run, seq=2)
    assert mine.label != "earlier attempt" and status(a)["remote"]["state"] == "held"
    assert bucket.head(run)["latest"] == 2


def test_restart_after_a_crash_takes_its_own_lease_back(s3, run_factory):
    """A daemon SIGKILLed with its lease held, mounted again on the same store,
    takes its own lease back at once (its owner token is in the store) and
    publishes what it left unpublished."""
    url = s3.unique_url("own")
    a = run_factory("a", "--remote", url, *FAST, "--remote-lease-ttl", "600")
    a.expect_errors = True
    (a.root / "f.bin").write_bytes(os.urandom(2 * MiB))
    snapshot(a)
    sync(a)
    (a.root / "g.bin").write_bytes(os.urandom(2 * MiB))
    pid = int((a.state_dir / "vfsd.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), "the daemon to die", 10)
    subprocess.run(["fusermount3", "-u", "-z", str(a.root)], capture_output=True)
    proc = subprocess.run([*VFSD, "mount", str(a.run_dir), *a.extra_args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert status(a)["remote"]["state"] == "held"  # no 600 s wait for its own lease
    s2 = snapshot(a)
    assert json.loads(sync(a).stdout)["published"] == s2
    assert Bucket(s3, url).missing_chunks() == {}
    assert vfsd_cli("status", a.run_dir).returncode == 0
