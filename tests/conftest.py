"""Shared fixtures: real vfsd daemons mounted on temporary run directories.

Integration tests start the daemon through the same CLI a user would
(`vfsd mount`), and always unmount in teardown, lazily if needed, so a failing
test never leaves a dead mount behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

VFSD = [sys.executable, "-m", "vfsd.cli"]


def vfsd_cli(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the `vfsd` command line and return the finished process."""
    proc = subprocess.run(
        [*VFSD, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"vfsd {' '.join(map(str, args))} exited {proc.returncode}\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
    return proc


def tree(root: Path) -> dict[str, bytes | str]:
    """path -> bytes (files), "-> target" (symlinks) or "dir", as the shell sees them."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".vfsd"]
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d)) + "/"] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            key = os.path.normpath(os.path.join(rel, f))
            out[key] = ("-> " + os.readlink(p)) if os.path.islink(p) else Path(p).read_bytes()
    return out


def is_mounted(path: Path) -> bool:
    """True when `path` is a mount point (mountinfo's octal escapes decoded)."""
    target = os.fsencode(os.path.realpath(path))
    with open("/proc/self/mountinfo", "rb") as f:
        return any(
            re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), line.split(b" ")[4]) == target
            for line in f
        )


def unmount_quietly(mount) -> None:
    """Unmount a mount_tool.Mount in teardown, lazily if it will not go cleanly."""
    import mount_tool

    if is_mounted(mount.root):
        try:
            mount.unmount()
        except mount_tool.MountError:
            subprocess.run(["fusermount3", "-u", "-z", str(mount.root)], capture_output=True)


def open_files_under(root: Path) -> list[str]:
    """Paths under `root` that this process holds open."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(root) or target.startswith(f"{root}/"):
            held.append(target)
    return held


def daemons_under(root: Path) -> list[int]:
    """The processes (other than this one) holding a store under `root` open:
    the vfsd daemons serving it, found by their LMDB files (not by their
    titles, which name what they serve: tests/test_proctitle.py)."""
    prefix = os.path.realpath(root) + "/"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            targets = [os.readlink(f"/proc/{name}/fd/{fd}") for fd in os.listdir(f"/proc/{name}/fd")]
        except OSError:
            continue
        if any(t.startswith(prefix) and "/lmdb/" in t for t in targets):
            found.append(int(name))
    return sorted(found)


def mounts_under(root: Path) -> list[str]:
    """Mount points under `root` in this mount namespace, sorted."""
    prefix = os.fsencode(os.path.realpath(root)) + b"/"
    with open("/proc/self/mountinfo", "rb") as f:
        targets = [re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]),
                          line.split(b" ")[4]) for line in f]
    return sorted(os.fsdecode(t) for t in targets if t.startswith(prefix))


def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    """Poll until `predicate()` holds (the kernel sends release/forget
    asynchronously); AssertionError naming `what` after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def as_old_schema(store_dir: Path, schema: int, record_size: int,
                  drop_dbs: tuple[bytes, ...] = ()) -> None:
    """Turn a closed store into one an older vfsd wrote: inode records cut to
    `record_size` bytes, the databases it did not have dropped, its schema."""
    import lmdb

    env = lmdb.open(str(store_dir / "lmdb"), max_dbs=64)
    try:
        with env.begin(write=True) as txn:
            inodes = env.open_db(b"inode", txn=txn)
            for key, val in list(txn.cursor(db=inodes)):
                txn.put(key, bytes(val)[:record_size], db=inodes)
            for name in drop_dbs:
                txn.drop(env.open_db(name, txn=txn))
            txn.put(b"schema", schema.to_bytes(4, "big"), db=env.open_db(b"meta", txn=txn))
    finally:
        env.close()


@dataclass
class MountedRun:
    """A run dir with a live vfsd mount on `root` (RUN_DIR/fs)."""

    run_dir: Path
    extra_args: tuple[str, ...] = ()

    @property
    def root(self) -> Path:
        return self.run_dir / "fs"

    @property
    def state_dir(self) -> Path:
        return self.run_dir / ".vfsd"

    def mount(self, *args: str) -> None:
        vfsd_cli("mount", self.run_dir, *self.extra_args, *args)
        assert is_mounted(self.root)

    def umount(self) -> None:
        vfsd_cli("umount", self.run_dir)
        assert not is_mounted(self.root)

    def remount(self) -> None:
        self.umount()
        self.mount()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return vfsd_cli(*args, check=check)

    def status(self) -> dict:
        return json.loads(vfsd_cli("status", self.run_dir, "--json").stdout)

    def log_text(self) -> str:
        log = self.state_dir / "vfsd.log"
        return log.read_text() if log.exists() else ""

    def cleanup(self) -> None:
        if is_mounted(self.root):
            subprocess.run(["fusermount3", "-u", "-z", str(self.root)], capture_output=True)
        pidfile = self.state_dir / "vfsd.pid"
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text().strip()), 9)
            except (ValueError, ProcessLookupError, PermissionError, FileNotFoundError):
                pass


@pytest.fixture
def run(tmp_path: Path):
    """A mounted run dir with the default options; unmounted in teardown.

    Fails the test if the daemon logged an error or a traceback, unless the test
    set `run.expect_errors = True`.
    """
    r = MountedRun(tmp_path / "run")
    r.mount()
    r.expect_errors = False  # type: ignore[attr-defined]
    try:
        yield r
    finally:
        if is_mounted(r.root):
            proc = vfsd_cli("umount", r.run_dir, check=False)
            if proc.returncode != 0:
                r.cleanup()
        log = r.log_text()
        r.cleanup()
    if not r.expect_errors:  # type: ignore[attr-defined]
        bad = [ln for ln in log.splitlines() if '"level": "error"' in ln or "Traceback" in ln]
        assert not bad, "daemon logged errors:\n" + "\n".join(bad[:20])


@pytest.fixture
def run_factory(tmp_path: Path):
    """Make extra run dirs (for shared stores, custom options)."""
    made: list[MountedRun] = []

    def make(name: str = "run2", *args: str, mount: bool = True) -> MountedRun:
        r = MountedRun(tmp_path / name, tuple(args))
        made.append(r)
        if mount:
            r.mount()
        return r

    yield make
    for r in made:
        if is_mounted(r.root):
            vfsd_cli("umount", r.run_dir, check=False)
        r.cleanup()
