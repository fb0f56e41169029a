"""Chunk fetches from a real SeaweedFS into an empty local chunk store.

Lazy fetch with verification, one download for many readers, damaged and
missing chunks, a frozen or dead object store (reads fail after the bounded
wait, never hang), and readahead. `ReadaheadWindow` is checked on its own.
"""

from __future__ import annotations

import pytest
import trio
from remote_helpers import make_chunks, settings_for
from s3server import s3_private_server, s3_server  # noqa: F401 - fixtures

from vfsd.remote.fetcher import ChunkUnavailable, Fetcher, FetchError, FetchTimeout, ReadaheadWindow
from vfsd.remote.layout import chunk_key
from vfsd.remote.objstore import ObjectStore
from vfsd.store.chunks import ChunkStore, chunk_hash


@pytest.fixture
def bucket(s3_server, tmp_path):  # noqa: F811
    """An object store holding 8 chunks that were made on another machine."""
    store = ObjectStore(s3_server.unique_url("fetch"), settings_for(s3_server))
    made = make_chunks(ChunkStore(tmp_path / "elsewhere"), 8)
    for digest, data in made.items():
        store.put_if_absent(chunk_key(digest), data)
    yield store, made
    store.close()


def with_fetcher(fetcher: Fetcher, body) -> None:
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(fetcher.run)
            await body()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_fetch_fills_an_empty_local_store_and_verifies(bucket, tmp_path):
    store, made = bucket
    local = ChunkStore(tmp_path / "local")
    fetcher = Fetcher(store, local)

    async def body():
        for digest, data in made.items():
            assert await fetcher.fetch(digest) == data
        for digest, data in made.items():  # now local
            assert await fetcher.fetch(digest) == data

    with_fetcher(fetcher, body)
    assert fetcher.stats["downloads"] == 8 and fetcher.stats["local"] == 8
    for digest, data in made.items():
        assert local.read_all(digest) == data
    assert list(local.iter_temps()) == []


def test_concurrent_readers_share_one_download(bucket, tmp_path):
    store, made = bucket
    digest = next(iter(made))
    fetcher = Fetcher(store, ChunkStore(tmp_path / "local"))
    results = []

    async def body():
        async def read():
            results.append(await fetcher.fetch(digest))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(read)

    with_fetcher(fetcher, body)
    assert results == [made[digest]] * 10
    assert fetcher.stats["downloads"] == 1


def test_a_damaged_remote_chunk_is_refused_and_not_installed(bucket, tmp_path):
    store, _made = bucket
    good = b"the real bytes" * 1000
    digest = chunk_hash(good)
    store.put_if_absent(chunk_key(digest), b"other bytes under its name")
    local = ChunkStore(tmp_path / "local")
    fetcher = Fetcher(store, local)

    async def body():
        with pytest.raises(ChunkUnavailable, match="does not match its hash"):
            await fetcher.fetch(digest)

    with_fetcher(fetcher, body)
    assert not local.exists(digest) and list(local.iter_temps()) == []


def test_a_chunk_missing_from_the_bucket_fails_at_once(bucket, tmp_path):
    store, _made = bucket
    fetcher = Fetcher(store, ChunkStore(tmp_path / "local"), timeout=600)

    async def body():
        with pytest.raises(ChunkUnavailable, match="not in"):
            await fetcher.fetch(chunk_hash(b"never uploaded"))

    with_fetcher(fetcher, body)


def test_a_damaged_local_copy_is_replaced_from_the_bucket(bucket, tmp_path):
    store, made = bucket
    digest, data = next(iter(made.items()))
    local = ChunkStore(tmp_path / "local")
    local.put(digest, b"rotten" + data[6:])
    fetcher = Fetcher(store, local)

    async def body():
        assert await fetcher.fetch(digest) == data

    with_fetcher(fetcher, body)
    assert local.read_all(digest) == data


def test_reads_fail_after_the_bounded_wait_when_the_store_freezes(s3_private_server, tmp_path):  # noqa: F811
    server = s3_private_server
    store = ObjectStore(server.unique_url("frozen"), settings_for(server, read_timeout=30))
    made = make_chunks(ChunkStore(tmp_path / "elsewhere"), 2)
    for digest, data in made.items():
        store.put_if_absent(chunk_key(digest), data)
    first, second = made
    local = ChunkStore(tmp_path / "local")
    fetcher = Fetcher(store, local, timeout=1.0)

    async def body():
        await trio.to_thread.run_sync(server.pause)
        try:
            with pytest.raises(FetchTimeout, match="within 1 s"):
                await fetcher.fetch(first)
            with pytest.raises(FetchTimeout):  # a second reader is bounded too
                await fetcher.fetch(first, timeout=0.5)
        finally:
            await trio.to_thread.run_sync(server.resume)
        # The store is back: the download that was under way completes, and
        # new reads work.
        assert await fetcher.fetch(first, timeout=60) == made[first]
        assert await fetcher.fetch(second, timeout=60) == made[second]

    with_fetcher(fetcher, body)
    assert fetcher.stats["timeouts"] == 2


def test_reads_fail_when_the_store_is_dead(s3_private_server, tmp_path):  # noqa: F811
    server = s3_private_server
    store = ObjectStore(server.unique_url("dead"),
                        settings_for(server, max_attempts=100, retry_base_delay=0.05,
                                     retry_max_delay=0.2))
    data = b"x" * 100_000
    digest = chunk_hash(data)
    store.put_if_absent(chunk_key(digest), data)
    server.kill()
    fetcher = Fetcher(store, ChunkStore(tmp_path / "local"), timeout=1.5)

    async def body():
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(digest)
        assert info.value.errno == 5  # EIO for the reader

    with_fetcher(fetcher, body)


def test_prefetch_brings_the_next_chunks_in_the_background(bucket, tmp_path):
    store, made = bucket
    digests = list(made)
    local = ChunkStore(tmp_path / "local")
    fetcher = Fetcher(store, local, workers=3)

    async def body():
        assert fetcher.prefetch(digests[:5]) == 5
        assert fetcher.prefetch(digests[:5]) == 0  # already on their way
        with trio.fail_after(60):
            while not all(local.exists(d) for d in digests[:5]):
                await trio.sleep(0.02)
        assert await fetcher.fetch(digests[0]) == made[digests[0]]

    with_fetcher(fetcher, body)
    assert fetcher.stats["readahead"] == 5 and fetcher.stats["downloads"] == 5
    assert fetcher.stats["local"] == 1


def test_readahead_window_follows_sequential_reads():
    w = ReadaheadWindow(max_chunks=4)
    assert list(w.on_read("f", 0)) == [1]
    assert list(w.on_read("f", 0)) == []  # the rest of chunk 0
    assert list(w.on_read("f", 1)) == [2, 3]
    assert list(w.on_read("f", 2)) == [4, 5, 6]
    assert list(w.on_read("f", 3)) == [7]
    assert list(w.on_read("f", 4)) == [8]
    assert list(w.on_read("f", 40)) == []  # a jump: start over
    assert list(w.on_read("f", 41)) == [42]
    assert list(w.on_read("g", 7)) == []  # another file, not from its start
    assert list(ReadaheadWindow(max_chunks=0).on_read("f", 0)) == []
