"""Hostile and bad input: each gets a clear error, and the store stays intact.

Covered: names at and past the 255-byte limit, non-UTF-8 names, deep paths
(past PATH_MAX), files at the quota, a full disk under the chunk directory
(a 20 MB tmpfs; skipped where tmpfs cannot be mounted), a damaged LMDB file at
start, a store remounted with another chunk size, chunk files deleted or
altered behind the daemon's back, bad mount targets (missing, non-empty,
already mounted, a file), a second daemon on the same store, who may read the
socket and the store, and mount_tool paths that try to leave the mount. After
each, `vfsd fsck` on the unmounted store says what the test expects (clean,
unless the test damaged the store on purpose).

Tests marked xfail(strict) are known limits, each described in its reason.
The control socket fed garbage is covered by test_control.py.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import xxhash
from conftest import VFSD, MountedRun, is_mounted, vfsd_cli
from ctl import call, connect

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

KiB = 1024
MiB = 1024 * KiB


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsck(run: MountedRun, *args: str) -> tuple[int, dict]:
    proc = vfsd_cli("fsck", run.run_dir, "--json", *args, check=False)
    assert proc.stdout, f"fsck printed nothing (exit {proc.returncode}): {proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def assert_store_clean(run: MountedRun) -> None:
    """Unmount (if needed) and insist fsck finds nothing at all."""
    if is_mounted(run.root):
        run.umount()
    code, report = fsck(run, "--verify")
    assert code == 0 and report["clean"], report


def write_errno(path: Path | bytes, data: bytes, *, fsync: bool = True) -> int | None:
    """Write a whole file; the errno of the first step that failed, None if all worked.

    With the writeback cache an error may surface at write(), fsync() or close().
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        return exc.errno
    first = None
    try:
        for off in range(0, len(data), MiB):
            os.write(fd, data[off : off + MiB])
        if fsync:
            os.fsync(fd)
    except OSError as exc:
        first = exc.errno
    try:
        os.close(fd)
    except OSError as exc:
        first = first or exc.errno
    return first


def daemon_pid(run: MountedRun) -> int:
    return int((run.state_dir / "vfsd.pid").read_text())


def pid_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while pid_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_running(pid)


# ------------------------------------------------------------------ names


def test_name_length_limit(run):
    root = run.root
    ok, bad = "n" * 255, "m" * 256
    (root / "src").write_bytes(b"src")
    cases = {
        "create": lambda n: (root / n).write_bytes(b"x"),
        "mkdir": lambda n: os.mkdir(root / f"{n[:-1]}d"),
        "symlink": lambda n: os.symlink("src", root / f"{n[:-1]}s"),
        "link": lambda n: os.link(root / "src", root / f"{n[:-1]}l"),
        "rename": lambda n: os.rename(root / "src", root / f"{n[:-1]}r"),
    }
    for what, fn in cases.items():
        with pytest.raises(OSError) as exc:
            fn(bad)
        assert exc.value.errno == errno.ENAMETOOLONG, what
    assert sorted(os.listdir(root)) == ["src"], "a refused name left something behind"
    for fn in cases.values():
        fn(ok)
    names = set(os.listdir(root))
    assert {ok, ok[:-1] + "d", ok[:-1] + "s", ok[:-1] + "l", ok[:-1] + "r"} == names
    assert (root / ok).read_bytes() == b"x"
    assert (root / (ok[:-1] + "l")).read_bytes() == b"src"
    run.remount()
    assert set(os.listdir(root)) == names
    assert_store_clean(run)


NON_UTF8 = [b"\xff\xfe.bin", b"caf\xe9.txt", b"\x80", b"ok-\xc3\x28-bad", b"\xed\xa0\x80surrogate"]


def test_non_utf8_names_round_trip(run):
    root = os.fsencode(run.root)
    contents = {}
    for i, name in enumerate(NON_UTF8):
        contents[name] = f"content {i}".encode()
        with open(os.path.join(root, name), "wb") as f:
            f.write(contents[name])
    os.mkdir(os.path.join(root, b"dir-\xfe"))
    os.rename(os.path.join(root, b"\x80"), os.path.join(root, b"dir-\xfe", b"\x81"))
    contents[b"dir-\xfe/\x81"] = contents.pop(b"\x80")
    os.symlink(b"\xff\xfe.bin", os.path.join(root, b"link-\xff"))

    def check() -> None:
        top = set(os.listdir(root))
        assert top == {n for n in contents if b"/" not in n} | {b"dir-\xfe", b"link-\xff"}
        assert os.listdir(os.path.join(root, b"dir-\xfe")) == [b"\x81"]
        for name, data in contents.items():
            with open(os.path.join(root, name), "rb") as f:
                assert f.read() == data
        assert os.readlink(os.path.join(root, b"link-\xff")) == b"\xff\xfe.bin"

    check()
    # The control plane speaks JSON: such names must not break its replies.
    with connect(run.run_dir) as c:
        assert c.request("changes", since=0)["ok"] is True
        assert c.request("stats")["ok"] is True
    # Eviction logs the path of what it removes.
    os.setxattr(os.path.join(root, b"caf\xe9.txt"), "user.vfsd.status", b"done")
    report = call(run.run_dir, "set_step", step=10)
    assert report["files"] == 1, report
    contents.pop(b"caf\xe9.txt")
    proc = subprocess.run([*VFSD, "evicted", str(run.run_dir)], capture_output=True, timeout=60)
    assert proc.returncode == 0 and b"caf\xe9.txt" in proc.stdout, proc
    run.remount()
    check()
    assert_store_clean(run)


def test_deep_paths_beyond_path_max(run):
    """200 levels of 30-byte names: 6,200 bytes, past PATH_MAX, walked with dir fds."""
    depth, name = 200, "d" * 29
    fds = [os.open(run.root, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fds[-1])
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        fd = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fds[-1])
        os.write(fd, b"at the bottom")
        os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    rel = "/".join([name] * depth + ["leaf.txt"])
    assert len(rel) > 4096
    ref = call(run.run_dir, "ref", path=rel)
    assert ref["size"] == len(b"at the bottom") and ref["path"] == rel
    # A path that long is refused by the kernel itself, never by a crash.
    with pytest.raises(OSError) as exc:
        open(run.root / rel, "rb")
    assert exc.value.errno == errno.ENAMETOOLONG
    run.remount()
    fd = os.open(run.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("leaf.txt", os.O_RDONLY, dir_fd=fd)
        assert os.read(leaf, 100) == b"at the bottom"
        os.close(leaf)
    finally:
        os.close(fd)
    shutil.rmtree(run.root / name)  # fd-based on Linux: fine past PATH_MAX
    assert os.listdir(run.root) == []
    assert_store_clean(run)


# ------------------------------------------------------------------ space


def test_quota_enospc_loses_nothing_else(run_factory):
    run = run_factory("quota", "--quota-bytes", str(1 * MiB))
    root = run.root
    a, b = random.randbytes(600 * KiB), random.randbytes(1 * MiB - 600 * KiB)
    for name, data in (("a", a), ("b", b)):
        assert write_errno(root / name, data) is None, name
        os.setxattr(root / name, "user.vfsd.pin", b"1")  # pinned: eviction cannot help
    # The volume is exactly at its quota; one more byte is refused.
    assert write_errno(root / "c", b"1") == errno.ENOSPC
    assert write_errno(root / "d", random.randbytes(300 * KiB), fsync=False) == errno.ENOSPC
    assert sha((root / "a").read_bytes()) == sha(a)
    assert sha((root / "b").read_bytes()) == sha(b)
    assert run.status()["counters"]["enospc"] >= 2
    # Room again once something goes.
    os.unlink(root / "b")
    assert write_errno(root / "c", b"fits now") is None
    run.remount()
    assert (root / "a").read_bytes() == a and (root / "c").read_bytes() == b"fits now"
    assert_store_clean(run)


@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "close"])
def test_refused_write_is_not_shown(run_factory, fsync):
    """Right after ENOSPC, the mount shows what the store holds, not the refused bytes."""
    run = run_factory("quota", "--quota-bytes", str(64 * KiB))
    root = run.root
    (root / "pinned").write_bytes(b"p" * 60 * KiB)
    os.setxattr(root / "pinned", "user.vfsd.pin", b"1")
    assert write_errno(root / "refused", b"r" * 200 * KiB, fsync=fsync) == errno.ENOSPC
    seen = (os.stat(root / "refused").st_size, (root / "refused").read_bytes())
    run.remount()
    stored = (os.stat(root / "refused").st_size, (root / "refused").read_bytes())
    assert seen == stored, f"shown {seen[0]} bytes, stored {stored[0]}"


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 20 MB tmpfs, for a store that runs out of disk (needs CAP_SYS_ADMIN)."""
    path = tmp_path / "small-disk"
    path.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(disk: Path, leave: int = 0) -> Path:
    """Fill `disk` from outside the mount until only about `leave` bytes are free."""
    filler = disk / f"filler-{len(list(disk.glob('filler-*')))}"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                st = os.statvfs(disk)
                free = st.f_bavail * st.f_frsize
                if free <= leave:
                    break
                f.write(bytes(min(MiB, max(free - leave, 4096))))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_full_store_disk(run_factory, small_disk):
    """A write that does not fit fails; the daemon stays up; nothing else is lost."""
    run = run_factory("full", "--store", str(small_disk))
    run.expect_errors = True  # the daemon logs what it refused
    root = run.root
    rng = random.Random(7)
    kept = {"early.bin": rng.randbytes(3 * MiB), "small.txt": b"small and early"}
    for name, data in kept.items():
        assert write_errno(root / name, data) is None
    filler = fill_disk(small_disk, leave=6 * MiB)
    pid = daemon_pid(run)
    assert write_errno(root / "huge.bin", rng.randbytes(30 * MiB)) in (errno.ENOSPC, errno.EIO)
    for i in range(3):  # more writes while full: refused or not, never a hang or a crash
        write_errno(root / f"more{i}", rng.randbytes(100 * KiB))
    assert pid_running(pid) and call(run.run_dir, "ping")["pong"]
    for name, data in kept.items():
        assert (root / name).read_bytes() == data, f"{name} damaged by the full disk"
    filler.unlink()  # space comes back (see test_full_disk_metadata_ops for why not via the mount)
    os.unlink(root / "huge.bin")
    assert write_errno(root / "after.bin", rng.randbytes(2 * MiB)) is None
    kept["after.bin"] = (root / "after.bin").read_bytes()
    run.remount()
    for name, data in kept.items():
        assert (root / name).read_bytes() == data
    run.umount()
    code, report = fsck(run, "--verify")
    assert not report["damaged_files"], report
    code, report = fsck(run, "--repair")
    assert code == 0 and report["clean_after_repair"], report


def test_full_disk_metadata_ops(run_factory, small_disk):
    run = run_factory("full", "--store", str(small_disk))
    run.expect_errors = True
    (run.root / "old.bin").write_bytes(random.randbytes(2 * MiB))
    filler = fill_disk(small_disk)
    try:
        errnos = set()
        for i in range(100):
            try:
                os.mkdir(run.root / f"{'d' * 200}{i}")
            except OSError as exc:
                errnos.add(exc.errno)
        assert errnos <= {errno.ENOSPC}, f"mkdir on a full disk: {errnos}"
        os.unlink(run.root / "old.bin")  # deleting must work: it is how users make room
    finally:
        filler.unlink()


def write_back(fd: int) -> None:
    """Push a file's dirty pages from the kernel to the daemon without fsync (no commit)."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER
    if libc.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), flags) != 0:
        raise OSError(ctypes.get_errno(), "sync_file_range")


def test_full_disk_leaves_no_temporaries(run_factory, small_disk):
    # 8 MiB chunks: the whole file is one block. An overwrite inside it stays
    # buffered in the daemon until release, when the disk is already full.
    run = run_factory("full", "--store", str(small_disk), "--chunk-size", str(8 * MiB))
    run.expect_errors = True
    (run.root / "buffered.bin").write_bytes(random.randbytes(3 * MiB))
    fd = os.open(run.root / "buffered.bin", os.O_WRONLY)
    os.pwrite(fd, random.randbytes(MiB), MiB)
    write_back(fd)  # the daemon now holds the new bytes, uncommitted
    filler = fill_disk(small_disk)
    try:
        os.close(fd)
    except OSError:
        pass
    # The commit may run at release, after close(): wait until the daemon has tried it.
    deadline = time.monotonic() + 10
    while "buffered.bin" not in run.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    filler.unlink()
    run.umount()
    code, report = fsck(run)
    assert code == 0 and report["clean"], report


# ----------------------------------------------------------- damaged store


def damage_lmdb(path: Path, how: str) -> None:
    size = path.stat().st_size
    if how == "empty":
        os.truncate(path, 0)
    elif how == "truncated":
        os.truncate(path, size // 3)
    elif how == "garbage_meta":
        with open(path, "r+b") as f:
            f.write(random.Random(1).randbytes(8192))
    elif how == "zeroed_pages":
        # Everything past the two meta pages reads as zeros (a lost write-back).
        with open(path, "r+b") as f:
            f.seek(8192)
            f.write(bytes(size - 8192))


@pytest.mark.parametrize(
    "how",
    [
        "garbage_meta",
        "zeroed_pages",
        "truncated",
        "empty",
    ],
)
def test_damaged_lmdb_refused_at_start(tmp_path: Path, how: str):
    run = MountedRun(tmp_path / "run")
    try:
        run.mount()
        (run.root / "big").write_bytes(random.randbytes(2 * MiB))
        for i in range(200):
            (run.root / f"f{i}").write_bytes(b"x" * 100)
        run.umount()
        damage_lmdb(run.state_dir / "lmdb" / "data.mdb", how)
        for attempt in range(2):  # the same answer every time: no crash loop
            proc = vfsd_cli("mount", run.run_dir, check=False, timeout=30)
            assert proc.returncode != 0, f"attempt {attempt}: mounted a damaged store"
            assert "store" in proc.stderr and ("damaged" in proc.stderr or "LMDB" in proc.stderr), (
                proc.stderr
            )
            assert not is_mounted(run.root)
            pid = run.state_dir / "vfsd.pid"
            assert not pid.exists() or not pid_running(int(pid.read_text()))
        proc = vfsd_cli("fsck", run.run_dir, check=False, timeout=30)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc
        assert "problem: the store's LMDB file" in proc.stdout, proc
        assert "fsck: NOT clean" in proc.stdout, proc
    finally:
        run.cleanup()


def test_other_chunk_size_never_returns_wrong_bytes(tmp_path: Path):
    run = MountedRun(tmp_path / "run")
    data = random.randbytes(3 * MiB)
    try:
        run.mount("--chunk-size", str(256 * KiB))
        (run.root / "f").write_bytes(data)
        run.umount()
        proc = vfsd_cli("mount", run.run_dir, check=False)  # default: 1 MiB chunks
        if proc.returncode != 0:
            assert "chunk" in proc.stderr, proc.stderr  # refused, and says why
            return
        assert sha((run.root / "f").read_bytes()) == sha(data)
    finally:
        if is_mounted(run.root):
            vfsd_cli("umount", run.run_dir, check=False)
        run.cleanup()


def chunk_file(run: MountedRun, data: bytes) -> Path:
    digest = xxhash.xxh3_128_digest(data).hex()
    return run.state_dir / "chunks" / digest[:2] / digest


@pytest.fixture
def tampered(run):
    """Two 3 MiB files; block 1 of `gone` deleted, block 1 of `altered` changed, unmounted."""
    rng = random.Random(5)
    data = {"gone": rng.randbytes(3 * MiB), "altered": rng.randbytes(3 * MiB)}
    for name, content in data.items():
        (run.root / name).write_bytes(content)
    run.umount()
    chunk_file(run, data["gone"][MiB : 2 * MiB]).unlink()
    path = chunk_file(run, data["altered"][MiB : 2 * MiB])
    raw = bytearray(path.read_bytes())
    raw[1000] ^= 0x5A
    path.write_bytes(bytes(raw))
    # Remounting drops the daemon's open chunk fds and the kernel's page cache.
    run.mount()
    run.expect_errors = True
    return run, data


def read_blocks(path: Path) -> list[bytes | int]:
    """Each 1 MiB block of a file: its bytes, or the errno reading it gave."""
    out: list[bytes | int] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for blk in range(-(-os.fstat(fd).st_size // MiB)):
            try:
                out.append(os.pread(fd, MiB, blk * MiB))
            except OSError as exc:
                out.append(exc.errno)
    finally:
        os.close(fd)
    return out


def test_deleted_chunk_reads_eio_and_fsck_reports(tampered):
    run, data = tampered
    blocks = read_blocks(run.root / "gone")
    assert blocks[0] == data["gone"][:MiB]
    assert blocks[1] == errno.EIO
    assert blocks[2] == data["gone"][2 * MiB :]
    assert "store_damaged" in run.log_text()
    assert call(run.run_dir, "ping")["pong"]
    run.umount()
    code, report = fsck(run)
    assert code == 1 and report["damaged_files"] == ["gone"], report
    code, report = fsck(run, "--verify")
    assert code == 1 and sorted(report["damaged_files"]) == ["altered", "gone"], report
    # Repair cannot bring content back: still reported, still not clean.
    code, report = fsck(run, "--repair")
    assert code == 1 and "gone" in report["damaged_files"]


def test_altered_chunk_never_returns_wrong_bytes(tampered):
    run, data = tampered
    blocks = read_blocks(run.root / "altered")
    assert blocks[0] == data["altered"][:MiB]
    assert blocks[1] == errno.EIO, "read returned bytes that are not the file's"
    assert "store_damaged" in run.log_text()


# ------------------------------------------------------------ mount targets


def test_mount_creates_missing_dirs(tmp_path: Path):
    run = MountedRun(tmp_path / "not" / "there" / "run")
    try:
        run.mount()
        (run.root / "x").write_bytes(b"x")
        assert_store_clean(run)
    finally:
        run.cleanup()


def test_mount_refuses_non_empty_dir(tmp_path: Path):
    run = MountedRun(tmp_path / "run")
    run.root.mkdir(parents=True)
    (run.root / "precious.txt").write_bytes(b"mine")
    proc = vfsd_cli("mount", run.run_dir, check=False)
    assert proc.returncode != 0 and "not empty" in proc.stderr, proc.stderr
    assert not is_mounted(run.root)
    assert (run.root / "precious.txt").read_bytes() == b"mine"


def test_mount_refuses_file_as_mountpoint(tmp_path: Path):
    run = MountedRun(tmp_path / "run")
    run.run_dir.mkdir()
    run.root.write_bytes(b"a file, not a dir")
    proc = vfsd_cli("mount", run.run_dir, check=False)
    assert run.root.read_bytes() == b"a file, not a dir"
    assert proc.returncode != 0 and "not a directory" in proc.stderr, proc.stderr


def test_mount_refuses_mounted_dir(run):
    (run.root / "f").write_bytes(b"data")
    pid = daemon_pid(run)
    proc = vfsd_cli("mount", run.run_dir, check=False)
    assert proc.returncode != 0 and "already mounted" in proc.stderr, proc.stderr
    assert daemon_pid(run) == pid and pid_running(pid)
    assert (run.root / "f").read_bytes() == b"data"
    run.expect_errors = True  # the refused daemon logs its startup error


def test_second_daemon_on_same_store(run):
    """A daemon still serving a lazily unmounted dir holds the store: others are told who."""
    (run.root / "f").write_bytes(b"data")
    pid = daemon_pid(run)
    run.expect_errors = True
    fd = os.open(run.root / "f", os.O_RDONLY)
    try:
        subprocess.run(["fusermount3", "-u", "-z", str(run.root)], check=True)
        assert not is_mounted(run.root) and pid_running(pid)
        proc = vfsd_cli("mount", run.run_dir, check=False)
        assert proc.returncode != 0 and f"pid {pid}" in proc.stderr, proc.stderr
        assert "in use" in proc.stderr
        proc = vfsd_cli("fsck", run.run_dir, check=False)
        assert proc.returncode != 0 and f"pid {pid}" in proc.stderr, proc.stderr
        assert os.read(fd, 10) == b"data"  # the first daemon still serves its reader
    finally:
        os.close(fd)
    assert wait_gone(pid), "the daemon did not stop after its last reader left"
    run.mount()
    assert (run.root / "f").read_bytes() == b"data"
    assert_store_clean(run)


# ---------------------------------------------------------- who can reach


def test_control_socket_owner_only(run):
    sock = run.state_dir / "vfsd.sock"
    assert sock.stat().st_mode & 0o777 == 0o600


def test_store_not_readable_by_others(tmp_path: Path):
    old = os.umask(0o022)
    run = MountedRun(tmp_path / "run")
    try:
        run.mount()
        fd = os.open(run.root / "secret", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"inline secret")
        os.close(fd)
        run.umount()
    finally:
        os.umask(old)
        run.cleanup()
    exposed = [
        str(p.relative_to(run.run_dir))
        for p in [run.state_dir, *run.state_dir.rglob("*")]
        if p.stat().st_mode & 0o077 and not p.is_socket()
    ]
    assert not exposed, f"readable or searchable by others: {exposed}"


# ------------------------------------------------------------- mount_tool


def test_mount_tool_refuses_paths_that_escape(tmp_path: Path):
    import mount_tool

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"do not touch")
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    m = mount_tool.mount(tmp_path / "run")
    try:
        os.symlink(outside, m.root / "dir_out")
        os.symlink(outside / "secret.txt", m.root / "file_out")
        os.mkdir(m.root / "sub")
        os.symlink("../../outside", m.root / "sub" / "rel_out")
        escapes = [
            "../escape.txt",
            "sub/../../escape.txt",
            str(outside / "new.txt"),
            "dir_out/new.txt",
            "file_out",
            "sub/rel_out/new.txt",
            "/etc/passwd",
            "sub/../../outside/secret.txt",
            "ok\0bad",
        ]
        for path in escapes:
            with pytest.raises(ValueError):
                m.write(path, b"escaped")
            with pytest.raises(ValueError):
                m.ref(path)
            with pytest.raises(ValueError):
                m.set_status(path, "done")
            with pytest.raises(ValueError):
                m.pin(path)
        # The daemon refuses '..' on its own, too.
        with connect(m.run_dir) as c:
            for path in ("../x", "/../x", "sub/../../x"):
                assert c.error("ref", path=path)["code"] == "forbidden"
        # Paths inside still work, including through a symlink that stays inside.
        os.symlink("sub", m.root / "inside_link")
        assert m.write("inside_link/ok.txt", b"fine")["size"] == 4
        assert (m.root / "sub" / "ok.txt").read_bytes() == b"fine"
    finally:
        m.close()
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "run" / "escape.txt").exists()
    code, report = fsck(MountedRun(tmp_path / "run"))
    assert code == 0 and report["clean"], report
