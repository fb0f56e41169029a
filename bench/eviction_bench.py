#!/usr/bin/env python3
"""Cost of eviction on a step advance, with 10,000 and 100,000 files in the store.

Usage (from the repo):
    .venv/bin/python bench/eviction_bench.py [--quick] [--files N ...] [--rounds R]
                                              [--scenario max_age|done|rules|both|all]
                                              [--json FILE|-]

How the store is filled: as an agent would. The bench holds a control connection to
the daemon (RUN_DIR/.vfsd/vfsd.sock, its own newline-JSON client so no process
start-up is in the figures), sets the step with `set_step`, and writes a batch of
1,000 files through the mount at that step (4 writer threads, each file ~2 KB of
tool-output text, so inline tier). The policy and the spacing of the batches are
chosen so that one step advance evicts exactly one batch:

- max_age: batches at even steps 0, 2, ..., 2(K-1) (K = N / 1,000) and
  `--max-age-steps 2K-1`. From an even step, the advance to the odd step evicts
  nothing (the batch it would reach is at an odd step: there is none) and the next
  advance evicts exactly the oldest batch. Then a new batch is written at the new
  step, so every measured advance runs with N files in the store.
- done: N - 1,000 active files at older steps, `--max-age-steps` out of reach and
  `--done-retention-steps 3`. Each round writes a batch, marks it done with
  `setxattr user.vfsd.status done`, advances three times (nothing due) and once
  more (the batch is due). This checks that finding done files does not walk the
  older active ones.
- rules: max_age's batches and advances, with rules by path and ages from the
  last use in play: the policy is four rules (pins, a done retention, a glob
  for logs, then `bench/**` with the max age, so every candidate is matched
  against all four), and 1,000 source files written at step 0 are read (opened)
  before every advance. They would be past the max age; read, they are young,
  and the pass writes their 1,000 opens before it judges anything (counted in
  the daemon's figure). An evicted source file is reported as a problem.

Measured per advance: the control round trip of `set_step` (send to reply parsed)
and, if the reply carries one, the daemon's own duration. Checked per advance: the
reply lists exactly the expected number of files, and every evicted path is gone
from the mount at once (stat gives ENOENT). Targets: evicting 1,000 under 50 ms,
evicting nothing under 5 ms, and flat from the smallest to the largest N.
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
    ControlClient,
    VfsdMount,
    add_run_options,
    cpu_pressure,
    fmt_seconds,
    load_average,
    machine_info,
    print_machine,
    reported_duration,
    rmtree_quiet,
    summary,
    tool_output_text,
    wait_for_quiet,
)

BATCH = 1000
TARGET_EVICT_BATCH = 0.050
TARGET_EVICT_NONE = 0.005
FLAT_LIMIT = 1.5  # largest-N over smallest-N figure still called "flat"


class EvictionRun:
    """One mounted store with N files and one eviction policy."""

    def __init__(self, base: Path, n_files: int, scenario: str, args: argparse.Namespace):
        self.n_files = n_files
        self.scenario = scenario
        self.batches = n_files // BATCH
        self.file_size = args.file_size
        self.writers = args.writers
        self.rng = random.Random(n_files)
        self.sources: list[Path] = []
        if scenario == "max_age":
            policy = ("--max-age-steps", str(2 * self.batches - 1))
        elif scenario == "rules":
            rules = [{"path": "keep/**", "pin": True},
                     {"path": "scratch/**", "done_retention_steps": 0},
                     {"path": "**/*.log", "max_age_steps": 2 * self.batches - 1},
                     {"path": "bench/**", "max_age_steps": 2 * self.batches - 1}]
            policy = ("--max-age-steps", str(2 * self.batches - 1),
                      "--eviction-rules", json.dumps(rules))
        else:
            policy = ("--max-age-steps", str(10**9), "--done-retention-steps", "3")
        self.mount = VfsdMount(base / f"run-{scenario}-{n_files}", (*policy, *args.vfsd_opt))
        self.client: ControlClient | None = None
        self.evict_batch: list[dict] = []  # per advance: round trip, daemon figure
        self.evict_none: list[dict] = []
        self.problems: list[str] = []
        self.setup_seconds = 0.0
        self.step = 0

    def log(self, msg: str) -> None:
        print(f"[{self.scenario} N={self.n_files:,}] {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ filling

    def set_step_untimed(self, step: int) -> None:
        report = self.client.request("set_step", step=step)
        if report.get("files"):
            self.problems.append(f"setup advance to {step} evicted {report['files']} files")
        self.step = step

    def write_batch(self) -> list[Path]:
        """Write BATCH files at the current step, in parallel; return their paths."""
        d = self.mount.root / "bench" / f"step_{self.step:06d}"
        d.mkdir(parents=True)
        contents = [tool_output_text(self.rng, self.file_size) for _ in range(BATCH)]
        paths = [d / f"out_{i:04d}.txt" for i in range(BATCH)]

        def write(i: int) -> None:
            with open(paths[i], "wb") as f:
                f.write(contents[i])

        with ThreadPoolExecutor(self.writers) as pool:
            list(pool.map(write, range(BATCH)))
        return paths

    def write_sources(self) -> None:
        """The agent's working files, read before every measured advance (rules)."""
        d = self.mount.root / "src"
        d.mkdir()
        self.sources = [d / f"mod_{i:04d}.py" for i in range(BATCH)]
        for p in self.sources:
            p.write_bytes(tool_output_text(self.rng, 500))

    def read_sources(self) -> None:
        with ThreadPoolExecutor(self.writers) as pool:
            list(pool.map(lambda p: p.read_bytes(), self.sources))

    def fill(self) -> None:
        start = time.perf_counter()
        if self.scenario == "rules":
            self.write_sources()
        if self.scenario in ("max_age", "rules"):
            for j in range(self.batches):
                self.set_step_untimed(2 * j)
                self.write_batch()
        else:
            for j in range(self.batches - 1):
                self.set_step_untimed(j)
                self.write_batch()
            self.set_step_untimed(self.batches - 1)
        self.setup_seconds = time.perf_counter() - start
        rate = (self.batches * BATCH) / self.setup_seconds
        self.log(f"filled in {self.setup_seconds:.1f} s ({rate:,.0f} files/s through the mount)")

    # ------------------------------------------------------------------ measuring

    def advance(self, expect: int) -> None:
        """Advance the step by one, timed; check the reply and the mount."""
        if self.sources:
            self.read_sources()
        self.step += 1
        rtt, report = self.client.timed_request("set_step", step=self.step)
        got = report.get("files", len(report.get("evicted", [])))
        if got != expect:
            self.problems.append(f"advance to {self.step} evicted {got} files, expected {expect}")
        gone = [self.mount.root / rec["path"].lstrip("/") for rec in report.get("evicted", [])]
        sources = sum(1 for rec in report.get("evicted", []) if rec["path"].startswith("src/"))
        if sources:
            self.problems.append(f"advance to {self.step} evicted {sources} source files "
                                 "read at every step")
        visible = [p for p in gone if p.exists()]
        if visible:
            time.sleep(0.2)  # a late kernel invalidation, or none at all?
            late = sum(1 for p in visible if p.exists())
            self.problems.append(
                f"advance to {self.step}: {len(visible)} evicted paths still visible right "
                f"after the reply (first: {visible[0].relative_to(self.mount.root)}), "
                f"{late} still visible 0.2 s later"
            )
        sample = {"round_trip": rtt, "daemon": reported_duration(report)}
        # File the sample by what really happened, so a policy off by one step
        # shows up as a problem above, never as a mislabelled figure.
        (self.evict_batch if got else self.evict_none).append(sample)

    def round_max_age(self) -> None:
        self.advance(expect=0)
        self.advance(expect=BATCH)
        self.write_batch()

    def round_done(self) -> None:
        for p in self.write_batch():
            os.setxattr(p, "user.vfsd.status", b"done")
        for _ in range(3):
            self.advance(expect=0)
        self.advance(expect=BATCH)

    def run(self, rounds: int) -> None:
        try:
            self.mount.mount()
            self.client = ControlClient(self.mount.socket_path)
            self.fill()
            for _ in range(rounds):
                (self.round_done if self.scenario == "done" else self.round_max_age)()
            self.cli_step_seconds = self.time_cli_step()
            self.status = self.safe_status()
            self.mount.sample_rss()
        finally:
            if self.client:
                self.client.close()
            try:
                self.mount.umount()
            except Exception as exc:  # noqa: BLE001 - report, then clean up by force
                self.problems.append(f"umount failed: {exc}")
                self.mount.force_cleanup()
        b, n = self.result()["evict_batch"], self.result()["evict_none"]
        self.log(
            f"evict {BATCH}: {fmt_seconds(b['round_trip']['median'])}, "
            f"evict 0: {fmt_seconds(n['round_trip']['median'])}"
        )

    def time_cli_step(self) -> float:
        """Wall time of one `vfsd step RUN_DIR N` (nothing due), start-up included."""
        start = time.perf_counter()
        self.mount.cli("step", str(self.mount.run_dir), str(self.step))
        return time.perf_counter() - start

    def safe_status(self) -> dict | None:
        try:
            return self.mount.status()
        except Exception as exc:  # noqa: BLE001 - status is a nicety here
            self.problems.append(f"status failed: {exc}")
            return None

    def result(self) -> dict:
        def figs(samples: list[dict]) -> dict:
            if not samples:
                return {"round_trip": None, "daemon": None}
            daemon = [s["daemon"] for s in samples if s["daemon"] is not None]
            return {
                "round_trip": summary([s["round_trip"] for s in samples]),
                "daemon": summary(daemon) if daemon else None,
            }

        return {
            "scenario": self.scenario,
            "files": self.n_files,
            "setup_seconds": self.setup_seconds,
            "evict_batch": figs(self.evict_batch),
            "evict_none": figs(self.evict_none),
            "cli_step_seconds": getattr(self, "cli_step_seconds", None),
            "peak_rss_mib": round(self.mount.peak_rss_kib / 1024, 1),
            "rss_anon_mib": round(self.mount.max_anon_kib / 1024, 1),
            "status": getattr(self, "status", None),
            "problems": self.problems,
        }


def fmt_fig(fig: dict, key: str) -> str:
    part = fig[key]
    if part is None:
        return "-"
    return f"{fmt_seconds(part['median'])} ({fmt_seconds(part['min'])}-{fmt_seconds(part['max'])})"


def print_table(results: list[dict], info: dict, rounds: int, doc_end: dict) -> None:
    print_machine(info)
    print(
        f"load average at end: {doc_end.get('loadavg_at_end', '?')}, "
        f"CPU pressure {doc_end.get('cpu_pressure_at_end', '?')}"
    )
    print(
        f"{rounds} rounds per store; median (min-max). round trip = set_step request sent "
        f"to reply parsed, over a persistent control connection"
    )
    print()
    print(
        f"| scenario | files in store | evict {BATCH:,}: round trip | daemon-reported | "
        f"evict 0: round trip | daemon-reported | `vfsd step` CLI (evict 0) | peak RSS (anon) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        cli = fmt_seconds(r["cli_step_seconds"]) if r["cli_step_seconds"] else "-"
        print(
            f"| {r['scenario']} | {r['files']:,} | {fmt_fig(r['evict_batch'], 'round_trip')} | "
            f"{fmt_fig(r['evict_batch'], 'daemon')} | {fmt_fig(r['evict_none'], 'round_trip')} | "
            f"{fmt_fig(r['evict_none'], 'daemon')} | {cli} | {r['peak_rss_mib']} MiB "
            f"({r['rss_anon_mib']} MiB) |"
        )
    print()
    for scenario in sorted({r["scenario"] for r in results}):
        rs = sorted((r for r in results if r["scenario"] == scenario), key=lambda r: r["files"])
        rs = [r for r in rs if r["evict_batch"]["round_trip"] and r["evict_none"]["round_trip"]]
        if not rs:
            print(f"{scenario}: no complete measurement")
            continue
        big = rs[-1]
        batch = big["evict_batch"]["round_trip"]["median"]
        none = big["evict_none"]["round_trip"]["median"]
        line = (
            f"{scenario}: at {big['files']:,} files, evict {BATCH:,} {fmt_seconds(batch)} "
            f"(target < 50 ms: {'met' if batch < TARGET_EVICT_BATCH else 'NOT met'}), "
            f"evict 0 {fmt_seconds(none)} "
            f"(target < 5 ms: {'met' if none < TARGET_EVICT_NONE else 'NOT met'})"
        )
        if len(rs) > 1:
            small = rs[0]
            growth = {}
            for kind in ("evict_batch", "evict_none"):
                a, b = small[kind]["round_trip"], big[kind]["round_trip"]
                growth[kind] = (b["median"] / a["median"], b["min"] / a["min"])
            # Other load only ever adds time, so the minimum is the steadier estimate
            # of the intrinsic cost; both are shown.
            flat = all(g[1] <= FLAT_LIMIT for g in growth.values())
            (bm, bn), (nm, nn) = growth["evict_batch"], growth["evict_none"]
            line += (
                f"; {small['files']:,} -> {big['files']:,} files: evict {BATCH:,} "
                f"x{bm:.2f} (median) x{bn:.2f} (min), evict 0 x{nm:.2f} (median) "
                f"x{nn:.2f} (min): {'flat' if flat else 'NOT flat'} by the minimum"
            )
        print(line)
    for r in results:
        for p in r["problems"]:
            print(f"PROBLEM [{r['scenario']} N={r['files']:,}]: {p}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 and 5,000 files, 3 rounds")
    ap.add_argument("--files", type=int, nargs="+", help="store sizes (multiples of 1,000)")
    ap.add_argument("--rounds", type=int, help="measured rounds per store (default 7, quick 3)")
    ap.add_argument("--scenario", choices=("max_age", "done", "rules", "both", "all"),
                    default="all", help="both: max_age and done; all: the three")
    ap.add_argument("--file-size", type=int, default=2000, help="bytes per file")
    ap.add_argument("--writers", type=int, default=4, help="writer threads while filling")
    add_run_options(ap)
    args = ap.parse_args(argv)
    sizes = args.files or ([2000, 5000] if args.quick else [10_000, 100_000])
    if any(n % BATCH or n < BATCH for n in sizes):
        ap.error(f"--files must be multiples of {BATCH}")
    rounds = args.rounds or (3 if args.quick else 7)
    scenarios = {"both": ("max_age", "done"), "all": ("max_age", "done", "rules")}.get(
        args.scenario, (args.scenario,))

    if args.wait_quiet:
        load = wait_for_quiet(args.wait_quiet, 1800)
        print(f"1-minute load average {load} when starting", file=sys.stderr)
    base = Path(tempfile.mkdtemp(prefix="vfsd-evict-bench-", dir=args.base_dir))
    info = machine_info(base)
    print_machine(info, file=sys.stderr)
    results = []
    try:
        for scenario in scenarios:
            for n in sizes:
                run = EvictionRun(base, n, scenario, args)
                run.run(rounds)
                results.append(run.result())
                if not args.keep:
                    rmtree_quiet(run.mount.run_dir)
    finally:
        if not args.keep:
            rmtree_quiet(base)
    doc = {
        "machine": info,
        "rounds": rounds,
        "batch": BATCH,
        "results": results,
        "loadavg_at_end": load_average(),
        "cpu_pressure_at_end": cpu_pressure(),
    }
    if args.json:
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
            return 0
        Path(args.json).write_text(text + "\n")
    print_table(results, info, rounds, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
