"""POSIX semantics on a real vfsd mount, checked by errno through the os module.

rename (plain, RENAME_NOREPLACE, RENAME_EXCHANGE), rmdir, unlink of open files,
link counts, readdir under concurrent change, statfs, setattr, name length limits
and extended attributes, including the daemon's own `user.vfsd.*` attributes.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import random
import stat
import subprocess
import time
from pathlib import Path

import pytest

import mount_tool
from mount_tool.refs import content_hash

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB
INLINE_MAX = 64 * KiB
CHUNK = 1 * MiB

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_uint,
]
_libc.opendir.restype = _libc.readdir.restype = ctypes.c_void_p
_libc.readdir.argtypes = _libc.telldir.argtypes = _libc.closedir.argtypes = [ctypes.c_void_p]
_libc.telldir.restype = ctypes.c_long
_libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]


def renameat2(old: Path, new: Path, flags: int) -> None:
    """renameat2(2) with `flags`; raises OSError with the kernel's errno."""
    if _libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(old), None, str(new))


def errno_of(fn, *args, **kwargs) -> int:
    """The errno `fn` fails with; fails the test if it succeeds."""
    try:
        fn(*args, **kwargs)
    except OSError as e:
        return e.errno
    raise AssertionError(f"{fn.__name__}{args} succeeded, expected an error")


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def read_uncached(fd: int) -> bytes:
    """Everything behind `fd`, after dropping its page cache so the daemon must answer."""
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    size = os.fstat(fd).st_size
    out = bytearray()
    while len(out) < size:
        piece = os.pread(fd, size - len(out), len(out))
        if not piece:
            break
        out += piece
    return bytes(out)


# ---------------------------------------------------------------- rename


def test_rename_noreplace(run):
    root = run.root
    (root / "a").write_text("A")
    (root / "b").write_text("B")
    assert errno_of(renameat2, root / "a", root / "b", RENAME_NOREPLACE) == errno.EEXIST
    assert (root / "a").read_text() == "A" and (root / "b").read_text() == "B"
    (root / "d").mkdir()
    renameat2(root / "a", root / "d/c", RENAME_NOREPLACE)
    assert not (root / "a").exists() and (root / "d/c").read_text() == "A"


def test_rename_exchange(run):
    root = run.root
    (root / "a").write_text("A")
    big = random_bytes(2 * CHUNK + 3, seed=1)
    (root / "b").write_bytes(big)
    ino_a, ino_b = os.stat(root / "a").st_ino, os.stat(root / "b").st_ino
    renameat2(root / "a", root / "b", RENAME_EXCHANGE)
    assert (root / "a").read_bytes() == big and (root / "b").read_text() == "A"
    assert os.stat(root / "a").st_ino == ino_b and os.stat(root / "b").st_ino == ino_a

    # A file and a non-empty directory in different parents trade places.
    (root / "p1").mkdir()
    (root / "p2/dir").mkdir(parents=True)
    (root / "p2/dir/child").write_text("child")
    (root / "p1/file").write_text("file")
    renameat2(root / "p1/file", root / "p2/dir", RENAME_EXCHANGE)
    assert (root / "p1/file/child").read_text() == "child"
    assert (root / "p2/dir").read_text() == "file"
    assert sorted(os.listdir(root / "p1")) == ["file"]
    assert sorted(os.listdir(root / "p2")) == ["dir"]

    assert errno_of(renameat2, root / "a", root / "missing", RENAME_EXCHANGE) == errno.ENOENT
    assert (
        errno_of(renameat2, root / "a", root / "b", RENAME_EXCHANGE | RENAME_NOREPLACE)
        == errno.EINVAL
    )


def test_rename_over_existing_file_keeps_open_victim_readable(run):
    root = run.root
    (root / "src").write_bytes(b"new content")
    old = random_bytes(CHUNK + 10, seed=2)
    (root / "dst").write_bytes(old)
    ino_src = os.stat(root / "src").st_ino
    fd = os.open(root / "dst", os.O_RDONLY)
    try:
        os.rename(root / "src", root / "dst")
        assert not (root / "src").exists()
        assert (root / "dst").read_bytes() == b"new content"
        assert os.stat(root / "dst").st_ino == ino_src
        assert read_uncached(fd) == old
    finally:
        os.close(fd)
    assert sorted(os.listdir(root)) == ["dst"]


def test_rename_directory_errors(run):
    root = run.root
    (root / "d1/sub").mkdir(parents=True)
    (root / "d1/sub/f").write_text("f")
    (root / "empty").mkdir()
    (root / "full").mkdir()
    (root / "full/x").write_text("x")
    (root / "file").write_text("file")

    assert errno_of(os.rename, root / "d1", root / "full") in (errno.ENOTEMPTY, errno.EEXIST)
    assert errno_of(os.rename, root / "file", root / "empty") == errno.EISDIR
    assert errno_of(os.rename, root / "d1", root / "file") == errno.ENOTDIR
    assert errno_of(os.rename, root / "d1", root / "d1/sub/inside") == errno.EINVAL
    assert errno_of(os.rename, root / "nope", root / "x") == errno.ENOENT

    os.rename(root / "d1", root / "empty")  # a directory may replace an empty one
    assert (root / "empty/sub/f").read_text() == "f"
    assert not (root / "d1").exists()
    assert sorted(os.listdir(root)) == ["empty", "file", "full"]


# ---------------------------------------------------------------- rmdir, unlink


def test_rmdir_and_unlink_errors(run):
    root = run.root
    (root / "d").mkdir()
    (root / "d/f").write_text("x")
    assert errno_of(os.rmdir, root / "d") == errno.ENOTEMPTY
    assert errno_of(os.rmdir, root / "d/f") == errno.ENOTDIR
    assert errno_of(os.unlink, root / "d") == errno.EISDIR
    assert errno_of(os.rmdir, root / "missing") == errno.ENOENT
    assert errno_of(os.mkdir, root / "d") == errno.EEXIST
    assert errno_of(os.open, root / "d/f", os.O_CREAT | os.O_EXCL | os.O_WRONLY) == errno.EEXIST
    assert errno_of(os.open, root / "d/f/x", os.O_RDONLY) == errno.ENOTDIR
    os.unlink(root / "d/f")
    os.rmdir(root / "d")
    assert os.listdir(root) == []


def test_unlink_while_open_keeps_data_until_close(run):
    root = run.root
    big = random_bytes(3 * CHUNK + 5, seed=3)
    small = random_bytes(100, seed=4)
    (root / "big").write_bytes(big)
    (root / "small").write_bytes(small)
    fd_big = os.open(root / "big", os.O_RDWR)
    fd_small = os.open(root / "small", os.O_RDONLY)
    try:
        os.unlink(root / "big")
        os.unlink(root / "small")
        assert not (root / "big").exists() and os.listdir(root) == []
        assert os.fstat(fd_big).st_nlink == 0

        # Reuse the name and churn the store; the open inode must not change.
        (root / "big").write_bytes(random_bytes(3 * CHUNK + 5, seed=5))
        assert read_uncached(fd_big) == big
        assert read_uncached(fd_small) == small

        # Another process opens the unlinked inode through /proc.
        proc = subprocess.run(
            ["sha256sum", f"/proc/{os.getpid()}/fd/{fd_big}"], capture_output=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[0].decode() == hashlib.sha256(big).hexdigest()

        # Still writable, like any open file.
        os.pwrite(fd_big, b"late", len(big))
        assert read_uncached(fd_big) == big + b"late"
    finally:
        os.close(fd_big)
        os.close(fd_small)
    assert (root / "big").read_bytes() == random_bytes(3 * CHUNK + 5, seed=5)


# ---------------------------------------------------------------- links


def test_hard_link_counts(run):
    root = run.root
    (root / "d").mkdir()
    f = root / "f"
    f.write_text("shared")
    assert os.stat(f).st_nlink == 1
    os.link(f, root / "d/g")
    os.link(f, root / "h")
    for p in [f, root / "d/g", root / "h"]:
        assert os.stat(p).st_nlink == 3
    assert len({os.stat(p).st_ino for p in [f, root / "d/g", root / "h"]}) == 1
    with open(root / "h", "a") as out:
        out.write("+more")
    assert (root / "d/g").read_text() == "shared+more"

    os.unlink(f)
    assert os.stat(root / "h").st_nlink == 2
    os.rename(root / "h", root / "d/h2")
    assert os.stat(root / "d/g").st_nlink == 2
    assert errno_of(os.link, root / "d/g", root / "d/h2") == errno.EEXIST
    assert errno_of(os.link, root / "d", root / "dirlink") == errno.EPERM
    assert errno_of(os.link, root / "missing", root / "x") == errno.ENOENT
    os.unlink(root / "d/h2")
    assert os.stat(root / "d/g").st_nlink == 1
    assert (root / "d/g").read_text() == "shared+more"


def test_directory_link_counts(run):
    """A directory has 2 links plus one per subdirectory (its `..` entries)."""
    root = run.root
    (root / "d").mkdir()
    assert os.stat(root / "d").st_nlink == 2
    (root / "d/s1").mkdir()
    (root / "d/s2").mkdir()
    (root / "d/file").write_text("x")
    assert os.stat(root / "d").st_nlink == 4
    os.rmdir(root / "d/s1")
    assert os.stat(root / "d").st_nlink == 3
    os.rename(root / "d/s2", root / "s2")
    assert os.stat(root / "d").st_nlink == 2


# ---------------------------------------------------------------- readdir


def test_readdir_stable_while_entries_change(run):
    d = run.root / "many"
    d.mkdir()
    keep = {f"keep_{i:04d}" for i in range(700)}
    drop = [f"drop_{i:04d}" for i in range(700)]
    subprocess.run(
        "touch keep_{0000..0699} drop_{0000..0699}",
        shell=True,
        executable="/bin/bash",
        cwd=d,
        check=True,
        timeout=120,
    )
    random.Random(9).shuffle(drop)
    added: set[str] = set()
    seen: list[str] = []
    with os.scandir(d) as entries:
        for n, entry in enumerate(entries):
            seen.append(entry.name)
            if n % 10 == 0:
                for _ in range(5):
                    if drop:
                        os.unlink(d / drop.pop())
                # New names sort among the existing ones, before and after the cursor.
                for k in range(3):
                    name = f"keep_{(n * 7 + k * 331) % 700:04d}_new{n}"
                    (d / name).touch()
                    added.add(name)
    dupes = {name for name in seen if seen.count(name) > 1}
    assert not dupes, f"entries returned twice: {sorted(dupes)[:10]}"
    missing = keep - set(seen)
    assert not missing, f"untouched entries never returned: {sorted(missing)[:10]}"
    unknown = set(seen) - keep - {f"drop_{i:04d}" for i in range(700)} - added
    assert not unknown, sorted(unknown)[:10]
    # After the dust settles a fresh listing is exact.
    assert set(os.listdir(d)) == keep | set(drop) | added


def test_rm_r_of_large_directory(run):
    root = run.root
    subprocess.run(
        "mkdir -p big/sub && touch big/f{0000..1999} big/sub/g{000..299} && rm -r big",
        shell=True,
        executable="/bin/bash",
        cwd=root,
        check=True,
        timeout=120,
    )
    assert os.listdir(root) == []
    assert subprocess.run(["ls", "-A"], cwd=root, capture_output=True, check=True).stdout == b""


# ---------------------------------------------------------------- statfs, setattr


def test_statfs(run):
    sv = os.statvfs(run.root)
    assert sv.f_bsize > 0 and sv.f_frsize > 0
    assert sv.f_blocks > 0
    assert 0 <= sv.f_bavail <= sv.f_bfree <= sv.f_blocks
    assert sv.f_favail <= sv.f_ffree <= sv.f_files
    assert sv.f_namemax == 255
    proc = subprocess.run(["df", "-P", str(run.root)], capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(["stat", "-f", str(run.root)], capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_setattr_mode_owner_and_ns_times(run):
    root = run.root
    f = root / "f"
    f.write_text("x")
    (root / "d").mkdir()

    if os.geteuid() == 0:
        os.chown(f, 1234, 5678)
        assert (os.stat(f).st_uid, os.stat(f).st_gid) == (1234, 5678)
        os.chown(f, -1, 42)
        assert (os.stat(f).st_uid, os.stat(f).st_gid) == (1234, 42)
        os.chown(root / "d", 7, 8)
        assert (os.stat(root / "d").st_uid, os.stat(root / "d").st_gid) == (7, 8)

    for mode in [0o640, 0o4755, 0o000, 0o777, 0o600]:
        ctime_before = os.stat(f).st_ctime_ns
        os.chmod(f, mode)
        st = os.stat(f)
        assert stat.S_IMODE(st.st_mode) == mode and stat.S_ISREG(st.st_mode)
        assert st.st_ctime_ns >= ctime_before
    os.chmod(root / "d", 0o1777)
    assert stat.S_IMODE(os.stat(root / "d").st_mode) == 0o1777

    cases = [
        (1_234_567_891_123_456_789, 1_700_000_000_987_654_321),
        (1, 999_999_999),
        (4_000_000_000_000_000_001, 4_000_000_000_000_000_002),  # past 2038
    ]
    for atime_ns, mtime_ns in cases:
        os.utime(f, ns=(atime_ns, mtime_ns))
        st = os.stat(f)
        assert (st.st_atime_ns, st.st_mtime_ns) == (atime_ns, mtime_ns)
    os.utime(root / "d", ns=(11, 22))
    assert (os.stat(root / "d").st_atime_ns, os.stat(root / "d").st_mtime_ns) == (11, 22)

    proc = subprocess.run(
        ["touch", "-m", "-d", "2001-02-03 04:05:06.123456789 UTC", "f"], cwd=root, timeout=30
    )
    assert proc.returncode == 0
    assert os.stat(f).st_mtime_ns == 981173106_123456789

    # Touching with "now" and writing both move mtime forward from an old value.
    before = time.time_ns()
    os.utime(f)
    after = time.time_ns()
    # Kernel timestamps come from a coarse clock, so allow a second either way.
    assert before - 10**9 <= os.stat(f).st_mtime_ns <= after + 10**9
    os.utime(f, ns=(10**18, 10**18))
    with open(f, "a") as out:
        out.write("more")
    assert os.stat(f).st_mtime_ns > 10**18


def test_symlink_times_set_without_following(run):
    root = run.root
    (root / "target").write_text("t")
    os.symlink("target", root / "link")
    os.utime(root / "target", ns=(5, 6))
    os.utime(root / "link", ns=(123_456_789_012, 987_654_321_098), follow_symlinks=False)
    lst = os.lstat(root / "link")
    assert (lst.st_atime_ns, lst.st_mtime_ns) == (123_456_789_012, 987_654_321_098)
    assert os.stat(root / "target").st_mtime_ns == 6


def test_times_before_1970(run):
    f = run.root / "old"
    f.write_text("old")
    os.utime(f, ns=(-1_000_000_001, -86_400 * 10**9 * 365 * 50))
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == (-1_000_000_001, -86_400 * 10**9 * 365 * 50)


def test_truncate_through_setattr_updates_size(run):
    f = run.root / "t"
    f.write_bytes(b"x" * 100)
    os.truncate(f, 10)
    assert os.stat(f).st_size == 10 and f.read_bytes() == b"x" * 10
    os.truncate(f, 2 * CHUNK)
    assert f.read_bytes() == b"x" * 10 + bytes(2 * CHUNK - 10)


# ---------------------------------------------------------------- names


def test_name_length_limits(run):
    root = run.root
    ok_ascii = "a" * 255
    ok_utf8 = "é" * 127 + "a"  # 255 bytes in UTF-8
    assert len(ok_utf8.encode()) == 255
    for name in [ok_ascii, ok_utf8]:
        (root / name).write_text(name)
        assert (root / name).read_text() == name
    (root / ("d" * 255)).mkdir()
    assert set(os.listdir(root)) == {ok_ascii, ok_utf8, "d" * 255}

    long = "b" * 256
    (root / "src").write_text("s")
    checks = {
        "create": lambda: os.open(root / long, os.O_CREAT | os.O_WRONLY, 0o644),
        "mkdir": lambda: os.mkdir(root / long),
        "symlink": lambda: os.symlink("src", root / long),
        "link": lambda: os.link(root / "src", root / long),
        "rename": lambda: os.rename(root / "src", root / long),
        "mknod": lambda: os.mknod(root / long, 0o644 | stat.S_IFREG),
    }
    got = {what: errno_of(fn) for what, fn in checks.items()}
    assert got == {what: errno.ENAMETOOLONG for what in checks}
    assert errno_of(os.stat, root / long) in (errno.ENAMETOOLONG, errno.ENOENT)
    assert (root / "src").read_text() == "s"
    assert set(os.listdir(root)) == {ok_ascii, ok_utf8, "d" * 255, "src"}


def test_names_are_bytes(run):
    root = os.fsencode(run.root)
    names = [b"bin\xff\xfeary", b"new\nline", b" spaced out ", b"-dash", b"\xe2\x98\x83"]
    for i, name in enumerate(names):
        with open(os.path.join(root, name), "wb") as out:
            out.write(b"%d" % i)
    assert set(os.listdir(root)) == set(names)
    for i, name in enumerate(names):
        with open(os.path.join(root, name), "rb") as inp:
            assert inp.read() == b"%d" % i


# ---------------------------------------------------------------- xattrs


def _getfattr(name: str, path: str, cwd: Path) -> bytes:
    proc = subprocess.run(
        ["getfattr", "--absolute-names", "--only-values", "-n", name, path],
        cwd=cwd,
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _setfattr(name: str, value: str, path: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setfattr", "-n", name, "-v", value, path], cwd=cwd, capture_output=True, timeout=30
    )


@pytest.fixture
def xattr_run(run_factory):
    """A mount that answers getxattr (`--xattr-reads`; by default it does not)."""
    return run_factory("xattr-run", "--xattr-reads")


def test_xattrs_with_tools_and_os(xattr_run):
    root = xattr_run.root
    f = root / "f"
    f.write_text("data")
    (root / "d").mkdir()

    assert _setfattr("user.color", "blue", "f", root).returncode == 0
    assert _getfattr("user.color", "f", root) == b"blue"
    dump = subprocess.run(
        ["getfattr", "-d", "f"], cwd=root, capture_output=True, timeout=30
    ).stdout.decode()
    assert 'user.color="blue"' in dump

    binary = bytes(range(256))
    big = random_bytes(16 * KiB, seed=6)
    os.setxattr(f, "user.bin", binary)
    os.setxattr(f, "user.big", big)
    os.setxattr(f, "user.empty", b"")
    assert os.getxattr(f, "user.bin") == binary
    assert os.getxattr(f, "user.big") == big
    assert os.getxattr(f, "user.empty") == b""
    assert {"user.color", "user.bin", "user.big", "user.empty"} <= set(os.listxattr(f))

    os.setxattr(f, "user.color", b"green")
    assert os.getxattr(f, "user.color") == b"green"
    assert errno_of(os.setxattr, f, "user.color", b"red", os.XATTR_CREATE) == errno.EEXIST
    assert errno_of(os.setxattr, f, "user.nope", b"x", os.XATTR_REPLACE) == errno.ENODATA
    assert errno_of(os.getxattr, f, "user.nope") == errno.ENODATA
    assert os.getxattr(f, "user.color") == b"green"

    os.removexattr(f, "user.color")
    assert errno_of(os.getxattr, f, "user.color") == errno.ENODATA
    assert "user.color" not in os.listxattr(f)
    assert errno_of(os.removexattr, f, "user.color") == errno.ENODATA
    assert subprocess.run(["setfattr", "-x", "user.bin", "f"], cwd=root).returncode == 0
    assert "user.bin" not in os.listxattr(f)

    # Directories carry xattrs; hard links share them; rename keeps them.
    os.setxattr(root / "d", "user.dir", b"1")
    assert os.getxattr(root / "d", "user.dir") == b"1"
    os.link(f, root / "d/alias")
    assert os.getxattr(root / "d/alias", "user.big") == big
    os.rename(f, root / "moved")
    assert os.getxattr(root / "moved", "user.big") == big


def test_hash_of_a_file_written_in_place_while_open(xattr_run):
    """A database-like file: pages rewritten in place (hot blocks, hashed in
    a worker thread) while open; its hash must follow every write."""
    root = xattr_run.root
    data = bytearray(random_bytes(3 * CHUNK, seed=12))
    (root / "db").write_bytes(bytes(data))
    fd = os.open(root / "db", os.O_RDWR)
    try:
        for i, off in enumerate([CHUNK + 4096, 2 * CHUNK + 10, CHUNK + 8192, CHUNK + 4096]):
            page = random_bytes(100, seed=20 + i)
            os.pwrite(fd, page, off)
            data[off:off + 100] = page
            os.fsync(fd)
            assert os.getxattr(root / "db", "user.vfsd.hash").decode() == content_hash(
                bytes(data)), i
            ref = json.loads(xattr_run.cli("ref", str(xattr_run.run_dir), "db").stdout)
            assert ref["hash"] == content_hash(bytes(data))
    finally:
        os.close(fd)
    assert os.getxattr(root / "db", "user.vfsd.hash").decode() == content_hash(bytes(data))


def test_vfsd_xattrs(xattr_run):
    run = xattr_run
    root = run.root
    small = random_bytes(100, seed=10)
    big = random_bytes(2 * CHUNK + 1, seed=11)
    (root / "s").write_bytes(small)
    (root / "b").write_bytes(big)

    assert os.getxattr(root / "s", "user.vfsd.tier") == b"inline"
    assert os.getxattr(root / "b", "user.vfsd.tier") == b"chunked"
    assert os.getxattr(root / "s", "user.vfsd.hash").decode() == content_hash(small)
    assert os.getxattr(root / "b", "user.vfsd.hash").decode() == content_hash(big)
    assert _getfattr("user.vfsd.status", "s", root) == b"active"
    assert _getfattr("user.vfsd.pin", "s", root) == b"0"

    assert _setfattr("user.vfsd.status", "done", "s", root).returncode == 0
    assert _getfattr("user.vfsd.status", "s", root) == b"done"
    assert _setfattr("user.vfsd.status", "weird", "s", root).returncode != 0
    assert _getfattr("user.vfsd.status", "s", root) == b"done"
    assert _setfattr("user.vfsd.pin", "1", "s", root).returncode == 0
    assert _getfattr("user.vfsd.pin", "s", root) == b"1"

    # The read-only ones refuse writes and keep their value.
    for name in ["user.vfsd.hash", "user.vfsd.tier"]:
        before = os.getxattr(root / "b", name)
        assert _setfattr(name, "x", "b", root).returncode != 0
        assert os.getxattr(root / "b", name) == before

    # The step stamp follows the daemon's clock on each content change. ("s" is
    # done but pinned, so advancing the step must not evict it.)
    step0 = int(os.getxattr(root / "s", "user.vfsd.step"))
    run.cli("step", str(run.run_dir), str(step0 + 5))
    with open(root / "b", "ab") as out:
        out.write(b"more")
    assert int(os.getxattr(root / "b", "user.vfsd.step")) == step0 + 5
    assert int(os.getxattr(root / "s", "user.vfsd.step")) == step0
    assert os.getxattr(root / "b", "user.vfsd.hash").decode() == content_hash(
        big + b"more"
    )

    # A file changes tier as it grows and shrinks.
    with open(root / "s", "ab") as out:
        out.write(bytes(INLINE_MAX))
    assert os.getxattr(root / "s", "user.vfsd.tier") == b"chunked"
    os.truncate(root / "s", 10)
    assert os.getxattr(root / "s", "user.vfsd.tier") == b"inline"
    assert os.getxattr(root / "s", "user.vfsd.hash").decode() == content_hash(
        small[:10]
    )


def test_readdir_lists_dot_and_dotdot_as_ext4_does(run):
    sub = run.root / "d" / "e"
    sub.mkdir(parents=True)
    for i in range(300):  # more than one reply buffer: the cookies after the dots hold
        (sub / f"f{i:03d}").touch()
    # ls -a: the two entries first, with the inode numbers stat gives them.
    out = subprocess.run(["ls", "-aif", str(sub)], capture_output=True, text=True, check=True,
                         timeout=30).stdout.split("\n")
    listed = [line.split(maxsplit=1) for line in out if line.strip()]
    assert [name for _, name in listed[:2]] == [".", ".."], listed[:3]
    assert int(listed[0][0]) == os.stat(sub).st_ino
    assert int(listed[1][0]) == os.stat(sub.parent).st_ino
    # ls -i stats the dots: readdir's own d_ino must say the same.
    assert _dots(sub) == [os.stat(sub).st_ino, os.stat(sub.parent).st_ino]
    assert _dots(run.root / ".vfsd")[1] == os.stat(run.root).st_ino
    assert sorted(name for _, name in listed[2:]) == [f"f{i:03d}" for i in range(300)]
    # find counts no extra entries, and the root and .vfsd list them too.
    assert subprocess.run(["find", str(sub)], capture_output=True, text=True, check=True,
                          timeout=30).stdout.count("\n") == 301
    for d in (run.root, run.root / ".vfsd", run.root / ".vfsd" / "snapshots"):
        names = subprocess.run(["ls", "-af", str(d)], capture_output=True, text=True,
                               check=True, timeout=30).stdout.split()
        assert names[:2] == [".", ".."] and ".." not in names[2:], (d, names)
    # A listing resumed with seekdir() from telldir() after the dots goes on where it was.
    libc = _libc

    def names(dirp, n):
        return [name for name, _ in _read_entries(dirp, n)]

    dirp = libc.opendir(str(sub).encode())
    try:
        first = names(dirp, 3)
        pos = libc.telldir(dirp)
        after = names(dirp, 2)
        libc.seekdir(dirp, pos)
        assert names(dirp, 2) == after and first[:2] == [".", ".."]
    finally:
        libc.closedir(dirp)


def _read_entries(dirp, n: int) -> list[tuple[str, int]]:
    """The next `n` (name, d_ino) readdir(3) gives."""
    got = []
    for _ in range(n):
        ent = _libc.readdir(dirp)
        assert ent, ctypes.get_errno()
        # struct dirent64: d_ino 8, d_off 8, d_reclen 2, d_type 1, d_name
        got.append((ctypes.string_at(ent + 19).decode(), ctypes.c_uint64.from_address(ent).value))
    return got


def _dots(directory: Path) -> list[int]:
    """d_ino of `.` and `..` as readdir(3) gives them (ls -i stats them instead)."""
    dirp = _libc.opendir(str(directory).encode())
    assert dirp, ctypes.get_errno()
    try:
        got = _read_entries(dirp, 2)
    finally:
        _libc.closedir(dirp)
    assert [name for name, _ in got] == [".", ".."], got
    return [ino for _, ino in got]


def test_dotdot_in_the_snapshot_and_evicted_views_names_the_parent(run_factory):
    """`..` inside `.vfsd/snapshots/sN/a/b` and `.vfsd/evicted/a/b` is the
    directory above, as stat sees it (it named the directory itself)."""
    run = run_factory("dots", "--max-age-steps", "1")
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        m.write("a/b/c/f.txt", "x")
        ident = m.snapshot()["id"]
        assert {r["path"] for r in m.set_step(3)["evicted"]} == {"a/b/c/f.txt"}
        for top in (run.root / ".vfsd" / "snapshots" / ident, run.root / ".vfsd" / "evicted"):
            for d in (top, top / "a", top / "a" / "b", top / "a" / "b" / "c"):
                assert _dots(d) == [os.stat(d).st_ino, os.stat(d.parent).st_ino], d
    finally:
        m.detach()
