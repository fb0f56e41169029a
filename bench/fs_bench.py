#!/usr/bin/env python3
"""vfsd against a native directory on the same disk, same work, one run.

Usage (as root, from the repo):
    .venv/bin/python bench/fs_bench.py [--quick] [--reps N] [--json FILE|-]
                                        [--base-dir /var/tmp] [--dry-run] [--vfsd-opt=ARG]

Mounts a fresh run dir with `python -m vfsd.cli mount RUN_DIR` in a temporary
directory under --base-dir, next to a native directory, and runs each workload on
both, alternating which goes first. Every figure is the median of --reps runs.

Cold reads: before each cold run the kernel's caches are dropped (`sync; echo 3 >
/proc/sys/vm/drop_caches`, needs root) and vfsd is also unmounted and mounted again,
so neither the kernel's FUSE page cache nor the daemon's own memory nor its LMDB /
chunk pages help. Without root, caches are dropped per file with fadvise(DONTNEED)
(native files and the vfsd store), and the output says so.

--dry-run compares two native directories (no daemon) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    NEEDLE,
    VfsdMount,
    add_run_options,
    cpu_pressure,
    drop_caches,
    evict_file_pages,
    fmt_seconds,
    load_average,
    machine_info,
    print_machine,
    rmtree_quiet,
    run_timed,
    run_worker,
    summary,
    wait_for_quiet,
)

MIB = 1 << 20

FULL = {
    "big_mib": 256,
    "small_files": 1000,
    "small_size": 20_000,
    "csu_files": 5000,
    "tree_dirs": 100,
    "tree_per_dir": 100,
    "reps": 5,
}
QUICK = {
    "big_mib": 32,
    "small_files": 200,
    "small_size": 20_000,
    "csu_files": 1000,
    "tree_dirs": 20,
    "tree_per_dir": 100,
    "reps": 3,
}
NEEDLE_EVERY = 20  # one small file in 20 holds the grep pattern

# figure key -> (label, target ratio vfsd/native or None)
FIGURES: dict[str, tuple[str, float | None]] = {
    "seq_write_fsync": ("sequential write {big} MiB (dd bs=1M conv=fsync)", 3.0),
    "seq_write": ("sequential write {big} MiB (dd bs=1M, no fsync)", 3.0),
    "seq_read_cold": ("sequential read {big} MiB cold (cat)", 1.5),
    "seq_read_warm": ("sequential read {big} MiB warm (cat)", 1.5),
    "small_write": ("write {n} x 20 KB tool outputs (open/write/close)", 10.0),
    "grep_cold": ("grep -rl over {n} x 20 KB, cold", 3.0),
    "grep_warm": ("grep -rl over {n} x 20 KB, warm", 3.0),
    "create_stat_unlink": ("create+stat+unlink {csu} empty files", 10.0),
    "find_cold": ("find | wc -l over {tree} files, cold", None),
    "find_warm": ("find | wc -l over {tree} files, warm", None),
}


def spread_directories(path: Path) -> str:
    """Mark a native directory so ext4 spreads its subdirectories over block groups.

    Every run below writes into a fresh subdirectory. ext4 without a journal (as on
    some VM images) skips inodes freed in the last minute when it allocates new
    ones, checking each on disk: creating files in a block group where thousands
    were just deleted costs ~0.5 ms per create instead of ~20 us, which would
    inflate the native figures. With the Orlov "top directory" flag (chattr +T)
    each fresh subdirectory lands in another group, away from recent deletes.
    """
    proc = subprocess.run(["chattr", "+T", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"chattr +T failed ({proc.stderr.strip()}); runs reuse block groups"
    return "native runs in fresh subdirectories of a chattr +T directory"


@dataclass
class Side:
    """One place the work runs: the native directory or the vfsd mount."""

    name: str
    root: Path
    mount: VfsdMount | None = None


class Bench:
    """Runs every workload on both sides and collects samples."""

    def __init__(self, args: argparse.Namespace, base: Path):
        self.sizes = dict(QUICK if args.quick else FULL)
        if args.reps:
            self.sizes["reps"] = args.reps
        self.base = base
        self.native = Side("native", base / "native")
        self.native.root.mkdir()
        self.spread_note = spread_directories(self.native.root)
        if args.dry_run:
            self.vfsd = Side("vfsd (dry-run: native)", base / "native2")
            self.vfsd.root.mkdir()
            spread_directories(self.vfsd.root)
        else:
            mount = VfsdMount(base / "run", tuple(args.vfsd_opt),
                              access_log_reader=args.access_log_reader)
            mount.mount()
            self.vfsd = Side("vfsd", mount.root, mount)
        self.sides = (self.native, self.vfsd)
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.extra: dict[str, dict] = {}
        self.cold_method = "not measured"
        self.src = self._source_path()

    def _source_path(self) -> Path:
        # The dd source lives in tmpfs so reading it costs neither side any disk time.
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="vfsd-bench-src-", dir=shm)) / "src.bin"
        return self.base / "src.bin"

    # ------------------------------------------------------------------ helpers

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def ordered(self, rep: int) -> tuple[Side, ...]:
        """Alternate which side goes first, so drift hits both alike."""
        return self.sides if rep % 2 == 0 else self.sides[::-1]

    def record(self, key: str, side: Side, seconds: float) -> None:
        self.samples.setdefault(key, {}).setdefault(side.name, []).append(seconds)

    def make_cold(self, native_paths: list[Path]) -> None:
        """Empty every cache between the disk and a reader, on both sides."""
        m = self.vfsd.mount
        if m:
            m.umount()
        method = drop_caches()
        if method != "drop_caches":
            for p in native_paths:
                evict_file_pages(p)
            if m:
                evict_file_pages(m.state_dir)
            else:
                for p in native_paths:
                    evict_file_pages(self.vfsd.root / p.relative_to(self.native.root))
            method = "fadvise(DONTNEED) per file"
        if m:
            m.mount()
            method += " + vfsd remount"
        self.cold_method = method

    def each_rep(
        self,
        key: str,
        fn: Callable[[Side, int], float],
        before: Callable[[int], None] | None = None,
    ) -> None:
        for rep in range(self.sizes["reps"]):
            if before:
                before(rep)
            for side in self.ordered(rep):
                self.record(key, side, fn(side, rep))
        med = {s: summary(v)["median"] for s, v in self.samples[key].items()}
        self.log(f"  {key}: " + ", ".join(f"{s} {fmt_seconds(v)}" for s, v in med.items()))

    # ------------------------------------------------------------------ workloads

    def big_file(self) -> None:
        big = self.sizes["big_mib"]
        self.log(f"big file: {big} MiB")

        def fresh_source(_rep: int) -> None:
            # New random bytes every rep: a rewrite must never find its chunks stored.
            with open(self.src, "wb") as f:
                for _ in range(big):
                    f.write(os.urandom(MIB))
            for side in self.sides:
                (side.root / "big.bin").unlink(missing_ok=True)
            os.sync()

        def dd(fsync: bool) -> Callable[[Side, int], float]:
            def run(side: Side, _rep: int) -> float:
                extra = ["conv=fsync"] if fsync else []
                t, _ = run_timed(
                    ["dd", f"if={self.src}", f"of={side.root / 'big.bin'}", "bs=1M",
                     "status=none", *extra]
                )
                os.sync()
                return t

            return run

        self.each_rep("seq_write_fsync", dd(True), fresh_source)
        self.each_rep("seq_write", dd(False), fresh_source)
        for side in self.sides:  # what was written is what is read
            run_timed(["cmp", str(self.src), str(side.root / "big.bin")])

        def cat(side: Side, _rep: int) -> float:
            # Paths go to the shell as arguments, never inside its command line.
            return run_timed(["sh", "-c", 'cat -- "$1" > /dev/null', "sh",
                              str(side.root / "big.bin")])[0]

        self.each_rep(
            "seq_read_cold", cat, lambda _r: self.make_cold([self.native.root / "big.bin"])
        )
        for side in self.sides:
            cat(side, 0)
        self.each_rep("seq_read_warm", cat)
        for side in self.sides:
            (side.root / "big.bin").unlink()

    def small_files(self) -> None:
        n, size = self.sizes["small_files"], self.sizes["small_size"]
        self.log(f"small files: {n} x {size} B")

        def clear(rep: int) -> None:
            for side in self.sides:
                rmtree_quiet(side.root / f"small_r{rep - 1}")
            os.sync()

        def write(side: Side, rep: int) -> float:
            d = side.root / f"small_r{rep}"
            return run_worker("write-files", d, n, size, rep, NEEDLE_EVERY)["seconds"]

        self.each_rep("small_write", write, clear)
        expected = len(range(0, n, NEEDLE_EVERY))
        last = f"small_r{self.sizes['reps'] - 1}"

        def grep(side: Side, _rep: int) -> float:
            t, out = run_timed(["grep", "-rl", NEEDLE, str(side.root / last)])
            hits = len(out.splitlines())
            if hits != expected:
                raise RuntimeError(f"grep on {side.name} found {hits} files, expected {expected}")
            return t

        self.each_rep("grep_cold", grep, lambda _r: self.make_cold([self.native.root / last]))
        for side in self.sides:
            grep(side, 0)
        self.each_rep("grep_warm", grep)
        for side in self.sides:
            rmtree_quiet(side.root / last)

    def create_stat_unlink(self) -> None:
        n = self.sizes["csu_files"]
        self.log(f"create+stat+unlink: {n} files")
        phases: dict[str, dict[str, list[float]]] = {}

        def csu(side: Side, rep: int) -> float:
            d = side.root / f"csu_r{rep}"
            r = run_worker("create-stat-unlink", d, n)
            d.rmdir()
            for ph in ("create", "stat", "unlink"):
                phases.setdefault(side.name, {}).setdefault(ph, []).append(r[ph])
            return r["seconds"]

        self.each_rep("create_stat_unlink", csu)
        self.extra["create_stat_unlink_phases"] = {
            s: {ph: summary(v)["median"] for ph, v in d.items()} for s, d in phases.items()
        }

    def find_tree(self) -> None:
        ndirs, per = self.sizes["tree_dirs"], self.sizes["tree_per_dir"]
        self.log(f"find: {ndirs * per} files in {ndirs} dirs")
        for side in self.sides:
            run_worker("make-tree", side.root / "tree", ndirs, per)
        expected = ndirs * per + ndirs + 1

        def find(side: Side, _rep: int) -> float:
            t, out = run_timed(["sh", "-c", 'find "$1" | wc -l', "sh", str(side.root / "tree")])
            if int(out.strip()) != expected:
                raise RuntimeError(f"find on {side.name} saw {out.strip()}, expected {expected}")
            return t

        self.each_rep("find_cold", find, lambda _r: self.make_cold([self.native.root / "tree"]))
        for side in self.sides:
            find(side, 0)
        self.each_rep("find_warm", find)
        for side in self.sides:
            rmtree_quiet(side.root / "tree")

    def run_all(self, only: list[str]) -> None:
        groups = {
            "big": self.big_file,
            "small": self.small_files,
            "csu": self.create_stat_unlink,
            "find": self.find_tree,
        }
        for name, fn in groups.items():
            if not only or name in only:
                fn()

    # ------------------------------------------------------------------ report

    def results(self) -> dict:
        s = self.sizes
        names = {
            "big": s["big_mib"],
            "n": f"{s['small_files']:,}",
            "csu": f"{s['csu_files']:,}",
            "tree": f"{s['tree_dirs'] * s['tree_per_dir']:,}",
        }
        figures = []
        for key, (label, target) in FIGURES.items():
            if key not in self.samples:
                continue
            native = summary(self.samples[key][self.native.name])
            vfsd = summary(self.samples[key][self.vfsd.name])
            ratio = vfsd["median"] / native["median"] if native["median"] > 0 else None
            figures.append(
                {
                    "key": key,
                    "label": label.format(**names),
                    "native_s": native,
                    "vfsd_s": vfsd,
                    "ratio": ratio,
                    "target": target,
                    "met": None if target is None or ratio is None else ratio <= target,
                }
            )
        out = {
            "sizes": s,
            "cold_method": self.cold_method,
            "native_dirs": self.spread_note,
            "figures": figures,
            **self.extra,
        }
        m = self.vfsd.mount
        if m:
            out["vfsd_peak_rss_mib"] = round(m.peak_rss_kib / 1024, 1)
            out["vfsd_max_rss_anon_mib"] = round(m.max_anon_kib / 1024, 1)
            out["vfsd_mount_options"] = list(m.options)
        return out

    def close(self) -> None:
        m = self.vfsd.mount
        if m:
            try:
                m.umount()
            except Exception as exc:  # noqa: BLE001 - report, then clean up by force
                self.log(f"umount failed: {exc}")
                m.force_cleanup()
        rmtree_quiet(self.src.parent if self.src.parent != self.base else self.src)


def print_table(res: dict, info: dict, quick: bool) -> None:
    print_machine(info)
    print(
        f"mode: {'quick' if quick else 'full'}, median of {res['sizes']['reps']} runs; "
        f"cold = {res['cold_method']}; {res['native_dirs']}"
    )
    print(
        f"load average at end: {res.get('loadavg_at_end', '?')}, "
        f"CPU pressure {res.get('cpu_pressure_at_end', '?')}"
    )
    if "vfsd_peak_rss_mib" in res:
        print(
            f"vfsd daemon peak RSS (VmHWM, max over mounts): {res['vfsd_peak_rss_mib']} MiB; "
            f"anonymous (RssAnon, sampled before each unmount): {res['vfsd_max_rss_anon_mib']} MiB"
        )
    print()
    print("| figure | native | vfsd | vfsd/native | target | met |")
    print("| --- | ---: | ---: | ---: | ---: | :---: |")
    for f in res["figures"]:
        ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "-"
        target = f"<= {f['target']:g}x" if f["target"] else "-"
        met = {True: "yes", False: "**no**", None: "-"}[f["met"]]
        label = f["label"].replace("|", "\\|")
        print(
            f"| {label} | {fmt_seconds(f['native_s']['median'])} | "
            f"{fmt_seconds(f['vfsd_s']['median'])} | {ratio} | {target} | {met} |"
        )
    phases = res.get("create_stat_unlink_phases")
    if phases:
        print()
        print(
            "create+stat+unlink phases (median): "
            + "; ".join(
                f"{side}: " + ", ".join(f"{ph} {fmt_seconds(v)}" for ph, v in d.items())
                for side, d in phases.items()
            )
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    ap.add_argument("--reps", type=int, help="runs per figure (default 5, quick 3)")
    ap.add_argument("--dry-run", action="store_true", help="two native dirs, no daemon")
    ap.add_argument(
        "--only",
        action="append",
        choices=("big", "small", "csu", "find"),
        help="run only these workload groups (repeat)",
    )
    add_run_options(ap)
    args = ap.parse_args(argv)

    if args.wait_quiet:
        load = wait_for_quiet(args.wait_quiet, 1800)
        print(f"1-minute load average {load} when starting", file=sys.stderr)
    base = Path(tempfile.mkdtemp(prefix="vfsd-bench-", dir=args.base_dir))
    info = machine_info(base)
    print_machine(info, file=sys.stderr)  # at once too, so a long run shows what it runs on at once
    bench = None
    try:
        bench = Bench(args, base)
        bench.run_all(args.only)
        res = bench.results()
    finally:
        if bench:
            bench.close()
        else:  # failed while mounting: leave no dead mount or daemon behind
            VfsdMount(base / "run").force_cleanup()
        if not args.keep:
            rmtree_quiet(base)
    res["machine"] = info
    res["loadavg_at_end"] = load_average()
    res["cpu_pressure_at_end"] = cpu_pressure()
    if args.json:
        text = json.dumps(res, indent=2)
        if args.json == "-":
            print(text)
            return 0
        Path(args.json).write_text(text + "\n")
    print_table(res, info, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
