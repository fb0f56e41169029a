"""The write-behind chunk uploader against a real SeaweedFS.

Uploads and dedup (within a worker and across workers sharing a bucket), the
bounded queue refilled from a durable backlog, damaged local chunks, an object
store that dies and comes back (the backlog grows, then drains), and a SIGKILL
of a process in the middle of a PUT (nothing partial is ever visible under the
chunk's name; the backlog survives and the next process finishes the job).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
from remote_helpers import FileBacklog, make_chunks, settings_for
from s3server import s3_private_server, s3_server  # noqa: F401 - fixtures

from vfsd.remote.layout import chunk_key, digest_of_chunk_key
from vfsd.remote.objstore import ObjectStore, RemoteNotFound
from vfsd.remote.uploader import PendingChunk, Uploader, UploadFailed
from vfsd.store.chunks import ChunkStore, chunk_hash

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def chunks(tmp_path):
    return ChunkStore(tmp_path / "chunks")


@pytest.fixture
def store(s3_server):  # noqa: F811
    st = ObjectStore(s3_server.unique_url("up"), settings_for(s3_server))
    yield st
    st.close()


def bucket_chunks(store: ObjectStore) -> dict[bytes, int]:
    return {digest_of_chunk_key(o.key): o.size for o in store.list("chunks/")}


async def wait_until(predicate, limit: float = 60.0) -> None:
    with trio.fail_after(limit):
        while not predicate():
            await trio.sleep(0.02)


def run_uploader(uploader: Uploader, body) -> None:
    """trio.run `body()` while `uploader.run()` is going; stop it afterwards."""

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(uploader.run)
            await body()
            nursery.cancel_scope.cancel()

    trio.run(main)


# --------------------------------------------------------------------- basics


def test_uploads_every_chunk_and_reports_it(store, chunks, tmp_path):
    made = make_chunks(chunks, 20)
    backlog = FileBacklog(tmp_path / "backlog")
    up = Uploader(store, chunks.read_all, on_uploaded=backlog.remove, workers=4)

    async def body():
        for digest, data in made.items():
            assert up.enqueue(backlog.add(digest, len(data)))
        await up.ensure_uploaded(made)
        await wait_until(lambda: not backlog.digests())
        status = up.status()
        assert status["backlog"] == 0 and status["uploaded"] == 20
        assert status["sent_bytes"] == sum(map(len, made.values()))

    run_uploader(up, body)
    assert bucket_chunks(store) == {d: len(b) for d, b in made.items()}
    for digest, data in list(made.items())[:3]:
        assert store.get(chunk_key(digest)).data == data


@pytest.mark.parametrize("head_first", [True, False])
def test_a_chunk_already_in_the_bucket_is_not_an_error(s3_server, chunks, head_first):  # noqa: F811
    url = s3_server.unique_url("dedup")
    made = make_chunks(chunks, 6)
    worker_a = Uploader(ObjectStore(url, settings_for(s3_server)), chunks.read_all)
    reported: list[bytes] = []
    # Another worker sharing the bucket, with its own uploader.
    worker_b = Uploader(ObjectStore(url, settings_for(s3_server)), chunks.read_all,
                        on_uploaded=reported.extend, head_first=head_first)
    first = list(made)[:4]

    async def body_a():
        for digest in first:
            worker_a.enqueue(PendingChunk(digest, len(made[digest]), time.time()))
            worker_a.enqueue(PendingChunk(digest, len(made[digest]), time.time()))  # twice
        await worker_a.ensure_uploaded(first)
        assert worker_a.status()["uploaded"] == 4  # each once

    async def body_b():
        for digest, data in made.items():
            worker_b.enqueue(PendingChunk(digest, len(data), time.time()))
        await worker_b.ensure_uploaded(made)
        await wait_until(lambda: len(reported) == 6)

    run_uploader(worker_a, body_a)
    run_uploader(worker_b, body_b)
    status = worker_b.status()
    assert status["existed"] == 4 and status["uploaded"] == 2 and status["failed"] == 0
    if head_first:  # found by a HEAD: the bytes were not sent again
        assert status["sent_bytes"] == sum(len(made[d]) for d in list(made)[4:])
    assert set(reported) == set(made)
    assert set(bucket_chunks(worker_b.store)) == set(made)


def test_ensure_uploaded_checks_what_it_was_never_told_about(store, chunks):
    made = make_chunks(chunks, 4)
    digests = list(made)
    store.put_if_absent(chunk_key(digests[0]), made[digests[0]])  # there already
    ghost = chunk_hash(b"not stored anywhere")
    up = Uploader(store, chunks.read_all)

    async def body():
        await up.ensure_uploaded(digests)  # uploads the three missing ones itself
        with pytest.raises(UploadFailed) as info:
            await up.ensure_uploaded([digests[0], ghost])
        assert list(info.value.reasons) == [ghost]

    run_uploader(up, body)
    assert set(bucket_chunks(store)) == set(made)


def test_a_damaged_local_chunk_is_never_uploaded(store, chunks):
    made = make_chunks(chunks, 3)
    bad, good = list(made)[0], list(made)[1:]
    path = chunks.path(bad)
    path.write_bytes(b"X" + path.read_bytes()[1:])  # bit rot on the local disk
    missing = chunk_hash(b"deleted locally")
    failed: dict[bytes, str] = {}
    up = Uploader(store, chunks.read_all, on_failed=failed.__setitem__)

    async def body():
        for digest in [bad, missing, *good]:
            up.enqueue(PendingChunk(digest, 1, time.time()))
        with pytest.raises(UploadFailed) as info:
            await up.ensure_uploaded([bad, missing, *good])
        assert set(info.value.reasons) == {bad, missing}

    run_uploader(up, body)
    assert set(failed) == {bad, missing}
    assert "does not match" in failed[bad] and "missing" in failed[missing]
    assert set(bucket_chunks(store)) == set(good)
    with pytest.raises(RemoteNotFound):
        store.head(chunk_key(bad))


# ------------------------------------------------------------- bounded queue


def test_a_full_queue_refuses_and_the_durable_backlog_refills_it(store, chunks, tmp_path):
    made = make_chunks(chunks, 40, size=64 * 1024)
    backlog = FileBacklog(tmp_path / "backlog")
    up = Uploader(store, chunks.read_all, on_uploaded=backlog.remove,
                  load_pending=backlog.load, workers=2, max_queued=5)
    most_queued = []

    async def body():
        accepted = [up.enqueue(backlog.add(d, len(b))) for d, b in made.items()]
        assert accepted.count(True) <= 5 + 2 and accepted.count(False) >= 30
        while backlog.digests():
            most_queued.append(up.status()["queued"])
            await trio.sleep(0.01)
        assert up.status()["deferred"] == 0

    run_uploader(up, body)
    assert max(most_queued) <= 5
    assert set(bucket_chunks(store)) == set(made)


def test_enqueue_wait_applies_backpressure(store, chunks):
    made = make_chunks(chunks, 12, size=32 * 1024)
    up = Uploader(store, chunks.read_all, workers=1, max_queued=2)

    async def body():
        for digest, data in made.items():
            await up.enqueue_wait(PendingChunk(digest, len(data), time.time()))
            assert up.status()["queued"] <= 2
        await up.ensure_uploaded(made)

    run_uploader(up, body)
    assert set(bucket_chunks(store)) == set(made)


def test_pending_chunks_from_a_previous_process_are_uploaded_at_start(store, chunks, tmp_path):
    made = make_chunks(chunks, 10)
    backlog = FileBacklog(tmp_path / "backlog")
    for digest, data in made.items():
        backlog.add(digest, len(data), at=time.time() - 3600)
    up = Uploader(store, chunks.read_all, on_uploaded=backlog.remove, load_pending=backlog.load,
                  max_queued=4)

    async def body():
        await wait_until(lambda: not backlog.digests())

    run_uploader(up, body)
    assert set(bucket_chunks(store)) == set(made)


# -------------------------------------------------------------------- outages


def test_store_down_backlog_grows_then_drains(s3_private_server, chunks, tmp_path):  # noqa: F811
    server = s3_private_server
    store = ObjectStore(server.unique_url("outage"),
                        settings_for(server, max_attempts=1, connect_timeout=0.5))
    made = make_chunks(chunks, 24, size=128 * 1024)
    digests = list(made)
    backlog = FileBacklog(tmp_path / "backlog")
    up = Uploader(store, chunks.read_all, on_uploaded=backlog.remove,
                  load_pending=backlog.load, workers=4, retry_base_delay=0.05,
                  retry_max_delay=0.5)
    seen = {}

    async def body():
        await trio.to_thread.run_sync(server.kill)
        hour_ago = time.time() - 3600
        for digest in digests[:12]:
            up.enqueue(backlog.add(digest, len(made[digest]), at=hour_ago))
        await wait_until(lambda: up.status()["store_down_for"] is not None)
        seen["down"] = up.status()
        for digest in digests[12:]:  # writes go on while the store is down
            up.enqueue(backlog.add(digest, len(made[digest])))
        seen["grown"] = up.status()
        await trio.to_thread.run_sync(server.restart)
        with trio.fail_after(120):
            await up.ensure_uploaded(digests)
        await wait_until(lambda: not backlog.digests())
        seen["drained"] = up.status()

    run_uploader(up, body)
    down, grown, drained = seen["down"], seen["grown"], seen["drained"]
    assert down["backlog"] == 12 and down["uploaded"] == 0
    assert "unreachable" in down["last_error"] and down["oldest_pending_age"] >= 3600
    assert grown["backlog"] == 24
    assert grown["backlog_bytes"] == sum(map(len, made.values()))
    assert drained["backlog"] == 0 and drained["store_down_for"] is None
    assert drained["uploaded"] == 24 and drained["retries"] >= 1
    assert {d: len(b) for d, b in made.items()} == bucket_chunks(store)


CRASHER = textwrap.dedent("""
    import sys, trio, structlog
    from pathlib import Path
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    sys.path.insert(0, sys.argv[4])
    from remote_helpers import FileBacklog
    from vfsd.store.chunks import ChunkStore
    from vfsd.remote.objstore import ObjectStore, RemoteSettings
    from vfsd.remote.uploader import Uploader

    chunks = ChunkStore(Path(sys.argv[2]), create=False)
    backlog = FileBacklog(Path(sys.argv[3]))

    def read_chunk(digest):
        data = chunks.read_all(digest)
        print("READ", flush=True)
        return data

    store = ObjectStore(sys.argv[1], RemoteSettings(max_attempts=1, read_timeout=600))
    up = Uploader(store, read_chunk, on_uploaded=backlog.remove, load_pending=backlog.load,
                  workers=1, head_first=False)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(up.run)
            await trio.sleep_forever()

    trio.run(main)
""")


def send_queue_bytes(pid: int, port: int) -> int:
    """Bytes that process `pid` has queued on its TCP connections to `port`."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True).stdout
    total = 0
    for line in out.splitlines():
        if f"pid={pid}," in line:
            total += int(line.split()[1])  # Recv-Q, Send-Q, local, peer, process
    return total


def test_sigkill_mid_upload_leaves_nothing_partial(s3_private_server, tmp_path):  # noqa: F811
    server = s3_private_server
    url = server.unique_url("crash")
    chunks = ChunkStore(tmp_path / "chunks")
    data = os.urandom(32 << 20)  # far more than the socket buffers hold
    digest = chunk_hash(data)
    chunks.put(digest, data)
    backlog = FileBacklog(tmp_path / "backlog")
    backlog.add(digest, len(data))
    store = ObjectStore(url, settings_for(server))

    server.pause()  # the PUT will stall with its body half sent
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHER, url, str(chunks.root), str(backlog.root), str(TESTS)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, **server.env},
        text=True)
    try:
        assert child.stdout.readline().strip() == "READ"
        deadline = time.monotonic() + 60
        while send_queue_bytes(child.pid, server.ports["s3"]) == 0:
            assert time.monotonic() < deadline, "the upload never started sending"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # mid-PUT
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()
        server.resume()

    for _ in range(20):  # the server now sees the broken request; nothing may appear
        with pytest.raises(RemoteNotFound):
            store.head(chunk_key(digest))
        assert bucket_chunks(store) == {}
        time.sleep(0.05)
    assert backlog.digests() == {digest}  # the pending set survived the crash

    up = Uploader(store, chunks.read_all, on_uploaded=backlog.remove, load_pending=backlog.load)

    async def body():
        await wait_until(lambda: not backlog.digests())

    run_uploader(up, body)
    assert chunk_hash(store.get(chunk_key(digest)).data) == digest
