"""The order of durable writes (vfsd/durability.py), on a real store.

A machine crash rolls LMDB back to its last sync. These tests take that
durable state (a copy of data.mdb right after a sync), go on writing, and
then open the copy with the chunk files as they are by then: what the
copy names must still be there, and read back as it was.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from vfsd.fsck import fsck
from vfsd.openfiles import OpenFiles
from vfsd.store import ROOT_INO, Store

CS = 4096
INLINE = 512


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
