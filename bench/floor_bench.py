#!/usr/bin/env python3
"""How much of a small-file workload is pyfuse3 itself: vfsd against a
filesystem that does nothing, and native, in one run, with the requests each got.

Usage (as root, from the repo):
    .venv/bin/python bench/floor_bench.py [--files N] [--tree-files N] [--reps R]
                                          [--only NAME] [--json FILE]

The floor is `floorfs.py`: a whole tree in Python dicts on pyfuse3, answering
the kernel as vfsd does (writeback cache, hour-long entry and attribute
timeouts, cached negative lookups, FLUSH and getxattr ENOSYS), so the kernel
sends both the same requests for the same program. What vfsd costs beyond
the floor is its own work; the floor against native is what no Python FUSE
daemon gets below on this machine.

Workloads, each on a fresh directory of each side, the sides' order turned
every repetition:

- loops in a fresh interpreter that times only its loop: create+stat+unlink
  of N empty files, writing N 20 KB files;
- real programs over a source tree (TREE files copied from this Python's
  standard library, cached under --cache): `tar xf` of its tarball, `cp -r`
  and `rsync -a` of it, then on the tree `tar xf` just wrote, `du -s` and
  `find -type f | xargs grep -l` (the kernel's caches are warm from writing).

Per workload it prints the median time on each side, vfsd / floor, and per
file the requests each daemon answered (the floor counts its own; vfsd's from
`vfsd status --json`, with its LMDB write transactions). Progress goes to
stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ControlClient,
    VfsdMount,
    is_mounted,
    load_average,
    machine_info,
    print_machine,
    rmtree_quiet,
)

HERE = Path(__file__).resolve()
FLOORFS = HERE.parent / "floorfs.py"


def work_csu(directory: str, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        p = f"{directory}/e{i:06d}"
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.stat(p)
        os.unlink(p)
    return time.perf_counter() - start


def work_small_files(directory: str, n: int) -> float:
    data = os.urandom(20_000)
    start = time.perf_counter()
    for i in range(n):
        with open(f"{directory}/f{i:06d}", "wb") as f:
            f.write(data)
    return time.perf_counter() - start


LOOPS = {"create+stat+unlink": work_csu, "write 20 KB files": work_small_files}


def run_loop(name: str, directory: Path, n: int) -> float:
    out = subprocess.run([sys.executable, str(HERE), "work", name, str(directory), str(n)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def run_tool(cmd: list[str] | str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, shell=isinstance(cmd, str), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"})
    return time.perf_counter() - start


# ------------------------------------------------------------------ the tree


def source_tree(cache: Path, n: int) -> tuple[Path, Path, int]:
    """(tree, its tarball, files): n files of this Python's stdlib, built once."""
    tree, tarball = cache / f"floor-tree-{n}", cache / f"floor-tree-{n}.tar"
    if not (cache / f"floor-tree-{n}.complete").exists():
        shutil.rmtree(tree, ignore_errors=True)
        stdlib, count = Path(sysconfig.get_paths()["stdlib"]), 0
        for dirpath, dirs, files in os.walk(stdlib):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "site-packages"))
            for name in sorted(files):
                src = Path(dirpath) / name
                if src.is_symlink() or not src.is_file() or src.stat().st_size > 1 << 20:
                    continue
                dest = tree / src.relative_to(stdlib)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
                os.chmod(dest, 0o644)
                count += 1
                if count >= n:
                    break
            if count >= n:
                break
        subprocess.run(["tar", "cf", str(tarball), "--sort=name", "-C", str(tree), "."],
                       check=True)
        (cache / f"floor-tree-{n}.complete").write_text(str(count))
    return tree, tarball, int((cache / f"floor-tree-{n}.complete").read_text())


# ----------------------------------------------------------------- the sides


class FloorMount:
    """floorfs.py in a subprocess; `counts()` asks it for its request counts."""

    def __init__(self, base: Path) -> None:
        self.root = base / "floor"
        self.root.mkdir()
        self.counts_file = base / "floor-counts.json"
        self.proc = subprocess.Popen([sys.executable, str(FLOORFS), str(self.root),
                                      str(self.counts_file)])
        deadline = time.monotonic() + 30
        while not is_mounted(self.root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the floor filesystem did not mount")
            time.sleep(0.05)

    def counts(self) -> dict[str, int]:
        before = self.counts_file.stat().st_mtime_ns if self.counts_file.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.counts_file.exists() or self.counts_file.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise RuntimeError("the floor filesystem did not write its counts")
            time.sleep(0.01)
        return json.loads(self.counts_file.read_text())

    def close(self) -> None:
        for _attempt in range(50):  # busy while something else on the machine walks it
            if subprocess.run(["fusermount3", "-u", str(self.root)],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["fusermount3", "-u", "-z", str(self.root)], capture_output=True)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class VfsdSide:
    """A vfsd mount; `counts()` reads its request and LMDB write counters."""

    def __init__(self, base: Path, options: tuple[str, ...] = ()) -> None:
        self.mount = VfsdMount(base / "run", options)
        self.mount.mount()
        self.root = self.mount.root

    def counts(self) -> dict[str, int]:
        client = ControlClient(self.mount.socket_path)
        try:
            doc = client.request("stats")
        finally:
            client.close()
        out = dict(doc["requests"])
        out["lmdb_write_txns"] = doc["counters"]["lmdb_write_txns"]
        return out

    def close(self) -> None:
        self.mount.umount()


def cpu_seconds(pid: int) -> float:
    """CPU time all threads of `pid` have run (schedstat: nanoseconds on a CPU)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


# ------------------------------------------------------------------ running


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "work":
        print(LOOPS[sys.argv[2]](sys.argv[3], int(sys.argv[4])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=3000, help="files of each loop [3000]")
    ap.add_argument("--tree-files", type=int, default=3600, help="files of the tree [3600]")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each workload [3]")
    ap.add_argument("--only", action="append", help="run only workloads whose name has this")
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "vfsd-bench"))
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--vfsd-opt", action="append", default=[],
                    help="extra `vfsd mount` argument (repeat; use --vfsd-opt=--flag)")
    args = ap.parse_args()
    tree, tarball, tree_files = source_tree(Path(args.cache), args.tree_files)
    base = Path(tempfile.mkdtemp(prefix="vfsd-floor-", dir=args.base_dir))
    info = machine_info(base)
    native = base / "native"
    native.mkdir()
    # ext4 skips inodes freed in the last minute: each native run in a fresh
    # block group (see bench/README.md).
    subprocess.run(["chattr", "+T", str(native)], check=False, capture_output=True)
    floor, vfsd = FloorMount(base), VfsdSide(base, tuple(args.vfsd_opt))
    roots = {"native": native, "floor": floor.root, "vfsd": vfsd.root}
    counters = {"floor": floor.counts, "vfsd": vfsd.counts}
    pids = {"floor": floor.proc.pid, "vfsd": vfsd.mount.pid()}

    def tool(make) -> object:
        return lambda d, made: run_tool(make(d, made))

    # name -> (files, fn(dir, written tree dir) -> seconds, needs the tar tree)
    workloads = {
        "create+stat+unlink": (args.files, lambda d, _t: run_loop("create+stat+unlink", d,
                                                                   args.files), False),
        "write 20 KB files": (args.files, lambda d, _t: run_loop("write 20 KB files", d,
                                                                  args.files), False),
        "tar xf": (tree_files, tool(lambda d, _t: ["tar", "xf", str(tarball), "-C", str(d)]),
                   False),
        "cp -r": (tree_files, tool(lambda d, _t: ["cp", "-r", f"{tree}/.", str(d)]), False),
        "rsync -a": (tree_files, tool(lambda d, _t: ["rsync", "-a", f"{tree}/", f"{d}/"]),
                     False),
        "du -s after tar xf": (tree_files, tool(lambda _d, t: ["du", "-s", str(t)]), True),
        "find | xargs grep after tar xf": (
            # xargs says 123 when one of its greps found nothing: not a failure here.
            tree_files, tool(lambda _d, t: f"find {t} -type f | xargs grep -l ConnectionError"
                                           " || [ $? -eq 123 ]"),
            True),
    }
    if args.only:
        workloads = {k: v for k, v in workloads.items() if any(o in k for o in args.only)}
    times: dict[str, dict[str, list[float]]] = {w: {s: [] for s in roots} for w in workloads}
    # CPU time the daemon spent: much steadier than wall time on a busy machine.
    cpu: dict[str, dict[str, list[float]]] = {w: {s: [] for s in pids} for w in workloads}
    requests: dict[str, dict[str, dict[str, int]]] = {w: {} for w in workloads}
    sides = list(roots)
    print_machine(info)
    try:
        for rep in range(args.reps):
            order = sides[rep % 3:] + sides[:rep % 3]
            for side in order:
                root = roots[side]
                written = None
                for name, (_files, fn, needs_tree) in workloads.items():
                    d = root / f"{rep}-{name.split()[0].replace('+', '')}"
                    if needs_tree:
                        written = written or _tar_tree(root, rep, tarball)
                    else:
                        d.mkdir()
                    before = counters[side]() if side in counters and rep == 0 else None
                    cpu0 = cpu_seconds(pids[side]) if side in pids else 0.0
                    times[name][side].append(fn(d, written))
                    if side in pids:
                        cpu[name][side].append(cpu_seconds(pids[side]) - cpu0)
                    if before is not None:
                        requests[name][side] = delta(counters[side](), before)
                print(f"rep {rep + 1}/{args.reps} {side} done (load {load_average()})",
                      file=sys.stderr)
                for child in root.iterdir():  # the next repetition starts empty
                    run_tool(["rm", "-rf", str(child)])
    finally:
        for close in (floor.close, vfsd.close):
            try:
                close()
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                print(f"cleanup: {exc}", file=sys.stderr)  # the figures still count
        rmtree_quiet(base)
    print(f"\nload average at the end: {load_average()}")
    print(f"\nmedian of {args.reps} runs; loops of {args.files} files, a tree of "
          f"{tree_files} files; requests per file (first run):\n")
    print("| workload | native | pyfuse3 floor | vfsd | vfsd / floor | daemon CPU: floor / "
          "vfsd | vfsd / floor (CPU) | requests per file: floor / vfsd | "
          "vfsd LMDB write txns per file |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (files, _fn, _t) in workloads.items():
        med = {s: statistics.median(times[name][s]) for s in roots}
        mcpu = {s: statistics.median(cpu[name][s]) for s in pids}
        req = requests[name]
        f_req = sum(req.get("floor", {}).values()) / files
        v_all = dict(req.get("vfsd", {}))
        txns = v_all.pop("lmdb_write_txns", 0) / files
        v_req = sum(v_all.values()) / files
        print(f"| {name} | {_ms(med['native'])} | {_ms(med['floor'])} | {_ms(med['vfsd'])} | "
              f"{med['vfsd'] / med['floor']:.2f}x | {_ms(mcpu['floor'])} / {_ms(mcpu['vfsd'])} | "
              f"{mcpu['vfsd'] / max(mcpu['floor'], 1e-9):.2f}x | {f_req:.1f} / {v_req:.1f} | "
              f"{txns:.2f} |")
    print("\nrequests per file, by kind (floor / vfsd):\n")
    for name, (files, _fn, _t) in workloads.items():
        req = requests[name]
        kinds = sorted(set(req.get("floor", {})) | set(req.get("vfsd", {})) - {"lmdb_write_txns"})
        print(f"- {name}: " + ", ".join(
            f"{k} {req.get('floor', {}).get(k, 0) / files:.2f} / "
            f"{req.get('vfsd', {}).get(k, 0) / files:.2f}" for k in kinds))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": info, "times": times, "daemon_cpu": cpu, "requests": requests,
             "files": {n: w[0] for n, w in workloads.items()}}, indent=2))
    return 0


def _tar_tree(root: Path, rep: int, tarball: Path) -> Path:
    """The tree the read workloads walk: unpacked by tar on this side, untimed."""
    d = root / f"{rep}-walk"
    d.mkdir()
    run_tool(["tar", "xf", str(tarball), "-C", str(d)])
    return d


def _ms(s: float) -> str:
    return f"{s * 1000:.0f} ms"


if __name__ == "__main__":
    sys.exit(main())
