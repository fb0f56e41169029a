#!/usr/bin/env python3
"""Real programs on a vfsd mount and on a native directory of the same disk, one run.

Usage (as root, from the repo):
    .venv/bin/python bench/workloads.py [--quick] [--reps N] [--only NAME ...]
                                         [--json FILE|-] [--vfsd-src DIR] [--vfsd-opt=ARG]

Each workload runs on both sides (alternating which goes first) in a fresh
directory, and both sides must produce the same result: a digest of the tree they
left, of a query's answer or of a program's output. A mismatch is printed as a
PROBLEM line and makes the exit code 1. The table gives vfsd / native for each
workload, the daemon's peak RSS and largest anonymous memory while it ran, and
the FUSE requests and LMDB write transactions it cost (from `vfsd status`).

Offline: everything the workloads need is built once in a cache directory outside
the repo (`--cache`, default ~/.cache/vfsd-bench): a source tree of a few
thousand files taken from this interpreter's standard library and site-packages,
a tarball and a git repository made from it, and a wheel directory filled with
`pip download` the first time (the only step that needs the package index).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO,
    VfsdMount,
    add_run_options,
    fmt_seconds,
    load_average,
    machine_info,
    memory_kib,
    print_machine,
    repo_python,
    summary,
    wait_for_quiet,
    worker_create_stat_unlink,
    worker_write_files,
)
from fs_bench import spread_directories  # noqa: E402

HERE = Path(__file__).resolve()
FULL = {"tree_files": 3600, "sqlite_rows": 200_000, "log_records": 20_000,
        "line_writes": 20_000, "write_delete": 5_000, "csu": 5_000, "small_files": 1_000,
        "pytest_files": 34, "c_files": 150, "reps": 1}
QUICK = {"tree_files": 800, "sqlite_rows": 20_000, "log_records": 2_000,
         "line_writes": 2_000, "write_delete": 500, "csu": 1_000, "small_files": 200,
         "pytest_files": 8, "c_files": 40, "reps": 1}
#: what pip installs into the benchmark's venv (the project's own runtime stack)
WHEELS = ["trio==0.35.0", "structlog==25.5.0", "click==8.3.3", "tqdm==4.67.3",
          "prometheus-client==0.26.0", "xxhash==3.8.2", "lmdb==2.3.0", "pytest==9.0.3"]
IMPORTS = "trio, structlog, click, tqdm, prometheus_client, xxhash, lmdb, pytest"
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
           "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}

# --------------------------------------------------------------------------- results


def tree_digest(root: Path, skip: Callable[[str], bool] = lambda _p: False) -> str:
    """sha256 over every entry below root: relative path, type, mode bits, content."""
    h = hashlib.sha256()
    count = 0
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if skip(rel):
                continue
            st = os.lstat(full)
            count += 1
            if os.path.islink(full):
                h.update(f"L {rel} {os.readlink(full)}\n".encode())
                continue
            with open(full, "rb") as f:
                content = hashlib.sha256(f.read()).hexdigest()
            h.update(f"F {rel} {st.st_mode & 0o777:o} {st.st_size} {content}\n".encode())
    return f"{count} files {h.hexdigest()[:16]}"


def run(cmd: list[str] | str, cwd: Path, env: dict | None = None, timeout: float = 1800) -> str:
    """Run a command; its stdout, or RuntimeError with its stderr."""
    proc = subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "LC_ALL": "C", **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd!r} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def run_worker(name: str, *args: object) -> dict:
    """A worker of this module in a fresh interpreter: it times its own loop."""
    out = run([sys.executable, str(HERE), "worker", name, *map(str, args)], cwd=Path("/"))
    return json.loads(out.strip().splitlines()[-1])


# --------------------------------------------------------------------------- assets


class Assets:
    """What the workloads start from, built once in the cache directory."""

    def __init__(self, cache: Path, tree_files: int, log: Callable[[str], None]) -> None:
        self.cache = cache
        self.log = log
        self.tree = cache / f"tree-{tree_files}"
        self.tarball = cache / f"tree-{tree_files}.tar.gz"
        self.repo = cache / f"repo-{tree_files}.git"
        self.wheels = cache / "wheels"
        cache.mkdir(parents=True, exist_ok=True)
        self._tree(tree_files)
        self._tarball()
        self._repo()
        self._wheels()

    def _tree(self, n: int) -> None:
        stamp = self.tree.with_suffix(".complete")
        if stamp.exists():
            return
        self.log(f"assets: copying a {n}-file source tree to {self.tree}")
        shutil.rmtree(self.tree, ignore_errors=True)
        paths = sysconfig.get_paths()
        picked: list[tuple[Path, Path]] = []
        for label, base in (("stdlib", Path(paths["stdlib"])), ("site", Path(paths["purelib"]))):
            for dirpath, dirs, files in os.walk(base):
                dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "site-packages"))
                for name in sorted(files):
                    src = Path(dirpath) / name
                    if src.is_symlink() or not src.is_file() or src.stat().st_size > 1 << 20:
                        continue
                    picked.append((src, Path(label) / src.relative_to(base)))
                    if len(picked) >= n:
                        break
                if len(picked) >= n:
                    break
        for src, rel in picked:
            dest = self.tree / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            os.chmod(dest, 0o644)
        stamp.write_text(str(len(picked)))

    def _tarball(self) -> None:
        if self.tarball.exists():
            return
        self.log(f"assets: {self.tarball}")
        tmp = self.tarball.with_suffix(".tmp")
        run(["tar", "czf", str(tmp), "--sort=name", "--mtime=2025-01-01", "--owner=0",
             "--group=0", "--numeric-owner", "-C", str(self.tree), "."],
            cwd=self.cache)
        tmp.rename(self.tarball)

    def _repo(self) -> None:
        if (self.repo / "complete").exists():
            return
        self.log(f"assets: git repository {self.repo}")
        shutil.rmtree(self.repo, ignore_errors=True)
        work = self.cache / "repo-work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(self.tree, work)
        run(["git", "init", "-q", "-b", "main"], cwd=work, env=GIT_ENV)
        # Three commits, so a clone has history to pack and walk.
        files = sorted(p for p in work.rglob("*") if p.is_file() and ".git" not in p.parts)
        for i, chunk in enumerate((files[: len(files) // 2], files[len(files) // 2:], files[::7])):
            if i == 2:
                for p in chunk:
                    with open(p, "a") as f:
                        f.write("\n# revised\n")
            run(["git", "add", *map(str, chunk)], cwd=work, env=GIT_ENV)
            run(["git", "commit", "-q", "-m", f"commit {i}"], cwd=work, env=GIT_ENV)
        run(["git", "clone", "-q", "--bare", str(work), str(self.repo)], cwd=self.cache,
            env=GIT_ENV)
        shutil.rmtree(work)
        (self.repo / "complete").write_text("")

    def _wheels(self) -> None:
        stamp = self.wheels / ".complete"
        if stamp.exists() and stamp.read_text() == "\n".join(WHEELS):
            return
        self.log(f"assets: pip download into {self.wheels} (needs the package index once)")
        self.wheels.mkdir(exist_ok=True)
        run([repo_python(), "-m", "pip", "download", "-q", "-d", str(self.wheels),
             "--only-binary=:all:", *WHEELS], cwd=self.cache)
        stamp.write_text("\n".join(WHEELS))


# --------------------------------------------------------------------------- workloads


@dataclass
class Outcome:
    """What one run of a workload took and left behind."""

    seconds: float
    result: str
    phases: dict[str, float] = field(default_factory=dict)


def timed_steps(steps: list[tuple[str, Callable[[], object]]]) -> tuple[float, dict[str, float]]:
    phases = {}
    for name, fn in steps:
        t0 = time.perf_counter()
        fn()
        phases[name] = time.perf_counter() - t0
    return sum(phases.values()), phases


def wl_git(d: Path, a: Assets, _s: dict) -> Outcome:
    clone = d / "clone"

    def edit() -> None:
        for i, p in enumerate(sorted(clone.rglob("*.py"))[:50]):
            with open(p, "a") as f:
                f.write(f"\n# edit {i}\n")

    steps = [
        ("clone", lambda: run(["git", "clone", "-q", "--no-local", f"file://{a.repo}",
                               str(clone)], cwd=d, env=GIT_ENV)),
        ("status", lambda: run(["git", "status", "--porcelain"], cwd=clone, env=GIT_ENV)),
        ("edit", edit),
        ("commit", lambda: run(["git", "commit", "-q", "-a", "-m", "edit"], cwd=clone,
                               env=GIT_ENV)),
        ("gc", lambda: run(["git", "gc", "-q"], cwd=clone, env=GIT_ENV)),
    ]
    seconds, phases = timed_steps(steps)
    head = run(["git", "rev-parse", "HEAD"], cwd=clone, env=GIT_ENV).strip()
    run(["git", "fsck", "--no-progress"], cwd=clone, env=GIT_ENV)
    work = tree_digest(clone, lambda rel: rel.startswith(".git"))
    return Outcome(seconds, f"HEAD {head[:12]}, {work}", phases)


def wl_pip(d: Path, a: Assets, _s: dict) -> Outcome:
    venv = d / "venv"
    py = venv / "bin" / "python"
    base_python = getattr(sys, "_base_executable", sys.executable)
    steps = [
        ("venv", lambda: run([base_python, "-m", "venv", str(venv)], cwd=d)),
        ("install", lambda: run([str(py), "-m", "pip", "install", "-q", "--no-index",
                                 "--disable-pip-version-check", "--find-links",
                                 str(a.wheels), *WHEELS], cwd=d)),
        ("import", lambda: run([str(py), "-c", f"import {IMPORTS}"], cwd=d)),
    ]
    seconds, phases = timed_steps(steps)
    freeze = run([str(py), "-m", "pip", "freeze", "--all"], cwd=d)
    site = next((venv / "lib").glob("python*/site-packages"))

    def skip(rel: str) -> bool:  # compiled files and records that name absolute paths
        return "__pycache__" in rel or rel.endswith(("/RECORD", "/direct_url.json", ".pyc"))

    digest = hashlib.sha256(freeze.encode()).hexdigest()[:12]
    return Outcome(seconds, f"freeze {digest}, site {tree_digest(site, skip)}", phases)


PYTEST_MODULE = '''\
import pytest


def helper(n):
    return sum(i * i for i in range(n))


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "data.txt"
    p.write_text("x" * 100)
    return p

'''


def make_pytest_project(d: Path, files: int) -> None:
    tests = d / "tests"
    tests.mkdir(parents=True)
    (d / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    for i in range(files):
        body = [PYTEST_MODULE]
        for j in range(50):
            if j % 10 == 0:
                body.append(f"def test_file_{j}(data):\n    assert data.read_text() == 'x' * 100\n\n")
            elif j % 10 == 1:
                body.append(f"@pytest.mark.parametrize('n', [1, 2, 3])\n"
                            f"def test_param_{j}(n):\n    assert helper(n) >= 0\n\n")
            else:
                body.append(f"def test_{i}_{j}():\n    assert helper({j}) == {sum(k * k for k in range(j))}\n\n")
        (tests / f"test_mod{i:03d}.py").write_text("".join(body))


def wl_pytest(d: Path, _a: Assets, s: dict) -> Outcome:
    make_pytest_project(d / "proj", s["pytest_files"])
    t0 = time.perf_counter()
    out = run([repo_python(), "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:hypothesispytest",
               "--basetemp", str(d / "tmp")], cwd=d / "proj")
    seconds = time.perf_counter() - t0
    return Outcome(seconds, out.strip().splitlines()[-1].split(" in ")[0])


CONFIGURE = r'''#!/bin/sh
# A configure script in autoconf's manner: one tiny compile per check.
CC=${CC:-cc}
: > config.log
echo "/* config.h: generated by configure */" > confdefs.h
check_header() {
    printf '#include <%s>\nint main(void) { return 0; }\n' "$1" > conftest.c
    if $CC -c conftest.c -o conftest.o >>config.log 2>&1; then
        echo "#define HAVE_$(echo "$1" | tr 'a-z./' 'A-Z__') 1" >> confdefs.h
        echo "checking for $1... yes"
    else
        echo "checking for $1... no"
    fi
    rm -f conftest.c conftest.o
}
check_func() {
    printf 'char %s(void);\nint main(void) { return (int)(long)&%s; }\n' "$1" "$1" > conftest.c
    if $CC conftest.c -o conftest >>config.log 2>&1; then
        echo "#define HAVE_$(echo "$1" | tr 'a-z' 'A-Z') 1" >> confdefs.h
        echo "checking for $1... yes"
    else
        echo "checking for $1... no"
    fi
    rm -f conftest.c conftest
}
for h in stdio.h stdlib.h string.h strings.h unistd.h stdint.h inttypes.h fcntl.h \
         errno.h limits.h sys/types.h sys/stat.h sys/time.h time.h signal.h \
         pthread.h dirent.h locale.h math.h ctype.h; do check_header "$h"; done
for f in memcpy memmove strdup strndup snprintf vsnprintf getline fsync fdatasync \
         mmap munmap pread pwrite clock_gettime nanosleep posix_fadvise \
         strerror setlocale qsort bsearch; do check_func "$f"; done
mv confdefs.h config.h
sed "s|@CC@|$CC|" Makefile.in > Makefile
echo "configure: wrote config.h and Makefile"
'''

MAKEFILE = '''CC = @CC@
CFLAGS = -O1 -Wall -MMD -MP
SRCS = $(wildcard src/*.c)
OBJS = $(SRCS:.c=.o)

all: gen

libgen.a: $(OBJS)
\tar rcs $@ $^

gen: main.o libgen.a
\t$(CC) -o $@ main.o libgen.a

-include $(OBJS:.o=.d) main.d
'''


def make_c_project(d: Path, files: int) -> None:
    (d / "src").mkdir(parents=True)
    (d / "configure").write_text(CONFIGURE)
    os.chmod(d / "configure", 0o755)
    (d / "Makefile.in").write_text(MAKEFILE)
    decls = []
    calls = []
    for i in range(files):
        funcs = []
        for j in range(8):
            name = f"gen_{i}_{j}"
            decls.append(f"long {name}(long x);")
            calls.append(f"    total += {name}({i + j});")
            funcs.append(
                f"long {name}(long x)\n{{\n    long acc = {j};\n"
                f"    for (long k = 0; k < x % 17 + 3; k++)\n"
                f"        acc = (acc * 31 + k) ^ (x << {j % 5});\n"
                f"    return acc % 1000003;\n}}\n")
        (d / "src" / f"unit{i:03d}.c").write_text(
            '#include "../config.h"\n#include "../gen.h"\n#include <string.h>\n\n'
            + "\n".join(funcs))
    (d / "gen.h").write_text("#ifndef GEN_H\n#define GEN_H\n" + "\n".join(decls) + "\n#endif\n")
    (d / "main.c").write_text(
        '#include <stdio.h>\n#include "config.h"\n#include "gen.h"\n\nint main(void)\n{\n'
        "    long total = 0;\n" + "\n".join(calls) + '\n    printf("%ld\\n", total);\n'
        "    return 0;\n}\n")


def wl_cbuild(d: Path, _a: Assets, s: dict) -> Outcome:
    proj = d / "proj"
    make_c_project(proj, s["c_files"])
    steps = [
        ("configure", lambda: run(["./configure"], cwd=proj)),
        ("make", lambda: run(["make", "-s", f"-j{os.cpu_count() or 2}"], cwd=proj)),
    ]
    seconds, phases = timed_steps(steps)
    out = run(["./gen"], cwd=proj).strip()
    config = hashlib.sha256((proj / "config.h").read_bytes()).hexdigest()[:12]
    return Outcome(seconds, f"gen prints {out}, config.h {config}", phases)


def wl_untar(d: Path, a: Assets, _s: dict) -> Outcome:
    dest = d / "tree"
    dest.mkdir()
    t0 = time.perf_counter()
    run(["tar", "xzf", str(a.tarball), "-C", str(dest)], cwd=d)
    return Outcome(time.perf_counter() - t0, tree_digest(dest))


def wl_cp(d: Path, a: Assets, _s: dict) -> Outcome:
    t0 = time.perf_counter()
    run(["cp", "-r", str(a.tree), str(d / "tree")], cwd=d)
    return Outcome(time.perf_counter() - t0, tree_digest(d / "tree"))


def wl_rsync(d: Path, a: Assets, _s: dict) -> Outcome:
    t0 = time.perf_counter()
    run(["rsync", "-a", f"{a.tree}/", f"{d / 'tree'}/"], cwd=d)
    return Outcome(time.perf_counter() - t0, tree_digest(d / "tree"))


def _from_worker(name: str, *args: object) -> Outcome:
    rep = run_worker(name, *args)
    return Outcome(rep["seconds"], rep["result"])


def sqlite_workload(journal: str, sync: str) -> Callable[[Path, Assets, dict], Outcome]:
    def wl(d: Path, _a: Assets, s: dict) -> Outcome:
        return _from_worker("sqlite", d / "bench.db", s["sqlite_rows"], journal, sync)

    return wl


def wl_logging(d: Path, _a: Assets, s: dict) -> Outcome:
    return _from_worker("logging", d / "app.log", s["log_records"])


def wl_line_writes(d: Path, _a: Assets, s: dict) -> Outcome:
    return _from_worker("line-writes", d / "out.txt", s["line_writes"])


def wl_write_delete(d: Path, _a: Assets, s: dict) -> Outcome:
    return _from_worker("write-delete", d, s["write_delete"])


def wl_csu(d: Path, _a: Assets, s: dict) -> Outcome:
    rep = run_worker("csu", d / "e", s["csu"])
    left = len(os.listdir(d / "e"))
    return Outcome(rep["seconds"], f"{left} files left",
                   {k: rep[k] for k in ("create", "stat", "unlink")})


def wl_small_files(d: Path, _a: Assets, s: dict) -> Outcome:
    rep = run_worker("small-files", d / "out", s["small_files"])
    return Outcome(rep["seconds"], tree_digest(d / "out"))


# key -> (label, function, target ratio or None)
WORKLOADS: dict[str, tuple[str, Callable[[Path, Assets, dict], Outcome], float | None]] = {
    "git": ("git clone + status + commit + gc ({tree_files} files)", wl_git, 2.0),
    "pip": ("venv + pip install (local wheels) + imports", wl_pip, 2.0),
    "pytest": ("pytest, {pytest_tests} tests", wl_pytest, 2.0),
    "cbuild": ("C project: configure + make ({c_files} files)", wl_cbuild, 2.0),
    "sqlite_journal": ("SQLite {sqlite_rows} inserts / 1,000 per txn, rollback journal",
                       sqlite_workload("delete", "full"), 3.0),
    "sqlite_wal": ("SQLite {sqlite_rows} inserts / 1,000 per txn, WAL",
                   sqlite_workload("wal", "full"), 3.0),
    "sqlite_journal_nosync": ("same, rollback journal, synchronous=OFF",
                              sqlite_workload("delete", "off"), 3.0),
    "sqlite_wal_nosync": ("same, WAL, synchronous=OFF", sqlite_workload("wal", "off"), 3.0),
    "untar": ("tar xzf of {tree_files} files", wl_untar, 4.0),
    "cp": ("cp -r of {tree_files} files", wl_cp, 4.0),
    "rsync": ("rsync -a of {tree_files} files", wl_rsync, 4.0),
    "logging": ("logging.FileHandler, {log_records} records", wl_logging, 2.0),
    "line_writes": ("{line_writes} line-buffered write() calls", wl_line_writes, 2.0),
    "write_delete": ("write 4 KB + close + delete, {write_delete} times", wl_write_delete, None),
    "csu": ("create+stat+unlink {csu} empty files", wl_csu, 10.0),
    "small_files": ("write {small_files} x 20 KB files", wl_small_files, 8.0),
}


# --------------------------------------------------------------------------- workers


def worker_sqlite(path: str, rows: str, journal: str, sync: str) -> dict:
    """Inserts in transactions of 1,000 rows; the answer of a query as the result."""
    n = int(rows)
    rng = random.Random(42)
    payloads = [rng.randbytes(rng.randint(20, 200)).hex() for _ in range(1000)]
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA journal_mode={journal}")
    db.execute(f"PRAGMA synchronous={sync}")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER, payload TEXT)")
    db.execute("CREATE INDEX t_k ON t (k)")
    start = time.perf_counter()
    for base in range(0, n, 1000):
        db.execute("BEGIN")
        db.executemany("INSERT INTO t (k, payload) VALUES (?, ?)",
                       ((rng.randrange(1 << 30), payloads[i % 1000])
                        for i in range(base, min(base + 1000, n))))
        db.execute("COMMIT")
    seconds = time.perf_counter() - start
    count, total, ksum = db.execute("SELECT count(*), sum(length(payload)), sum(k) FROM t").fetchone()
    check = db.execute("PRAGMA integrity_check").fetchone()[0]
    db.close()
    return {"seconds": seconds, "result": f"{count} rows, {total} bytes, k sum {ksum}, {check}"}


def worker_logging(path: str, records: str) -> dict:
    """Records through logging.FileHandler, which flushes after each one."""
    import logging

    logger = logging.getLogger("bench")
    logger.propagate = False
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    start = time.perf_counter()
    for i in range(int(records)):
        logger.info("request %d handled in %d ms status %d", i, i % 97, 200 + i % 3)
    handler.close()
    seconds = time.perf_counter() - start
    with open(path, "rb") as f:  # the time stamps differ; the rest must not
        lines = [line.split(b" ", 2)[2] for line in f]
    digest = hashlib.sha256(b"".join(lines)).hexdigest()[:16]
    return {"seconds": seconds, "result": f"{len(lines)} lines {digest}"}


def worker_line_writes(path: str, count: str) -> dict:
    """Line-buffered text output: one write() per line."""
    start = time.perf_counter()
    with open(path, "w", buffering=1) as f:
        for i in range(int(count)):
            f.write(f"{i:08d} progress: step {i % 1000} of 1000, loss {i % 7}.{i % 13:02d}\n")
    seconds = time.perf_counter() - start
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return {"seconds": seconds, "result": digest}


def worker_write_delete(directory: str, count: str) -> dict:
    """Write a small file, close it, delete it: scratch files of a tool, N times."""
    data = os.urandom(4096)
    start = time.perf_counter()
    for i in range(int(count)):
        p = os.path.join(directory, f"scratch{i % 10}.tmp")
        with open(p, "wb") as f:
            f.write(data)
        os.unlink(p)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "result": f"{len(os.listdir(directory))} files left"}


WORKERS = {
    "sqlite": worker_sqlite,
    "logging": worker_logging,
    "line-writes": worker_line_writes,
    "write-delete": worker_write_delete,
    "csu": lambda d, n: worker_create_stat_unlink(d, n),
    "small-files": lambda d, n: worker_write_files(d, n, "20000", "7"),
}


# --------------------------------------------------------------------------- driver


class MemorySampler:
    """Peak RSS (VmHWM, reset before each workload) and the largest RssAnon seen."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.max_anon = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        if self.pid:
            try:  # 5: reset the peak RSS counter (root or the daemon's owner)
                Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            except OSError:
                pass
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self.max_anon = max(self.max_anon, memory_kib(self.pid).get("RssAnon", 0))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self.pid:
            mem = memory_kib(self.pid)
            self.peak = mem.get("VmHWM", 0)
            self.max_anon = max(self.max_anon, mem.get("RssAnon", 0))
        else:
            self.peak = 0


class SourceMount(VfsdMount):
    """A vfsd mount whose code comes from another checkout (for before/after runs)."""

    src: Path | None = None

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src)
        proc = subprocess.run([repo_python(), "-m", "vfsd.cli", *args], capture_output=True,
                              text=True, timeout=timeout, cwd=self.src or REPO, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"vfsd {' '.join(args)} exited {proc.returncode}: "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc


class Runner:
    """Runs the chosen workloads on both sides and keeps every sample."""

    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        self.sizes = dict(QUICK if args.quick else FULL)
        if args.reps:
            self.sizes["reps"] = args.reps
        self.sizes["pytest_tests"] = self.sizes["pytest_files"] * 60
        self.base = base
        self.native = base / "native"
        self.native.mkdir()
        self.spread_note = spread_directories(self.native)
        self.mount = SourceMount(base / "run", tuple(args.vfsd_opt))
        self.mount.src = Path(args.vfsd_src).resolve() if args.vfsd_src else None
        self.mount.access_log_reader = args.access_log_reader
        self.mount.mount()
        self.assets = Assets(Path(args.cache).expanduser(), self.sizes["tree_files"], self.log)
        self.rows: dict[str, dict] = {}
        self.problems: list[str] = []

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def daemon_counters(self) -> dict:
        try:
            doc = self.mount.status()
        except Exception:  # noqa: BLE001 - an older daemon may not answer the same way
            return {}
        return {**doc.get("counters", {}), "requests": doc.get("requests", {})}

    def run_one(self, key: str, side: str, rep: int) -> tuple[Outcome, dict]:
        root = self.native if side == "native" else self.mount.root
        d = root / f"{key}-{rep}"
        d.mkdir()
        fn = WORKLOADS[key][1]
        extra: dict = {}
        try:
            if side == "vfsd":
                before = self.daemon_counters()
                with MemorySampler(self.mount.pid()) as mem:
                    out = fn(d, self.assets, self.sizes)
                after = self.daemon_counters()
                extra = {"peak_rss_kib": mem.peak, "max_anon_kib": mem.max_anon,
                         "counters": diff_counters(before, after)}
            else:
                out = fn(d, self.assets, self.sizes)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        return out, extra

    def run(self, only: list[str]) -> None:
        for key in WORKLOADS:
            if only and key not in only:
                continue
            row = {"label": WORKLOADS[key][0].format(**self.sizes), "target": WORKLOADS[key][2],
                   "native": [], "vfsd": [], "results": {}, "phases": {}, "vfsd_extra": []}
            self.rows[key] = row
            for rep in range(self.sizes["reps"]):
                for side in (("native", "vfsd") if rep % 2 == 0 else ("vfsd", "native")):
                    try:
                        out, extra = self.run_one(key, side, rep)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        self.problems.append(f"{key} on {side}: {exc}")
                        self.log(f"PROBLEM: {key} on {side}: {exc}")
                        continue
                    row[side].append(out.seconds)
                    row["results"].setdefault(side, out.result)
                    row["phases"].setdefault(side, []).append(out.phases)
                    if extra:
                        row["vfsd_extra"].append(extra)
            res = row["results"]
            if res.get("native") != res.get("vfsd"):
                msg = f"{key}: results differ: native {res.get('native')!r}, vfsd {res.get('vfsd')!r}"
                self.problems.append(msg)
                self.log(f"PROBLEM: {msg}")
            if row["native"] and row["vfsd"]:
                n, v = summary(row["native"])["median"], summary(row["vfsd"])["median"]
                self.log(f"  {key}: native {fmt_seconds(n)}, vfsd {fmt_seconds(v)}, "
                         f"{v / n:.1f}x ({res.get('vfsd')})")

    def close(self) -> None:
        try:
            self.mount.umount()
        except Exception:  # noqa: BLE001
            self.mount.force_cleanup()


def diff_counters(before: dict, after: dict) -> dict:
    out = {}
    for k, v in after.items():
        if isinstance(v, dict):
            d = diff_counters(before.get(k, {}), v)
            if d:
                out[k] = d
        elif isinstance(v, int) and v - before.get(k, 0):
            out[k] = v - before.get(k, 0)
    return out


def print_table(runner: Runner, info: dict) -> None:
    print_machine(info)
    print(f"sizes: {json.dumps({k: v for k, v in runner.sizes.items()})}; {runner.spread_note}")
    print(f"load average at end: {load_average()}\n")
    print("| workload | native | vfsd | vfsd / native | target | daemon peak RSS / anon | "
          "FUSE requests | LMDB write txns |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in runner.rows.values():
        if not row["native"] or not row["vfsd"]:
            print(f"| {row['label']} | failed | | | | | | |")
            continue
        n, v = summary(row["native"])["median"], summary(row["vfsd"])["median"]
        extra = row["vfsd_extra"][0] if row["vfsd_extra"] else {}
        c = extra.get("counters", {})
        reqs = sum(c.get("requests", {}).values()) if c.get("requests") else None
        txns = c.get("lmdb_write_txns")
        target = f"{row['target']:.0f}x" if row["target"] else "-"
        mark = " ✓" if row["target"] and v / n <= row["target"] else ""
        mem = (f"{extra.get('peak_rss_kib', 0) / 1024:.0f} / "
               f"{extra.get('max_anon_kib', 0) / 1024:.0f} MiB") if extra else "-"
        print(f"| {row['label']} | {fmt_seconds(n)} | {fmt_seconds(v)} | **{v / n:.1f}x**{mark} "
              f"| {target} | {mem} | {reqs if reqs is not None else '-'} "
              f"| {txns if txns is not None else '-'} |")
    if runner.problems:
        print()
        for p in runner.problems:
            print(f"PROBLEM: {p}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        print(json.dumps(WORKERS[argv[1]](*argv[2:])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes)")
    ap.add_argument("--reps", type=int, help="runs per side (median reported) [1]")
    ap.add_argument("--only", action="append", default=[], choices=sorted(WORKLOADS),
                    help="run only this workload (repeatable)")
    ap.add_argument("--cache", default=os.environ.get("VFSD_BENCH_CACHE", "~/.cache/vfsd-bench"),
                    help="where the source tree, tarball, git repo and wheels are kept")
    ap.add_argument("--vfsd-src", metavar="DIR",
                    help="run the daemon from this checkout (e.g. the commit to compare with)")
    add_run_options(ap)
    args = ap.parse_args(argv)
    if args.wait_quiet:
        wait_for_quiet(args.wait_quiet, 1800)
    base = Path(tempfile.mkdtemp(prefix="vfsd-workloads-", dir=args.base_dir))
    info = machine_info(base)
    print_machine(info, file=sys.stderr)
    runner = Runner(args, base)
    try:
        runner.run(args.only)
    finally:
        runner.close()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    res = {"machine": info, "sizes": runner.sizes, "workloads": runner.rows,
           "problems": runner.problems, "load_at_end": load_average()}
    if args.json:
        text = json.dumps(res, indent=2)
        if args.json == "-":
            print(text)
            return 1 if runner.problems else 0
        Path(args.json).write_text(text + "\n")
    print_table(runner, info)
    return 1 if runner.problems else 0


if __name__ == "__main__":
    sys.exit(main())
