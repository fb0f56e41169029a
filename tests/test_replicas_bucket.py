"""Replicas and a bucket that lies, and the GC of deleted threads.

What a tenant of the prefix can plant (a thread record of another id, a
record pointing at another thread's run, a head of another run, a damaged
record, a tombstone) is refused clearly, never served: no thread ever sees
another thread's files. What is not defended: a tenant who can write the
prefix can delete a thread (plant its tombstone), as it could delete its
objects; a planted tombstone never makes GC delete another thread's run.
"""

from __future__ import annotations

import json

import pytest
from remote_run import Bucket, use_server
from replica_helpers import Replica, tkey
from s3server import s3_server  # noqa: F401 - fixture
from test_replicas import expect, write

from vfsd.remote.bucketgc import sweep
from vfsd.remote.objstore import ObjectStore, RemoteSettings

pytestmark = pytest.mark.fuse


@pytest.fixture(scope="module")
def replica(s3_server, tmp_path_factory):  # noqa: F811
    mp = pytest.MonkeyPatch()
    use_server(s3_server, mp)
    url = s3_server.unique_url("hostile")
    r = Replica(tmp_path_factory.mktemp("hostile") / "a", url)
    try:
        r.start()
        yield r, Bucket(s3_server, url), url
    finally:
        r.stop()
        mp.undo()


def record(key: str, thread: str, run: str | None, state: str = "live",
           old_runs: list | None = None, generation: int = 1) -> bytes:
    return json.dumps({"vfsd_thread": 1, "key": key, "thread_id": thread, "run": run,
                       "generation": generation, "state": state, "copied_from": None,
                       "old_runs": old_runs or []}).encode()


def run_once(r: Replica, thread: str, files: dict) -> str:
    run = r.begin(thread)["run"]
    write(r, thread, files)
    r.snapshot(thread)
    r.end(thread)
    return run


def test_a_planted_record_of_another_thread_id_is_refused(replica):
    r, bucket, _ = replica
    t = "victim-id"
    bucket.put(f"threads/{tkey(t)}", record(tkey(t), "someone else", "a" * 32))
    err = r.error("remote_begin", volume=tkey(t), thread=t, wait=0)
    assert err["code"] == "wrong_thread" and "someone else" in err["message"]
    assert not bucket.keys(f"runs/{'a' * 32}/")  # nothing taken, nothing fenced


def test_a_record_pointing_at_another_threads_run_is_refused(replica):
    r, bucket, _ = replica
    owner, thief = "run-owner", "run-thief"
    run = run_once(r, owner, {"private.md": "owner's\n"})
    head_before = bucket.get(f"runs/{run}/head")
    bucket.put(f"threads/{tkey(thief)}", record(tkey(thief), thief, run))
    err = r.error("remote_begin", volume=tkey(thief), thread=thief, wait=0)
    assert err["code"] == "remote_damaged" and "belongs to thread" in err["message"]
    assert r.files(thief) == {}
    assert bucket.get(f"runs/{run}/head") == head_before
    r.begin(owner)
    assert r.files(owner) == expect({"private.md": "owner's\n"})
    r.end(owner)


def test_a_head_of_another_run_and_a_damaged_record_are_refused(replica):
    r, bucket, _ = replica
    t = "lied-to"
    run = run_once(r, t, {"a.md": "mine\n"})
    head = json.loads(bucket.get(f"runs/{run}/head"))
    bucket.put(f"runs/{run}/head", json.dumps({**head, "run": "b" * 32}).encode())
    err = r.error("remote_begin", volume=tkey(t), thread=t, wait=0)
    assert err["code"] == "remote_damaged" and "names run" in err["message"]
    bucket.put(f"runs/{run}/head", json.dumps(head).encode())
    bucket.put(f"threads/{tkey(t)}", b"{not json")
    err = r.error("remote_begin", volume=tkey(t), thread=t, wait=0)
    assert err["code"] == "remote_damaged" and "not valid JSON" in err["message"]
    assert r.files(t) == expect({"a.md": "mine\n"})  # the cache as it was, still read-only


def test_gc_removes_a_deleted_threads_run_and_never_another_threads(replica):
    r, bucket, url = replica
    doomed, kept, planter = "gc-doomed", "gc-kept", "gc-planter"
    doomed_run = run_once(r, doomed, {"only-here.bin": "d" * 400_000})
    kept_run = run_once(r, kept, {"kept.bin": "k" * 400_000})
    # A tombstone a tenant planted, listing another thread's run.
    bucket.put(f"threads/{tkey(planter)}",
               record(tkey(planter), planter, None, "deleted", [kept_run]))
    # The doomed thread's tombstone, its objects left behind (a delete cut short).
    rec = json.loads(bucket.get(f"threads/{tkey(doomed)}"))
    bucket.put(f"threads/{tkey(doomed)}",
               record(tkey(doomed), doomed, None, "deleted", [doomed_run], rec["generation"] + 1))
    only_doomed = _chunks_of(bucket, doomed_run) - _chunks_of(bucket, kept_run)
    assert only_doomed and bucket.keys(f"runs/{doomed_run}/")
    # A copy whose source is deleted keeps its chunks: they are its manifests' too.
    run_once(r, "gc-source", {"shared.bin": "s" * 400_000})
    copy = r.call("remote_copy", volume=tkey("gc-source"), thread="gc-source",
                  target=tkey("gc-copy"), target_thread="gc-copy")
    r.call("remote_delete", volume=tkey("gc-source"), thread="gc-source")
    assert _chunks_of(bucket, copy["run"])
    store = ObjectStore(url, RemoteSettings(endpoint_url=bucket.client.meta.endpoint_url))
    try:
        import time

        time.sleep(3)  # past a 1 s grace at one-second clock resolution
        report = sweep(store, grace=1.0)
    finally:
        store.close()
    assert doomed_run in report.runs_deleted and kept_run not in report.runs_deleted
    assert [x["run"] for x in report.runs_refused] == [kept_run]
    assert not bucket.keys(f"runs/{doomed_run}/")
    assert not only_doomed & bucket.chunks()
    assert json.loads(bucket.get(f"threads/{tkey(doomed)}"))["old_runs"] == []
    assert not bucket.missing_chunks()  # every manifest left names chunks still there
    r.begin("gc-copy")
    assert r.files("gc-copy") == expect({"shared.bin": "s" * 400_000})
    r.end("gc-copy")
    r.begin(kept)
    assert r.files(kept) == expect({"kept.bin": "k" * 400_000})
    r.end(kept)
    # Not defended: the tombstone of a thread deletes it, planted or not. Its id
    # used again starts empty, as after any delete.
    got = r.begin(doomed)
    assert got["rebuilt"] and r.files(doomed) == {}
    r.end(doomed)


def _chunks_of(bucket: Bucket, run: str) -> set[bytes]:
    from vfsd.remote.manifest import decode

    out: set[bytes] = set()
    for (_run, seq), data in bucket.manifests(run).items():
        out |= decode(data, run=run, seq=seq).chunk_digests()
    return out
