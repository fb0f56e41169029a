"""Unit tests of content-addressed chunks: the ChunkStore, dedup and refcounts, gc.

Everything runs on real files under tmp_path; the store-level tests go through
Store and OpenFiles (4 KiB chunks, 1 KiB inline limit), no FUSE.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import xxhash

from vfsd.errors import CorruptChunk, NotFound
from vfsd.fuse.openfiles import OpenFiles
from vfsd.store.chunks import ChunkStore, chunk_hash
from vfsd.store.content import LOC_FILE, LOC_LMDB
from vfsd.store.store import Store

CS = 4096
INLINE = 1024
REG = stat.S_IFREG | 0o644


# ------------------------------------------------------------------- ChunkStore


@pytest.fixture
def chunks(tmp_path: Path):
    c = ChunkStore(tmp_path / "chunks")
    yield c
    c.close()


def test_chunk_hash_is_xxh3_128() -> None:
    data = os.urandom(1000)
    assert chunk_hash(data) == xxhash.xxh3_128(data).digest()
    assert chunk_hash(bytearray(data)) == chunk_hash(memoryview(data)) == chunk_hash(data)
    assert len(chunk_hash(b"")) == 16


def test_put_read_and_layout(chunks: ChunkStore) -> None:
    data = os.urandom(5000)
    digest = chunk_hash(data)
    chunks.put(digest, data)
    path = chunks.path(digest)
    assert path == chunks.root / digest.hex()[:2] / digest.hex()
    assert path.read_bytes() == data and chunks.exists(digest)
    assert chunks.read(digest, 0, 5000) == data
    assert chunks.read(digest, 4000, 5000) == data[4000:]  # short at the end
    assert chunks.read(digest, 6000, 10) == b""
    assert chunks.read_all(digest) == data
    assert list(chunks.iter_temps()) == []  # the temporary was renamed into place
    assert list(chunks.iter_all()) == [digest]


def test_missing_chunk_is_an_error_not_zeros(chunks: ChunkStore) -> None:
    digest = chunk_hash(b"never stored")
    with pytest.raises(CorruptChunk, match="missing"):
        chunks.read(digest, 0, 10)
    with pytest.raises(CorruptChunk, match="missing"):
        chunks.read_all(digest)


def test_corrupt_chunk_is_detected(tmp_path: Path) -> None:
    data = os.urandom(3000)
    digest = chunk_hash(data)
    plain = ChunkStore(tmp_path / "chunks")
    plain.put(digest, data)
    plain.path(digest).write_bytes(b"X" + data[1:])
    with pytest.raises(CorruptChunk, match="does not match"):
        plain.read_all(digest)
    # Reads verify the whole chunk before serving any slice of it.
    with pytest.raises(CorruptChunk, match="does not match"):
        plain.read(digest, 100, 10)
    plain.close()


def test_delete_and_content_cache(tmp_path: Path) -> None:
    chunks = ChunkStore(tmp_path / "chunks", cache_bytes=10_000)
    digests = []
    for i in range(100):
        data = b"%03d" % i * 100  # 300 bytes each
        digest = chunk_hash(data)
        chunks.put(digest, data)
        digests.append(digest)
        assert chunks.read(digest, 0, 3) == data[:3]
    assert chunks._cache_bytes <= 10_000  # the cache is bounded by bytes
    assert chunks.read(digests[-1], 3, 3) == b"099"
    assert chunks.cache_hits >= 1 and chunks.cache_misses == 100
    # A cached chunk that is deleted is not served from memory afterwards.
    for digest in digests:
        chunks.delete(digest)
    assert chunks._cache_bytes == 0
    with pytest.raises(CorruptChunk, match="missing"):
        chunks.read(digests[-1], 0, 3)
    assert list(chunks.iter_all()) == []
    chunks.delete(digests[0])  # deleting twice is harmless


def test_iter_all_skips_tmp_and_junk(chunks: ChunkStore) -> None:
    data = os.urandom(100)
    chunks.put(chunk_hash(data), data)
    tmp = chunks.write_temp(b"half written")
    (chunks.root / "zz").mkdir()
    (chunks.root / "zz" / "not-hex").write_bytes(b"")
    assert list(chunks.iter_all()) == [chunk_hash(data)]
    assert list(chunks.iter_temps()) == [tmp]


def test_fsync_tolerates_deleted_chunks(chunks: ChunkStore) -> None:
    a, b = os.urandom(100), os.urandom(100)
    chunks.put(chunk_hash(a), a)
    chunks.fsync([chunk_hash(a), chunk_hash(b)])  # b was never stored


# --------------------------------------------------------- dedup and refcounts


class Files:
    """A store with OpenFiles, and whole-file helpers."""

    def __init__(self, path: Path) -> None:
        self.store = Store(path)
        self.files = OpenFiles(self.store, chunk_size=CS, inline_max=INLINE)

    def put(self, name: bytes, data: bytes, offset: int = 0) -> int:
        root = self.store.root_ino
        try:
            ino = self.store.lookup(root, name).ino
        except NotFound:
            ino = self.store.create(root, name, REG, os.getuid(), os.getgid()).ino
        of = self.files.acquire(ino)
        self.files.write(of, offset, data)
        self.files.release(of)
        return ino

    def get(self, ino: int) -> bytes:
        of = self.files.acquire(ino)
        try:
            return self.files.read(of, 0, of.inode.size)
        finally:
            self.files.release(of)

    def delete(self, name: bytes) -> None:
        child = self.store.unlink(self.store.root_ino, name)
        self.files.names_changed(child)
        self.store.free_inode(child.ino)

    def on_disk(self) -> set[bytes]:
        return set(self.store.chunks.iter_all())

    def refs(self) -> dict[bytes, int]:
        """Reference counts of chunk files (small objects live in LMDB)."""
        return {h: n for h, (n, _, loc) in self.store.content_refs().items()
                if loc == LOC_FILE}

    def digests(self, ino: int) -> dict[int, bytes]:
        return {i: ref[:16] for i, ref in self.store.block_map(ino).items()}


@pytest.fixture
def fs(tmp_path: Path):
    f = Files(tmp_path / "store")
    yield f
    f.store.close()


def test_same_content_in_two_files_is_stored_once(fs: Files) -> None:
    data = os.urandom(3 * CS + 100)
    a = fs.put(b"a", data)
    files_after_one = fs.on_disk()
    b = fs.put(b"b", data)
    # Three whole chunks as files; the 100-byte tail is small: an LMDB object.
    assert fs.on_disk() == files_after_one and len(files_after_one) == 3
    assert set(fs.refs().values()) == {2}
    assert fs.store.block_map(a) == fs.store.block_map(b)
    assert fs.store.block_map(a)[3][16] == LOC_LMDB
    c = fs.store.counters()
    assert c["chunk_count"] == 3 and c["chunk_bytes"] == 3 * CS
    assert c["blob_count"] == 1 and c["blob_bytes"] == 100
    assert c["logical_bytes"] == 2 * len(data)

    fs.delete(b"a")
    assert fs.on_disk() == files_after_one  # b still needs every chunk
    assert set(fs.refs().values()) == {1}
    assert fs.get(b) == data

    fs.delete(b"b")
    assert fs.on_disk() == set()
    assert fs.store.content_refs() == {}  # no tombstones left behind
    assert fs.store.counters()["chunk_count"] == 0
    assert fs.store.counters()["chunk_bytes"] == 0
    assert fs.store.counters()["blob_count"] == 0


def test_repeated_block_inside_one_file(fs: Files) -> None:
    block = os.urandom(CS)
    ino = fs.put(b"f", block * 3 + b"tail")
    digest = chunk_hash(block)
    assert fs.refs()[digest] == 3 and len(fs.on_disk()) == 1  # "tail" lives in LMDB
    fs.put(b"f", os.urandom(CS), offset=CS)  # overwrite the middle copy
    assert fs.refs()[digest] == 2
    assert fs.get(ino)[:CS] == block and fs.get(ino)[2 * CS:3 * CS] == block


def test_shared_chunk_survives_overwrite_in_one_file(fs: Files) -> None:
    data = os.urandom(2 * CS)
    a = fs.put(b"a", data)
    fs.put(b"b", data)
    fs.put(b"a", b"Z" * CS)  # a's first block changes; b still holds the old one
    old_first = chunk_hash(data[:CS])
    assert old_first in fs.on_disk() and fs.refs()[old_first] == 1
    assert fs.get(a) == b"Z" * CS + data[CS:]
    fs.delete(b"b")
    assert old_first not in fs.on_disk()


def test_chunk_freed_when_last_reference_rewritten(fs: Files) -> None:
    ino = fs.put(b"f", os.urandom(2 * CS))
    first = fs.digests(ino)[0]
    fs.put(b"f", os.urandom(CS), offset=0)
    assert first not in fs.on_disk() and first not in fs.refs()
    assert len(fs.on_disk()) == 2 == fs.store.counters()["chunk_count"]


def test_chunk_refs_match_files_on_disk(fs: Files) -> None:
    payloads = [os.urandom(n) for n in (CS * 2, CS * 5 + 7, 100, CS + 1)]
    for i, data in enumerate(payloads):
        fs.put(b"f%d" % i, data)
        fs.put(b"g%d" % i, data[: len(data) // 2])
    fs.delete(b"f1")
    fs.delete(b"g3")
    assert set(fs.refs()) == fs.on_disk()
    refs = {h: n for h, (n, _, _) in fs.store.content_refs().items()}
    assert all(n > 0 for n in refs.values())
    maps = [fs.digests(fs.store.lookup(fs.store.root_ino, n).ino)
            for n in (b"f0", b"f2", b"f3", b"g0", b"g1", b"g2")]
    want: dict[bytes, int] = {}
    for bmap in maps:
        for h in bmap.values():
            want[h] = want.get(h, 0) + 1
    assert refs == want


# ------------------------------------------------------------------------- gc


def test_gc_removes_strays_and_old_temporaries(fs: Files) -> None:
    keep = os.urandom(2 * CS)
    fs.put(b"keep", keep)
    kept = fs.on_disk()
    chunks = fs.store.chunks
    stray = os.urandom(500)  # a chunk file no record names (crash before commit)
    chunks.put(chunk_hash(stray), stray)
    old_tmp = chunks.write_temp(b"old partial")
    past = time.time() - 3600
    os.utime(old_tmp, (past, past))
    young_tmp = chunks.write_temp(b"being written right now")
    report = fs.store.gc_chunks(min_temp_age_s=60)
    assert report == {"chunks_removed": 1, "tombstones_removed": 0, "temps_removed": 1}
    assert fs.on_disk() == kept
    assert list(chunks.iter_temps()) == [young_tmp]
    assert fs.get(fs.store.lookup(fs.store.root_ino, b"keep").ino) == keep
    assert fs.store.gc_chunks(min_temp_age_s=60)["chunks_removed"] == 0


def test_chunk_refcounts_persist_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    fs = Files(path)
    data = os.urandom(3 * CS)
    fs.put(b"a", data)
    fs.put(b"b", data)
    fs.store.close()
    fs = Files(path)
    try:
        assert set(fs.refs().values()) == {2} and len(fs.on_disk()) == 3
        fs.delete(b"a")
        fs.delete(b"b")
        assert fs.on_disk() == set()
    finally:
        fs.store.close()
