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
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    VfsdMount,
    add_run_options,
    fmt_seconds,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--file-size", type=int, default=1024)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    add_run_options(ap)
    args = ap.parse_args()
    if args.wait_quiet:
        wait_for_quiet(args.wait_quiet, 1800)
    base = Path(tempfile.mkdtemp(prefix="vfsd-startup-", dir=args.base_dir))
    info = machine_info(base)
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
