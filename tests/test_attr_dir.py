"""getxattr switched off (the default) and `.vfsd/attr/PATH`, which replaces it.

Under the writeback cache the kernel asks getxattr("security.capability") before
every write() unless the daemon answered getxattr with ENOSYS once. These tests
check that flushed writes cost no such round trip any more, that setting and
copying attributes still works, and that `.vfsd/attr/` shows every file's
attributes with plain tools and follows the tree as it changes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mount_tool.refs import content_hash

pytestmark = pytest.mark.fuse


def requests(run) -> dict[str, int]:
    return run.status()["requests"]


def attr(root: Path, rel: str) -> dict:
    return json.loads((root / ".vfsd" / "attr" / rel).read_bytes())


def test_flushed_writes_cost_no_getxattr_round_trip(run):
    before = requests(run)
    with open(run.root / "app.log", "w", buffering=1) as f:  # a write() per line
        for i in range(2000):
            f.write(f"line {i}\n")
    after = requests(run)
    asked = after.get("getxattr", 0) - before.get("getxattr", 0)
    # One ENOSYS answer at most, then the kernel never asks again.
    assert asked <= 1, f"getxattr sent {asked} times for 2,000 writes"
    assert (run.root / "app.log").read_text().count("\n") == 2000


def test_getxattr_unsupported_setxattr_still_works(run):
    root = run.root
    f = root / "f"
    f.write_bytes(b"data")
    with pytest.raises(OSError) as exc:
        os.getxattr(f, "user.vfsd.status")
    assert exc.value.errno == errno.EOPNOTSUPP
    assert os.listxattr(f) == []  # nothing listed that cannot be read

    proc = subprocess.run(["setfattr", "-n", "user.vfsd.status", "-v", "done", "f"], cwd=root,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    os.setxattr(f, "user.vfsd.pin", b"1")
    os.setxattr(f, "user.color", b"blue")
    doc = attr(root, "f")
    assert (doc["status"], doc["pin"], doc["xattrs"]) == ("done", True, {"user.color": "blue"})
    # Bad values are still refused, and change nothing.
    with pytest.raises(OSError) as exc:
        os.setxattr(f, "user.vfsd.status", b"finished")
    assert exc.value.errno == errno.EINVAL
    os.removexattr(f, "user.color")
    assert attr(root, "f")["xattrs"] == {}
    assert attr(root, "f")["status"] == "done"


def test_attr_dir_mirrors_the_tree(run):
    root = run.root
    (root / "notes" / "deep").mkdir(parents=True)
    small = b"# plan\n"
    big = os.urandom(3 * 1024 * 1024 + 7)
    (root / "notes" / "plan.md").write_bytes(small)
    (root / "notes" / "deep" / "big.bin").write_bytes(big)
    os.symlink("plan.md", root / "notes" / "link")
    odd = "sp ace\u2603.txt"
    (root / odd).write_bytes(b"x")

    mirror = root / ".vfsd" / "attr"
    assert sorted(os.listdir(root / ".vfsd")) == ["accesslog", "attr", "evicted",
                                                  "evicted.ndjson", "snapshots", "status.json"]
    assert sorted(os.listdir(mirror)) == sorted(["notes", odd])
    assert sorted(os.listdir(mirror / "notes")) == ["deep", "plan.md"]  # no symlinks
    assert (mirror / "notes").is_dir() and (mirror / "notes" / "plan.md").is_file()

    doc = attr(root, "notes/plan.md")
    assert doc["path"] == "notes/plan.md"
    assert doc["hash"] == content_hash(small)
    assert (doc["tier"], doc["size"], doc["status"], doc["pin"]) == ("inline", 7, "active", False)
    assert doc["ino"] == os.stat(root / "notes" / "plan.md").st_ino
    big_doc = attr(root, "notes/deep/big.bin")
    assert (big_doc["tier"], big_doc["hash"]) == ("chunked", content_hash(big))
    assert attr(root, odd)["path"] == odd
    # The shell way.
    out = subprocess.run(["cat", ".vfsd/attr/notes/plan.md"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out)["hash"] == doc["hash"]

    # Renames and deletions show at once (mirror names are never cached).
    os.rename(root / "notes" / "plan.md", root / "notes" / "plan-v2.md")
    assert not (mirror / "notes" / "plan.md").exists()
    assert attr(root, "notes/plan-v2.md")["path"] == "notes/plan-v2.md"
    with open(root / "notes" / "plan-v2.md", "ab") as f:
        f.write(b"- more\n")
    assert attr(root, "notes/plan-v2.md")["hash"] == content_hash(small + b"- more\n")
    os.unlink(root / "notes" / "plan-v2.md")
    assert not (mirror / "notes" / "plan-v2.md").exists()

    # Read-only, and nothing but regular files and directories.
    for bad in (lambda: open(mirror / "notes" / "deep" / "big.bin", "wb"),
                lambda: (mirror / "new").write_text("x"),
                lambda: (mirror / "notes" / "x").mkdir(),
                lambda: os.unlink(mirror / odd)):
        with pytest.raises(OSError) as exc:
            bad()
        assert exc.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    with pytest.raises(FileNotFoundError):
        (mirror / "notes" / "link").read_bytes()
    with pytest.raises(IsADirectoryError):
        (mirror / "notes").read_bytes()
    with pytest.raises(NotADirectoryError):
        os.listdir(mirror / odd)


def test_tools_copy_files_without_xattr_errors(run, tmp_path):
    """cp -a, tar --xattrs and rsync -X see no xattrs to copy, and say nothing."""
    root = run.root
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"content\n")
    os.setxattr(root / "d" / "f", "user.vfsd.pin", b"1")
    outside = tmp_path / "outside"
    for cmd in (["cp", "-a", str(root / "d"), str(outside)],
                ["tar", "--xattrs", "-cf", str(tmp_path / "d.tar"), "-C", str(root), "d"],
                ["rsync", "-aX", f"{root / 'd'}/", f"{tmp_path / 'rs'}/"],
                ["rsync", "-aX", f"{outside}/", f"{root / 'back'}/"],
                ["cp", "-a", str(outside), str(root / "cpa")]):
        if shutil.which(cmd[0]) is None:
            continue
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert (proc.returncode, proc.stderr) == (0, ""), cmd
    assert (outside / "f").read_bytes() == b"content\n"
    assert (root / "cpa" / "f").read_bytes() == b"content\n"


def test_unlink_costs_no_attribute_write_for_the_dead_inode(run):
    """The kernel's ctime flush after unlink() is answered without an LMDB write."""
    d = run.root / "d"
    d.mkdir()
    for i in range(20):
        (d / f"f{i}").write_bytes(b"x")
    before = run.status()
    for i in range(20):
        os.unlink(d / f"f{i}")
    os.listdir(d)  # the kernel has answered every unlink by now
    after = run.status()
    sent = after["requests"].get("setattr", 0) - before["requests"].get("setattr", 0)
    txns = after["counters"]["lmdb_write_txns"] - before["counters"]["lmdb_write_txns"]
    # unlink and the freeing at forget; the ctime flush (when the kernel sends
    # one) writes nothing.
    assert txns <= 2 * 20, (txns, sent)
    assert sorted(os.listdir(d)) == []
    # An unlinked file still open keeps its attributes working.
    with open(d / "open", "wb") as f:
        os.unlink(d / "open")
        f.write(b"still here")
        os.utime(f.fileno(), ns=(10**9, 2 * 10**9))
        assert os.fstat(f.fileno()).st_mtime_ns == 2 * 10**9


def _as_nobody(root_fd: int, rels: list[str]) -> list[str]:
    """In a child running as uid/gid 65534, read (files) or list (directories)
    each path relative to the mount root; per path "ok" or the errno's name.

    The child reaches the mount through a descriptor opened before it drops
    privileges, so the test's private tmp dirs do not stop it first.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = []
            for rel in rels:
                path = f"/proc/self/fd/{root_fd}/{rel}"
                try:
                    if os.path.isdir(path):
                        os.listdir(path)
                    else:
                        with open(path, "rb") as f:
                            f.read()
                    out.append("ok")
                except OSError as exc:
                    out.append(errno.errorcode[exc.errno])
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_attr_mirror_follows_the_modes_it_mirrors(run_factory):
    # With --allow-other every local user reaches the mount; the mirror used
    # to be 0555/0444 throughout, so anyone could list a private directory
    # there and read a private file's hash and xattrs.
    run = run_factory("shared", "--allow-other")
    root = run.root
    (root / "private").mkdir(mode=0o700)
    (root / "private" / "secret.txt").write_bytes(b"s")
    os.setxattr(root / "private" / "secret.txt", "user.note", b"do not share")
    (root / "closed.txt").write_bytes(b"c")
    os.chmod(root / "closed.txt", 0o600)
    (root / "open.txt").write_bytes(b"o")
    os.chmod(root / "open.txt", 0o644)
    (root / "public").mkdir(mode=0o755)
    rels = ["private", "private/secret.txt", "closed.txt", "open.txt", "public"]
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        real = _as_nobody(fd, rels)
        mirror = _as_nobody(fd, [f".vfsd/attr/{rel}" for rel in rels])
    finally:
        os.close(fd)
    assert real == ["EACCES", "EACCES", "EACCES", "ok", "ok"]
    assert mirror == real
    # The owner still reads every one of them.
    assert attr(root, "private/secret.txt")["xattrs"] == {"user.note": "do not share"}
    assert attr(root, "closed.txt")["size"] == 1
