"""Bucket GC (vfsd/remote/bucketgc.py) against a real SeaweedFS, at the interleavings
its argument in vfsd/remote/layout.py ("GC") has to survive.

The writer's side is played by the test with plain bucket operations (a
manifest PUT, an intent or a retired manifest deleted) at the exact moment
the sweep reads an object; the hooks wrap the sweep's own calls (the
`ObjectStore` it was given, `Lease.read`), and every request still goes to
the real server.
"""

from __future__ import annotations

import json
import stat
import struct
import threading
import time

import pytest
from remote_helpers import settings_for
from s3server import s3_private_server, s3_server  # noqa: F401 - fixtures

from vfsd.remote import bucketgc
from vfsd.remote.bucketgc import GcBusy, GcError, sweep
from vfsd.remote.layout import GC_LEASE_KEY, chunk_key, intent_key, manifest_key
from vfsd.remote.lease import Lease
from vfsd.remote.manifest import Manifest, encode
from vfsd.remote.objstore import ObjectStore, RemoteError
from vfsd.snapshots.snapshots import InodeEntry, pack_inode_entry
from vfsd.store.chunks import chunk_hash
from vfsd.store.content import LOC_FILE, make_ref
from vfsd.store.inode import Inode

RUN = "r1"
CS = 4096


def manifest(seq: int, digests: list[bytes], parent: int = 0) -> bytes:
    """A manifest of RUN whose one file is made of the chunks `digests`."""
    blocks = {i: make_ref(d, LOC_FILE) for i, d in enumerate(digests)}
    ino = Inode(2, 1, stat.S_IFREG | 0o644, size=len(digests) * CS, inline=False)
    root = Inode(1, 1, stat.S_IFDIR | 0o755)
    entries = [
        (b"i" + struct.pack(">Q", 1), pack_inode_entry(InodeEntry(root, 0, b"", {}, b"", []))),
        (b"i" + struct.pack(">Q", 2), pack_inode_entry(InodeEntry(ino, 1, b"f", blocks, b"",
                                                                  []))),
    ]
    return encode(Manifest(RUN, seq, parent, 1, 0, 1, CS, sorted(entries)))


def old_chunk(store: ObjectStore, seed: bytes) -> bytes:
    """An unreferenced chunk put in the bucket; the caller waits for it to age."""
    data = seed * (CS // len(seed))
    digest = chunk_hash(data)
    store.put(chunk_key(digest), data)
    return digest


def past_one_second_grace() -> None:
    # Last-Modified and Date have one-second resolution: 3 s is past a 1 s grace.
    time.sleep(3)


class Hooked:
    """The sweep's ObjectStore, running `before(key)` ahead of each GET it makes."""

    def __init__(self, store: ObjectStore, before) -> None:
        self._store = store
        self._before = before

    def __getattr__(self, name):
        return getattr(self._store, name)

    def get(self, key, **kw):
        self._before(key)
        return self._store.get(key, **kw)


@pytest.fixture
def store(s3_server):  # noqa: F811
    st = ObjectStore(s3_server.unique_url("gc"), settings_for(s3_server))
    yield st
    st.close()


# --------------------------------------------------- objects gone when read


def test_intent_gone_when_read_its_manifest_is_marked(store):
    """The sweep lists the run (the intent of s2 is there, manifest s2 not yet);
    before it GETs the intent, the writer PUTs s2 naming X, CASes its head and
    deletes the intent. X must not be deleted."""
    x = old_chunk(store, b"intent")
    store.put(intent_key(RUN, 2, 1), x)
    past_one_second_grace()
    done = []

    def writer(key: str) -> None:
        if key == intent_key(RUN, 2, 1) and not done:
            done.append(key)
            store.put(manifest_key(RUN, 2), manifest(2, [x]))
            store.delete([intent_key(RUN, 2, 1)])

    report = sweep(Hooked(store, writer), grace=1)
    assert done
    assert store.exists(chunk_key(x)), report
    assert report.deleted == 0


def test_manifest_retired_when_read_its_successor_is_marked(store):
    """The sweep lists s1 (naming X); before it GETs s1, the writer publishes a
    forced-full s2 (X unchanged, so in no intent) and retention deletes s1."""
    x = old_chunk(store, b"retired")
    store.put(manifest_key(RUN, 1), manifest(1, [x]))
    past_one_second_grace()
    done = []

    def writer(key: str) -> None:
        if key == manifest_key(RUN, 1) and not done:
            done.append(key)
            store.put(manifest_key(RUN, 2), manifest(2, [x]))
            store.delete([manifest_key(RUN, 1)])

    report = sweep(Hooked(store, writer), grace=1)
    assert done
    assert store.exists(chunk_key(x)), report
    assert report.deleted == 0 and report.mark_rounds >= 2


def test_a_run_that_never_settles_stops_the_sweep(store, monkeypatch):
    """A listing that shows something new every round: GC gives up, deleting nothing."""
    x = old_chunk(store, b"busy")
    past_one_second_grace()
    seq = [0]

    def writer(key: str) -> None:
        if key.startswith(f"runs/{RUN}/snapshots/"):
            seq[0] += 1
            store.put(manifest_key(RUN, 100 + seq[0]), manifest(100 + seq[0], []))

    store.put(manifest_key(RUN, 100), manifest(100, []))
    monkeypatch.setattr(bucketgc, "MAX_MARK_ROUNDS", 4)
    with pytest.raises(GcError, match="kept changing"):
        sweep(Hooked(store, writer), grace=1)
    assert store.exists(chunk_key(x))


# ------------------------------------------------------------- grace floor


def test_a_sweep_never_raises_the_grace_floor(store, monkeypatch):
    """Sweep A (grace 3600) reads `gc/lease`; sweep B (grace 10) runs to the end
    before A's CAS. The floor must end at 10: A's takeover replaces B's record."""
    first = Lease(store, "gc", key=GC_LEASE_KEY,
                  extra={"grace": 3600.0, "grace_floor": 3600.0})
    first.acquire()
    first.release()
    real_read = Lease.read
    ran_b = []

    def read(self):
        state = real_read(self)
        if self.key == GC_LEASE_KEY and not ran_b:
            ran_b.append("running")  # B's own reads must not start a third sweep
            ran_b[0] = sweep(store, grace=10)
        return state

    monkeypatch.setattr(Lease, "read", read)
    sweep(store, grace=3600)
    assert ran_b
    record = json.loads(store.get(GC_LEASE_KEY).data)
    assert record["grace"] == 3600.0 and record["grace_floor"] == 10.0


def test_a_damaged_gc_lease_sets_the_floor_to_the_minimum(s3_server):  # noqa: F811
    """Whatever grace a damaged record hid, the next floor is MIN_GRACE. (A
    damaged lease is waited out like a held one: a TTL of the sweep's own.)"""
    store = ObjectStore(s3_server.unique_url("gcdmg"), settings_for(
        s3_server, connect_timeout=1.0, read_timeout=1.0))
    try:
        store.put(GC_LEASE_KEY, b"not a lease")
        with pytest.raises(GcBusy, match="damaged"):
            sweep(store, grace=3600, ttl=2)
        sweep(store, grace=3600, ttl=2, wait=30)
        record = json.loads(store.get(GC_LEASE_KEY).data)
        assert record["grace_floor"] == bucketgc.MIN_GRACE and record["released"]
    finally:
        store.close()


# ------------------------------------------------- deletes within the lease


def test_deletes_never_land_after_the_sweep_lease_expired(s3_private_server):  # noqa: F811
    """The store freezes during the sweep's delete request and comes back after
    the sweep's lease has expired: the request must have given up by then."""
    server = s3_private_server
    store = ObjectStore(server.unique_url("gcdl"), settings_for(
        server, connect_timeout=1.0, read_timeout=2.0, max_attempts=30,
        retry_base_delay=0.05, retry_max_delay=0.2))
    try:
        x = old_chunk(store, b"deadline")
        past_one_second_grace()
        paused = threading.Event()
        real_delete = store.delete

        def delete(keys, deadline=None):
            if not paused.is_set():
                server.pause()
                paused.set()
            return real_delete(keys, deadline=deadline)

        store.delete = delete
        result: dict = {}

        def gc():
            try:
                result["report"] = sweep(store, grace=1, ttl=5)
            except (GcError, RemoteError) as exc:
                result["error"] = exc

        sweeper = threading.Thread(target=gc)
        sweeper.start()
        assert paused.wait(60)
        # Past any lease the sweep may hold (its TTL, raised to three request
        # attempts: 9 s), plus the server's one-second clock.
        time.sleep(11)
        server.resume()
        sweeper.join(120)
        assert not sweeper.is_alive()
        assert store.exists(chunk_key(x)), result
        assert "error" in result
    finally:
        server.resume()
        store.close()
