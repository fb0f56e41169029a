"""Unit tests of file content through OpenFiles (write buffers and tiering), no FUSE.

A real Store and chunk directory under tmp_path; a small chunk size (4 KiB) and
inline limit (1 KiB) keep the tier and chunk boundaries cheap to cross, and a
couple of tests use the defaults. The property test compares random write,
truncate, flush and reopen sequences with a bytearray model.
"""

from __future__ import annotations

import os
import random
import stat
import tempfile
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vfsd import DEFAULT_CHUNK_SIZE, DEFAULT_INLINE_MAX
from vfsd.fuse.openfiles import OpenFiles
from vfsd.store.content import LOC_FILE, LOC_LMDB
from vfsd.store.filehash import bytes_hash
from vfsd.store.store import Store

CS = 4096
INLINE = 1024
REG = stat.S_IFREG | 0o644


class Volume:
    """A store plus the OpenFiles layer over it, reopenable like a daemon restart."""

    def __init__(self, path: Path, chunk_size: int = CS, inline_max: int = INLINE,
                 dirty_limit: int = 64 << 20) -> None:
        self.path = path
        self.opts = {"chunk_size": chunk_size, "inline_max": inline_max,
                     "dirty_limit": dirty_limit}
        self.store = Store(path)
        self.files = OpenFiles(self.store, **self.opts)

    def reopen(self) -> None:
        assert not self.files.files, "close files before reopening"
        self.store.close()
        self.store = Store(self.path)
        self.files = OpenFiles(self.store, **self.opts)

    def close(self) -> None:
        self.store.close()

    def new_file(self, name: bytes = b"f") -> int:
        return self.store.create(self.store.root_ino, name, REG, os.getuid(), os.getgid()).ino

    def write(self, ino: int, data: bytes, offset: int = 0) -> None:
        of = self.files.acquire(ino)
        self.files.write(of, offset, data)
        self.files.release(of)

    def truncate(self, ino: int, size: int) -> None:
        of = self.files.acquire(ino)
        self.files.truncate(of, size)
        self.files.release(of)

    def read(self, ino: int) -> bytes:
        of = self.files.acquire(ino)
        try:
            return self.files.read(of, 0, of.inode.size + 10)
        finally:
            self.files.release(of)

    def delete(self, name: bytes) -> None:
        child = self.store.unlink(self.store.root_ino, name)
        self.store.free_inode(child.ino)

    def chunk_files(self) -> set[bytes]:
        return set(self.store.chunks.iter_all())


@pytest.fixture
def vol(tmp_path: Path):
    v = Volume(tmp_path / "store")
    yield v
    v.close()


def blocks_expected(data: bytes, cs: int = CS) -> int:
    """Chunks a file needs: one per block that is not all zeros."""
    return sum(1 for i in range(0, len(data), cs) if data[i:i + cs].count(0) != len(data[i:i + cs]))


def chunk_files_expected(data: bytes, cs: int = CS, inline: int = INLINE) -> int:
    """Distinct blocks big enough to be chunk files (smaller ones live in LMDB)."""
    blocks = {data[i:i + cs] for i in range(0, len(data), cs)}
    return sum(1 for b in blocks if len(b) > inline and b.count(0) != len(b))


def check_stored(vol: Volume, ino: int, data: bytes) -> None:
    """What the store holds for `ino` matches `data`: size, tier, blocks, bytes.

    Each stored block is exactly its extent of the file, named by its
    xxh3-128, in LMDB when small and in a chunk file otherwise.
    """
    inode = vol.store.get_inode(ino)
    cs = vol.files.cs
    assert inode.size == len(data)
    assert inode.inline == (len(data) <= vol.files.inline_max)
    bmap = vol.store.block_map(ino)
    assert len(bmap) == blocks_expected(data, cs) == inode.nblocks
    for idx, ref in bmap.items():
        block = data[idx * cs:(idx + 1) * cs]
        assert ref[:16] == xxhash.xxh3_128_digest(block)
        assert ref[16] == (LOC_LMDB if len(block) <= vol.files.inline_max else LOC_FILE)
        assert vol.store.read_block(ref) == block
    assert vol.read(ino) == data


# ------------------------------------------------------------------ round trips

SIZES = [0, 1, INLINE - 1, INLINE, INLINE + 1, CS - 1, CS, CS + 1,
         3 * CS - 1, 3 * CS, 3 * CS + 1, 10 * CS + 123]


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_one_write(vol: Volume, size: int) -> None:
    data = os.urandom(size)
    ino = vol.new_file()
    vol.write(ino, data)
    check_stored(vol, ino, data)
    vol.reopen()
    check_stored(vol, ino, data)


@pytest.mark.parametrize("size", [INLINE + 1, 3 * CS + 17])
@pytest.mark.parametrize("piece", [1, 100, 1000, CS + 3])
def test_round_trip_many_small_writes(vol: Volume, size: int, piece: int) -> None:
    data = os.urandom(size)
    ino = vol.new_file()
    of = vol.files.acquire(ino)
    for off in range(0, size, piece):
        vol.files.write(of, off, data[off:off + piece])
    assert vol.files.read(of, 0, size) == data  # through the buffers
    vol.files.release(of)
    check_stored(vol, ino, data)


def test_reads_across_boundaries(vol: Volume) -> None:
    data = os.urandom(5 * CS + 300)
    ino = vol.new_file()
    vol.write(ino, data)
    of = vol.files.acquire(ino)
    rng = random.Random(1)
    for _ in range(200):
        off = rng.randrange(0, len(data) + 100)
        n = rng.randrange(0, 3 * CS)
        assert vol.files.read(of, off, n) == data[off:off + n]
    vol.files.release(of)


@pytest.mark.parametrize("size", [DEFAULT_INLINE_MAX, DEFAULT_INLINE_MAX + 1,
                                  DEFAULT_CHUNK_SIZE + 1])
def test_round_trip_default_sizes(tmp_path: Path, size: int) -> None:
    vol = Volume(tmp_path / "store", DEFAULT_CHUNK_SIZE, DEFAULT_INLINE_MAX)
    try:
        data = os.urandom(size)
        ino = vol.new_file()
        of = vol.files.acquire(ino)
        for off in range(0, size, 128 * 1024):  # the kernel's write size
            vol.files.write(of, off, data[off:off + 128 * 1024])
        vol.files.release(of)
        check_stored(vol, ino, data)
        vol.reopen()
        check_stored(vol, ino, data)
    finally:
        vol.close()


def test_dirty_limit_commits_early(tmp_path: Path) -> None:
    vol = Volume(tmp_path / "store", dirty_limit=2 * CS)
    try:
        ino = vol.new_file()
        data = os.urandom(8 * CS + 5)
        of = vol.files.acquire(ino)
        for off in range(0, len(data), 1000):  # never a whole aligned block at once
            vol.files.write(of, off, data[off:off + 1000])
            assert vol.files.dirty_bytes <= 2 * CS + 1000
        assert len(vol.store.block_map(ino)) >= 6  # most of it already committed
        vol.files.release(of)
        assert vol.files.dirty_bytes == 0
        check_stored(vol, ino, data)
    finally:
        vol.close()


# ----------------------------------------------------------------- sparse files


def test_sparse_write_reads_zeros_and_stores_no_hole_chunks(vol: Volume) -> None:
    ino = vol.new_file()
    vol.write(ino, b"tail", offset=5 * CS + 100)
    data = bytes(5 * CS + 100) + b"tail"
    check_stored(vol, ino, data)
    assert list(vol.store.block_map(ino)) == [5]
    c = vol.store.counters()
    assert (c["chunk_count"], c["blob_count"]) == (0, 1)  # 104 bytes: a small object
    assert vol.store.get_inode(ino).nblocks == 1


def test_all_zero_blocks_are_holes(vol: Volume) -> None:
    ino = vol.new_file()
    data = bytearray(os.urandom(4 * CS))
    data[CS:3 * CS] = bytes(2 * CS)  # blocks 1 and 2 written as zeros
    vol.write(ino, bytes(data))
    assert sorted(vol.store.block_map(ino)) == [0, 3]
    assert len(vol.chunk_files()) == 2
    # Overwriting a data block with zeros releases its chunk.
    vol.write(ino, bytes(CS), offset=3 * CS)
    data[3 * CS:] = bytes(CS)
    assert sorted(vol.store.block_map(ino)) == [0]
    assert len(vol.chunk_files()) == 1
    check_stored(vol, ino, bytes(data))


def test_zeros_file_stores_no_chunk(vol: Volume) -> None:
    ino = vol.new_file()
    vol.write(ino, bytes(6 * CS))
    check_stored(vol, ino, bytes(6 * CS))
    assert vol.chunk_files() == set() and vol.store.counters()["chunk_count"] == 0


# --------------------------------------------------------------------- truncate

TRUNCATES = [
    (100, 5000), (5000, 100), (10_000, 4096), (10_000, 4097), (10_000, 8191),
    (9000, 0), (0, 9000), (INLINE, INLINE + 1), (INLINE + 1, INLINE), (3 * CS, 3 * CS + 1),
    (3 * CS + 1, 3 * CS), (7 * CS + 5, CS - 1), (500, 500), (2 * CS, 20 * CS),
]


@pytest.mark.parametrize(("start", "size"), TRUNCATES)
@pytest.mark.parametrize("flush_between", [True, False])
def test_truncate_across_tiers_and_chunks(vol: Volume, start: int, size: int,
                                          flush_between: bool) -> None:
    ino = vol.new_file()
    data = os.urandom(start)
    of = vol.files.acquire(ino)
    vol.files.write(of, 0, data)
    if flush_between:
        vol.files.flush(of)
    vol.files.truncate(of, size)
    want = data[:size].ljust(size, b"\0")
    assert vol.files.read(of, 0, size + 10) == want
    vol.files.release(of)
    check_stored(vol, ino, want)
    c = vol.store.counters()
    assert c["logical_bytes"] == size
    assert c["inline_bytes"] == (size if size <= INLINE else 0)
    assert c["chunk_count"] == len(vol.chunk_files()) == chunk_files_expected(want)


def test_shrink_then_grow_keeps_zeros(vol: Volume) -> None:
    ino = vol.new_file()
    data = os.urandom(6 * CS)
    vol.write(ino, data)
    of = vol.files.acquire(ino)
    vol.files.truncate(of, CS + 10)
    vol.files.truncate(of, 5 * CS)
    vol.files.write(of, 4 * CS, b"x" * 10)
    vol.files.release(of)
    want = data[:CS + 10] + bytes(3 * CS - 10) + b"x" * 10 + bytes(CS - 10)
    check_stored(vol, ino, want)


# ----------------------------------------------------------------------- append


def test_append_rewrites_only_the_last_chunk(vol: Volume) -> None:
    ino = vol.new_file()
    data = os.urandom(10 * CS + 2000)
    vol.write(ino, data)
    before_map = vol.store.block_map(ino)
    before_files = vol.chunk_files()
    before_refs = vol.store.content_refs()
    assert len(before_map) == 11 and len(before_files) == 11

    vol.write(ino, b"appended", offset=len(data))
    after_map = vol.store.block_map(ino)
    after_files = vol.chunk_files()
    assert {i: h for i, h in after_map.items() if i < 10} == {
        i: h for i, h in before_map.items() if i < 10}
    assert after_map[10] != before_map[10]
    assert before_files - after_files == {before_map[10][:16]}
    assert after_files - before_files == {after_map[10][:16]}
    assert len(vol.store.content_refs()) == len(before_refs) == 11
    check_stored(vol, ino, data + b"appended")


def test_append_that_fills_the_last_chunk_and_spills(vol: Volume) -> None:
    ino = vol.new_file()
    data = os.urandom(4 * CS - 10)
    vol.write(ino, data)
    before_map = vol.store.block_map(ino)
    before_files = vol.chunk_files()
    extra = os.urandom(30)
    vol.write(ino, extra, offset=len(data))
    after_map = vol.store.block_map(ino)
    assert {i: after_map[i] for i in range(3)} == {i: before_map[i] for i in range(3)}
    assert before_files - vol.chunk_files() == {before_map[3][:16]}
    # Block 4 holds 20 bytes: a small object in LMDB, not a chunk file.
    assert vol.chunk_files() - before_files == {after_map[3][:16]}
    assert after_map[4][16] == LOC_LMDB
    check_stored(vol, ino, data + extra)


# ------------------------------------------------------------------ content hash


@pytest.mark.parametrize("kind", ["empty", "inline", "chunked", "sparse", "zeros"])
def test_content_hash_is_the_file_hash_of_the_bytes(vol: Volume, kind: str) -> None:
    data = {
        "empty": b"", "inline": os.urandom(700), "chunked": os.urandom(3 * CS + 9),
        "sparse": bytes(2 * CS + 5) + b"end", "zeros": bytes(CS + 1),
    }[kind]
    ino = vol.new_file()
    vol.write(ino, data)
    want = bytes_hash(data, CS)
    assert vol.files.content_hash(ino) == want
    vol.reopen()
    assert vol.files.content_hash(ino) == want


def test_content_hash_of_open_dirty_file_and_after_change(vol: Volume) -> None:
    ino = vol.new_file()
    of = vol.files.acquire(ino)
    vol.files.write(of, 0, b"a" * 5000)
    assert vol.files.content_hash(ino) == bytes_hash(b"a" * 5000, CS)
    vol.files.write(of, 100, b"b")
    want = bytes_hash(b"a" * 100 + b"b" + b"a" * 4899, CS)
    assert vol.files.content_hash(ino) == want
    vol.files.release(of)


# ------------------------------------------------------------- known bugs

def test_truncate_to_zero_then_write_past_zero_reads_zeros(vol: Volume) -> None:
    ino = vol.new_file()
    of = vol.files.acquire(ino)
    vol.files.write(of, 0, b"OLD")
    vol.files.flush(of)
    vol.files.truncate(of, 0)
    vol.files.write(of, 5, b"new")
    assert vol.files.read(of, 0, 8) == bytes(5) + b"new"
    vol.files.release(of)
    assert vol.store.read_block(vol.store.block_map(ino)[0]) == bytes(5) + b"new"


# ------------------------------------------------- link counts of open files


def test_nblocks_matches_stored_chunks(vol: Volume) -> None:
    """st_blocks comes from nblocks: it must follow commits made while open."""
    ino = vol.new_file()
    of = vol.files.acquire(ino)
    vol.files.write(of, 0, os.urandom(3 * CS))
    vol.files.write(of, 3 * CS, os.urandom(CS))
    assert of.inode.nblocks == 4
    vol.files.write(of, 0, bytes(CS))  # block 0 becomes a hole
    vol.files.release(of)
    assert sorted(vol.store.block_map(ino)) == [1, 2, 3]
    assert vol.store.get_inode(ino).nblocks == 3


def test_unlinked_open_file_keeps_working_and_is_not_resurrected(vol: Volume) -> None:
    """Unlink while open, as fs.py does it: store.unlink then names_changed."""
    ino = vol.new_file(b"gone")
    of = vol.files.acquire(ino)
    vol.files.write(of, 0, b"x" * 100)
    vol.files.flush(of)
    child = vol.store.unlink(vol.store.root_ino, b"gone")
    vol.files.names_changed(child)
    vol.files.write(of, 100, os.urandom(2 * CS))  # the program keeps writing its fd
    vol.files.flush(of)
    assert vol.files.read(of, 0, 100) == b"x" * 100
    vol.files.release(of)
    stored = vol.store.get_inode(ino)
    assert stored.nlink == 0 and stored.size == 100 + 2 * CS
    assert vol.store.counters()["files"] == 0
    assert list(vol.store.scan_index("bystep")) == []
    assert vol.store.orphans() == [ino]
    vol.store.free_inode(ino)
    assert not vol.store.inode_exists(ino) and vol.chunk_files() == set()


def test_link_while_open_keeps_both_names(vol: Volume) -> None:
    ino = vol.new_file(b"a")
    of = vol.files.acquire(ino)
    vol.files.names_changed(vol.store.link(ino, vol.store.root_ino, b"b"))
    vol.files.write(of, 0, b"data")
    vol.files.release(of)
    assert vol.store.get_inode(ino).nlink == 2
    assert vol.store.counters()["files"] == 1


# -------------------------------------------------------------- property test

MAX_SIZE = 6 * CS + 300
LONG = os.environ.get("VFSD_LONG") == "1"

offsets = st.one_of(
    st.integers(0, MAX_SIZE),
    st.sampled_from([0, INLINE - 1, INLINE, INLINE + 1, CS - 1, CS, CS + 1, 2 * CS, 3 * CS - 1]),
)
payloads = st.one_of(
    st.binary(min_size=1, max_size=300),
    st.builds(lambda n, b: bytes([b]) * n, st.integers(1, 2 * CS + 10), st.integers(0, 255)),
    st.builds(lambda n: bytes(n), st.integers(1, 2 * CS)),
)
which = st.integers(0, 1)  # two files, so identical blocks share chunks
operations = st.one_of(
    st.tuples(st.just("write"), which, offsets, payloads),
    st.tuples(st.just("truncate"), which, offsets),
    st.tuples(st.just("flush"), which),
    st.tuples(st.just("reopen_file"), which),
    st.tuples(st.just("reopen_store")),
)


def check_buffers(files: OpenFiles) -> None:
    """dirty_bytes equals what the buffers actually hold."""
    held = sum(len(b) for of in files.files.values() for b in of.dirty.values())
    assert files.dirty_bytes == held


def check_store_invariants(vol: Volume, inos: list[int], models: list[bytearray]) -> None:
    """After everything is committed: refcounts, chunk files and counters agree."""
    store = vol.store
    refs = store.content_refs()
    live = {h: n for h, (n, _, _) in refs.items() if n > 0}
    want_refs: dict[bytes, int] = {}
    for ino, model in zip(inos, models, strict=True):
        inode = store.get_inode(ino)
        assert inode.inline == (len(model) <= INLINE) and inode.size == len(model)
        bmap = store.block_map(ino)
        assert inode.nblocks == len(bmap)
        for ref in bmap.values():
            want_refs[ref[:16]] = want_refs.get(ref[:16], 0) + 1
    assert live == want_refs
    files = {h for h in live if refs[h][2] == LOC_FILE}
    assert vol.chunk_files() == files
    c = store.counters()
    assert c["chunk_count"] == len(files)
    assert c["chunk_bytes"] == sum(refs[h][1] for h in files)
    assert c["files"] == 2
    assert c["logical_bytes"] == sum(len(m) for m in models)
    assert c["inline_bytes"] == sum(len(m) for m in models if len(m) <= INLINE)


@settings(max_examples=2000 if LONG else 200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(operations, min_size=1, max_size=40 if LONG else 25))
def test_random_operations_match_a_bytearray_model(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        vol = Volume(Path(tmp) / "store")
        try:
            inos = [vol.new_file(b"a"), vol.new_file(b"b")]
            models = [bytearray(), bytearray()]
            handles = [vol.files.acquire(ino) for ino in inos]
            for op in ops:
                kind = op[0]
                if kind == "write":
                    _, i, off, data = op
                    model = models[i]
                    if len(model) < off:
                        model.extend(bytes(off - len(model)))
                    model[off:off + len(data)] = data
                    assert vol.files.write(handles[i], off, data) == len(data)
                elif kind == "truncate":
                    _, i, size = op
                    del models[i][size:]
                    models[i].extend(bytes(size - len(models[i])))
                    vol.files.truncate(handles[i], size)
                elif kind == "flush":
                    vol.files.flush(handles[op[1]])
                    assert not handles[op[1]].is_dirty
                elif kind == "reopen_file":
                    vol.files.release(handles[op[1]])
                    handles[op[1]] = vol.files.acquire(inos[op[1]])
                else:
                    for of in handles:
                        vol.files.release(of)
                    vol.reopen()
                    handles = [vol.files.acquire(ino) for ino in inos]
                check_buffers(vol.files)
                for of, model in zip(handles, models, strict=True):
                    assert of.inode.size == len(model)
                    assert vol.files.read(of, 0, MAX_SIZE * 2) == bytes(model)
            for of in handles:
                vol.files.release(of)
            assert vol.files.dirty_bytes == 0
            check_store_invariants(vol, inos, models)
            for ino, model in zip(inos, models, strict=True):
                assert vol.files.content_hash(ino) == bytes_hash(bytes(model), CS)
            vol.reopen()
            for ino, model in zip(inos, models, strict=True):
                assert vol.read(ino) == bytes(model)
        finally:
            vol.close()
