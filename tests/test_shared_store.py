"""Two run dirs on one store: each volume's open files are its own (issue 9, item 5).

A file whose last name goes (unlink, or eviction) while it is open is an
orphan: its content stays until the last handle closes. Orphans used to be
store-wide, so mounting or unmounting another run dir on the same store
freed them, and the open file's readers and writers got EIO with the data
gone. Now inodes and orphans are per volume.
"""

from __future__ import annotations

import errno
import json
import os
import random
import time

import pytest
from conftest import MountedRun, vfsd_cli

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

MiB = 1 << 20
#: two chunk files and an inline tail
SIZE = 2 * MiB + 1000


def objects(run: MountedRun) -> tuple[int, int]:
    """(chunk_count, blob_count) of the whole store."""
    doc = json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)
    return doc["chunk_count"], doc["blob_count"]


def read_all(fd: int) -> bytes:
    """The file's bytes as the daemon serves them (the kernel's cached pages dropped)."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return os.pread(fd, SIZE + MiB, 0)


def cycle_other_volume(b: MountedRun, i: int) -> None:
    """Mount B, make and drop its own files (one unlinked while open), unmount."""
    b.mount()
    (b.root / f"kept-{i}").write_bytes(b"")
    scratch = b.root / "scratch"
    scratch.write_bytes(random.randbytes(MiB + 10))
    fd = os.open(scratch, os.O_RDONLY)
    scratch.unlink()
    assert len(os.pread(fd, 2 * MiB, 0)) == MiB + 10
    os.close(fd)
    b.umount()


def test_other_volume_never_frees_open_orphans(run_factory, tmp_path):
    # An unlinked file held open is an orphan with handles. (Eviction makes none:
    # it defers open files until their last close.)
    store = str(tmp_path / "store")
    a = run_factory("a", "--store", store)
    b = run_factory("b", "--store", store, mount=False)
    baseline = objects(a)
    path = a.root / "held.bin"
    expected = bytearray(random.randbytes(SIZE))
    path.write_bytes(expected)
    reader = os.open(path, os.O_RDONLY)
    writer = os.open(path, os.O_RDWR)
    try:
        path.unlink()
        assert not path.exists()

        for i in range(3):
            cycle_other_volume(b, i)
            assert read_all(reader) == expected, f"A's reader lost its bytes after B's cycle {i}"
            # The writer changes each block (chunk, chunk, inline tail) and commits.
            for off in (i * 4096, MiB + 77 * i, 2 * MiB + 10 * i):
                patch = random.randbytes(300)
                assert os.pwrite(writer, patch, off) == len(patch)
                expected[off : off + len(patch)] = patch
            os.fsync(writer)
            assert read_all(reader) == expected

        # Once more, after a last cycle of B with the writes committed.
        cycle_other_volume(b, 3)
        assert read_all(writer) == expected
        assert read_all(reader) == expected
    finally:
        os.close(reader)
        os.close(writer)

    # A's last close frees the orphan (the kernel's forget may lag the close).
    deadline = time.monotonic() + 20
    while objects(a) != baseline and time.monotonic() < deadline:
        time.sleep(0.1)
    assert objects(a) == baseline, "the orphan's content outlived its last handle"
    with pytest.raises(OSError) as exc:
        os.stat(path)
    assert exc.value.errno == errno.ENOENT
    a.umount()
    proc = vfsd_cli("fsck", store, "--verify", "--json", check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["clean"], report


def test_startup_check_of_a_store_other_daemons_write(tmp_path):
    """The check a daemon makes before it mounts (vfsd.store.lmdbcheck) on a
    shared store that another process keeps growing: a whole file, never
    "truncated" because the file grew between its size and its metadata."""
    import subprocess
    import sys

    from vfsd.store import lmdbcheck
    from vfsd.store.store import Store

    store = tmp_path / "store"
    Store(store, "one").close()
    writer = subprocess.Popen([sys.executable, "-c", f"""
import lmdb, os
env = lmdb.open({str(store / 'lmdb')!r}, max_dbs=64, map_size=1 << 32)
db = env.open_db(b"grow")
for i in range(1_000_000):
    with env.begin(write=True) as txn:
        txn.put(i.to_bytes(8, "big"), os.urandom(64 * 1024), db=db)
"""])
    try:
        deadline = time.monotonic() + 60
        walks = 0
        while walks < 300 and time.monotonic() < deadline and writer.poll() is None:
            lmdbcheck.walk(store)  # raises Damaged("... truncated ...") on the race
            walks += 1
        assert walks >= 50, f"only {walks} walks while the writer ran"
    finally:
        writer.kill()
        writer.wait()
