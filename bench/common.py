"""Shared helpers for the vfsd benchmarks.

Mounting a run dir through the real CLI, a control-socket client, cache dropping,
machine description, synthetic tool-output text, and timing/median helpers.

Run as a script, this module is also the small worker that the benchmarks start in
a subprocess for work that has no single shell tool (writing many small files,
create+stat+unlink): `python bench/common.py WORKER ARGS...`. A worker times only
its own loop and prints one JSON line, so interpreter start-up is not in the figure.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve()


def repo_python() -> str:
    """The interpreter to run vfsd with: the repo's .venv if present, else this one."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


# --------------------------------------------------------------------------- timing


def timed(fn: Callable[[], object]) -> float:
    """Seconds taken by fn()."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_timed(cmd: str | Sequence[str], *, expect_rc: Sequence[int] = (0,)) -> tuple[float, str]:
    """Run a command (a string goes through `sh -c`: give paths as arguments of an
    argument list instead, e.g. ["sh", "-c", 'cat "$1"', "sh", path]), return
    (seconds, stdout).

    The clock runs around the whole subprocess: these are real tools (dd, cat, grep,
    find) whose start-up is part of what a user waits for.
    """
    shell = isinstance(cmd, str)
    env = dict(os.environ, LC_ALL="C")
    start = time.perf_counter()
    proc = subprocess.run(cmd, shell=shell, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode not in expect_rc:
        raise RuntimeError(f"{cmd!r} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed, proc.stdout


def run_worker(*args: object) -> dict:
    """Run a worker of this module in a fresh interpreter; return its JSON report."""
    proc = subprocess.run(
        [sys.executable, str(WORKER), *map(str, args)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker {args!r} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(samples: Sequence[float]) -> dict:
    """Median, min, max and all samples (seconds)."""
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": list(samples),
    }


def fmt_seconds(s: float | None) -> str:
    """Human figure for a duration: ms below 10 s."""
    if s is None:
        return "-"
    if s < 0.01:
        return f"{s * 1000:.2f} ms"
    if s < 10:
        return f"{s * 1000:.0f} ms"
    return f"{s:.1f} s"


# --------------------------------------------------------------------------- caches


def drop_caches() -> str:
    """Flush dirty data and drop the kernel's page, dentry and inode caches.

    Returns the method used. Needs root; without it the caller must fall back to
    `evict_file_pages` on the files it is about to read.
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        return "unavailable"


def evict_file_pages(root: Path) -> None:
    """Drop cached pages of every file under root (fadvise DONTNEED; no root needed)."""
    os.sync()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --------------------------------------------------------------------------- machine


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def fs_type(path: Path) -> str:
    """Filesystem type and device of the mount holding path (from df)."""
    proc = subprocess.run(
        ["df", "--output=source,fstype", str(path)], capture_output=True, text=True
    )
    lines = proc.stdout.strip().splitlines()
    return " ".join(lines[-1].split()) if len(lines) > 1 else "unknown"


def machine_info(disk_path: Path) -> dict:
    """What the numbers were measured on."""
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in _read("/proc/cpuinfo").splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    mem_kb = next(
        (
            int(ln.split()[1])
            for ln in _read("/proc/meminfo").splitlines()
            if ln.startswith("MemTotal:")
        ),
        0,
    )
    libfuse = subprocess.run(["fusermount3", "-V"], capture_output=True, text=True).stdout
    try:
        import pyfuse3  # noqa: PLC0415 - optional, only for the record

        pyfuse3_version = getattr(pyfuse3, "__version__", "?")
    except ImportError:
        pyfuse3_version = "not installed"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "disk": fs_type(disk_path),
        "python": platform.python_version(),
        "pyfuse3": pyfuse3_version,
        "fusermount3": libfuse.strip().split()[-1] if libfuse.strip() else "?",
        "loadavg_at_start": load_average(),
        "cpu_pressure_at_start": cpu_pressure(),
    }


def load_average() -> str:
    """1/5/15-minute load average: other work on the machine skews every figure."""
    return " ".join(_read("/proc/loadavg").split()[:3])


def cpu_pressure() -> str:
    """PSI 'some' CPU pressure (share of time tasks waited for a CPU), avg10/avg60."""
    for line in _read("/proc/pressure/cpu").splitlines():
        if line.startswith("some"):
            fields = dict(f.split("=") for f in line.split()[1:])
            return f"{fields.get('avg10', '?')}%/{fields.get('avg60', '?')}%"
    return "?"


def wait_for_quiet(max_load: float, max_wait_s: float) -> float:
    """Wait until the 1-minute load average drops below max_load; return it."""
    deadline = time.monotonic() + max_wait_s
    while True:
        load = float(_read("/proc/loadavg").split()[0])
        if load < max_load or time.monotonic() > deadline:
            return load
        time.sleep(10)


def print_machine(info: dict, file=None) -> None:
    """One line describing the machine."""
    print(
        f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory_gib']} GiB RAM, "
        f"kernel {info['kernel']}, disk {info['disk']}, Python {info['python']}, "
        f"pyfuse3 {info['pyfuse3']}, libfuse {info['fusermount3']}; "
        f"load average {info['loadavg_at_start']}, CPU pressure (PSI some avg10/avg60) "
        f"{info['cpu_pressure_at_start']} at start",
        file=file,
    )


# --------------------------------------------------------------------------- vfsd mount


def is_mounted(path: Path) -> bool:
    """True if path is a mount point (per /proc/self/mountinfo)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def memory_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS), VmRSS, RssAnon and RssFile of a live process, in KiB.

    RssFile includes the pages of LMDB's memory map that the daemon touched: they
    are page cache, shared with the kernel, not memory the daemon allocated.
    """
    out = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(line.split()[1])
    return out


@dataclass
class VfsdMount:
    """A vfsd run dir mounted through the real CLI (`python -m vfsd.cli mount`)."""

    run_dir: Path
    options: tuple[str, ...] = ()
    peak_rss_kib: int = 0
    max_anon_kib: int = 0
    mount_count: int = field(default=0, init=False)
    #: keep a reader on `.vfsd/accesslog` while mounted (the cost of a busy log)
    access_log_reader: bool = False
    _reader: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def root(self) -> Path:
        return self.run_dir / "fs"

    @property
    def state_dir(self) -> Path:
        return self.run_dir / ".vfsd"

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "vfsd.sock"

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `vfsd ARGS` with the repo's interpreter; raise on failure."""
        proc = subprocess.run(
            [repo_python(), "-m", "vfsd.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"vfsd {' '.join(args)} exited {proc.returncode}: "
                f"{proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def mount(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cli("mount", str(self.run_dir), *self.options)
        if not is_mounted(self.root):
            raise RuntimeError(f"vfsd mount returned but {self.root} is not mounted")
        self.mount_count += 1
        if self.access_log_reader:
            self._reader = subprocess.Popen(["cat", str(self.root / ".vfsd" / "accesslog")],
                                            stdout=subprocess.DEVNULL)

    def pid(self) -> int | None:
        try:
            return int((self.state_dir / "vfsd.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def sample_rss(self) -> dict[str, int]:
        """Record the daemon's VmHWM and RssAnon; the max over all daemons is kept."""
        pid = self.pid()
        mem = memory_kib(pid) if pid else {}
        self.peak_rss_kib = max(self.peak_rss_kib, mem.get("VmHWM", 0))
        self.max_anon_kib = max(self.max_anon_kib, mem.get("RssAnon", 0))
        return mem

    def umount(self) -> None:
        self.sample_rss()
        if self._reader is not None:
            self._reader.terminate()
            self._reader.wait()
            self._reader = None
        self.cli("umount", str(self.run_dir))

    def remount(self) -> None:
        self.umount()
        self.mount()

    def force_cleanup(self) -> None:
        """Last resort after a failure: lazy unmount and kill our daemon by pid."""
        if is_mounted(self.root):
            subprocess.run(["fusermount3", "-u", "-z", str(self.root)], capture_output=True)
        pid = self.pid()
        if pid:
            try:
                os.kill(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass

    def status(self) -> dict:
        return json.loads(self.cli("status", str(self.run_dir), "--json").stdout)


def daemon_works(probe_dir: Path) -> tuple[bool, str]:
    """Mount a throwaway run dir, list it, unmount. (ok, message)."""
    m = VfsdMount(probe_dir)
    try:
        m.mount()
        os.listdir(m.root)
        m.umount()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
        m.force_cleanup()
        return False, str(exc)


# --------------------------------------------------------------------------- control socket


class ControlError(RuntimeError):
    """An `{"ok": false}` reply from the daemon."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class ControlClient:
    """Newline-delimited JSON over RUN_DIR/.vfsd/vfsd.sock (docs/control.md).

    One connection reused for every request, as a long-running agent program would.
    """

    def __init__(self, socket_path: Path, timeout: float = 60.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(socket_path))
        self.reader = self.sock.makefile("rb")
        self._next_id = 0

    def request(self, op: str, **args: object) -> dict:
        """Send one request, return its `result`; raise ControlError on an error reply."""
        self._next_id += 1
        line = json.dumps({"op": op, "id": self._next_id, **args}).encode() + b"\n"
        self.sock.sendall(line)
        reply = self.reader.readline()
        if not reply:
            raise ConnectionError("daemon closed the control connection")
        msg = json.loads(reply)
        if not msg.get("ok"):
            err = msg.get("error") or {}
            raise ControlError(err.get("code", "?"), err.get("message", ""))
        return msg.get("result", {})

    def timed_request(self, op: str, **args: object) -> tuple[float, dict]:
        """(round-trip seconds, result) of one request."""
        start = time.perf_counter()
        result = self.request(op, **args)
        return time.perf_counter() - start, result

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def reported_duration(result: dict) -> float | None:
    """A duration the daemon put in its reply, in seconds, if it reports one.

    Looks for the usual key spellings (`duration_ms`, `elapsed_s`, `took_ms`, ...).
    """
    for key, value in result.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        k = key.lower()
        if not any(w in k for w in ("duration", "elapsed", "took", "time")):
            continue
        if k.endswith("_ms") or k.endswith("ms"):
            return value / 1000
        if k.endswith("_us"):
            return value / 1e6
        if k.endswith("_ns"):
            return value / 1e9
        return float(value)
    return None


# --------------------------------------------------------------------------- tool-output text

_WORDS = (
    "request response status error warning info debug module function return value "
    "file path line column token index cache result query search match found missing "
    "user agent tool call output input config timeout retry connection server client "
    "build test passed failed skipped import class method argument parameter schema"
).split()
_TOOLS = ("bash", "grep", "web_search", "python", "read_file", "ls", "pytest")


def tool_output_text(rng: random.Random, size: int, needle: str | None = None) -> bytes:
    """About `size` bytes of text resembling an agent's tool output.

    Mixes shell-like log lines, grep-style `path:line: text` hits and JSON records.
    If `needle` is given it is planted once, at a random line.
    """
    lines: list[str] = [f"$ {rng.choice(_TOOLS)} --step {rng.randint(1, 500)}"]
    total = len(lines[0]) + 1
    while total < size:
        kind = rng.random()
        words = " ".join(rng.choices(_WORDS, k=rng.randint(5, 14)))
        if kind < 0.4:
            line = (
                f"2025-01-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} "
                f"{rng.choice(('INFO', 'DEBUG', 'WARN'))} {words}"
            )
        elif kind < 0.7:
            line = (
                f"src/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}.py:{rng.randint(1, 2000)}: {words}"
            )
        else:
            line = json.dumps(
                {"id": rng.randint(0, 10**9), "name": rng.choice(_WORDS), "text": words}
            )
        lines.append(line)
        total += len(line) + 1
    if needle:
        lines.insert(rng.randint(1, len(lines)), f"ERROR {needle} in {rng.choice(_WORDS)}")
    data = ("\n".join(lines) + "\n").encode()
    return data[:size] if not needle else data


# --------------------------------------------------------------------------- workers


NEEDLE = "ConnectionResetError"


def worker_write_files(
    directory: str, count: str, size: str, seed: str, needle_every: str = "0"
) -> dict:
    """Write `count` tool-output files of `size` bytes with open/write/close.

    Every `needle_every`-th file (0: none) gets NEEDLE planted in it once.
    """
    rng = random.Random(int(seed))
    every = int(needle_every)
    contents = [
        tool_output_text(
            rng, int(size), f"{NEEDLE}: [Errno 104]" if every and i % every == 0 else None
        )
        for i in range(int(count))
    ]
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i, data in enumerate(contents):
        with open(d / f"out_{i:05d}.txt", "wb") as f:
            f.write(data)
    return {"seconds": time.perf_counter() - start}


def worker_make_tree(directory: str, ndirs: str, per_dir: str) -> dict:
    """Create ndirs directories of per_dir small files each (a tree for `find`)."""
    d = Path(directory)
    start = time.perf_counter()
    for i in range(int(ndirs)):
        sub = d / f"step_{i:04d}"
        sub.mkdir(parents=True, exist_ok=True)
        for j in range(int(per_dir)):
            with open(sub / f"f{j:05d}.txt", "wb") as f:
                f.write(b"x" * 64)
    return {"seconds": time.perf_counter() - start}


def worker_create_stat_unlink(directory: str, count: str) -> dict:
    """Create `count` empty files, stat each, unlink each; time each phase."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [str(d / f"e{i:06d}") for i in range(int(count))]
    t0 = time.perf_counter()
    for p in paths:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    t1 = time.perf_counter()
    for p in paths:
        os.stat(p)
    t2 = time.perf_counter()
    for p in paths:
        os.unlink(p)
    t3 = time.perf_counter()
    return {"seconds": t3 - t0, "create": t1 - t0, "stat": t2 - t1, "unlink": t3 - t2}


WORKERS = {
    "write-files": worker_write_files,
    "make-tree": worker_make_tree,
    "create-stat-unlink": worker_create_stat_unlink,
}


def rmtree_quiet(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(WORKERS[sys.argv[1]](*sys.argv[2:])))


def add_run_options(ap) -> None:
    """The options every benchmark here takes: where to run, output, mount flags."""
    ap.add_argument("--base-dir", default="/var/tmp", help="where the run dirs go")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON ('-': stdout, no table)")
    ap.add_argument(
        "--vfsd-opt",
        action="append",
        default=[],
        help="extra `vfsd mount` argument (repeat; use --vfsd-opt=--flag)",
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        metavar="LOAD",
        help="first wait (up to 30 min) for the 1-minute load average to drop below LOAD",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--access-log-reader", action="store_true",
                    help="keep `cat .vfsd/accesslog` running while mounted (a busy access log)")
