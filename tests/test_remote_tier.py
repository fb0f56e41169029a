"""The remote tier end to end: real daemons with separate stores (two machines),
a real SeaweedFS, real mounts, real tools.

Write on A, snapshot, sync, resume on B with `--from` (bytes equal, fetched
lazily: the fetch counters say so), go on writing on B and publish a delta, a
third worker resumes that; two workers racing for one run's lease; the local
chunk cache bounded in bytes and refilled; fsck of remote-only chunks; bad
`--from` input and damaged objects in the bucket (clear errors, nothing
half-imported, EIO and never wrong bytes); bucket GC, including the race with
a worker that reuses a chunk GC is about to delete.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import VFSD, is_mounted, vfsd_cli
from pagecache import drop_page_cache
from remote_run import (
    FAST,
    Bucket,
    log_errors,
    snapshot,
    status,
    sync,
    tree,
    use_server,
    wait_for,
)
from s3server import s3_server  # noqa: F401 - fixture
from vfsdattr import attr_doc

import mount_tool
from vfsd.remote.bucketgc import sweep
from vfsd.remote.layout import chunk_key
from vfsd.remote.manifest import decode
from vfsd.remote.objstore import ObjectStore, RemoteSettings
from vfsd.store.chunks import chunk_hash

pytestmark = pytest.mark.fuse
MiB = 1 << 20


@pytest.fixture
def s3(s3_server, monkeypatch):  # noqa: F811
    use_server(s3_server, monkeypatch)
    return s3_server


def objstore(server, url: str) -> ObjectStore:
    return ObjectStore(url, RemoteSettings(
        endpoint_url=server.endpoint_url, region="us-east-1", access_key_id=server.access_key,
        secret_access_key=server.secret_key))


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


# ------------------------------------------------------------ resume elsewhere


def test_write_sync_resume_elsewhere_and_go_on(s3, run_factory):
    url = s3.unique_url("resume")
    bucket = Bucket(s3, url)
    a = run_factory("a", "--remote", url, *FAST)
    files = {"notes/plan.md": b"# plan\n- fetch logs\n", "big.bin": os.urandom(3 * MiB + 5),
             "data/x.json": os.urandom(100_000), "empty": b""}
    # Files nobody changes later: B's delta stays small next to the full manifest.
    files.update({f"logs/{i:02d}.log": f"log {i}\n".encode() * 50 for i in range(30)})
    write_tree(a.root, files)
    os.symlink("notes/plan.md", a.root / "plan")
    os.setxattr(a.root / "notes/plan.md", "user.color", b"blue")
    s1 = snapshot(a)
    synced = json.loads(sync(a).stdout)
    st = status(a)
    run = st["run"]
    assert synced == {**synced, "published": s1, "run": run}
    assert st["remote"]["state"] == "held" and st["remote"]["backlog"]["chunks"] == 0
    assert bucket.head(run)["latest"] == 1
    before = tree(a.root)
    a.umount()  # a clean stop gives the lease back: B need not wait

    b = run_factory("b", "--remote", url, "--from", f"{run}@{s1}", *FAST)
    st = status(b)
    assert st["run"] == run and st["remote"]["state"] == "held"
    assert st["remote"]["fetcher"]["downloads"] == 0  # nothing fetched at mount
    assert sorted(os.listdir(b.root)) == ["big.bin", "data", "empty", "logs", "notes", "plan"]
    assert (b.root / "notes/plan.md").read_bytes() == files["notes/plan.md"]  # in the manifest
    assert status(b)["remote"]["fetcher"]["downloads"] == 0
    assert (b.root / "big.bin").read_bytes() == files["big.bin"]
    fetched = status(b)["remote"]["fetcher"]
    # Three 1 MiB chunks from the bucket; the 5-byte tail block travelled in the manifest.
    assert fetched["downloads"] == 3 and fetched["downloaded_bytes"] == 3 * MiB
    assert tree(b.root) == before
    assert attr_doc(b.root / "notes/plan.md")["xattrs"] == {"user.color": "blue"}

    # Changing a remote-only chunk in place fetches it first (write, truncate).
    big = bytearray(files["big.bin"])
    drop_page_cache(b.root / "big.bin")
    with open(b.root / "big.bin", "r+b") as f:
        f.seek(MiB + 100)
        f.write(b"patched in the middle")
        big[MiB + 100:MiB + 121] = b"patched in the middle"
        f.truncate(2 * MiB + 4096)
        del big[2 * MiB + 4096:]
    drop_page_cache(b.root / "big.bin")
    assert (b.root / "big.bin").read_bytes() == bytes(big)
    # B goes on with the run; its next snapshot is a delta on s1.
    (b.root / "notes/plan.md").write_bytes(b"# plan v2\n")
    (b.root / "data/x.json").unlink()
    (b.root / "new.txt").write_bytes(b"written on B\n" * 10_000)
    with mount_tool.Mount.attach(b.run_dir) as m:
        s2 = snapshot(b)
        assert m.sync(timeout=60)["published"] == s2
        published = {s["id"]: s for s in m.publish_status()["snapshots"]}
    assert published[s2]["published"] and published[s2]["full"] is False
    assert int(s2[1:]) > 1
    head = bucket.head(run)
    assert [s["seq"] for s in head["snapshots"]] == [1, int(s2[1:])]
    assert head["snapshots"][-1]["parent"] == 1 and head["generation"] == 2
    after = tree(b.root)
    assert not log_errors(b)
    b.umount()

    # A third worker resumes B's snapshot through the chain (full s1 + delta).
    c = run_factory("c", "--remote", url, "--from", f"{run}@{s2}", *FAST)
    assert tree(c.root) == after
    assert status(c)["remote"]["imported"]["manifests"] == 2
    # The older snapshot is still there to rewind to, read-only while C holds the run.
    d = run_factory("d", "--remote", url, "--from", f"{run}@{s1}", *FAST)
    assert tree(d.root) == before
    st = status(d)["remote"]
    assert st["read_only"] and "held by another worker" in st["reason"]
    assert bucket.missing_chunks() == {}


def test_unaligned_and_concurrent_writes_upload_cleanly(s3, run_factory):
    """Small and unaligned writes rewrite blocks while their first versions wait
    for upload: superseded chunks are dropped quietly, the rest published."""
    url = s3.unique_url("unaligned")
    a = run_factory("a", "--remote", url, *FAST)
    src = a.run_dir / "src.bin"
    src.write_bytes(os.urandom(16 * MiB + 333))
    shutil.copyfile(src, a.root / "copied.bin")  # sendfile, in pieces
    subprocess.run(["dd", f"if={src}", f"of={a.root / 'dd.bin'}", "bs=4k", "status=none"],
                   check=True)
    # Four threads write one file in 100 KB pieces, fsyncing now and then: blocks
    # are committed half full, then rewritten, while uploads are queued.
    pieces = os.urandom(8 * MiB)
    fd = os.open(a.root / "pwrite.bin", os.O_RDWR | os.O_CREAT, 0o644)

    def writer(k: int) -> None:
        for off in range(k * 100_000, len(pieces), 400_000):
            os.pwrite(fd, pieces[off:off + 100_000], off)
            if off % 1_000_000 < 100_000:
                os.fsync(fd)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(fd)
    snapshot(a)
    sync(a)
    assert (a.root / "copied.bin").read_bytes() == src.read_bytes()
    assert (a.root / "dd.bin").read_bytes() == src.read_bytes()
    assert (a.root / "pwrite.bin").read_bytes() == pieces
    assert Bucket(s3, url).missing_chunks() == {}
    st = status(a)["remote"]
    assert st["uploads"]["failed"] == 0 and st["backlog"]["chunks"] == 0
    assert not log_errors(a)


def test_two_workers_race_for_one_run(s3, run_factory, tmp_path):
    url = s3.unique_url("race")
    a = run_factory("a", "--remote", url, *FAST)
    (a.root / "f.txt").write_text("base\n")
    s1 = snapshot(a)
    sync(a)
    run = status(a)["run"]
    a.umount()
    workers = [run_factory(name, "--remote", url, "--from", f"{run}@{s1}", *FAST, mount=False)
               for name in ("w1", "w2")]
    procs = [subprocess.Popen([*VFSD, "mount", str(w.run_dir), *w.extra_args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in workers]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    states = {w.run_dir.name: status(w)["remote"] for w in workers}
    winners = [w for w in workers if states[w.run_dir.name]["state"] == "held"]
    losers = [w for w in workers if states[w.run_dir.name]["read_only"]]
    assert len(winners) == 1 and len(losers) == 1, states
    win, lose = winners[0], losers[0]
    assert "read-only" in outs[workers.index(lose)][1]  # `vfsd mount` said so
    (win.root / "f.txt").write_text("winner\n")
    for attempt in (lambda: (lose.root / "f.txt").write_text("loser\n"),
                    lambda: (lose.root / "other").mkdir(),
                    lambda: (lose.root / "f.txt").unlink()):
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS
    assert (lose.root / "f.txt").read_text() == "base\n"  # reads go on
    proc = vfsd_cli("step", lose.run_dir, "3", check=False)
    assert proc.returncode == 1 and "read-only" in proc.stderr
    assert '"read_only"' in lose.log_text()


# ---------------------------------------------------------- local cache, fsck


def test_local_cache_is_bounded_and_refilled_and_fsck_knows(s3, run_factory):
    url = s3.unique_url("cache")
    bucket = Bucket(s3, url)
    a = run_factory("a", "--remote", url, *FAST, "--remote-cache-bytes", str(4 * MiB))
    files = {f"f{i}.bin": os.urandom(3 * MiB) for i in range(4)}
    write_tree(a.root, files)
    snapshot(a)
    sync(a)
    chunk_dir = a.state_dir / "chunks"

    def local_bytes() -> int:
        return sum(p.stat().st_size for p in chunk_dir.glob("??/*"))

    wait_for(lambda: local_bytes() <= 4 * MiB, "the cache to shrink to its bound")
    for name, data in files.items():  # read back through the bucket
        drop_page_cache(a.root / name)
        assert (a.root / name).read_bytes() == data
    st = status(a)["remote"]
    assert st["fetcher"]["downloads"] >= 8 and st["cache"]["evicted"] >= 8
    wait_for(lambda: local_bytes() <= 4 * MiB, "the cache to shrink again")
    a.umount()
    report = json.loads(vfsd_cli("fsck", a.run_dir, "--json").stdout)
    assert report["clean"] and report["stats"]["remote_only"] >= 8, report
    report = json.loads(vfsd_cli("fsck", a.run_dir, "--remote", "--json").stdout)
    assert report["clean"], report
    gone = next(d for d in bucket.chunks() if not (chunk_dir / d.hex()[:2] / d.hex()).exists())
    bucket.delete(chunk_key(gone))
    proc = vfsd_cli("fsck", a.run_dir, "--remote", "--json", check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and any("missing locally and in" in p for p in report["problems"])
    assert report["damaged_files"]


# ------------------------------------------------------------------ bad input


def test_bad_resume_requests_change_nothing(s3, run_factory, tmp_path):
    url = s3.unique_url("bad")
    bucket = Bucket(s3, url)
    a = run_factory("a", "--remote", url, *FAST)
    payload = os.urandom(2 * MiB)
    (a.root / "data.bin").write_bytes(payload)
    (a.root / "small.txt").write_text("small\n")
    s1 = snapshot(a)
    sync(a)
    run = status(a)["run"]

    def refused(spec: str, *extra: str, code: int = 1) -> str:
        target = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        proc = vfsd_cli("mount", target, "--remote", url, "--from", spec, *FAST, *extra,
                        check=False)
        assert proc.returncode == code, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        assert not is_mounted(target / "fs")
        assert not (target / ".vfsd" / "lmdb").exists(), "nothing may be imported"
        return proc.stderr

    assert "is unknown in" in refused("no-at-sign")  # a run id alone: its latest snapshot
    assert "not a snapshot id" in refused(f"{run}@12", code=2)
    assert "run id" in refused("../etc@s1", code=2)
    proc = vfsd_cli("mount", tmp_path / "x", "--from", f"{run}@{s1}", check=False)
    assert proc.returncode == 2 and "--from needs --remote" in proc.stderr
    assert "unknown" in refused(f"{'f' * 32}@s1")
    assert f"no published snapshot s9 in {url}" in refused(f"{run}@s9")
    # A damaged manifest: the import stops before anything is written.
    key = f"runs/{run}/snapshots/1"
    good = bucket.get(key)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    bucket.put(key, bytes(bad))
    assert "damaged" in refused(f"{run}@{s1}")
    bucket.put(key, good)
    # A chunk whose bytes do not match its name: EIO when read, never those bytes.
    digest = next(iter(decode(good, run=run, seq=1).chunk_digests()))
    real = bucket.get(chunk_key(digest))
    bucket.put(chunk_key(digest), os.urandom(len(real)))
    a.umount()
    b = run_factory("b", "--remote", url, "--from", f"{run}@{s1}", *FAST)
    assert (b.root / "small.txt").read_text() == "small\n"
    with pytest.raises(OSError) as info:
        (b.root / "data.bin").read_bytes()
    assert info.value.errno == errno.EIO
    assert status(b)["remote"]["fetcher"]["errors"] >= 1
    assert "remote_chunk_corrupt" in b.log_text()
    bucket.put(chunk_key(digest), real)  # repaired in the bucket: readable again
    assert (b.root / "data.bin").read_bytes() == payload


def test_a_resume_bound_to_fail_leaves_the_run_alone(s3, run_factory, tmp_path):
    """`--from` into a store that keeps its chunks in another prefix is refused
    before the run's lease is taken: lease and head stay as the run's worker
    left them (a worker merely slow to renew would otherwise be fenced out)."""
    url, other = s3.unique_url("keep"), s3.unique_url("other")
    bucket = Bucket(s3, url)
    a = run_factory("a", "--remote", url, *FAST)
    (a.root / "f.txt").write_text("hello\n")
    s1 = snapshot(a)
    sync(a)
    run = status(a)["run"]
    a.umount()  # the lease is released: anyone may take it at once
    lease, head = bucket.get(f"runs/{run}/lease"), bucket.get(f"runs/{run}/head")
    shared = tmp_path / "shared"
    c = run_factory("c", "--remote", other, "--store", str(shared), *FAST)
    c.umount()
    proc = vfsd_cli("mount", tmp_path / "b", "--store", shared, "--remote", url, "--from",
                    f"{run}@{s1}", *FAST, check=False)
    assert proc.returncode == 1 and f"keeps its chunks in {other}" in proc.stderr, proc.stderr
    assert bucket.get(f"runs/{run}/lease") == lease
    assert bucket.get(f"runs/{run}/head") == head


def test_no_intent_is_left_once_published(s3, run_factory):
    """Each publication deletes its intent, a delta with nothing retired too."""
    url = s3.unique_url("intents")
    bucket = Bucket(s3, url)
    a = run_factory("a", "--remote", url, *FAST)
    (a.root / "one.bin").write_bytes(os.urandom(MiB + 1))
    for i in range(20):  # unchanged later: the next manifest is a small delta
        (a.root / f"log{i}.txt").write_text(f"log {i}\n")
    snapshot(a)
    sync(a)
    (a.root / "two.bin").write_bytes(os.urandom(MiB + 2))
    s2 = snapshot(a)
    assert json.loads(sync(a).stdout)["published"] == s2
    run = status(a)["run"]
    assert bucket.head(run)["snapshots"][-1]["full"] is False
    assert not bucket.keys(f"runs/{run}/intents/")


# ------------------------------------------------------------------ bucket GC


def _retire_a_chunk(s3, run_factory, name: str):
    """A worker publishing full manifests with keep-last 1: a file's chunk becomes
    unreferenced once the file is gone and its snapshot retired. Returns
    (worker, bucket, url, kept bytes, the retired chunk's bytes)."""
    url = s3.unique_url(name)
    bucket = Bucket(s3, url)
    a = run_factory(name, "--remote", url, *FAST, "--snapshot-keep-last", "1",
                    "--snapshot-keep-steps", "0", "--remote-full-every", "1")
    kept, gone = os.urandom(MiB + 3), os.urandom(MiB + 7)
    (a.root / "kept.bin").write_bytes(kept)
    (a.root / "gone.bin").write_bytes(gone)
    snapshot(a)
    sync(a)
    (a.root / "gone.bin").unlink()
    snapshot(a)
    sync(a)
    run = status(a)["run"]
    wait_for(lambda: list(bucket.manifests(run)) == [(run, 2)], "s1 to be retired")
    return a, bucket, url, kept, gone


def test_gc_deletes_only_unreferenced_chunks_after_the_grace(s3, run_factory):
    a, bucket, url, kept, gone = _retire_a_chunk(s3, run_factory, "gc")
    fresh = os.urandom(1000)
    bucket.put(chunk_key(chunk_hash(fresh)), fresh)  # unreferenced but young
    before = bucket.chunks()
    assert {chunk_hash(kept[:MiB]), chunk_hash(gone[:MiB]), chunk_hash(fresh)} <= before
    store = objstore(s3, url)
    report = sweep(store, grace=3600)
    # The tails of both files (3 and 7 bytes) travel in manifests: one chunk each.
    assert report.deleted == 0 and report.young == 2 and bucket.chunks() == before
    # Past a 10 s grace, with both clocks at one-second resolution (Last-Modified
    # and Date are truncated): 12 s. `fresh` is put again, young, and stays young
    # while the command line starts (seconds on a loaded machine: boto3 alone).
    time.sleep(12)
    bucket.put(chunk_key(chunk_hash(fresh)), fresh)
    report = sweep(store, grace=10, dry_run=True)
    assert report.deleted == 1 and bucket.chunks() == before
    proc = vfsd_cli("gc", "--remote", url, "--grace", "10", "--json")
    assert json.loads(proc.stdout)["deleted"] == 1
    assert bucket.chunks() == before - {chunk_hash(gone[:MiB])}
    assert bucket.missing_chunks() == {}
    assert (a.root / "kept.bin").read_bytes() == kept


def test_gc_race_with_a_worker_reusing_the_chunk_it_deletes(s3, run_factory):
    """GC has marked (the chunk is unreferenced and old) and holds its lease; a
    worker writes the same bytes (its uploader finds the chunk present), snapshots
    and syncs: the publication waits for the sweep, sees the chunk gone, uploads it
    again, and only then publishes. No manifest ever names a missing chunk."""
    a, bucket, url, kept, gone = _retire_a_chunk(s3, run_factory, "gcrace")
    time.sleep(3)  # past a 1 s grace at one-second clock resolution
    marked, go = threading.Event(), threading.Event()
    result: dict = {}

    def on_marked():
        marked.set()
        go.wait(60)

    def gc():
        try:
            result["report"] = sweep(objstore(s3, url), grace=1, on_marked=on_marked)
        except Exception as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    sweeper = threading.Thread(target=gc)
    sweeper.start()
    try:
        assert marked.wait(60)
        # The very bytes GC decided to delete: the store still has them, so nothing
        # is uploaded, and the publication finds the chunk present in the bucket.
        (a.root / "again.bin").write_bytes(gone)
        sid = snapshot(a)
        syncing = subprocess.Popen([*VFSD, "sync", str(a.run_dir), "--timeout", "60"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert syncing.poll() is None  # waiting for the sweep
    finally:
        go.set()
        sweeper.join(60)
    out, err = syncing.communicate(timeout=90)
    assert syncing.returncode == 0, out + err
    assert "error" not in result, result
    assert result["report"].deleted == 1  # GC did delete it...
    assert bucket.missing_chunks() == {}  # ...and the worker put it back first
    pub = status(a)["remote"]["publisher"]
    assert pub["chunks_reuploaded"] == 1 and pub["published"] == sid
    a.umount()
    run = status(a)["run"]
    b = run_factory("b", "--remote", url, "--from", f"{run}@{sid}", *FAST)
    assert (b.root / "again.bin").read_bytes() == gone
    assert (b.root / "kept.bin").read_bytes() == kept


def test_status_and_publish_status_without_a_daemon_and_bad_sync(s3, run_factory):
    url = s3.unique_url("st")
    a = run_factory("a", "--remote", url, *FAST)
    res = json.loads(vfsd_cli("sync", a.run_dir, "--json").stdout)
    assert res["published"] is None and "no snapshot" in res["message"]
    proc = vfsd_cli("sync", a.run_dir, "--snapshot", "s7", check=False)
    assert proc.returncode == 1 and "s7" in proc.stderr
    (a.root / "f").write_text("x")
    res = json.loads(vfsd_cli("sync", a.run_dir, "--take", "--json").stdout)
    assert res["published"] == "s1"
    a.umount()
    st = status(a)
    assert st["running"] is False and st["remote"]["url"] == url
    assert st["remote"]["publisher"]["published"] == "s1"
    plain = run_factory("plain")
    proc = vfsd_cli("sync", plain.run_dir, check=False)
    assert proc.returncode == 1 and "no remote tier" in proc.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
