"""Several processes writing and reading a vfsd mount at once, checked by hashes.

Workers are separate Python processes (the kernel and the daemon see truly
concurrent requests); each derives its bytes from a seed, so the parent can
compute every expected digest independently.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pagecache import drop_page_cache

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB
CHUNK = 1 * MiB

# argv: path seed size piece -- write the whole file in `piece`-sized writes.
WRITE_FILE = r"""
import os, random, sys
path, seed, size, piece = sys.argv[1], *map(int, sys.argv[2:5])
data = random.Random(seed).randbytes(size)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for off in range(0, size, piece):
    os.write(fd, data[off:off + piece])
os.close(fd)
"""

# argv: path seed offset length piece -- pwrite one region, pieces in shuffled order.
WRITE_REGION = r"""
import os, random, sys
path, seed, offset, length, piece = sys.argv[1], *map(int, sys.argv[2:6])
data = random.Random(seed).randbytes(length)
starts = list(range(0, length, piece))
random.Random(seed + 1).shuffle(starts)
fd = os.open(path, os.O_WRONLY)
for s in starts:
    os.pwrite(fd, data[s:s + piece], offset + s)
os.close(fd)
"""

# argv: path tag count -- append `count` lines, one write(2) each, with O_APPEND.
APPEND_LINES = r"""
import os, sys
path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
for i in range(count):
    os.write(fd, f"{tag} {i:05d} {'x' * (i % 97)}\n".encode())
os.close(fd)
"""

# argv: path stopfile max_reads -- read `path` whole, print its sha256, until stopfile exists.
READ_LOOP = r"""
import hashlib, os, sys
path, stop, max_reads = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(max_reads):
    done = os.path.exists(stop)
    with open(path, "rb") as f:
        print(hashlib.sha256(f.read()).hexdigest(), flush=True)
    if done:
        break
"""

# argv: dir version_count stopfile -- replace dir/current atomically, version by version.
REPLACE_LOOP = r"""
import os, random, sys
d, versions, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for v in range(1, versions + 1):
    data = random.Random(v).randbytes(200_000 + v * 1_001)
    tmp = os.path.join(d, f".tmp{v}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, os.path.join(d, "current"))
open(stop, "w").close()
"""

# argv: dir prefix count -- create `count` small files named prefix-i with known content.
CREATE_MANY = r"""
import os, sys
d, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(count):
    with open(os.path.join(d, f"{prefix}-{i:04d}"), "w") as f:
        f.write(f"{prefix}:{i}\n" * (1 + i % 50))
"""


def start(script: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[bytes]:
    """Wait for every worker; fail with the stderr of any that failed. Returns stdouts."""
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"worker {p.args[3:]} exited {p.returncode}: {err.decode()}"
        outs.append(out)
    return outs


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)




def sha256_file(path: Path) -> str:
    """Digest of `path` as the daemon serves it (page cache dropped first)."""
    drop_page_cache(path)
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def test_writers_on_different_files_then_parallel_readers(run):
    root = run.root
    specs = [
        (root / f"w{i}.bin", 50 + i, 2 * CHUNK + i * 99_991, [4096, 65537, CHUNK, 777][i % 4])
        for i in range(6)
    ]
    finish([start(WRITE_FILE, path, seed, size, piece) for path, seed, size, piece in specs])

    want = {
        str(path): hashlib.sha256(random_bytes(size, seed)).hexdigest()
        for path, seed, size, _ in specs
    }
    for path in want:
        drop_page_cache(path)
    readers = [
        subprocess.Popen(["sha256sum", *want], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for out in finish(readers):
        got = dict(reversed(line.split(maxsplit=1)) for line in out.decode().splitlines())
        assert got == want


def test_writers_on_disjoint_regions_of_one_file(run):
    """Regions are not chunk- or page-aligned, so neighbours share chunks and pages."""
    path = run.root / "shared.bin"
    region = 700 * KiB + 3
    writers = 5
    with open(path, "wb") as f:
        f.truncate(region * writers)
    finish(
        [
            start(WRITE_REGION, path, 70 + i, i * region, region, 64 * KiB + 1)
            for i in range(writers)
        ]
    )
    want = b"".join(random_bytes(region, 70 + i) for i in range(writers))
    assert os.stat(path).st_size == len(want)
    assert sha256_file(path) == hashlib.sha256(want).hexdigest()
    run.remount()
    assert sha256_file(path) == hashlib.sha256(want).hexdigest()


def test_concurrent_appends_keep_every_line_whole(run):
    path = run.root / "log.txt"
    tags, count = ["alpha", "bravo", "charlie", "delta"], 400
    finish([start(APPEND_LINES, path, tag, count) for tag in tags])
    want = Counter(f"{tag} {i:05d} {'x' * (i % 97)}" for tag in tags for i in range(count))
    drop_page_cache(path)
    text = path.read_text()
    assert text.endswith("\n")
    assert Counter(text.splitlines()) == want
    assert os.stat(path).st_size == sum(len(line) + 1 for line in want.elements())


def test_readers_see_whole_versions_during_atomic_replace(run):
    d = run.root
    versions = 25
    first = random_bytes(200_000, seed=0)
    (d / "current").write_bytes(first)
    known = {hashlib.sha256(first).hexdigest()} | {
        hashlib.sha256(random_bytes(200_000 + v * 1_001, v)).hexdigest()
        for v in range(1, versions + 1)
    }
    stop = d / "stop"
    readers = [start(READ_LOOP, d / "current", stop, 2000) for _ in range(3)]
    writer = start(REPLACE_LOOP, d, versions, stop)
    finish([writer])
    for out in finish(readers):
        seen = out.decode().split()
        assert seen, "reader read nothing"
        torn = set(seen) - known
        assert not torn, f"readers saw {len(torn)} content(s) that were never written"
    last = hashlib.sha256(random_bytes(200_000 + versions * 1_001, versions)).hexdigest()
    assert sha256_file(d / "current") == last
    assert sorted(p.name for p in d.iterdir()) == ["current", "stop"]


def test_parallel_creates_in_one_directory(run):
    d = run.root / "out"
    d.mkdir()
    prefixes, count = ["p0", "p1", "p2", "p3"], 150
    finish([start(CREATE_MANY, d, prefix, count) for prefix in prefixes])
    names = sorted(os.listdir(d))
    assert names == sorted(f"{p}-{i:04d}" for p in prefixes for i in range(count))
    for p in prefixes:
        for i in (0, 49, count - 1):
            drop_page_cache(d / f"{p}-{i:04d}")
            assert (d / f"{p}-{i:04d}").read_text() == f"{p}:{i}\n" * (1 + i % 50)
    proc = subprocess.run(["grep", "-rl", "p2:149", "."], cwd=d, capture_output=True, timeout=60)
    assert proc.stdout.split() == [b"./p2-0149"]


def test_readers_and_writer_on_same_file(run):
    """One process rewrites a file in place while others read it; the end state is exact."""
    path = run.root / "live.bin"
    size = 3 * CHUNK + 11
    path.write_bytes(random_bytes(size, seed=90))
    stop = run.root / "stop"
    readers = [start(READ_LOOP, path, stop, 300) for _ in range(2)]
    writer = start(WRITE_REGION, path, 91, 0, size, 128 * KiB)
    finish([writer])
    stop.touch()
    finish(readers)
    assert sha256_file(path) == hashlib.sha256(random_bytes(size, 91)).hexdigest()
