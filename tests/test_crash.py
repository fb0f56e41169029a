"""Crash consistency: SIGKILL the daemon under load, remount, and lose nothing durable.

Each round mounts the run dir, starts a writer process (small and large files,
appends, overwrites at offsets, truncates, renames, unlinks, fsyncs) and
SIGKILLs the daemon at a random moment. Rounds alternate `--durability fsync`
and `sync`, and every other pair runs with a commit window of a second (group
commit, `vfsd.store.groupcommit`), so most kills land while requests wait for
their shared commit. The writer logs, to a file outside the mount, what it
knows to be durable: a line is appended (and the log fsync'd) only after the
fsync() -- or, under `sync`, the close() -- it describes has returned. An
"unsure" line is logged before every change, so a change in flight at the kill
leaves that path's state unknown rather than wrong. A rename or unlink is
durable once a later fsync has returned (the daemon's sync covers every
request before it), so a renamed durable file is durable under its new name
from then on.

After the kill: `vfsd fsck --repair --verify` on the crashed store must find
only what an unclean stop may leave (orphans, stray chunks, temporaries),
never a name or block pointing at something missing, and be clean after its
repair. The next `vfsd mount` must remove the dead mount the killed daemon
left, and every file the writers knew durable must read back with its hash.

VFSD_LONG=1 runs many more rounds.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MountedRun, is_mounted, vfsd_cli

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

LONG = bool(os.environ.get("VFSD_LONG"))
ROUNDS = 150 if LONG else 10
KiB = 1024
MiB = 1024 * KiB
# Small tiers so that a round crosses many inline/chunk boundaries cheaply.
MOUNT_ARGS = ("--chunk-size", str(256 * KiB), "--inline-max", str(16 * KiB))

# What fsck may find after a daemon was killed; anything else is corruption.
CRASH_LEFTOVERS = re.compile(
    r"orphan \(no names\) left by an unclean stop"
    r"|chunk file\(s\) without references"
    r"|leftover temporary chunk file\(s\)"
)

# argv: mount_dir subdir log_path seed durability
#
# The writer keeps, per path, the content it last wrote (or None for absent)
# and which of those are durable. Any OSError ends it: after the kill every
# request fails.
WRITER = r"""
import hashlib, json, os, random, sys

root, sub, log_path, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
close_durable = sys.argv[5] == "sync"
rng = random.Random(seed)
base = os.path.join(root, sub)
log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

def log(**ev):
    os.write(log_fd, (json.dumps(ev) + "\n").encode())
    os.fsync(log_fd)

def sha(b):
    return hashlib.sha256(b).hexdigest()

known = {}  # relative path -> bytes (last content written) or None (absent)
safe = set()  # paths whose content in `known` is durable
# Paths a rename or unlink changed since the last fsync: their new state is
# durable once an fsync returns (a crash may undo a name change that no sync
# covered: it may still sit in the group commit window).
touched = set()

def sync_point():
    for p in sorted(touched):
        if known.get(p) is None:
            log(ev="absent", path=p)
        elif p in safe:
            log(ev="durable", path=p, sha=sha(known[p]), how="sync")
    touched.clear()
DIRS = ["", "d1", "d2/deep"]

def rel_new():
    return os.path.join(rng.choice(DIRS), f"f{rng.randrange(40)}")

def existing():
    live = [p for p, c in known.items() if c is not None]
    return rng.choice(live) if live else None

def size_small():
    return rng.choice([0, 1, rng.randrange(1, 16 * 1024), rng.randrange(16 * 1024, 80 * 1024)])

def size_large():
    return rng.randrange(256 * 1024 - 10, 1536 * 1024)

def finish(fd, rel, content):
    # Logged only once the fsync() (or, with durability = "sync", the close())
    # has returned; a file only closed in "fsync" mode stays unsure.
    known[rel] = content
    if rng.random() < 0.6:
        os.fsync(fd)
        safe.add(rel)
        log(ev="durable", path=rel, sha=sha(content), how="fsync")
        sync_point()
        os.close(fd)
    else:
        os.close(fd)
        if close_durable:
            safe.add(rel)
            log(ev="durable", path=rel, sha=sha(content), how="close")
            sync_point()
        else:
            safe.discard(rel)

def write_all(fd, data, piece):
    for off in range(0, len(data), piece):
        os.write(fd, data[off:off + piece])

def op_create(large):
    rel = rel_new()
    data = rng.randbytes(size_large() if large else size_small())
    log(ev="unsure", paths=[rel])
    fd = os.open(os.path.join(base, rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write_all(fd, data, rng.choice([4096, 65536, 131072, 1 << 20]))
    finish(fd, rel, data)

def op_append():
    rel = existing()
    if rel is None:
        return
    extra = rng.randbytes(rng.choice([1, 100, 5000, 70000, 300000]))
    log(ev="unsure", paths=[rel])
    fd = os.open(os.path.join(base, rel), os.O_WRONLY | os.O_APPEND)
    write_all(fd, extra, 65536)
    finish(fd, rel, known[rel] + extra)

def op_overwrite():
    rel = existing()
    if rel is None:
        return
    old = known[rel]
    off = rng.randrange(len(old) + 1000)
    data = rng.randbytes(rng.choice([1, 3000, 40000, 260000]))
    log(ev="unsure", paths=[rel])
    fd = os.open(os.path.join(base, rel), os.O_WRONLY)
    os.pwrite(fd, data, off)
    new = bytearray(old)
    if len(new) < off:
        new.extend(bytes(off - len(new)))
    new[off:off + len(data)] = data
    finish(fd, rel, bytes(new))

def op_truncate():
    rel = existing()
    if rel is None:
        return
    old = known[rel]
    size = rng.choice([0, len(old) // 2, len(old) + rng.randrange(300000)])
    log(ev="unsure", paths=[rel])
    fd = os.open(os.path.join(base, rel), os.O_WRONLY)
    os.ftruncate(fd, size)
    finish(fd, rel, old[:size].ljust(size, b"\0"))

def op_rename():
    src = existing()
    if src is None:
        return
    dst = rel_new()
    if dst == src:
        return
    log(ev="unsure", paths=[src, dst])
    os.rename(os.path.join(base, src), os.path.join(base, dst))
    # The content is as safe as it was; the new names are, from the next fsync.
    known[dst], known[src] = known[src], None
    if src in safe:
        safe.add(dst)
    else:
        safe.discard(dst)
    safe.discard(src)
    touched.update((src, dst))

def op_unlink():
    rel = existing()
    if rel is None:
        return
    log(ev="unsure", paths=[rel])
    os.unlink(os.path.join(base, rel))
    known[rel] = None
    safe.discard(rel)
    touched.add(rel)

for d in DIRS:
    os.makedirs(os.path.join(base, d), exist_ok=True)
log(ev="started")
OPS = [(lambda: op_create(False), 5), (lambda: op_create(True), 2), (op_append, 2),
       (op_overwrite, 2), (op_truncate, 1), (op_rename, 2), (op_unlink, 1)]
funcs = [f for f, w in OPS for _ in range(w)]
try:
    while True:
        rng.choice(funcs)()
except OSError as exc:
    log(ev="stopped", errno=exc.errno)
"""


def wait_until_started(writer: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and writer.poll() is None:
        if log_path.exists() and b'"started"' in log_path.read_bytes():
            return
        time.sleep(0.01)
    if writer.poll() is not None:
        _, err = writer.communicate()
        pytest.fail(f"the writer ended before it started: {err.decode()[-2000:]}")
    pytest.fail(f"the writer did not start within {timeout:.0f} s")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def replay(log_path: Path) -> dict[str, str | None]:
    """Per path: the sha256 it must have, None if it must be absent (unknown paths left out)."""
    state: dict[str, str | None] = {}
    unknown: set[str] = set()
    if not log_path.exists():
        return {}
    for line in log_path.read_text().splitlines():
        ev = json.loads(line)
        if ev["ev"] == "unsure":
            unknown.update(ev["paths"])
        elif ev["ev"] == "durable":
            state[ev["path"]] = ev["sha"]
            unknown.discard(ev["path"])
        elif ev["ev"] == "absent":
            state[ev["path"]] = None
            unknown.discard(ev["path"])
    return {p: h for p, h in state.items() if p not in unknown}


def check_round(root: Path, sub: str, log_path: Path) -> int:
    """Assert every durable file of one writer reads back exactly; return how many were checked."""
    expected = replay(log_path)
    for rel, digest in expected.items():
        path = root / sub / rel
        if digest is None:
            assert not path.exists(), f"{sub}/{rel} was durably removed but is back"
        else:
            assert path.exists(), f"{sub}/{rel} was durable but is gone after the crash"
            assert sha256(path.read_bytes()) == digest, f"{sub}/{rel} lost durable content"
    return len(expected)


def read_everything(root: Path) -> int:
    """Read every file under `root` (content of unsure files may be anything, but no EIO)."""
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if stat.S_ISREG(p.lstat().st_mode):
                p.read_bytes()
                n += 1
    return n


def kill_daemon(run: MountedRun) -> int:
    pid = int((run.state_dir / "vfsd.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                break
        except (FileNotFoundError, IndexError):
            break
        time.sleep(0.01)
    return pid


def fsck_after_crash(run: MountedRun) -> dict:
    """Check the crashed store, repair it, and insist on nothing worse than leftovers."""
    proc = vfsd_cli("fsck", run.run_dir, "--repair", "--verify", "--json", check=False)
    report = json.loads(proc.stdout)
    bad = [p for p in report["problems"] if not CRASH_LEFTOVERS.search(p)]
    assert not bad, f"corruption after a crash: {bad}"
    assert not report["damaged_files"], report
    assert report["clean_after_repair"] and proc.returncode == 0, report
    return report


@pytest.fixture
def crash_run(tmp_path: Path):
    r = MountedRun(tmp_path / "run", MOUNT_ARGS)
    try:
        yield r
    finally:
        r.cleanup()


def test_sigkill_rounds_lose_nothing_durable(crash_run: MountedRun, tmp_path: Path):
    run = crash_run
    rng = random.Random(int(os.environ.get("VFSD_CRASH_SEED", "1234")))
    logs: list[tuple[str, Path]] = []
    checked = leftovers = 0
    for rnd in range(ROUNDS):
        durability = "sync" if rnd % 2 else "fsync"
        window = ("--commit-window", "1") if rnd % 4 >= 2 else ()
        if rnd:
            # The killed daemon left a dead FUSE mount; `vfsd mount` must clear it.
            assert is_mounted(run.root)
        run.mount("--durability", durability, *window)
        for sub, log_path in logs[-2:]:
            checked += check_round(run.root, sub, log_path)
        read_everything(run.root)
        if len(logs) > 2:
            # Keep the store small: the oldest round is verified twice, then removed.
            sub, _ = logs.pop(0)
            subprocess.run(["rm", "-rf", str(run.root / sub)], check=True)

        sub, log_path = f"r{rnd:03d}", tmp_path / f"r{rnd:03d}.log"
        logs.append((sub, log_path))
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(run.root),
                sub,
                str(log_path),
                str(rng.randrange(1 << 30)),
                durability,
            ],
            stderr=subprocess.PIPE,
        )
        # The kill lands while the writer works, not while its interpreter
        # starts (on a loaded machine that can take longer than the pause).
        wait_until_started(writer, log_path)
        time.sleep(rng.uniform(0.1, 0.9))
        kill_daemon(run)
        try:
            _, err = writer.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            writer.kill()
            pytest.fail(f"round {rnd}: the writer hung after the daemon was killed")
        assert writer.returncode == 0, f"round {rnd}: writer failed: {err.decode()[-2000:]}"
        report = fsck_after_crash(run)
        leftovers += len(report["problems"])

    run.mount()
    for sub, log_path in logs:
        checked += check_round(run.root, sub, log_path)
    read_everything(run.root)
    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--verify", "--json", check=False)
    assert proc.returncode == 0, proc.stdout
    log = run.log_text()
    assert log.count("stale_mount_cleaned") == ROUNDS
    assert "Traceback" not in log
    assert checked > ROUNDS * 3, f"only {checked} durable facts checked: writers too slow?"
    print(f"{ROUNDS} rounds, {checked} durable facts checked, {leftovers} crash leftovers repaired")


@pytest.mark.parametrize("root_attrs", ["cached", "invalidated"])
def test_mount_clears_dead_mount(crash_run: MountedRun, root_attrs: str):
    run = crash_run
    run.mount()
    with open(run.root / "kept.txt", "wb") as f:
        f.write(b"survives")
        f.flush()
        os.fsync(f.fileno())
    if root_attrs == "cached":
        os.stat(run.root)  # the kernel now answers stat of the root by itself
    kill_daemon(run)
    assert is_mounted(run.root)
    proc = vfsd_cli("mount", run.run_dir, check=False, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (run.root / "kept.txt").read_bytes() == b"survives"
    assert "stale_mount_cleaned" in run.log_text()
    run.umount()


def test_kill_inside_the_commit_window_keeps_what_was_fsynced(crash_run: MountedRun):
    """Requests share one LMDB commit for up to the window (a second here, so the
    kill lands inside it): what an fsync() or syncfs() covered survives the kill,
    names, modes and content; what none covered is either gone or whole; the
    store is consistent."""
    run = crash_run
    run.mount("--commit-window", "1")
    root = run.root
    (root / "d").mkdir()
    kept = {f"d/k{i}": os.urandom(100 + 997 * i) for i in range(6)}
    for rel, data in kept.items():
        with open(root / rel, "wb") as f:
            f.write(data)
    os.chmod(root / "d/k0", 0o600)
    os.rename(root / "d/k1", root / "d/k1-renamed")
    kept["d/k1-renamed"] = kept.pop("d/k1")
    os.unlink(root / "d/k2")
    gone = {"d/k2"}
    del kept["d/k2"]
    with open(root / "d/k3", "rb+") as f:  # one file's fsync covers every request before it
        os.fsync(f.fileno())
    later = {f"d/later{i}": os.urandom(3000 + i) for i in range(20)}
    for rel, data in later.items():
        (root / rel).write_bytes(data)
    os.chmod(root / "d/k4", 0o640)  # after the fsync: either mode may come back
    kill_daemon(run)

    fsck_after_crash(run)
    run.mount()
    for rel, data in kept.items():
        assert (root / rel).read_bytes() == data, rel
    assert stat.S_IMODE((root / "d/k0").stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "d/k4").stat().st_mode) in (0o644, 0o640)
    for rel in gone | {"d/k1"}:
        assert not (root / rel).exists(), rel
    for rel, data in later.items():
        # Absent, or as far as it had committed (its create and its content are
        # two requests): never anything that was not written.
        path = root / rel
        assert not path.exists() or data.startswith(path.read_bytes()), rel
    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--verify", "--json", check=False)
    assert proc.returncode == 0, proc.stdout


def test_durability_sync_keeps_an_empty_file_close_returned_inside_the_commit_window(
        crash_run: MountedRun):
    """With durability = "sync" a file is durable when close() returns. A file
    created and closed with nothing written had nothing dirty at FLUSH, so close()
    returned while its create still sat in the open group (a second's window
    here): a kill then lost it (the SIGKILL rounds found it, as an empty file)."""
    run = crash_run
    run.mount("--durability", "sync", "--commit-window", "1")
    root = run.root
    (root / "d").mkdir()
    with open(root / "d/full", "wb") as f:  # its close() commits what came before
        f.write(b"written\n")
    names = [f"d/e{i}" for i in range(5)]
    for name in names:
        with open(root / name, "wb"):
            pass
    kill_daemon(run)

    fsck_after_crash(run)
    run.mount()
    for name in names:
        assert (root / name).exists() and (root / name).stat().st_size == 0, name
    assert (root / "d/full").read_bytes() == b"written\n"
    run.umount()


# -- a shard serving several threads (mount_tool.runs) --------------------------------

SHARD_ROUNDS = 40 if LONG else 4
SHARD_THREADS = 3


def kill_pid(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                break
        except (FileNotFoundError, IndexError):
            break
        time.sleep(0.01)


def test_sigkill_rounds_on_a_shard_serving_several_threads(tmp_path: Path):
    """The SIGKILL rounds against one shard daemon serving three threads of a
    Runs, a writer in each thread's directory at once: the next use of a
    thread starts the shard again (its dead mount removed), and every file
    each writer knew durable reads back in its own thread, nowhere else."""
    import mount_tool

    rng = random.Random(int(os.environ.get("VFSD_CRASH_SEED", "4321")))
    threads = [f"crash-{i}" for i in range(SHARD_THREADS)]
    logs: dict[str, list[tuple[str, Path]]] = {t: [] for t in threads}
    checked = 0
    with mount_tool.runs(tmp_path / "runs", shards=1, chunk_size=256 * KiB,
                         inline_max=16 * KiB) as runs:
        for rnd in range(SHARD_ROUNDS):
            writers = []
            for t in threads:
                with runs.use(t) as m:  # the first use after a kill starts the shard again
                    for sub, log_path in logs[t][-2:]:
                        checked += check_round(m.root, sub, log_path)
                    read_everything(m.root)
                    sub, log_path = f"r{rnd:03d}", tmp_path / f"{t}-r{rnd:03d}.log"
                    logs[t].append((sub, log_path))
                    writers.append(subprocess.Popen(
                        [sys.executable, "-c", WRITER, str(m.root), sub, str(log_path),
                         str(rng.randrange(1 << 30)), "fsync"], stderr=subprocess.PIPE))
            for w, t in zip(writers, threads, strict=True):
                wait_until_started(w, logs[t][-1][1])
            time.sleep(rng.uniform(0.1, 0.9))
            [shard] = runs.shards()
            kill_pid(shard["pid"])
            for w in writers:
                try:
                    _, err = w.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    w.kill()
                    pytest.fail(f"round {rnd}: a writer hung after the shard was killed")
                assert w.returncode == 0, f"round {rnd}: {err.decode()[-2000:]}"
        for t in threads:
            with runs.use(t) as m:
                for sub, log_path in logs[t]:
                    checked += check_round(m.root, sub, log_path)
                # Each thread holds its own writers' directories only.
                assert sorted(os.listdir(m.root)) == [sub for sub, _ in logs[t]]
        assert runs.shards()[0]["starts"] == SHARD_ROUNDS + 1
        log = (runs.root / "shards" / "0" / ".vfsd" / "vfsd.log").read_text()
    assert log.count("stale_mount_cleaned") == SHARD_ROUNDS
    assert checked > SHARD_ROUNDS * SHARD_THREADS * 3, f"only {checked} durable facts checked"
