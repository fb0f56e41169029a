"""The order of durable writes (vfsd/store/durability.py), on a real store.

A machine crash rolls LMDB back to its last sync. These tests take that
durable state (a copy of data.mdb right after a sync), go on writing, and
then open the copy with the chunk files as they are by then: what the
copy names must still be there, and read back as it was.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
from pathlib import Path

import pytest

from vfsd.fsck import fsck
from vfsd.fuse.openfiles import OpenFiles
from vfsd.snapshots.snapshots import Snapshots
from vfsd.store.store import ROOT_INO, Store

CS = 4096
INLINE = 512



@pytest.fixture(autouse=True)
def small_reserve(monkeypatch):
    """Hundreds of stores per run: the 8 MiB disk-full reserve each would make
    is not what these tests are about."""
    monkeypatch.setattr(Store, "RESERVE_BYTES", 64 << 10)

def write_whole(files: OpenFiles, ino: int, data: bytes) -> None:
    of = files.acquire(ino)
    files.truncate(of, 0)
    files.write(of, 0, data)
    files.release(of)


def crash_copy(store_dir: Path, durable_mdb: Path, dest: Path) -> Path:
    """The store as a machine crash would leave it: LMDB as of the last sync,
    the chunk files as they are now."""
    shutil.copytree(store_dir, dest)
    shutil.copyfile(durable_mdb, dest / "lmdb" / "data.mdb")
    (dest / "lmdb" / "lock.mdb").unlink(missing_ok=True)
    return dest


def read_all(store_dir: Path, ino: int, size: int, *, clean: bool = True) -> bytes:
    """The file's bytes; the store must check clean (after a crash, chunk
    files written after the last sync are left over, which fsck repairs)."""
    store = Store(store_dir, chunk_size=CS)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    try:
        of = files.acquire(ino)
        data = files.read(of, 0, size)
        files.release(of)
        rep = fsck(store, verify=True)
        assert rep.clean if clean else not rep.damaged_files, rep.problems
        return data
    finally:
        store.close()


def test_overwritten_chunks_outlive_the_records_that_name_them(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", chunk_size=CS, defer_deletes=True)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    old, new = os.urandom(3 * CS), os.urandom(3 * CS)
    ino = store.create(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0).ino
    write_whole(files, ino, old)
    store.sync()  # what an fsync() of the file ends with
    durable = tmp_path / "durable.mdb"
    shutil.copyfile(tmp_path / "store" / "lmdb" / "data.mdb", durable)
    old_chunks = set(store.chunks.iter_all())

    write_whole(files, ino, new)  # no fsync: the old chunks are only doomed
    assert old_chunks <= set(store.chunks.iter_all())
    assert store.delete_synced() == 0  # nothing may go before a sync
    crashed = crash_copy(tmp_path / "store", durable, tmp_path / "crashed")
    assert read_all(crashed, ino, len(old), clean=False) == old

    store.sync()
    assert store.delete_synced() == len(old_chunks)
    assert not old_chunks & set(store.chunks.iter_all())
    store.close()
    assert read_all(tmp_path / "store", ino, len(new)) == new


def test_a_crash_before_the_deletes_leaves_them_to_the_next_start(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", chunk_size=CS, defer_deletes=True)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    ino = store.create(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0).ino
    write_whole(files, ino, os.urandom(2 * CS))
    write_whole(files, ino, os.urandom(2 * CS))
    assert len(list(store.chunks.iter_all())) == 4
    store.env.close()  # the daemon dies before its sync
    store = Store(tmp_path / "store", chunk_size=CS, defer_deletes=True)
    assert store.finish_deletes() == 2
    assert len(list(store.chunks.iter_all())) == 2
    store.close()
    assert fsck(Store(tmp_path / "store", chunk_size=CS)).clean


def test_a_metadata_only_change_waits_for_the_periodic_sync(tmp_path: Path) -> None:
    """The daemon's sync task syncs only while something is pending: a change
    that names no file (a new empty file) must count, or a machine crash
    could take it however long ago it was made."""
    store = Store(tmp_path / "store", chunk_size=CS, defer_deletes=True)
    store.sync()
    assert not store.durability.pending()
    store.create(ROOT_INO, b"empty", stat.S_IFREG | 0o644, 0, 0)
    assert store.durability.pending()
    store.sync()
    assert not store.durability.pending()
    with store.txn() as txn:  # reading is not a change
        txn.get(b"x")
    assert not store.durability.pending()
    store.close()


SEEDS = 400 if os.environ.get("VFSD_LONG") == "1" else 60


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_histories_crash_back_to_their_last_sync(tmp_path: Path, seed: int) -> None:
    """Whole-file rewrites from a small pool of blocks (so chunks are shared
    between files and versions), deletes, renames over other files,
    snapshots, and syncs with or without the deletes that follow them; then a
    machine crash. The crashed store must hold exactly the files of the last
    sync, all readable, with nothing worse than unreferenced chunk files."""
    rnd = random.Random(seed)
    store = Store(tmp_path / "store", chunk_size=CS, defer_deletes=True)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    snaps = Snapshots(store, keep_last=2, keep_steps=0)
    pool = [rnd.randbytes(CS) for _ in range(5)]
    inos: dict[bytes, int] = {}
    content: dict[bytes, bytes] = {}
    durable, expected = None, {}
    for step in range(40):
        op = rnd.choice(["write"] * 3 + ["delete", "rename", "snapshot", "sync", "sync only"])
        if op == "write":
            name = b"f%d" % rnd.randrange(6)
            if name not in inos:
                inos[name] = store.create(ROOT_INO, name, stat.S_IFREG | 0o644, 0, 0).ino
            if rnd.random() < 0.5:  # blocks shared with other files and versions
                data = b"".join(rnd.choice(pool) for _ in range(rnd.randint(0, 4)))
            else:  # blocks of its own, which a rewrite or delete frees
                data = rnd.randbytes(rnd.randint(1, 3) * CS)
            if rnd.random() < 0.3:
                data += rnd.randbytes(rnd.randint(1, 300))  # an unshared tail
            write_whole(files, inos[name], data)
            content[name] = data
        elif op == "delete" and inos:
            name = rnd.choice(sorted(inos))
            store.free_inode(store.unlink(ROOT_INO, name).ino)
            del inos[name], content[name]
        elif op == "rename" and inos:
            old, new = rnd.choice(sorted(inos)), b"f%d" % rnd.randrange(6)
            if old != new:
                if new in inos:
                    store.free_inode(store.unlink(ROOT_INO, new).ino)
                store.rename(ROOT_INO, old, ROOT_INO, new)
                inos[new], content[new] = inos.pop(old), content.pop(old)
        elif op == "snapshot":
            snaps.create()
        elif op.startswith("sync"):
            store.sync()
            durable = tmp_path / f"durable-{step}.mdb"
            shutil.copyfile(tmp_path / "store" / "lmdb" / "data.mdb", durable)
            expected = dict(content)
            if op == "sync":
                store.delete_synced()
    store.env.close()  # the machine goes down: no close(), no last sync
    if durable is None:
        return
    crashed = crash_copy(tmp_path / "store", durable, tmp_path / "crashed")
    after = Store(crashed, chunk_size=CS)
    try:
        after_files = OpenFiles(after, chunk_size=CS, inline_max=INLINE)
        got = {}
        for name in expected:
            of = after_files.acquire(after.lookup(ROOT_INO, name).ino)
            got[name] = after_files.read(of, 0, of.inode.size)
            after_files.release(of)
        assert got == expected
        rep = fsck(after, verify=True)
        assert not rep.damaged_files
        # Chunk files written after the sync are left over (fsck --repair removes them).
        assert all("without references" in p for p in rep.problems), rep.problems
    finally:
        after.close()
