"""Remount persistence: `vfsd umount` + `vfsd mount` on the same store shows the
same tree, bytes, modes, owners, times, xattrs, symlinks and hard links.

Metadata is compared snapshot to snapshot (lstat before and after, with no reads
in between); content is compared with digests of the bytes the test generated.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB
INLINE_MAX = 64 * KiB
CHUNK = 1 * MiB

FILE_SIZES = [0, 1, 100, INLINE_MAX - 1, INLINE_MAX, INLINE_MAX + 1, CHUNK - 1, CHUNK, CHUNK + 1]


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def walk_paths(root: bytes) -> list[bytes]:
    """Every path under `root` (relative, bytes), the root itself as b'.'."""
    paths = [b"."]
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            paths.append(os.path.normpath(os.path.join(rel_dir, name)))
    return sorted(paths)


def metadata_snapshot(root: Path) -> dict[bytes, dict]:
    """lstat fields and xattrs of every path, without reading any file or link."""
    root_b = os.fsencode(root)
    snap = {}
    for rel in walk_paths(root_b):
        path = os.path.join(root_b, rel)
        st = os.lstat(path)
        entry = {
            "mode": st.st_mode,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "size": st.st_size,
            "nlink": st.st_nlink,
            "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns,
        }
        # The walk itself reads directories and follows symlinks (is_dir), which
        # may legitimately move their atime; regular files are not read here.
        if stat.S_ISREG(st.st_mode):
            entry["atime_ns"] = st.st_atime_ns
        if not stat.S_ISLNK(st.st_mode):
            entry["xattrs"] = {
                name: os.getxattr(path, name, follow_symlinks=False)
                for name in sorted(os.listxattr(path, follow_symlinks=False))
            }
        snap[rel] = entry
    return snap


def content_snapshot(root: Path) -> dict[bytes, str]:
    """sha256 of every regular file, target of every symlink."""
    root_b = os.fsencode(root)
    out = {}
    for rel in walk_paths(root_b):
        path = os.path.join(root_b, rel)
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = "link:" + os.fsdecode(os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                out[rel] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def build_tree(root: Path) -> dict[bytes, str]:
    """Create a varied tree; return the expected content snapshot, computed from our data."""
    expected: dict[bytes, str] = {}

    def put(rel: str, data: bytes, mode: int = 0o644) -> None:
        (root / rel).write_bytes(data)
        os.chmod(root / rel, mode)
        expected[os.fsencode(rel)] = hashlib.sha256(data).hexdigest()

    for d in ["a/b/c", "empty", "sp ace", "ünïcødé", "sticky", "private"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "sticky", 0o1777)
    os.chmod(root / "private", 0o750)

    for i, size in enumerate(FILE_SIZES):
        put(f"a/f{i}", random_bytes(size, seed=200 + i))
    put("a/b/c/big", random_bytes(3 * CHUNK + 5, seed=300))
    put("sp ace/script.sh", b"#!/bin/sh\necho hi\n", 0o755)
    put("private/secret", b"secret\n", 0o600)
    put("a/b/ro", b"read only\n", 0o444)
    put("a/b/suid", b"#!/bin/sh\n", 0o4711)
    put("ünïcødé/ñ.txt", "ünïcødé\n".encode())

    raw_name = os.path.join(os.fsencode(root), b"raw\xff")
    with open(raw_name, "wb") as f:
        f.write(b"raw bytes name")
    expected[b"raw\xff"] = hashlib.sha256(b"raw bytes name").hexdigest()

    # Sparse: 5 MiB long, 10 bytes of data at 3 MiB.
    with open(root / "sparse", "wb") as f:
        f.truncate(5 * MiB)
        f.seek(3 * MiB)
        f.write(b"0123456789")
    sparse = bytearray(5 * MiB)
    sparse[3 * MiB : 3 * MiB + 10] = b"0123456789"
    expected[b"sparse"] = hashlib.sha256(sparse).hexdigest()

    # Hard links: three names, two directories.
    os.link(root / "a/f3", root / "hl1")
    os.link(root / "a/f3", root / "a/b/hl2")
    expected[b"hl1"] = expected[b"a/b/hl2"] = expected[b"a/f3"]

    links = {
        "rel-link": "a/b/c/big",
        "abs-link": "/etc/hostname",
        "dangling": "nowhere/at/all",
        "dir-link": "a/b",
        "long-link": "/".join(f"part{i:03d}" for i in range(150)),
    }
    for name, target in links.items():
        os.symlink(target, root / name)
        expected[os.fsencode(name)] = "link:" + target

    if os.geteuid() == 0:
        os.chown(root / "a/f1", 1234, 5678)
        os.chown(root / "private", 4321, 8765)

    os.setxattr(root / "a/f2", "user.binary", bytes(range(256)))
    os.setxattr(root / "a/f2", "user.empty", b"")
    os.setxattr(root / "a/b/c/big", "user.note", b"large file")
    os.setxattr(root / "a", "user.dir", b"on a directory")
    os.setxattr(root / "a/f4", "user.vfsd.pin", b"1")
    os.setxattr(root / "a/f4", "user.vfsd.status", b"done")

    # Times last, children before parents, since creating entries moves dir mtime.
    for i, rel in enumerate(["a/f0", "a/f5", "a/b/c/big", "sparse", "a/b/c", "a/b", "a"]):
        os.utime(
            root / rel,
            ns=(1_500_000_000_000_000_000 + i * 1_000_001, 1_600_000_000_123_456_789 + i),
        )
    os.utime(
        root / "rel-link",
        ns=(1_000_000_000_000_000_007, 1_000_000_000_000_000_009),
        follow_symlinks=False,
    )
    return expected


def test_remount_keeps_tree_bytes_and_metadata(run_factory):
    run = run_factory("run", "--xattr-reads")  # the snapshot compares xattrs via getxattr
    root = run.root
    expected = build_tree(root)
    before = metadata_snapshot(root)
    assert before[b"hl1"]["nlink"] == 3 and before[b"hl1"]["ino"] == before[b"a/f3"]["ino"]

    run.remount()
    after = metadata_snapshot(root)
    assert sorted(after) == sorted(before)
    diffs = {p: (before[p], after[p]) for p in before if before[p] != after[p]}
    assert not diffs, f"metadata changed across remount: {diffs}"
    assert content_snapshot(root) == expected


def test_changes_after_remount_persist_and_inodes_are_not_reused(run_factory):
    run = run_factory("run", "--xattr-reads")  # the snapshot compares xattrs via getxattr
    root = run.root
    expected = build_tree(root)
    (root / "doomed").write_bytes(b"will be deleted before the remount")
    seen_inos = {v["ino"] for v in metadata_snapshot(root).values()}
    os.unlink(root / "doomed")
    run.remount()

    # Change things on the remounted store, then remount again.
    appended = random_bytes(CHUNK + 3, seed=400)
    with open(root / "a/b/c/big", "ab") as f:
        f.write(appended)
    expected[b"a/b/c/big"] = hashlib.sha256(
        random_bytes(3 * CHUNK + 5, seed=300) + appended
    ).hexdigest()
    os.unlink(root / "hl1")
    del expected[b"hl1"]
    os.rename(root / "a/b", root / "moved")
    expected = {(b"moved" + k[3:] if k.startswith(b"a/b/") else k): v for k, v in expected.items()}
    os.unlink(root / "a/f0")
    del expected[b"a/f0"]
    (root / "new").write_bytes(b"fresh")
    expected[b"new"] = hashlib.sha256(b"fresh").hexdigest()
    os.truncate(root / "a/f8", 10)  # chunked back to inline
    expected[b"a/f8"] = hashlib.sha256(random_bytes(CHUNK + 1, seed=208)[:10]).hexdigest()
    os.setxattr(root / "new", "user.k", b"v")

    new_ino = os.stat(root / "new").st_ino
    assert new_ino not in seen_inos, "inode number reused after remount"

    before = metadata_snapshot(root)
    run.remount()
    after = metadata_snapshot(root)
    diffs = {
        p: (before.get(p), after.get(p))
        for p in set(before) | set(after)
        if before.get(p) != after.get(p)
    }
    assert not diffs, f"metadata changed across remount: {diffs}"
    assert after[b"a/f3"]["nlink"] == 2
    assert after[b"new"]["xattrs"]["user.k"] == b"v"
    assert content_snapshot(root) == expected


@pytest.mark.parametrize("size", [0, INLINE_MAX, INLINE_MAX + 1, 4 * CHUNK + 1])
def test_file_written_then_remounted_reads_back(run, size):
    data = random_bytes(size, seed=500 + size)
    (run.root / "f").write_bytes(data)
    run.remount()
    assert os.stat(run.root / "f").st_size == size
    assert hashlib.sha256((run.root / "f").read_bytes()).digest() == hashlib.sha256(data).digest()
