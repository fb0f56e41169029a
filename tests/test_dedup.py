"""Content-addressed dedup, seen through `vfsd status --json` and the chunk directory.

Each check is made twice: with the daemon's own counters and with the bytes the
chunk files actually take on disk, so a miscounting daemon cannot pass.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
from pathlib import Path

import pytest
from conftest import vfsd_cli
from pagecache import drop_page_cache

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB
CHUNK = 1 * MiB
SLACK = CHUNK  # allowance for a partial tail chunk and small metadata


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def chunk_files_bytes(store_dir: Path) -> int:
    """Total size of the chunk files under a store directory (temporaries excluded)."""
    total = 0
    chunks = store_dir / "chunks"
    for dirpath, dirnames, filenames in os.walk(chunks):
        if Path(dirpath) == chunks and "tmp" in dirnames:
            dirnames.remove("tmp")
        for name in filenames:
            total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def settle(run) -> None:
    """A sync point (an fsync of the mount's root): the chunk files that
    durable removals no longer name are deleted there, not earlier."""
    fd = os.open(run.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stored_chunk_bytes(status: dict) -> int:
    """Bytes held in the chunk tier according to the daemon."""
    return status["chunk_bytes"]


def read_from_daemon(path: Path) -> bytes:
    """The bytes of `path` with its page cache dropped first, so chunks are really read."""
    drop_page_cache(path)
    return path.read_bytes()


def sh(cmd: str, cwd: Path) -> None:
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, timeout=120)
    assert proc.returncode == 0, f"`{cmd}`: {proc.stderr.decode()}"


def test_two_copies_store_once(run, tmp_path):
    data = random_bytes(8 * MiB, seed=1)
    (tmp_path / "src").write_bytes(data)
    base = run.status()
    base_disk = chunk_files_bytes(run.state_dir)

    sh(f"cp '{tmp_path}/src' a && mkdir sub && cp a sub/b", run.root)
    st = run.status()
    assert st["logical_bytes"] - base["logical_bytes"] == 16 * MiB
    assert st["chunk_count"] - base["chunk_count"] == 8
    grown = stored_chunk_bytes(st) - stored_chunk_bytes(base)
    assert 8 * MiB <= grown <= 8 * MiB + SLACK, grown
    on_disk = chunk_files_bytes(run.state_dir) - base_disk
    assert 8 * MiB <= on_disk <= 8 * MiB + SLACK, on_disk
    digest = hashlib.sha256(data).hexdigest()
    for rel in ["a", "sub/b"]:
        assert hashlib.sha256(read_from_daemon(run.root / rel)).hexdigest() == digest

    # Chunks are released with the last file that uses them, not before.
    os.unlink(run.root / "a")
    assert stored_chunk_bytes(run.status()) - stored_chunk_bytes(base) == grown
    assert read_from_daemon(run.root / "sub/b") == data
    os.unlink(run.root / "sub/b")
    st = run.status()
    assert st["logical_bytes"] == base["logical_bytes"]
    assert st["chunk_count"] == base["chunk_count"]
    assert stored_chunk_bytes(st) == stored_chunk_bytes(base)
    settle(run)
    assert chunk_files_bytes(run.state_dir) == base_disk


def test_overwritten_large_file_releases_its_chunks(run, tmp_path):
    (tmp_path / "src").write_bytes(random_bytes(4 * MiB, seed=4))
    base = run.status()
    base_disk = chunk_files_bytes(run.state_dir)
    sh(f"cp '{tmp_path}/src' f", run.root)
    assert run.status()["chunk_count"] - base["chunk_count"] == 4
    sh("echo small > f", run.root)
    st = run.status()
    assert st["chunk_count"] == base["chunk_count"]
    assert stored_chunk_bytes(st) == stored_chunk_bytes(base)
    settle(run)
    assert chunk_files_bytes(run.state_dir) == base_disk
    assert st["logical_bytes"] - base["logical_bytes"] == 6


def test_repeated_and_zero_chunks_within_files(run):
    block = random_bytes(CHUNK, seed=2)
    base = run.status()
    (run.root / "repeat").write_bytes(block * 8)
    (run.root / "zeros").write_bytes(bytes(16 * MiB))
    with open(run.root / "holes", "wb") as f:
        f.truncate(32 * MiB)
    st = run.status()
    assert st["logical_bytes"] - base["logical_bytes"] == 56 * MiB
    grown = stored_chunk_bytes(st) - stored_chunk_bytes(base)
    # One distinct data chunk, and at most one all-zero chunk.
    assert CHUNK <= grown <= 2 * CHUNK, grown
    assert read_from_daemon(run.root / "repeat") == block * 8
    assert read_from_daemon(run.root / "zeros") == bytes(16 * MiB)
    assert read_from_daemon(run.root / "holes") == bytes(32 * MiB)


def test_small_files_stay_out_of_the_chunk_tier(run):
    base = run.status()
    for i in range(50):
        (run.root / f"s{i}").write_bytes(random_bytes(1000, seed=i))
    st = run.status()
    assert st["chunk_count"] == base["chunk_count"]
    assert st["files"] - base["files"] == 50
    assert st["inline_bytes"] - base["inline_bytes"] == 50_000


def test_dedup_across_run_dirs_sharing_a_store(run_factory, tmp_path):
    store = tmp_path / "shared-store"
    data = random_bytes(8 * MiB, seed=3)
    (tmp_path / "src").write_bytes(data)
    first = run_factory("run-a", "--store", str(store))
    second = run_factory("run-b", "--store", str(store))

    sh(f"cp '{tmp_path}/src' out.bin", first.root)
    after_first = chunk_files_bytes(store)
    sh(f"cp '{tmp_path}/src' copy.bin", second.root)
    after_second = chunk_files_bytes(store)
    assert 8 * MiB <= after_first <= 8 * MiB + SLACK, after_first
    assert after_second == after_first, "the second run stored the same bytes again"

    st_a, st_b = first.status(), second.status()
    assert st_a["logical_bytes"] == st_b["logical_bytes"] == 8 * MiB
    assert stored_chunk_bytes(st_b) == stored_chunk_bytes(st_a)
    assert 8 * MiB <= stored_chunk_bytes(st_b) <= 8 * MiB + SLACK

    # Each run sees only its own files, and removing one keeps the other intact.
    assert os.listdir(first.root) == ["out.bin"]
    assert os.listdir(second.root) == ["copy.bin"]
    os.unlink(first.root / "out.bin")
    assert read_from_daemon(second.root / "copy.bin") == data
    assert chunk_files_bytes(store) == after_first

    # The shared store keeps the chunk across a remount of the run still using it.
    second.remount()
    assert (second.root / "copy.bin").read_bytes() == data


def test_stored_over_logical_reads_as_people_expect(run, run_factory, tmp_path):
    """`vfsd status` said "dedup ratio 2.00x" (logical / stored) for a store
    holding half of what its files hold, and for a volume of a shared store
    divided its own bytes by everyone's. Now: stored / logical, and what dedup
    saved; no ratio where the store's bytes are not this volume's alone."""
    data = random_bytes(8 * MiB, seed=7)
    (tmp_path / "src").write_bytes(data)
    sh(f"cp '{tmp_path}/src' a && cp a b", run.root)
    st = run.status()
    assert "dedup_ratio" not in st
    assert st["store_volumes"] == 1
    assert st["stored_ratio"] == round(st["stored_bytes"] / st["logical_bytes"], 3)
    assert 0.5 <= st["stored_ratio"] <= 0.51, st
    text = vfsd_cli("status", run.run_dir).stdout
    assert "stored / logical     0.50 (saved 50%)" in text, text
    # A second run dir on the same store: the stored bytes are both runs'.
    other = run_factory("other", "--store", str(run.state_dir))
    (other.root / "c").write_bytes(data)
    shared = run.status()
    assert shared["store_volumes"] == 2 and shared["stored_ratio"] is None
    text = vfsd_cli("status", run.run_dir).stdout
    assert "(the whole store: 2 volumes)" in text
    assert "- (the store holds 2 volumes: its stored size is theirs together)" in text
