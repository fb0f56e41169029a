"""Hot blocks: chunk-file blocks modified in place live in the inode's hot file.

Unit tests on a real store (no FUSE) for the write, read, hash, truncate,
settle and crash paths; then SQLite on a real mount, with a snapshot taken
while the database is open and hot, and checked through the snapshot view.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest
import trio

from vfsd.fsck import fsck
from vfsd.fuse import openfiles
from vfsd.fuse.fs import VfsdOperations
from vfsd.fuse.openfiles import OpenFiles, prepare_blocks
from vfsd.fuse.settle import Settler
from vfsd.snapshots.snapshots import Snapshots
from vfsd.store.content import HOT_REF, LOC_FILE
from vfsd.store.filehash import bytes_hash
from vfsd.store.store import ROOT_INO, Store

CS = 4096
INLINE = 512


def open_store(path: Path) -> tuple[Store, OpenFiles]:
    store = Store(path, chunk_size=CS)
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    files.on_hot_release = lambda ino: None  # as the daemon: settled later, not at release
    return store, files


@pytest.fixture
def vol(tmp_path: Path):
    store, files = open_store(tmp_path / "store")
    yield store, files
    store.close()


def new_file(store: Store, data: bytes, files: OpenFiles) -> int:
    ino = store.create(ROOT_INO, b"db", stat.S_IFREG | 0o644, 0, 0).ino
    of = files.acquire(ino)
    files.write(of, 0, data)
    files.release(of)
    return ino


def test_in_place_write_goes_hot_and_settles(vol) -> None:
    store, files = vol
    data = bytearray(os.urandom(3 * CS + 100))
    ino = new_file(store, bytes(data), files)
    chunks_before = set(store.chunks.iter_all())
    of = files.acquire(ino)
    files.write(of, CS + 10, b"PAGE" * 10)
    data[CS + 10:CS + 50] = b"PAGE" * 10
    # Block 1 is hot: no chunk rewritten, the store says so, its bytes are in the hot file.
    assert store.block_map(ino)[1] == HOT_REF and of.hot == {1}
    assert set(store.chunks.iter_all()) <= chunks_before
    assert store.hot.exists(store.vol, ino)
    assert store.hot_inodes() == [ino]
    for _ in range(50):  # many more page writes: still one hot block, no new chunk
        files.write(of, CS + 200, os.urandom(8))
    files.write(of, CS + 200, bytes(data[CS + 200:CS + 208]))
    assert files.read(of, 0, len(data)) == bytes(data)
    assert files.content_hash(ino) == bytes_hash(bytes(data), CS)
    assert store.file_hash(len(data), store.block_map(ino), ino) == bytes_hash(bytes(data), CS)
    rep = fsck(store)
    assert rep.clean, rep.problems
    files.settle_now(of)
    assert of.hot == set() and store.block_map(ino)[1][16] == LOC_FILE
    assert store.hot_inodes() == []
    # Writing there again costs no copy: the hot file still holds the settled bytes.
    assert of.hot_valid[1] == store.block_map(ino)[1]
    files.write(of, CS, b"x")
    data[CS:CS + 1] = b"x"
    files.release(of)
    assert store.block_map(ino)[1] == HOT_REF  # left for the daemon's settler
    of = files.acquire(ino)
    assert files.read(of, 0, len(data)) == bytes(data)
    files.settle_now(of)
    files.release(of)
    assert not store.hot.exists(store.vol, ino)  # closed and settled: copy dropped
    assert fsck(store, verify=True).clean


def test_truncate_cuts_the_hot_tail_and_grows_with_zeros(vol) -> None:
    store, files = vol
    data = os.urandom(2 * CS)
    ino = new_file(store, data, files)
    of = files.acquire(ino)
    files.write(of, CS + 5, b"hot")
    assert of.hot == {1}
    files.truncate(of, CS + 100)
    files.truncate(of, 2 * CS)
    want = data[:CS] + data[CS:CS + 5] + b"hot" + data[CS + 8:CS + 100] + bytes(CS - 100)
    assert files.read(of, 0, 2 * CS) == want
    files.truncate(of, CS // 2)  # the hot block is gone entirely
    assert of.hot == set()
    files.release(of)
    assert store.block_map(ino).keys() == {0}
    of = files.acquire(ino)
    files.truncate(of, 3 * CS)
    assert files.read(of, 0, 3 * CS) == data[:CS // 2] + bytes(3 * CS - CS // 2)
    files.release(of)
    assert fsck(store).clean


def test_hot_blocks_survive_a_crash(tmp_path: Path) -> None:
    store, files = open_store(tmp_path / "store")
    data = bytearray(os.urandom(4 * CS))
    ino = new_file(store, bytes(data), files)
    of = files.acquire(ino)
    files.write(of, 2 * CS + 7, b"after crash")
    data[2 * CS + 7:2 * CS + 18] = b"after crash"
    # The daemon dies here: no release, no flush, no settle.
    store.env.close()
    store, files = open_store(tmp_path / "store")
    try:
        assert store.hot_inodes() == [ino]
        of = files.acquire(ino)
        assert files.read(of, 0, len(data)) == bytes(data)
        files.settle_now(of)
        files.release(of)
        rep = fsck(store, verify=True)
        assert rep.clean, rep.problems
    finally:
        store.close()


def test_going_hot_commits_a_pending_resize_with_it(tmp_path: Path) -> None:
    """The record that marks a block hot carries the current size, so a grow or
    shrink still buffered must commit with it: a grown file's short tail block
    is stored again at its new length (else the file hash is wrong for good),
    a shrunk file's dropped blocks go (else they come back after a crash)."""
    store, files = open_store(tmp_path / "grow")
    data = os.urandom(CS + CS // 2)
    ino = new_file(store, data, files)
    of = files.acquire(ino)
    files.truncate(of, 3 * CS)
    files.write(of, 10, b"zz")  # block 0 goes hot
    want = bytearray(data + bytes(3 * CS - len(data)))
    want[10:12] = b"zz"
    files.settle_now(of)
    files.release(of)
    assert files.content_hash(ino) == bytes_hash(bytes(want), CS)
    rep = fsck(store, verify=True)
    assert rep.clean, rep.problems
    store.close()

    store, files = open_store(tmp_path / "shrink")
    ino = new_file(store, os.urandom(3 * CS), files)
    of = files.acquire(ino)
    files.truncate(of, CS)
    files.write(of, 10, b"zz")
    assert store.block_map(ino).keys() == {0}
    store.env.close()  # the daemon dies here
    store, files = open_store(tmp_path / "shrink")
    of = files.acquire(ino)
    files.truncate(of, 3 * CS)
    assert files.read(of, CS, 2 * CS) == bytes(2 * CS)
    files.settle_now(of)
    files.release(of)
    assert fsck(store).clean
    store.close()


@pytest.mark.parametrize("change", ["rewrite", "shrink_and_grow"])
def test_a_settle_never_commits_bytes_changed_after_it_read_them(vol, change) -> None:
    """Settling reads a hot block in a worker thread, then commits on the loop
    if nothing changed it meanwhile: a truncate (which forgot the block's write
    count) followed by as many writes as before must still count as a change."""
    store, files = vol
    data = os.urandom(3 * CS)
    ino = new_file(store, data, files)
    of = files.acquire(ino)
    files.write(of, CS + 5, b"old")
    gens, extents, path = files.settle_plan(of)
    prepared = prepare_blocks(store, path, extents, INLINE)  # the worker's read
    if change == "rewrite":
        files.truncate(of, CS)
        new = os.urandom(2 * CS)
        files.write(of, CS, new)
        files.write(of, CS + 5, b"NEW")
        want = data[:CS] + new[:5] + b"NEW" + new[8:]
    else:
        files.truncate(of, CS + 100)
        files.truncate(of, 3 * CS)
        want = data[:CS + 5] + b"old" + data[CS + 8:CS + 100] + bytes(2 * CS - 100)
    files.commit_settled(of, gens, prepared)
    assert files.read(of, 0, 3 * CS) == want
    files.settle_now(of)
    files.release(of)
    of = files.acquire(ino)
    assert files.read(of, 0, 3 * CS) == want
    files.release(of)


def test_a_block_going_hot_again_after_a_restore_reads_zeros_past_its_end(vol) -> None:
    """A settled block's bytes stay in the hot file; after a restore to a
    shorter version, the block going hot again must not show them past its
    end when the file grows."""
    store, files = vol
    snaps = Snapshots(store)
    small = os.urandom(CS + CS // 2)
    ino = new_file(store, small, files)
    first = snaps.create()
    of = files.acquire(ino)
    files.write(of, 0, os.urandom(2 * CS))
    files.write(of, CS + 5, b"hot")
    files.settle_now(of)
    for i in snaps.restore(first["id"])["inodes"]:
        files.reload(i)
    files.write(of, CS + 10, b"W")
    files.write(of, CS + CS // 2 + 100, b"Z")
    want = bytearray(small[CS:] + bytes(101))
    want[10:11] = b"W"
    want[CS // 2 + 100:] = b"Z"
    assert files.read(of, CS, CS) == bytes(want)
    files.release(of)


def test_a_nameless_file_the_settler_holds_is_freed_when_it_lets_go(vol) -> None:
    """The settler holds a handle while it hashes; if the file lost its last
    name and every other handle meanwhile, its release is the last and must
    free the inode (not leave it to the next start)."""
    store, files = vol
    ops = VfsdOperations(store, files)
    settler = Settler(files)

    async def main() -> int:
        ino = store.create(ROOT_INO, b"x", stat.S_IFREG | 0o644, 0, 0).ino
        of = files.acquire(ino)
        files.write(of, 0, os.urandom(3 * CS))
        files.write(of, CS + 1, b"h")
        ops.lookups[ino] = 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(settler.settle_ino, ino)
            await trio.sleep(0)  # the settle is in its worker thread now
            await ops.unlink(ROOT_INO, b"x", None)
            await ops.release(ino)
            await ops.forget([(ino, 1)])
        return ino

    ino = trio.run(main)
    assert ino not in files.files
    assert store.orphans() == []
    assert list(store.chunks.iter_all()) == []


@pytest.mark.fuse
def test_sqlite_on_the_mount_with_a_snapshot_taken_while_it_is_open(run) -> None:
    """SQLite writes pages in place (hot blocks); a snapshot taken with the
    database open and hot holds a consistent database, and so does the live one."""
    from conftest import vfsd_cli

    db = sqlite3.connect(run.root / "app.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    for _ in range(40):
        with db:
            db.executemany("INSERT INTO t (v) VALUES (?)",
                           [(os.urandom(200).hex(),) for _ in range(500)])
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with db:
        db.execute("UPDATE t SET v = 'changed' WHERE k % 7 = 0")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # pages written in place: hot blocks
    assert run.status()["hot_files"] >= 1
    snap = vfsd_cli("snapshot", run.run_dir).stdout.strip()
    assert run.status()["hot_files"] == 0  # the snapshot settled them
    with db:
        db.execute("DELETE FROM t WHERE k % 3 = 0")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    count = db.execute("SELECT count(*) FROM t").fetchone()[0]
    db.close()
    snap_db = sqlite3.connect(f"file:{run.root}/.vfsd/snapshots/{snap}/app.db?mode=ro&immutable=1",
                              uri=True)
    assert snap_db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert snap_db.execute("SELECT count(*) FROM t").fetchone()[0] == 20000
    assert snap_db.execute("SELECT count(*) FROM t WHERE v = 'changed'").fetchone()[0] == 2857
    snap_db.close()
    run.remount()
    db = sqlite3.connect(run.root / "app.db")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == count
    db.close()
    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--json", check=False)
    assert proc.returncode == 0, proc.stdout


def test_hash_of_an_open_hot_file_follows_every_change(vol, monkeypatch) -> None:
    """Hot blocks are hashed again only when written, truncated or re-read
    from the store; every change still shows in the file hash."""
    store, files = vol
    data = bytearray(os.urandom(4 * CS))
    ino = new_file(store, bytes(data), files)
    of = files.acquire(ino)
    for idx in range(4):
        files.write(of, idx * CS + 7, b"hot")
        data[idx * CS + 7:idx * CS + 10] = b"hot"
    assert of.hot == {0, 1, 2, 3}
    reads = []
    real_hash = openfiles.hash_hot_blocks
    monkeypatch.setattr(openfiles, "hash_hot_blocks",
                        lambda cs, path, plan: reads.extend(plan) or real_hash(cs, path, plan))

    assert files.content_hash(ino) == bytes_hash(bytes(data), CS)
    assert len(reads) == 4
    assert files.content_hash(ino) == bytes_hash(bytes(data), CS)
    assert len(reads) == 4  # nothing changed: nothing read

    files.write(of, 2 * CS + 100, b"again")
    data[2 * CS + 100:2 * CS + 105] = b"again"
    assert files.content_hash(ino) == bytes_hash(bytes(data), CS)
    assert len(reads) == 5  # only the written block

    files.truncate(of, 3 * CS + 10)  # the last block shrinks, block 3 keeps 10 bytes
    del data[3 * CS + 10:]
    assert files.content_hash(ino) == bytes_hash(bytes(data), CS)
    files.truncate(of, 4 * CS)  # and grows back as zeros
    data += bytes(4 * CS - len(data))
    assert files.content_hash(ino) == bytes_hash(bytes(data), CS)
    assert files.read(of, 0, len(data)) == bytes(data)
    files.release(of)


def test_hot_blocks_hashed_off_the_loop_keep_only_what_is_current(vol, monkeypatch) -> None:
    """The daemon hashes hot blocks in a worker thread before a file hash; a
    block written (or cut) while the thread read it is hashed again, the
    others are not."""
    store, files = vol
    data = bytearray(os.urandom(3 * CS))
    ino = new_file(store, bytes(data), files)
    of = files.acquire(ino)
    for idx in range(3):
        files.write(of, idx * CS + 1, b"h")
        data[idx * CS + 1] = ord("h")
    path, plan = files.hot_hash_plan(of)
    assert [idx for idx, _, _ in plan] == [0, 1, 2]
    hashed = openfiles.hash_hot_blocks(CS, path, plan)  # as the worker thread does
    files.write(of, CS + 5, b"raced")  # lands before the loop adopts the result
    data[CS + 5:CS + 10] = b"raced"
    files.truncate(of, 2 * CS + 100)
    del data[2 * CS + 100:]
    files.adopt_hot_hashes(of, hashed)
    assert sorted(of.hot_hashes) == [0]

    reads = []
    real_hash = openfiles.hash_hot_blocks
    monkeypatch.setattr(openfiles, "hash_hot_blocks",
                        lambda cs, path, plan: reads.extend(plan) or real_hash(cs, path, plan))
    assert files.content_hash(ino) == bytes_hash(bytes(data), CS)
    assert [idx for idx, _, _ in reads] == [1, 2]
    files.release(of)
