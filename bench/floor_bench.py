#!/usr/bin/env python3
"""How much of a metadata-heavy workload is pyfuse3 itself: vfsd against a
filesystem that does nothing, and native, in one run.

Usage (as root, from the repo):
    .venv/bin/python bench/floor_bench.py [--files N] [--reps R] [--json FILE]

The floor is the minimal in-memory pyfuse3 filesystem of `xattr_probe.py`
(`serve`, answering getxattr with ENOSYS and using the writeback cache, as
vfsd does): every request reaches Python and trio, and the handler does
next to nothing. The kernel sends it the same requests it sends vfsd (the
counts are printed), so what vfsd adds on top of the floor is its own work,
and the floor against native is what no Python FUSE daemon gets below on
this machine. Workloads: create+stat+unlink of empty files, and writing
small (20 KB) files, each in a fresh interpreter timing only its loop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import VfsdMount, machine_info, print_machine, rmtree_quiet  # noqa: E402
from xattr_probe import ProbeMount  # noqa: E402

HERE = Path(__file__).resolve()


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


WORKLOADS = {"create+stat+unlink": work_csu, "write 20 KB files": work_small_files}


def run_work(name: str, directory: Path, n: int) -> float:
    out = subprocess.run([sys.executable, str(HERE), "work", name, str(directory), str(n)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "work":
        print(WORKLOADS[sys.argv[2]](sys.argv[3], int(sys.argv[4])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vfsd-floor-", dir=args.base_dir))
    info = machine_info(base)
    print_machine(info)
    probe = ProbeMount(base, "enosys", True)
    vfsd = VfsdMount(base / "run")
    vfsd.mount()
    native = base / "native"
    native.mkdir()
    results: dict[str, dict[str, float]] = {}
    try:
        for name in WORKLOADS:
            results[name] = {}
            for side, root in (("native", native), ("pyfuse3 floor", probe.root),
                               ("vfsd", vfsd.root)):
                times = []
                for rep in range(args.reps):
                    d = root if side == "pyfuse3 floor" else root / f"{name[:5]}{rep}"
                    if side != "pyfuse3 floor":
                        d.mkdir()
                    times.append(run_work(name, d, args.files))
                    if side == "pyfuse3 floor" and name.startswith("write"):
                        for i in range(args.files):  # it cannot list: names are known
                            os.unlink(d / f"f{i:06d}")
                results[name][side] = statistics.median(times)
    finally:
        counts = probe.close()
        vfsd.umount()
        rmtree_quiet(base)
    print(f"\nper file, median of {args.reps} runs of {args.files} files:\n")
    print("| workload | native | pyfuse3 floor | vfsd | floor / native | vfsd / native | "
          "vfsd / floor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        n, f, v = (r[k] / args.files * 1e6 for k in ("native", "pyfuse3 floor", "vfsd"))
        print(f"| {name} | {n:.0f} µs | {f:.0f} µs | {v:.0f} µs | {f / n:.1f}x | "
              f"{v / n:.1f}x | {v / f:.2f}x |")
    print(f"\nrequests the floor filesystem received: {json.dumps(counts)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "files": args.files,
                                               "results": results, "floor_requests": counts},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
