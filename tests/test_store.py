"""Unit tests of the metadata store (vfsd.store) on a real LMDB environment, no FUSE.

Covers the namespace (create, lookup, readdir cookies, rename, links, unlink and
orphans, path_of), inode number allocation, counters, persistence across reopen,
volumes sharing one store, the volume lock, step indexes and the bounded logs.
Content goes through a real OpenFiles with a small chunk size to keep it fast.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vfsd import errors
from vfsd.errors import StoreLocked
from vfsd.fuse.openfiles import OpenFiles
from vfsd.rundir import lock_volume
from vfsd.store import eventlog
from vfsd.store.inode import STATUS_DONE
from vfsd.store.store import Store

CS = 4096
INLINE = 1024
REG = stat.S_IFREG | 0o644
DIR = stat.S_IFDIR | 0o755
UID, GID = os.getuid(), os.getgid()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path):
    s = Store(store_dir)
    yield s
    s.close()


def mkfile(store: Store, parent: int, name: bytes) -> int:
    return store.create(parent, name, REG, UID, GID).ino


def mkdir(store: Store, parent: int, name: bytes) -> int:
    return store.create(parent, name, DIR, UID, GID).ino


def write_content(store: Store, ino: int, data: bytes, offset: int = 0) -> None:
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    of = files.acquire(ino)
    files.write(of, offset, data)
    files.release(of)


def read_content(store: Store, ino: int) -> bytes:
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)
    of = files.acquire(ino)
    try:
        return files.read(of, 0, of.inode.size)
    finally:
        files.release(of)


def names(store: Store, ino: int) -> list[bytes]:
    return [name for _, name, _ in store.readdir(ino, 0, limit=100_000)]


def chunk_files(store: Store) -> set[bytes]:
    return set(store.chunks.iter_all())


# ------------------------------------------------------------ create / lookup


def test_create_lookup_and_attributes(store: Store) -> None:
    d = mkdir(store, store.root_ino, b"dir")
    f = store.create(d, b"file", REG, UID, GID)
    assert store.lookup(store.root_ino, b"dir").ino == d
    got = store.lookup(d, b"file")
    assert got.ino == f.ino and got.is_reg and got.nlink == 1 and got.size == 0
    assert got.mode == REG and (got.uid, got.gid) == (UID, GID)
    assert got.gen == f.gen
    link = store.create(d, b"ln", stat.S_IFLNK | 0o777, UID, GID, target=b"file")
    assert store.readlink(link.ino) == b"file" and link.size == 4
    with pytest.raises(errors.NotFound):
        store.lookup(d, b"missing")
    with pytest.raises(errors.Exists):
        store.create(d, b"file", REG, UID, GID)
    with pytest.raises(errors.NotADirectory):
        store.create(f.ino, b"x", REG, UID, GID)


@pytest.mark.parametrize("bad", [b"", b".", b"..", b"a/b", b"a\0b"])
def test_create_rejects_bad_names(store: Store, bad: bytes) -> None:
    with pytest.raises(errors.InvalidArgument):
        store.create(store.root_ino, bad, REG, UID, GID)


@pytest.mark.parametrize("target", [b"", b"a\0b", b"x" * 4096], ids=["empty", "nul", "4096"])
def test_create_refuses_a_symlink_target_fsck_would_refuse(store: Store, target: bytes) -> None:
    """The store never makes what its own check (and an import) calls damage:
    a NUL in a target made `vfsd fsck` report the store damaged."""
    with pytest.raises(errors.InvalidArgument):
        store.create(store.root_ino, b"l", stat.S_IFLNK | 0o777, UID, GID, target=target)
    with pytest.raises(errors.NotFound):
        store.lookup(store.root_ino, b"l")
    store.create(store.root_ino, b"l", stat.S_IFLNK | 0o777, UID, GID, target=b"x" * 4095)


def test_name_length_limit(store: Store) -> None:
    mkfile(store, store.root_ino, b"n" * 255)
    with pytest.raises(errors.NameTooLong):
        mkfile(store, store.root_ino, b"n" * 256)


# ------------------------------------------------------------------- readdir


def test_readdir_cookies_are_stable_and_increasing(store: Store) -> None:
    d = mkdir(store, store.root_ino, b"d")
    for i in range(50):
        mkfile(store, d, b"f%03d" % i)
    first = store.readdir(d, 0, limit=1000)
    second = store.readdir(d, 0, limit=1000)
    assert [(c, n) for c, n, _ in first] == [(c, n) for c, n, _ in second]
    cookies = [c for c, _, _ in first]
    assert cookies == sorted(cookies) and len(set(cookies)) == 50 and min(cookies) > 0
    # Resuming after an entry that has since been deleted continues right after it.
    c10, n10, _ = first[10]
    store.unlink(d, n10)
    assert [n for _, n, _ in store.readdir(d, c10, limit=5)] == [n for _, n, _ in first[11:16]]


def test_readdir_paging_under_concurrent_change(store: Store) -> None:
    """Entries added or removed between pages: no untouched entry skipped or repeated."""
    d = mkdir(store, store.root_ino, b"d")
    original = [b"f%03d" % i for i in range(120)]
    for name in original:
        mkfile(store, d, name)
    seen: list[bytes] = []
    touched: set[bytes] = set()
    removed_unseen: set[bytes] = set()
    after = 0
    page = 0
    while True:
        batch = store.readdir(d, after, limit=7)
        if not batch:
            break
        seen += [n for _, n, _ in batch]
        after = batch[-1][0]
        page += 1
        if page > 25:
            continue  # let the listing finish
        # Churn between pages: drop one entry already returned and one still
        # ahead, add a new one, rename one still ahead.
        for victim in (b"f%03d" % (page * 3), b"f%03d" % (119 - page)):
            if victim in original and victim not in touched:
                if victim not in seen:
                    removed_unseen.add(victim)
                store.unlink(d, victim)
                touched.add(victim)
        mkfile(store, d, b"new%03d" % page)
        mover = b"f%03d" % (60 + page)
        if mover not in touched:
            store.rename(d, mover, d, b"moved%03d" % page)
            touched.add(mover)
    untouched = [n for n in original if n not in touched]
    assert page > 10 and len(untouched) > 40
    assert len(seen) == len(set(seen)), "an entry was returned twice"
    assert [n for n in untouched if n not in seen] == [], "untouched entries skipped"
    assert not removed_unseen & set(seen), "entries removed before their page showed up"
    final = set(names(store, d))
    assert final >= set(untouched) and not final & touched


def test_readdir_of_empty_and_unknown(store: Store) -> None:
    d = mkdir(store, store.root_ino, b"empty")
    assert store.readdir(d, 0) == []
    assert store.readdir(999_999, 0) == []


# -------------------------------------------------------------------- rename


def test_rename_plain_and_across_directories(store: Store) -> None:
    root = store.root_ino
    a, b = mkdir(store, root, b"a"), mkdir(store, root, b"b")
    f = mkfile(store, a, b"f")
    assert store.rename(a, b"f", a, b"g") is None
    assert store.lookup(a, b"g").ino == f
    with pytest.raises(errors.NotFound):
        store.lookup(a, b"f")
    store.rename(a, b"g", b, b"h")
    assert store.lookup(b, b"h").ino == f and names(store, a) == []
    assert store.path_of(f) == "b/h"
    # A directory moving between parents moves one link count with it.
    sub = mkdir(store, a, b"sub")
    assert store.get_inode(a).nlink == 3 and store.get_inode(b).nlink == 2
    store.rename(a, b"sub", b, b"sub2")
    assert store.get_inode(a).nlink == 2 and store.get_inode(b).nlink == 3
    assert store.path_of(sub) == "b/sub2"
    with pytest.raises(errors.NotFound):
        store.rename(a, b"nothing", b, b"x")


def test_rename_over_a_file_orphans_it(store: Store) -> None:
    root = store.root_ino
    src, dst = mkfile(store, root, b"src"), mkfile(store, root, b"dst")
    write_content(store, dst, os.urandom(3 * CS))
    before = store.counters()
    replaced = store.rename(root, b"src", root, b"dst")
    assert replaced is not None and replaced.ino == dst and replaced.nlink == 0
    assert store.lookup(root, b"dst").ino == src
    assert names(store, root) == [b"dst"]
    assert store.orphans() == [dst]
    after = store.counters()
    assert after["files"] == before["files"] - 1
    assert after["logical_bytes"] == before["logical_bytes"] - 3 * CS
    # Its content stays until the inode is freed.
    assert after["chunk_count"] == 3 and len(chunk_files(store)) == 3
    store.free_inode(dst)
    assert not store.inode_exists(dst) and store.orphans() == []
    assert store.counters()["chunk_count"] == 0 and chunk_files(store) == set()


def test_rename_over_a_file_with_another_link(store: Store) -> None:
    root = store.root_ino
    mkfile(store, root, b"src")
    dst = mkfile(store, root, b"dst")
    store.link(dst, root, b"other")
    replaced = store.rename(root, b"src", root, b"dst")
    assert replaced.nlink == 1 and store.orphans() == []
    assert store.lookup(root, b"other").ino == dst


def test_rename_type_mismatches(store: Store) -> None:
    root = store.root_ino
    mkfile(store, root, b"f")
    mkdir(store, root, b"d")
    full = mkdir(store, root, b"full")
    mkfile(store, full, b"x")
    with pytest.raises(errors.IsADirectory):
        store.rename(root, b"f", root, b"d")
    with pytest.raises(errors.NotADirectory):
        store.rename(root, b"d", root, b"f")
    with pytest.raises(errors.NotEmpty):
        store.rename(root, b"d", root, b"full")
    assert sorted(names(store, root)) == [b"d", b"f", b"full"]


def test_rename_dir_over_empty_dir(store: Store) -> None:
    root = store.root_ino
    d = mkdir(store, root, b"d")
    e = mkdir(store, root, b"e")
    assert store.get_inode(root).nlink == 4
    replaced = store.rename(root, b"d", root, b"e")
    assert replaced.ino == e and replaced.nlink == 0
    assert store.lookup(root, b"e").ino == d
    assert store.get_inode(root).nlink == 3
    assert e in store.orphans()


def test_rename_noreplace(store: Store) -> None:
    root = store.root_ino
    a, b = mkfile(store, root, b"a"), mkfile(store, root, b"b")
    with pytest.raises(errors.Exists):
        store.rename(root, b"a", root, b"b", noreplace=True)
    assert store.lookup(root, b"a").ino == a and store.lookup(root, b"b").ino == b
    store.rename(root, b"a", root, b"c", noreplace=True)
    assert store.lookup(root, b"c").ino == a


def test_rename_exchange(store: Store) -> None:
    root = store.root_ino
    p, q = mkdir(store, root, b"p"), mkdir(store, root, b"q")
    f = mkfile(store, p, b"f")
    g = mkfile(store, q, b"g")
    assert store.rename(p, b"f", q, b"g", exchange=True) is None
    assert store.lookup(p, b"f").ino == g and store.lookup(q, b"g").ino == f
    assert store.get_inode(f).nlink == 1 and store.get_inode(g).nlink == 1
    assert store.orphans() == []
    # A directory swapped with a file across parents moves one link count.
    sub = mkdir(store, p, b"sub")
    assert store.get_inode(p).nlink == 3 and store.get_inode(q).nlink == 2
    store.rename(p, b"sub", q, b"g", exchange=True)
    assert store.lookup(q, b"g").ino == sub and store.lookup(p, b"sub").ino == f
    assert store.get_inode(p).nlink == 2 and store.get_inode(q).nlink == 3
    assert store.path_of(sub) == "q/g"
    with pytest.raises(errors.NotFound):
        store.rename(p, b"f", q, b"absent", exchange=True)


def test_rename_directory_into_its_own_subtree_is_refused(store: Store) -> None:
    root = store.root_ino
    a = mkdir(store, root, b"a")
    b = mkdir(store, a, b"b")
    c = mkdir(store, b, b"c")
    for parent in (a, b, c):
        with pytest.raises(errors.InvalidArgument):
            store.rename(root, b"a", parent, b"moved")
    other = mkfile(store, root, b"other")
    mkfile(store, c, b"x")
    # An exchange may not put the ancestor below itself either, from either side.
    with pytest.raises(errors.InvalidArgument):
        store.rename(root, b"a", c, b"x", exchange=True)
    with pytest.raises(errors.InvalidArgument):
        store.rename(c, b"x", root, b"a", exchange=True)
    assert store.path_of(c) == "a/b/c" and store.path_of(other) == "other"


def test_rename_between_two_names_of_one_inode_does_nothing(store: Store) -> None:
    root = store.root_ino
    f = mkfile(store, root, b"one")
    store.link(f, root, b"two")
    assert store.rename(root, b"one", root, b"two") is None
    assert sorted(names(store, root)) == [b"one", b"two"]
    assert store.get_inode(f).nlink == 2


# ------------------------------------------------------------- links, unlink


def test_link_counts_files_and_directories(store: Store) -> None:
    root = store.root_ino
    assert store.get_inode(root).nlink == 2
    d = mkdir(store, root, b"d")
    assert store.get_inode(d).nlink == 2 and store.get_inode(root).nlink == 3
    f = mkfile(store, d, b"f")
    store.link(f, root, b"f2")
    store.link(f, d, b"f3")
    assert store.get_inode(f).nlink == 3
    assert store.counters()["files"] == 1  # one file, three names
    with pytest.raises(errors.Exists):
        store.link(f, d, b"f")
    with pytest.raises(errors.StoreError):
        store.link(d, root, b"dlink")
    assert store.unlink(d, b"f").nlink == 2
    assert store.unlink(root, b"f2").nlink == 1
    assert store.orphans() == []
    with pytest.raises(errors.NotEmpty):
        store.unlink(root, b"d", rmdir=True)
    with pytest.raises(errors.IsADirectory):
        store.unlink(root, b"d")
    with pytest.raises(errors.NotADirectory):
        store.unlink(d, b"f3", rmdir=True)
    assert store.unlink(d, b"f3").nlink == 0
    assert store.counters()["files"] == 0
    gone = store.unlink(root, b"d", rmdir=True)
    assert gone.nlink == 0 and store.get_inode(root).nlink == 2


def test_unlink_leaves_an_orphan_until_free_inode(store: Store) -> None:
    root = store.root_ino
    f = mkfile(store, root, b"f")
    data = os.urandom(2 * CS + 10)
    write_content(store, f, data)
    store.set_xattr(f, b"user.k", b"v")
    assert len(chunk_files(store)) == 2  # the 10-byte tail is a small object in LMDB
    child = store.unlink(root, b"f")
    assert child.nlink == 0 and store.orphans() == [f]
    # Still readable by whoever holds it open.
    assert store.get_inode(f).nlink == 0
    assert read_content(store, f) == data
    assert len(chunk_files(store)) == 2
    # free_inode refuses inodes that still have names, and frees nameless ones.
    g = mkfile(store, root, b"g")
    store.free_inode(g)
    assert store.inode_exists(g)
    store.free_inode(f)
    assert not store.inode_exists(f)
    assert store.orphans() == [] and store.get_xattr(f, b"user.k") is None
    assert chunk_files(store) == set() and store.content_refs() == {}
    store.free_inode(f)  # freeing twice is harmless


def test_orphans_survive_reopen(store_dir: Path) -> None:
    s = Store(store_dir)
    f = mkfile(s, s.root_ino, b"f")
    write_content(s, f, os.urandom(CS + 1))
    s.unlink(s.root_ino, b"f")
    s.close()
    s = Store(store_dir)
    try:
        assert s.orphans() == [f]
        for ino in s.orphans():  # what the daemon does at start
            s.free_inode(ino)
        assert s.orphans() == [] and chunk_files(s) == set()
    finally:
        s.close()


def test_inode_numbers_never_reused_across_reopen(store_dir: Path) -> None:
    s = Store(store_dir)
    used = {s.root_ino}
    for i in range(5):
        used.add(mkfile(s, s.root_ino, b"f%d" % i))
    for i in range(5):
        s.unlink(s.root_ino, b"f%d" % i)
    for ino in s.orphans():
        s.free_inode(ino)
    s.close()
    s = Store(store_dir)
    try:
        fresh = [mkfile(s, s.root_ino, b"g%d" % i) for i in range(5)]
        assert not set(fresh) & used
        assert min(fresh) > max(used)
        assert s.counters()["inodes_allocated"] == max(fresh)
    finally:
        s.close()


def test_path_of_and_resolve_path(store: Store) -> None:
    root = store.root_ino
    a = mkdir(store, root, b"a")
    b = mkdir(store, a, b"b")
    f = mkfile(store, b, b"file.txt")
    assert store.path_of(root) == ""
    assert store.path_of(a) == "a"
    assert store.path_of(f) == "a/b/file.txt"
    assert store.resolve_path("a/b/file.txt").ino == f
    assert store.resolve_path("/a/./b/").ino == b
    with pytest.raises(errors.InvalidArgument):
        store.resolve_path("a/../a")
    with pytest.raises(errors.NotFound):
        store.resolve_path("a/nope")
    store.link(f, root, b"top")
    assert store.path_of(f) in ("a/b/file.txt", "top")
    store.unlink(b, b"file.txt")
    assert store.path_of(f) == "top"
    store.unlink(root, b"top")
    assert store.path_of(f) is None
    assert store.path_of(123_456) is None


# ------------------------------------------------------------------ counters


def test_counters_exact_after_a_sequence(store: Store) -> None:
    root = store.root_ino
    files = OpenFiles(store, chunk_size=CS, inline_max=INLINE)

    def expect(**want: int) -> None:
        got = store.counters()
        assert {k: got[k] for k in want} == want

    expect(files=0, logical_bytes=0, inline_bytes=0, chunk_count=0, chunk_bytes=0)
    small = mkfile(store, root, b"small")
    big = mkfile(store, root, b"big")
    mkdir(store, root, b"dir")
    store.create(root, b"sym", stat.S_IFLNK | 0o777, UID, GID, target=b"small")
    expect(files=2, logical_bytes=0, inline_bytes=0, chunk_count=0)

    of = files.acquire(small)
    files.write(of, 0, os.urandom(100))
    files.release(of)
    of = files.acquire(big)
    files.write(of, 0, os.urandom(10_000))  # blocks of 4096, 4096, 1808
    files.release(of)
    expect(files=2, logical_bytes=10_100, inline_bytes=100, chunk_count=3, chunk_bytes=10_000)

    of = files.acquire(big)  # shrink into the inline tier
    files.truncate(of, 500)
    files.release(of)
    expect(files=2, logical_bytes=600, inline_bytes=600, chunk_count=0, chunk_bytes=0)

    of = files.acquire(big)  # grow past inline_max: block 0 stored at its full 4096
    files.truncate(of, 5000)  # bytes (a block's digest covers its whole extent), block 1 a hole
    files.release(of)
    expect(files=2, logical_bytes=5100, inline_bytes=100, chunk_count=1, chunk_bytes=4096)

    store.link(big, root, b"big2")
    expect(files=2, logical_bytes=5100)
    store.unlink(root, b"big")
    expect(files=2, logical_bytes=5100)
    store.unlink(root, b"big2")
    # No names left: out of the file counters, but its chunk is still held.
    expect(files=1, logical_bytes=100, inline_bytes=100, chunk_count=1, chunk_bytes=4096)
    store.free_inode(big)
    expect(files=1, logical_bytes=100, inline_bytes=100, chunk_count=0, chunk_bytes=0)
    store.unlink(root, b"small")
    store.free_inode(small)
    expect(files=0, logical_bytes=0, inline_bytes=0, chunk_count=0, chunk_bytes=0)


# --------------------------------------------------------------- persistence


def test_everything_persists_across_reopen(store_dir: Path) -> None:
    s = Store(store_dir)
    root = s.root_ino
    d = mkdir(s, root, b"dir")
    small, big = mkfile(s, d, b"small"), mkfile(s, root, b"big")
    small_data, big_data = os.urandom(700), os.urandom(3 * CS + 77)
    s.set_step(7)
    write_content(s, small, small_data)
    write_content(s, big, big_data)
    s.create(root, b"sym", stat.S_IFLNK | 0o777, UID, GID, target=b"dir/small")
    s.set_attrs(big, mode=stat.S_IFREG | 0o755, mtime_ns=1_234_567_890_123_456_789,
                status=STATUS_DONE)
    s.set_xattr(big, b"user.note", b"\x00binary\xff")
    tree = {ino: s.get_inode(ino) for ino in (root, d, small, big)}
    counters = s.counters()
    s.close()

    s = Store(store_dir)
    try:
        assert s.root_ino == root
        assert s.resolve_path("dir/small").ino == small
        assert s.readlink(s.lookup(root, b"sym").ino) == b"dir/small"
        assert read_content(s, small) == small_data
        assert read_content(s, big) == big_data
        for ino, before in tree.items():
            assert s.get_inode(ino) == before
        got = s.get_inode(big)
        assert got.mode == stat.S_IFREG | 0o755 and got.mtime_ns == 1_234_567_890_123_456_789
        assert got.step == 7 and got.status == STATUS_DONE and not got.inline
        assert s.get_xattr(big, b"user.note") == b"\x00binary\xff"
        assert s.list_xattrs(big) == [b"user.note"]
        assert s.get_step() == 7
        assert s.counters() == counters
    finally:
        s.close()


def test_readonly_open_sees_data_and_refuses_missing_store(store_dir: Path, tmp_path: Path) -> None:
    s = Store(store_dir)
    f = mkfile(s, s.root_ino, b"f")
    write_content(s, f, b"hello")
    s.close()
    ro = Store(store_dir, readonly=True)
    try:
        ino = ro.lookup(ro.root_ino, b"f").ino
        assert ro.read_block(ro.block_map(ino)[0]) == b"hello"
    finally:
        ro.close()
    with pytest.raises(errors.StoreVersionError):
        Store(tmp_path / "nothing-here", readonly=True)


# ------------------------------------------------------------------- volumes


def test_two_volumes_share_chunks_but_not_names_or_steps(store_dir: Path) -> None:
    data = os.urandom(3 * CS)
    a = Store(store_dir, "run-a")
    fa = mkfile(a, a.root_ino, b"same")
    only_a = mkfile(a, a.root_ino, b"only-in-a")
    a.set_step(5)
    write_content(a, fa, data)
    root_a, vol_a = a.root_ino, a.vol
    a.close()

    b = Store(store_dir, "run-b")
    # Inode numbers are per volume: each has its own root, inode 1.
    assert b.vol != vol_a and b.root_ino == root_a == 1
    assert names(b, b.root_ino) == [] and b.get_step() == 0
    assert b.counters()["files"] == 0
    assert b.counters()["chunk_count"] == 3  # store-wide
    fb = mkfile(b, b.root_ino, b"same")
    write_content(b, fb, data)
    refs = b.content_refs()
    assert len(refs) == 3 and all(count == 2 for count, _, _ in refs.values())
    assert b.counters()["chunk_count"] == 3 and len(chunk_files(b)) == 3
    assert b.get_inode(fb).step == 0 and list(b.scan_index("bystep")) == [(0, fb)]
    b.close()

    a = Store(store_dir, "run-a")
    assert a.root_ino == root_a and a.get_step() == 5
    assert sorted(names(a, a.root_ino)) == [b"only-in-a", b"same"]
    assert list(a.scan_index("bystep")) == [(0, only_a), (5, fa)]
    a.unlink(a.root_ino, b"same")
    a.free_inode(fa)
    assert len(chunk_files(a)) == 3, "volume b still needs the chunks"
    assert all(count == 1 for count, _, _ in a.content_refs().values())
    a.close()

    b = Store(store_dir, "run-b")
    try:
        assert read_content(b, fb) == data
        b.unlink(b.root_ino, b"same")
        b.free_inode(fb)
        assert chunk_files(b) == set() and b.counters()["chunk_count"] == 0
    finally:
        b.close()


def test_two_processes_share_one_store(store_dir: Path) -> None:
    """A second process writing another volume dedups against this one's chunks."""
    data = os.urandom(2 * CS + 5)
    a = Store(store_dir, "run-a")
    try:
        fa = mkfile(a, a.root_ino, b"f")
        write_content(a, fa, data)
        data_file = store_dir.parent / "payload"
        data_file.write_bytes(data)
        script = textwrap.dedent(f"""
            import json, os, stat
            from pathlib import Path
            from vfsd.fuse.openfiles import OpenFiles
            from vfsd.store.store import Store
            s = Store(Path({str(store_dir)!r}), "run-b")
            ino = s.create(s.root_ino, b"f", stat.S_IFREG | 0o644, 0, 0).ino
            files = OpenFiles(s, chunk_size={CS}, inline_max={INLINE})
            of = files.acquire(ino)
            files.write(of, 0, Path({str(data_file)!r}).read_bytes())
            files.release(of)
            print(json.dumps({{"root": s.root_ino, "ino": ino, "files": s.counters()["files"]}}))
            s.close()
        """)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        child = json.loads(proc.stdout.strip().splitlines()[-1])
        assert child["files"] == 1
        # Inode numbers are per volume: the other volume's first file has
        # the same number as ours, and they are different files.
        assert child["root"] == a.root_ino and child["ino"] == fa
        assert read_content(a, fa) == data
        refs = a.content_refs()
        assert len(refs) == 3 and all(count == 2 for count, _, _ in refs.values())
        assert a.counters()["files"] == 1 and names(a, a.root_ino) == [b"f"]
    finally:
        a.close()


def test_volume_lock_conflict(store_dir: Path) -> None:
    fd = lock_volume(store_dir, "run-a")
    try:
        with pytest.raises(StoreLocked, match=f"pid {os.getpid()}"):
            lock_volume(store_dir, "run-a")
        other = lock_volume(store_dir, "run-b")  # another volume is independent
        os.close(other)
    finally:
        os.close(fd)
    again = lock_volume(store_dir, "run-a")  # released with its descriptor
    os.close(again)


# -------------------------------------------------------------- step indexes


class CountingEnv:
    """The store's real LMDB environment, counting the keys its cursors step over.

    It only observes: every call goes to the real environment. Used to show
    that a scan's work follows what it returns, not the size of the index.
    """

    def __init__(self, env) -> None:
        self._env = env
        self.visited = 0

    def begin(self, *args, **kwargs):
        return _CountingTxn(self._env.begin(*args, **kwargs), self)

    def __getattr__(self, name):
        return getattr(self._env, name)


class _CountingTxn:
    def __init__(self, txn, counter: CountingEnv) -> None:
        self._txn = txn
        self._counter = counter

    def __enter__(self):
        self._txn.__enter__()
        return self

    def __exit__(self, *exc):
        return self._txn.__exit__(*exc)

    def cursor(self, *args, **kwargs):
        return _CountingCursor(self._txn.cursor(*args, **kwargs), self._counter)

    def __getattr__(self, name):
        return getattr(self._txn, name)


class _CountingCursor:
    def __init__(self, cur, counter: CountingEnv) -> None:
        self._cur = cur
        self._counter = counter

    def iternext(self, *args, **kwargs):
        for item in self._cur.iternext(*args, **kwargs):
            self._counter.visited += 1
            yield item

    def __iter__(self):
        for item in self._cur:
            self._counter.visited += 1
            yield item

    def __getattr__(self, name):
        return getattr(self._cur, name)


def test_step_indexes_follow_status_pin_and_content(store: Store) -> None:
    root = store.root_ino
    store.set_step(1)
    old = mkfile(store, root, b"old")
    pinned = mkfile(store, root, b"pinned")
    done = mkfile(store, root, b"done")
    mkdir(store, root, b"dir")  # directories are not indexed
    store.set_step(4)
    new = mkfile(store, root, b"new")
    store.set_attrs(pinned, pinned=True)
    store.set_attrs(done, status=STATUS_DONE)

    def scan(index: str, **kw) -> list[tuple[int, int]]:
        return list(store.scan_index(index, **kw))

    assert scan("bystep") == [(1, old), (1, pinned), (1, done), (4, new)]
    assert scan("agestep") == [(1, old), (1, done), (4, new)]
    assert scan("donestep") == [(1, done)]
    assert scan("bystep", before_step=4) == [(1, old), (1, pinned), (1, done)]
    assert scan("bystep", since_step=2) == [(4, new)]
    assert scan("bystep", limit=2) == [(1, old), (1, pinned)]
    # A content change restamps the file with the current step.
    store.set_step(9)
    write_content(store, old, b"changed")
    assert scan("bystep") == [(1, pinned), (1, done), (4, new), (9, old)]
    # Unpinning puts it back; unlinking takes it out of every index.
    store.set_attrs(pinned, pinned=False)
    assert (1, pinned) in scan("agestep")
    store.unlink(root, b"done")
    assert all(ino != done for idx in ("bystep", "agestep", "donestep") for _, ino in scan(idx))


def test_scan_index_cost_follows_what_it_yields(store: Store) -> None:
    root = store.root_ino
    store.set_step(1)
    old = [mkfile(store, root, b"old%d" % i) for i in range(5)]
    store.set_step(50)
    for i in range(2000):
        mkfile(store, root, b"new%04d" % i)
    counting = CountingEnv(store.env)
    store.env = counting
    try:
        got = [ino for _, ino in store.scan_index("agestep", before_step=10)]
        assert got == old
        # The yielded entries plus the one key that ends the range.
        assert counting.visited <= len(old) + 1
        counting.visited = 0
        assert list(store.scan_index("agestep", before_step=1)) == []
        assert counting.visited <= 1
        counting.visited = 0
        assert len(list(store.scan_index("bystep", since_step=50, limit=3))) == 3
        assert counting.visited == 3
    finally:
        store.env = counting._env


# ---------------------------------------------------------------------- logs


def _evict_all(store: Store, inos: list[int], step: int) -> None:
    store.evict([(ino, {"path": store.path_of(ino), "ino": ino, "evicted_step": step,
                        "reason": "max_age", "size": 0}) for ino in inos])


def test_eviction_log_is_bounded(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventlog, "EVICT_LOG_MAX", 20)
    root = store.root_ino
    inos = [mkfile(store, root, b"f%02d" % i) for i in range(35)]
    _evict_all(store, inos[:10], step=1)
    for ino in inos[10:]:
        _evict_all(store, [ino], step=2)
    log = store.eviction_log(limit=1000)
    assert [r["ino"] for r in log] == inos[-20:]
    assert log[0]["path"] == "f15" and log[-1]["reason"] == "max_age"
    assert [r["ino"] for r in store.eviction_log(limit=3)] == inos[-3:]
    assert store.eviction_record(inos[0]) is None  # trimmed away with its log entry
    assert store.eviction_record(inos[-1])["path"] == "f34"
    assert names(store, root) == []
    assert sorted(store.orphans()) == inos


def test_removed_log_records_unlinks_and_evictions(store: Store) -> None:
    root = store.root_ino
    a, b = mkfile(store, root, b"a"), mkfile(store, root, b"b")
    store.set_step(3)
    store.unlink(root, b"a")
    store.set_step(6)
    _evict_all(store, [b], step=6)
    removed = store.removed_since(0)
    assert [(r["ino"], r["step"], r["reason"]) for r in removed] == [
        (a, 3, "unlink"), (b, 6, "max_age")]
    assert [r["ino"] for r in store.removed_since(4)] == [b]
