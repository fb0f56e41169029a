"""Concurrency under eviction: writers, appenders, renamers and readers on one tree.

Writer processes replace files atomically (write a temporary, maybe fsync,
rename over the final name), append self-checking lines to logs, move files
between directories, mark files done and unlink them. Reader processes read
everything they find and check it: each `.dat` file carries the length and
sha256 of its body, each log line its own checksum, so a torn or mixed-up read
is caught without knowing who wrote what. Meanwhile the step advances every few
milliseconds through the control socket, so eviction keeps removing files,
some of them open or mid-rename.

At the end: every process finished before its deadline (no deadlock); every
file a writer last renamed into place either holds exactly those bytes or was
evicted with exactly that hash (the eviction log says so); logs are whole and
in order; the daemon's resident memory stayed bounded; fsck is clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import MountedRun, is_mounted, vfsd_cli
from ctl import connect

from mount_tool.refs import content_hash

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]

LONG = bool(os.environ.get("VFSD_LONG"))
LOAD_SECONDS = 60.0 if LONG else 8.0
WRITERS = 3
READERS = 2
RSS_LIMIT_MB = 300
MOUNT_ARGS = (
    "--chunk-size",
    str(256 * 1024),
    "--inline-max",
    str(16 * 1024),
    "--max-age-steps",
    "60",
    "--done-retention-steps",
    "3",
)

# Shared by writers and readers: the self-checking formats.
FORMATS = r"""
import hashlib, os, random, sys, time, json, errno
DIRS = ["d0", "d1", "d2/deep"]

def framed(body):
    return b"%016x" % len(body) + hashlib.sha256(body).hexdigest().encode() + body

def check_framed(data):
    if len(data) < 80:
        return False
    n = int(data[:16], 16)
    return len(data) == 80 + n and hashlib.sha256(data[80:]).hexdigest().encode() == data[16:80]

def log_line(tag, seq, rng):
    body = rng.randbytes(rng.randrange(1, 300)).hex()
    return f"{tag} {seq} {hashlib.sha256(body.encode()).hexdigest()[:16]} {body}\n".encode()

def check_log(data):
    "Sequence numbers of the complete lines; None if a complete line is damaged."
    seqs = []
    for line in data.split(b"\n")[:-1]:
        parts = line.split(b" ")
        if len(parts) != 4 or hashlib.sha256(parts[3]).hexdigest()[:16].encode() != parts[2]:
            return None
        seqs.append(int(parts[1]))
    return seqs
"""

# argv: root tag seed seconds
WRITER = (
    FORMATS
    + r"""
from mount_tool.refs import content_hash
CHUNK = 256 * 1024  # the mount's --chunk-size: file hashes depend on it
root, tag, seed, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rng = random.Random(seed)
files = {}   # final path -> [sha256, file hash] of what was last renamed there, or None (unlinked)
logs = {}    # log path -> last sequence number appended
seq = 0
counts = {}

def count(what):
    counts[what] = counts.get(what, 0) + 1

def own_final():
    live = [p for p, v in files.items() if v is not None]
    return rng.choice(live) if live else None

def replace():
    final = f"{rng.choice(DIRS)}/{tag}-f{rng.randrange(12)}.dat"
    tmp = f"{rng.choice(DIRS)}/{tag}-{rng.randrange(1 << 30):x}.tmp"
    size = rng.choice([0, 100, 5000, 20000, 300000, 1100000])
    data = framed(rng.randbytes(size))
    fd = os.open(os.path.join(root, tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for off in range(0, len(data), 65536):
            os.write(fd, data[off:off + 65536])
        if rng.random() < 0.3:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.rename(os.path.join(root, tmp), os.path.join(root, final))
    except FileNotFoundError:
        count("tmp_evicted")  # eviction took the temporary: the old final stays
        return
    files[final] = [hashlib.sha256(data).hexdigest(), content_hash(data, CHUNK), len(data)]
    count("replaced")

def append():
    global seq
    path = f"{rng.choice(DIRS)}/{tag}-{rng.randrange(3)}.log"
    seq += 1
    fd = os.open(os.path.join(root, path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, log_line(tag, seq, rng))
    finally:
        os.close(fd)
    logs[path] = seq
    count("appended")

def move():
    src = own_final()
    if src is None:
        return
    dst = f"{rng.choice(DIRS)}/{os.path.basename(src)}"
    if dst == src:
        return
    try:
        os.rename(os.path.join(root, src), os.path.join(root, dst))
    except FileNotFoundError:
        files.pop(src)  # evicted: the eviction log has it
        count("move_evicted")
        return
    files[dst] = files[src]
    files[src] = None
    count("moved")

def mark_done():
    p = own_final()
    if p is None:
        return
    try:
        os.setxattr(os.path.join(root, p), "user.vfsd.status", b"done")
        count("done")
    except FileNotFoundError:
        files.pop(p)
        count("done_evicted")

def remove():
    p = own_final()
    if p is None:
        return
    try:
        os.unlink(os.path.join(root, p))
        files[p] = None
        count("unlinked")
    except FileNotFoundError:
        files.pop(p)
        count("unlink_evicted")

ops = [replace] * 5 + [append] * 4 + [move] * 2 + [mark_done, remove]
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    rng.choice(ops)()
print(json.dumps({"files": files, "logs": logs, "counts": counts}))
"""
)

# argv: root seconds
READER = (
    FORMATS
    + r"""
root, seconds = sys.argv[1], float(sys.argv[2])
bad, checked = [], 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if name.endswith(".tmp"):
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue  # renamed or evicted since the listing
            checked += 1
            if name.endswith(".dat") and not check_framed(data):
                bad.append(f"torn file {path}: {len(data)} bytes")
            elif name.endswith(".log"):
                seqs = check_log(data)
                if seqs is None or seqs != sorted(set(seqs)):
                    bad.append(f"damaged log {path}")
print(json.dumps({"checked": checked, "bad": bad[:20]}))
"""
)


class Stepper(threading.Thread):
    """Advances the agent step in a loop (each advance runs eviction)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.stop = threading.Event()
        self.steps = self.evicted = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connect(self.run_dir, timeout=30) as c:
                step = c.call("get_step")["step"]
                while not self.stop.is_set():
                    step += 1
                    report = c.call("set_step", step=step)
                    self.steps += 1
                    self.evicted += report["files"]
                    if step % 10 == 0:
                        c.call("evict", dry_run=True)
                    time.sleep(0.02)
        except BaseException as exc:  # reported by the test
            self.error = exc


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture
def stress_run(tmp_path: Path):
    r = MountedRun(tmp_path / "run", MOUNT_ARGS)
    r.mount()
    try:
        yield r
    finally:
        if is_mounted(r.root):
            vfsd_cli("umount", r.run_dir, check=False)
        r.cleanup()


def test_writers_readers_and_eviction(stress_run: MountedRun):
    run = stress_run
    root = run.root / "shared"
    for d in ("d0", "d1", "d2/deep"):
        (root / d).mkdir(parents=True)
    pid = int((run.state_dir / "vfsd.pid").read_text())

    stepper = Stepper(run.run_dir)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), f"w{i}", str(i), str(LOAD_SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(WRITERS)
    ]
    procs += [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(root), str(LOAD_SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(READERS)
    ]
    stepper.start()
    peak_rss = 0.0
    deadline = time.monotonic() + LOAD_SECONDS + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        peak_rss = max(peak_rss, rss_mb(pid))
        time.sleep(0.2)
    stepper.stop.set()
    stepper.join(timeout=30)
    names = [f"writer w{i}" for i in range(WRITERS)] + [f"reader {i}" for i in range(READERS)]
    hung = [name for name, p in zip(names, procs, strict=True) if p.poll() is None]
    for p in procs:
        if p.poll() is None:
            p.kill()
    assert not hung, f"deadlock: still running after {LOAD_SECONDS + 60:.0f} s: {hung}"
    assert not stepper.is_alive(), "the control socket stopped answering (set_step hung)"
    assert stepper.error is None, f"stepper failed: {stepper.error!r}"

    outputs = []
    for name, p in zip(names, procs, strict=True):
        out, err = p.communicate()
        assert p.returncode == 0, f"{name} failed: {err.decode()[-3000:]}"
        outputs.append(json.loads(out))
    writers, readers = outputs[:WRITERS], outputs[WRITERS:]
    for r in readers:
        assert not r["bad"], r["bad"]
    assert stepper.evicted > 0, "eviction never ran into the load: the test tests nothing"

    with connect(run.run_dir, timeout=60) as c:
        records = c.call("evicted", limit=100_000)["records"]
    evicted = {(r["path"], r["hash"]) for r in records}
    evicted_paths = {r["path"] for r in records}
    checked = gone = 0
    for w in writers:
        for rel, expect in w["files"].items():
            path = root / rel
            if expect is None:
                assert not path.exists(), f"{rel} was unlinked but is there"
            elif path.exists():
                data = path.read_bytes()
                assert content_hash(data, 256 * 1024) == expect[1], f"{rel}: lost update"
                checked += 1
            else:
                assert (f"shared/{rel}", expect[1]) in evicted, f"{rel} vanished without eviction"
                gone += 1
        for rel, last in w["logs"].items():
            path = root / rel
            if path.exists():
                lines = path.read_bytes().split(b"\n")[:-1]
                assert lines and int(lines[-1].split(b" ")[1]) == last, f"{rel}: lost appends"
            else:
                assert f"shared/{rel}" in evicted_paths, f"{rel} vanished without eviction"
    assert peak_rss < RSS_LIMIT_MB, f"daemon RSS peaked at {peak_rss:.0f} MB"
    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--json", check=False)
    assert proc.returncode == 0, proc.stdout
    counts = {}
    for w in writers:
        for k, v in w["counts"].items():
            counts[k] = counts.get(k, 0) + v
    print(
        f"steps {stepper.steps}, evicted {stepper.evicted}, files checked {checked}, "
        f"evicted-and-accounted {gone}, reads {sum(r['checked'] for r in readers)}, "
        f"peak RSS {peak_rss:.0f} MB, writer ops {counts}"
    )
