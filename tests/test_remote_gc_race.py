"""Bucket GC racing real publishers while the object store freezes mid-sweep (issue 20 probe).

Two workers (real daemons, real mounts, one run each under one prefix) keep
writing files whose bytes come from a small pool of chunks, dropping some and
bringing them back, so chunks keep becoming garbage and being needed again by
a publication that finds them already in the bucket: the race the GC argument
in `vfsd.remote` is about. Meanwhile sweeps run back to back with a 1 s grace,
and the server is frozen (SIGSTOP: requests hang, they do not fail) at random
moments for longer than any lease involved, so sweeps stop mid-mark and
mid-delete, and workers' leases lapse and are taken again.

What must hold once the store is thawed and every worker has published
again: no manifest in the bucket names a chunk the bucket lacks, and each run
resumes elsewhere with exactly its worker's files.

Long (~2 min): runs with VFSD_LONG=1.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
from remote_helpers import settings_for
from remote_run import FAST, Bucket, snapshot, status, sync, tree, use_server
from s3server import s3_private_server  # noqa: F401 - fixture

from vfsd.remote.bucketgc import GcError, sweep
from vfsd.remote.objstore import ObjectStore, RemoteError

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1",
                                                   reason="long: VFSD_LONG=1")]
MiB = 1 << 20
ROUNDS_S = 90


def test_gc_with_frozen_store_and_racing_publishers_loses_no_chunk(s3_private_server,  # noqa: F811
                                                                   run_factory, monkeypatch,
                                                                   tmp_path):
    server = s3_private_server
    use_server(server, monkeypatch)
    url = server.unique_url("gcrace")
    bucket = Bucket(server, url)
    rng = random.Random(20)
    pool = [rng.randbytes(MiB) for _ in range(4)]
    # Only the last two snapshots stay (none kept for being young: the step
    # never moves here), so the bucket's manifests retire and chunks become garbage.
    workers = [run_factory(f"w{i}", "--remote", url, "--snapshot-keep-last", "2",
                           "--snapshot-keep-steps", "0", *FAST)
               for i in range(2)]
    stop = threading.Event()
    failures: list[str] = []
    counts = {"rounds": 0, "sweeps": 0, "swept": 0, "stopped": 0, "freezes": 0, "deleted": 0}

    def work(w, seed: int) -> None:
        r = random.Random(seed)
        while not stop.is_set():
            try:
                for i, data in enumerate(pool):
                    path = w.root / f"p{i}.bin"
                    if r.random() < 0.5:
                        path.write_bytes(data)
                    elif path.exists():
                        path.unlink()
                snapshot(w)
                sync(w, timeout=20, check=False)
                counts["rounds"] += 1
            except Exception as exc:  # noqa: BLE001 - reported by the test
                failures.append(f"{w.run_dir.name}: {exc!r}")
                return

    def collect() -> None:
        store = ObjectStore(url, settings_for(server, connect_timeout=0.5, read_timeout=1.0,
                                              max_attempts=2))
        try:
            while not stop.is_set():
                try:
                    report = sweep(store, grace=1, ttl=2, workers=4)
                    counts["swept"] += 1
                    counts["deleted"] += report.deleted
                except (GcError, RemoteError):
                    counts["stopped"] += 1
                counts["sweeps"] += 1
        finally:
            store.close()

    def freeze() -> None:
        r = random.Random(7)
        while not stop.wait(r.uniform(2, 6)):
            with server.paused_for_a_while():
                counts["freezes"] += 1
                time.sleep(r.uniform(3, 8))  # past the sweep's and the workers' leases

    threads = [threading.Thread(target=work, args=(w, i)) for i, w in enumerate(workers)]
    threads += [threading.Thread(target=collect), threading.Thread(target=freeze)]
    for t in threads:
        t.start()
    try:
        time.sleep(ROUNDS_S)
    finally:
        stop.set()
        for t in threads:
            t.join(300)
        server.resume()
    assert not failures, failures
    assert counts["freezes"] >= 5 and counts["swept"] >= 3 and counts["deleted"] >= 1, counts
    # Thawed: every worker publishes what it has now, then the bucket is checked.
    expected = {}
    for w in workers:
        ident = snapshot(w)
        sync(w, timeout=120)
        expected[status(w)["run"]] = (ident, tree(w.root))
        w.umount()
    assert bucket.missing_chunks() == {}, counts
    print("gc race:", counts)  # with -s: how much racing there was
    for run, (ident, files) in expected.items():
        r = run_factory(f"resumed-{run[:8]}", "--remote", url, "--from", f"{run}@{ident}", *FAST)
        assert tree(r.root) == files
        r.umount()
