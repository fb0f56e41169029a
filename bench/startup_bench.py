#!/usr/bin/env python3
"""What the start-up read of the whole LMDB file costs, on a store of many small files.

Usage (from the repo):
    .venv/bin/python bench/startup_bench.py [--files N] [--rounds R] [--json FILE|-]

Before it mounts, the daemon lets a child process read every record of every
table (`vfsd.store.lmdbcheck`), so damaged pages refuse the mount instead of killing
the daemon at its first unlucky read. This bench fills a store with N small
files (default 100,000 files of ~1 KB, written through the mount by 4 threads),
unmounts it, then per round, interleaved:

- `vfsd mount` + `vfsd umount`, timed from the start of `vfsd mount` to its
  return (the mount answers), warm (the LMDB file in the page cache) and cold
  (the LMDB file's pages dropped with fadvise(DONTNEED) first);
- the walk alone (`lmdbcheck.check_readable`), warm and cold the same way.

"mount without the walk" is the mount time minus the walk's: the walk runs
before anything else opens the store, so nothing overlaps it.

`--only mount` measures what a mount costs on an empty run dir, and what an
idle daemon holds, for the current tree and (with `--baseline REV`, a git
revision unpacked with `git archive`) the tree it replaces, alternating them
round by round (`bench/mount_probe.py` runs in a fresh interpreter with the
tree first on sys.path): `mount_tool.mount()` (its first call, which starts
the helper, apart), `vfsd mount` run as a process, the daemon alone
(`python -m vfsd.serve` until READY) and the interpreter with the daemon's
imports alone; then `umount`s; and RssAnon, Pss_Anon and Private_Dirty of
an idle daemon (1 s after mounting) started each way, and of the helper.
Both trees are byte-compiled first, as an installed package is.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO,
    VfsdMount,
    add_run_options,
    fmt_seconds,
    load_average,
    machine_info,
    print_machine,
    rmtree_quiet,
    summary,
    tool_output_text,
    wait_for_quiet,
)

from vfsd.store.lmdbcheck import check_readable  # noqa: E402


def fill(mount: VfsdMount, n_files: int, file_size: int, writers: int) -> float:
    """Write n_files small files in directories of 1,000; seconds taken."""
    rng = random.Random(n_files)
    start = time.perf_counter()
    for d in range(-(-n_files // 1000)):
        directory = mount.root / f"d{d:04d}"
        directory.mkdir()
        count = min(1000, n_files - d * 1000)
        contents = [tool_output_text(rng, file_size) for _ in range(count)]

        def write(i: int, directory=directory, contents=contents) -> None:
            with open(directory / f"f{i:04d}.txt", "wb") as f:
                f.write(contents[i])

        with ThreadPoolExecutor(writers) as pool:
            list(pool.map(write, range(count)))
    return time.perf_counter() - start


def drop_store_pages(lmdb_dir: Path) -> None:
    """Drop the LMDB file's cached pages (this file only, not the machine's caches)."""
    os.sync()
    fd = os.open(lmdb_dir / "data.mdb", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed_mount(mount: VfsdMount) -> float:
    start = time.perf_counter()
    mount.mount()
    took = time.perf_counter() - start
    mount.umount()
    return took


def timed_walk(store_dir: Path) -> float:
    start = time.perf_counter()
    damage = check_readable(store_dir)
    took = time.perf_counter() - start
    if damage is not None:
        raise RuntimeError(f"the store reads as damaged: {damage}")
    return took


MOUNT_ROWS = (
    ("mount_tool", "`mount_tool.mount()`, helper warm"),
    ("mount_tool_first", "`mount_tool.mount()`, first call of a program"),
    ("cli", "`vfsd mount` run as a process"),
    ("daemon", "the daemon alone (`python -m vfsd.serve` to READY)"),
    ("imports", "interpreter + the daemon's imports"),
    ("mount_tool_umount", "`Mount.close()` (unmount)"),
    ("cli_umount", "`vfsd umount` run as a process"),
)


def unpack(rev: str, into: Path) -> Path:
    """The tree of git revision `rev` of this repo, unpacked under `into`."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "x", "-C", str(into)], input=archive, check=True)
    return into


def compiled(tree: Path) -> Path:
    subprocess.run([sys.executable, "-m", "compileall", "-q", "vfsd", "mount_tool"],
                   cwd=tree, check=True, capture_output=True)
    return tree


def mount_costs(base: Path, trees: dict[str, Path], rounds: int) -> dict:
    """Per tree: the probe's figures, rounds alternating between the trees."""
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(rounds):
        for name, tree in (trees.items() if r % 2 == 0 else reversed(trees.items())):
            work = base / f"{name}-{r}"
            work.mkdir()
            env = {**os.environ, "PYTHONPATH": str(tree)}
            proc = subprocess.run([sys.executable, str(Path(__file__).parent / "mount_probe.py"),
                                   str(tree), str(work), "1"], env=env, cwd=tree,
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"mount probe on {name} failed: {proc.stderr[-2000:]}")
            runs[name].append(json.loads(proc.stdout.splitlines()[-1]))
        print(f"round {r + 1}/{rounds} done (load {load_average()})", file=sys.stderr)
    return runs


def mount_table(runs: dict[str, list[dict]]) -> None:
    names = list(runs)
    print("\n| figure (median of rounds; min-max) | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for key, label in MOUNT_ROWS:
        cells = []
        for name in names:
            vals = [x for run in runs[name] for x in
                    (run[key] if isinstance(run.get(key), list) else [run.get(key)])
                    if x is not None]
            cells.append("–" if not vals else
                         f"{fmt_seconds(statistics.median(vals))} "
                         f"({fmt_seconds(min(vals))}-{fmt_seconds(max(vals))})")
        print(f"| {label} | " + " | ".join(cells) + " |")
    mib = 1024
    for key, label in (("mem_mount_tool", "idle daemon from `mount_tool.mount()`"),
                       ("mem_cli", "idle daemon from `vfsd mount`"), ("helper", "the helper")):
        cells = []
        for name in names:
            vals = [m for run in runs[name] for m in
                    (run[key] if isinstance(run.get(key), list) else [run.get(key)]) if m]
            cells.append("–" if not vals else " / ".join(
                f"{statistics.median(v[k] for v in vals) / mib:.1f}"
                for k in ("RssAnon", "Pss_Anon", "Private_Dirty")))
        print(f"| {label}: RssAnon / Pss_Anon / Private_Dirty, MiB | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--file-size", type=int, default=1024)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=("walk", "mount"), action="append",
                    help="run one part (repeatable; default: both)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also measure the mount costs of this git revision (e.g. main)")
    add_run_options(ap)
    args = ap.parse_args()
    if args.wait_quiet:
        wait_for_quiet(args.wait_quiet, 1800)
    base = Path(tempfile.mkdtemp(prefix="vfsd-startup-", dir=args.base_dir))
    info = machine_info(base)
    parts = args.only or ["walk", "mount"]
    if "mount" in parts:
        try:
            trees = {"this tree": compiled(REPO)}
            if args.baseline:
                trees = {f"{args.baseline}": compiled(unpack(args.baseline, base / "baseline")),
                         **trees}
            runs = mount_costs(base, trees, args.rounds)
        finally:
            if not args.keep and "walk" not in parts:
                rmtree_quiet(base)
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": info, "mount": runs}, indent=2))
        print_machine(info)
        print(f"load average at the end: {load_average()}")
        mount_table(runs)
        if "walk" not in parts:
            return
    mount = VfsdMount(base / "run", tuple(args.vfsd_opt))
    lmdb_dir = mount.state_dir / "lmdb"
    samples: dict[str, list[float]] = {k: [] for k in
                                       ("mount_warm", "mount_cold", "walk_warm", "walk_cold")}
    try:
        mount.mount()
        fill_s = fill(mount, args.files, args.file_size, args.writers)
        print(f"filled {args.files:,} files in {fill_s:.1f} s", file=sys.stderr)
        mount.umount()
        timed_walk(mount.state_dir)  # warm the page cache once
        for r in range(args.rounds):
            for kind in ("walk", "mount"):
                for temp in ("cold", "warm"):
                    if temp == "cold":
                        drop_store_pages(lmdb_dir)
                    took = (timed_walk(mount.state_dir) if kind == "walk"
                            else timed_mount(mount))
                    samples[f"{kind}_{temp}"].append(took)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        size = (lmdb_dir / "data.mdb").stat().st_size
    except BaseException:
        mount.force_cleanup()
        raise
    finally:
        if not args.keep:
            rmtree_quiet(base)
    stats = {k: summary(v) for k, v in samples.items()}
    result = {"machine": info, "files": args.files, "file_size": args.file_size,
              "data_mdb_bytes": size, "fill_seconds": fill_s, "samples": samples,
              "summary": stats}
    if args.json:
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
            return
        Path(args.json).write_text(text)
    print_machine(info)
    print(f"\n{args.files:,} files of ~{args.file_size} B; data.mdb {size / 2**20:.0f} MiB\n")
    print("| page cache | walk | `vfsd mount` | mount without the walk | walk / rest |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for temp in ("warm", "cold"):
        walk = stats[f"walk_{temp}"]["median"]
        total = stats[f"mount_{temp}"]["median"]
        rest = total - walk
        print(f"| {temp} | {fmt_seconds(walk)} | {fmt_seconds(total)} | {fmt_seconds(rest)} | "
              f"{walk / rest:.1f}x |")


if __name__ == "__main__":
    main()
