#!/usr/bin/env python3
"""The remote tier under load: cold reads, resuming elsewhere, upload backlog, dedup.

Usage (from the repo, as root so caches can be dropped):
    .venv/bin/python bench/resume_bench.py [--quick] [--base-dir DIR] [--json FILE|-]

A private SeaweedFS (`weed mini`, tests/s3server.py) runs on 127.0.0.1 with its
data under --base-dir, the same disk as the local stores and the native
baseline. Workers are run dirs with their own stores, mounted through the real
CLI with `--remote`; credentials reach them through the AWS environment
variables. Figures, side by side in one run:

1. Cold sequential read of one file (256 MiB; 64 with --quick): native ext4,
   the local store, and an empty worker resumed with --from (every chunk
   fetched from the bucket, verified, with readahead). Caches dropped before
   each read (the object store's own files too).
2. Resume a run of 1 GiB in 2,000 files (200 MiB in 400 with --quick) on an
   empty worker: seconds from `vfsd mount --from` to the first byte of one file,
   and to the end of `grep -rl` over the whole tree; against `grep -rl` on
   native ext4 and on the local store that wrote the files, caches dropped.
3. Upload backlog under a sustained 50 MB/s write for 20 s (10 s with
   --quick): the backlog sampled every 0.5 s, its peak, and the seconds it
   takes to drain once writing stops.
4. Dedup across workers: two runs on two workers whose files are 90% the same;
   bytes in the bucket against the bytes both runs hold.

Nothing is asserted: the figures are printed as a markdown table (progress on
stderr) and, with --json, every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from common import (  # noqa: E402
    VfsdMount,
    cpu_pressure,
    drop_caches,
    evict_file_pages,
    load_average,
    machine_info,
    print_machine,
    run_timed,
)
from s3server import S3Server  # noqa: E402

MiB = 1 << 20
NEEDLE = b"ConnectionResetError"
FAST_FAULTS = ("--remote-retry-max-delay", "1")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cold(*dirs: Path) -> str:
    method = drop_caches()
    if method == "unavailable":
        for d in dirs:
            evict_file_pages(d)
        return "fadvise"
    return method


def write_files(root: Path, count: int, size: int, seed: int, needle_every: int = 20) -> int:
    """`count` files of `size` random bytes (1 in `needle_every` holds NEEDLE); bytes."""
    import random

    rng = random.Random(seed)
    total = 0
    for i in range(count):
        d = root / f"d{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        data = bytearray(rng.randbytes(size))
        if i % needle_every == 0:
            data[size // 2:size // 2 + len(NEEDLE)] = NEEDLE
        (d / f"f{i:05d}.bin").write_bytes(data)
        total += size
    return total


class Bench:
    def __init__(self, base: Path, quick: bool) -> None:
        self.base = base
        self.quick = quick
        self.rows: list[dict] = []
        self.server = S3Server()
        self.n = 0

    def worker(self, name: str, url: str, *extra: str) -> VfsdMount:
        m = VfsdMount(self.base / name, ("--remote", url, *FAST_FAULTS, *extra))
        return m

    def url(self, name: str) -> str:
        return self.server.unique_url(name)

    def sync(self, m: VfsdMount, timeout: float = 1800) -> float:
        start = time.perf_counter()
        m.cli("sync", str(m.run_dir), "--take", "--timeout", str(timeout),
              timeout=timeout + 60)
        return time.perf_counter() - start

    def run_id(self, m: VfsdMount) -> str:
        return m.status()["run"]

    def last_snapshot(self, m: VfsdMount) -> str:
        return json.loads(m.cli("snapshots", str(m.run_dir), "--json").stdout)["snapshots"][-1]["id"]

    # ------------------------------------------------------------- 1. cold read

    def cold_read(self) -> None:
        size = (64 if self.quick else 256) * MiB
        rounds = 1 if self.quick else 3
        say(f"cold read of {size // MiB} MiB ...")
        native = self.base / "native"
        native.mkdir()
        data_file = native / "big.bin"
        with open(data_file, "wb") as f:
            for _ in range(size // MiB):
                f.write(os.urandom(MiB))
        url = self.url("cold")
        a = self.worker("cold-a", url)
        a.mount()
        shutil.copyfile(data_file, a.root / "big.bin")
        self.sync(a)
        run, snap = self.run_id(a), self.last_snapshot(a)
        times = {"native": [], "local": [], "remote": []}
        for r in range(rounds):
            cold(native)
            times["native"].append(run_timed(f"cat '{data_file}' > /dev/null")[0])
            a.umount()
            cold(native)
            a.mount()
            times["local"].append(run_timed(f"cat '{a.root / 'big.bin'}' > /dev/null")[0])
            b = self.worker(f"cold-b{r}", url, "--from", f"{run}@{snap}",
                            "--remote-lease-wait", "0")
            a.umount()  # b takes the lease (not needed to read, but as in production)
            cold(native)
            b.mount()
            times["remote"].append(run_timed(f"cat '{b.root / 'big.bin'}' > /dev/null")[0])
            fetched = b.status()["remote"]["fetcher"]
            b.umount()
            a.mount()
        a.umount()
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        mbps = {k: size / MiB / v for k, v in med.items()}
        self.rows.append({
            "figure": f"cold sequential read, {size // MiB} MiB (MiB/s)",
            "native": round(mbps["native"]), "local": round(mbps["local"]),
            "remote": round(mbps["remote"]),
            "ratio": f"remote/local {mbps['remote'] / mbps['local']:.2f}x, "
                     f"local/native {mbps['local'] / mbps['native']:.2f}x",
            "detail": {"seconds": times, "fetcher_last": fetched}})

    # ------------------------------------------------------------- 2. resume

    def resume(self) -> None:
        count, size = (400, 512 * 1024) if self.quick else (2000, 512 * 1024)
        say(f"resume of {count} files x {size // 1024} KiB ...")
        native = self.base / "tree-native"
        total = write_files(native, count, size, seed=1)
        url = self.url("resume")
        a = self.worker("resume-a", url)
        a.mount()
        t_copy = run_timed(["cp", "-r", f"{native}/.", str(a.root)])[0]
        t_publish = self.sync(a)
        run, snap = self.run_id(a), self.last_snapshot(a)
        st = a.status()
        expected = count // 20
        cold(native)
        t_native, out = run_timed(["grep", "-rl", NEEDLE.decode(), str(native)])
        assert len(out.split()) == expected, out
        a.umount()
        cold(native)
        a.mount()
        t_local, out = run_timed(["grep", "-rl", NEEDLE.decode(), str(a.root)])
        assert len(out.split()) == expected
        a.umount()
        cold(native)
        b = self.worker("resume-b", url, "--from", f"{run}@{snap}")
        start = time.perf_counter()
        b.mount()
        t_mounted = time.perf_counter() - start
        first = b.root / "d000" / "f00000.bin"
        with open(first, "rb") as f:
            f.read(1)
        t_first = time.perf_counter() - start
        _, out = run_timed(["grep", "-rl", NEEDLE.decode(), str(b.root)])
        t_grep = time.perf_counter() - start
        assert len(out.split()) == expected
        fetched = b.status()["remote"]["fetcher"]
        b.umount()
        self.rows.append({
            "figure": f"resume {total // MiB} MiB in {count} files on an empty worker",
            "native": f"grep -rl {t_native:.1f} s", "local": f"grep -rl {t_local:.1f} s",
            "remote": f"mounted {t_mounted:.2f} s, first byte {t_first:.2f} s, "
                      f"grep -rl done {t_grep:.1f} s",
            "ratio": f"resume+grep / local grep {t_grep / t_local:.1f}x, "
                     f"/ native grep {t_grep / t_native:.1f}x",
            "detail": {"copy_in_s": t_copy, "publish_s": t_publish,
                       "manifest_bytes": st["remote"]["publisher"]["manifest_bytes"],
                       "fetcher": fetched}})

    # ------------------------------------------------------------- 3. backlog

    def backlog(self) -> None:
        rate = 50 * MiB
        seconds = 10 if self.quick else 20
        say(f"backlog under {rate // MiB} MB/s for {seconds} s ...")
        url = self.url("backlog")
        a = self.worker("backlog-a", url)
        a.mount()
        samples: list[tuple[float, int, int]] = []
        stop = threading.Event()

        def sampler() -> None:
            t0 = time.perf_counter()
            while not stop.is_set():
                try:
                    b = a.status()["remote"]["backlog"]
                    samples.append((round(time.perf_counter() - t0, 2), b["chunks"], b["bytes"]))
                except Exception:  # noqa: BLE001 - a missed sample
                    pass
                time.sleep(0.5)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        chunk = os.urandom(MiB)
        start = time.perf_counter()
        written = 0
        with open(a.root / "stream.bin", "wb") as f:
            while time.perf_counter() - start < seconds:
                # New bytes each MiB (a fresh chunk each time), paced to `rate`.
                f.write(chunk[:-8] + written.to_bytes(8, "big"))
                written += MiB
                ahead = written / rate - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
        t_write = time.perf_counter() - start
        t_drain0 = time.perf_counter()
        while True:
            b = a.status()["remote"]["backlog"]
            if b["chunks"] == 0:
                break
            time.sleep(0.2)
        t_drain = time.perf_counter() - t_drain0
        stop.set()
        th.join()
        up = a.status()["remote"]["uploads"]
        a.umount()
        peak = max(samples, key=lambda s: s[2]) if samples else (0, 0, 0)
        achieved = written / MiB / t_write
        self.rows.append({
            "figure": f"upload backlog, {rate // MiB} MB/s written for {seconds} s",
            "native": f"written at {achieved:.0f} MiB/s", "local": "-",
            "remote": f"peak backlog {peak[2] / MiB:.0f} MiB ({peak[1]} chunks) at "
                      f"{peak[0]} s; drained {t_drain:.1f} s after the last write",
            "ratio": f"upload rate ~{written / MiB / (t_write + t_drain):.0f} MiB/s "
                     f"vs {achieved:.0f} written",
            "detail": {"samples": samples, "uploads": up}})

    # ------------------------------------------------------------- 4. dedup

    def dedup(self) -> None:
        count, size = (40, 2 * MiB) if self.quick else (100, 2 * MiB)
        say(f"dedup across two workers, {count} files of {size // MiB} MiB, 90% shared ...")
        url = self.url("dedup")
        shared = self.base / "shared"
        write_files(shared, count, size, seed=3)
        a = self.worker("dedup-a", url)
        b = self.worker("dedup-b", url)
        a.mount()
        b.mount()
        run_timed(["cp", "-r", f"{shared}/.", str(a.root)])
        run_timed(["cp", "-r", f"{shared}/.", str(b.root)])
        for i in range(0, count, 10):  # B changes 10% of the files (whole files)
            p = next(b.root.glob(f"d*/f{i:05d}.bin"))
            p.write_bytes(os.urandom(size))
        self.sync(a)
        self.sync(b)
        logical = a.status()["logical_bytes"] + b.status()["logical_bytes"]
        a.umount()
        b.umount()
        client = self.server.client()
        prefix = url.split("/", 3)[3] + "/"
        chunk_bytes = manifest_bytes = 0
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=self.server.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"][len(prefix):]
                if key.startswith("chunks/"):
                    chunk_bytes += item["Size"]
                elif "/snapshots/" in key:
                    manifest_bytes += item["Size"]
        bucket = chunk_bytes + manifest_bytes
        self.rows.append({
            "figure": "bucket bytes, two workers, runs 90% alike",
            "native": f"{logical / MiB:.0f} MiB held by the two runs", "local": "-",
            "remote": f"{bucket / MiB:.0f} MiB in the bucket (chunks "
                      f"{chunk_bytes / MiB:.0f}, manifests {manifest_bytes / 1024:.0f} KiB)",
            "ratio": f"bucket/logical {bucket / logical:.2f}x (ideal 0.55x)",
            "detail": {"logical": logical, "chunk_bytes": chunk_bytes,
                       "manifest_bytes": manifest_bytes}})

    def run(self) -> None:
        self.server.start()
        os.environ.update(self.server.env)
        try:
            for step in (self.cold_read, self.resume, self.backlog, self.dedup):
                step()
        finally:
            for d in self.base.iterdir():
                if (d / "fs").is_dir():
                    VfsdMount(d).force_cleanup()
            self.server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--base-dir", default="/var/tmp")
    p.add_argument("--json")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vfsd-resume-", dir=args.base_dir))
    info = machine_info(base)
    print_machine(info, file=sys.stderr)
    bench = Bench(base, args.quick)
    try:
        bench.run()
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    info["loadavg_at_end"] = load_average()
    info["cpu_pressure_at_end"] = cpu_pressure()
    if args.json:
        doc = json.dumps({"machine": info, "rows": bench.rows}, indent=2)
        if args.json == "-":
            print(doc)
            return 0
        Path(args.json).write_text(doc)
    print_machine(info)
    print(f"load average at end {info['loadavg_at_end']}, CPU pressure "
          f"{info['cpu_pressure_at_end']}")
    print()
    print("| figure | native ext4 | local store | remote (SeaweedFS, same machine) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for r in bench.rows:
        print(f"| {r['figure']} | {r['native']} | {r['local']} | {r['remote']} | {r['ratio']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
