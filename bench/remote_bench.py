#!/usr/bin/env python3
"""Raw object store throughput for 1 MiB objects, to size the remote tier's worker pool.

Usage (from the repo):
    .venv/bin/python bench/remote_bench.py [--quick] [--objects N] [--threads 1,2,4,8,16]
                                           [--rounds R] [--json FILE|-]

A private SeaweedFS (`weed mini`, tests/s3server.py) is started on 127.0.0.1 with
its data in a temporary directory under --base-dir, on the same disk as the local
baseline. Every figure is the median of --rounds runs of N objects of 1 MiB of
random bytes (fresh keys each run, so nothing is found already there):

- local chunk store (the "native" baseline): `ChunkStore.put` (write a temporary
  file, rename; no fsync, as the daemon's chunk writes) and `ChunkStore.read_all`
  (page cache warm, hash verified), one thread.
- `ObjectStore.put_if_absent` of new objects (with Content-MD5), and
  `ObjectStore.get` of them, with 1, 2, 4, ... threads sharing one client.
- dedup probes on objects already there: `exists` (HEAD) and `put_if_absent`
  (the body is sent, then refused with 412).
- plain boto3 `put_object` without MD5, for the client's own overhead.
- the `Uploader` end to end (read from the local chunk store, verify xxh3, HEAD,
  PUT), with 1, 2, 4, ... workers.

Ratios are to the local chunk store in the same run. CPU seconds per GiB are
given for this process (the client) and for the weed process (the server): both
share the machine's cores, so on a small machine they bound each other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from common import cpu_pressure, load_average, machine_info, print_machine  # noqa: E402
from s3server import S3Server  # noqa: E402

from vfsd.remote.objstore import ObjectStore, RemoteSettings  # noqa: E402
from vfsd.store.chunks import ChunkStore, chunk_hash  # noqa: E402

MiB = 1 << 20


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one by default)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    def __init__(self, server: S3Server, base: Path, objects: int, rounds: int) -> None:
        self.server = server
        self.base = base
        self.objects = objects
        self.rounds = rounds
        self.settings = RemoteSettings(
            endpoint_url=server.endpoint_url, region="us-east-1",
            access_key_id=server.access_key, secret_access_key=server.secret_key,
            max_connections=64)
        self.store = ObjectStore(server.url("bench"), self.settings)
        self.rows: list[dict] = []
        self.baseline: dict[str, float] = {}
        self._seq = 0

    def payloads(self) -> list[bytes]:
        return [os.urandom(MiB) for _ in range(self.objects)]

    def keys(self, prefix: str) -> list[str]:
        self._seq += 1
        return [f"{prefix}/{self._seq}/{i:06d}" for i in range(self.objects)]

    def measure(self, name: str, threads: int, run, *, baseline: str | None = None,
                setup=None) -> dict:
        """Median over rounds of `run(setup_value)`, moving objects x 1 MiB."""
        seconds, client_cpu, server_cpu = [], [], []
        for _ in range(self.rounds):
            prepared = setup() if setup else None
            c0, s0 = cpu_seconds(), cpu_seconds(self.server.proc.pid)
            t0 = time.perf_counter()
            run(prepared)
            seconds.append(time.perf_counter() - t0)
            client_cpu.append(cpu_seconds() - c0)
            server_cpu.append(cpu_seconds(self.server.proc.pid) - s0)
        t = statistics.median(seconds)
        gib = self.objects * MiB / (1 << 30)
        row = {
            "figure": name, "threads": threads, "objects": self.objects,
            "seconds": round(t, 4), "mib_s": round(self.objects / t, 1),
            "objects_s": round(self.objects / t, 1),
            "client_cpu_s_per_gib": round(statistics.median(client_cpu) / gib, 2),
            "server_cpu_s_per_gib": round(statistics.median(server_cpu) / gib, 2),
            "samples": [round(s, 4) for s in seconds],
        }
        if baseline is not None and baseline in self.baseline:
            row["vs_local"] = round(row["mib_s"] / self.baseline[baseline], 3)
        self.rows.append(row)
        print(f"  {name:<38} {threads:>3} threads  {row['mib_s']:>8.1f} MiB/s", file=sys.stderr)
        return row

    def parallel(self, threads: int, fn, items) -> None:
        if threads == 1:
            for item in items:
                fn(item)
            return
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(fn, items):
                pass

    # ------------------------------------------------------------- figures

    def local(self) -> None:
        chunks = ChunkStore(self.base / "local-chunks")
        made: list[tuple[bytes, bytes]] = []

        def setup():
            return [(chunk_hash(p), p) for p in self.payloads()]

        def put(items):
            for digest, data in items:
                chunks.put(digest, data)
            made[:] = items

        row = self.measure("local chunk store: put", 1, put, setup=setup)
        self.baseline["put"] = row["mib_s"]

        def read(_):
            for digest, _data in made:
                chunks.read_all(digest)

        row = self.measure("local chunk store: read_all (warm)", 1, read)
        self.baseline["get"] = row["mib_s"]

    def objstore(self, thread_counts: list[int]) -> None:
        written: dict[int, list[str]] = {}
        for n in thread_counts:
            def setup():
                return list(zip(self.keys("put"), self.payloads(), strict=True))

            def put(items, n=n):
                self.parallel(n, lambda kv: self.store.put_if_absent(*kv), items)
                written[n] = [k for k, _ in items]

            self.measure("objstore: put_if_absent (new)", n, put, setup=setup, baseline="put")
        for n in thread_counts:
            keys = written[n]
            self.measure("objstore: get", n,
                         lambda _, n=n, keys=keys: self.parallel(n, self.store.get, keys),
                         baseline="get")
        existing = written[thread_counts[0]]
        body = os.urandom(MiB)
        for n in sorted({1, max(thread_counts)}):
            self.measure("dedup probe: exists (HEAD)", n,
                         lambda _, n=n: self.parallel(n, self.store.exists, existing))
            self.measure("dedup probe: put_if_absent (412)", n,
                         lambda _, n=n: self.parallel(
                             n, lambda k: self.store.put_if_absent(k, body), existing))
        client = self.server.client(max_pool_connections=64)
        for n in sorted({1, max(thread_counts)}):
            def setup():
                return list(zip(self.keys("raw"), self.payloads(), strict=True))

            def raw(items, n=n):
                self.parallel(n, lambda kv: client.put_object(
                    Bucket=self.server.bucket, Key="bench/" + kv[0], Body=kv[1]), items)

            self.measure("plain boto3 put_object (no MD5)", n, raw, setup=setup,
                         baseline="put")

    def uploader(self, thread_counts: list[int]) -> None:
        import trio

        from vfsd.remote.uploader import PendingChunk, Uploader

        chunks = ChunkStore(self.base / "upload-chunks")
        for n in thread_counts:
            def setup():
                items = []
                for data in self.payloads():
                    digest = chunk_hash(data)
                    chunks.put(digest, data)
                    items.append(PendingChunk(digest, len(data), time.time()))
                return items

            def run(items, n=n):
                up = Uploader(self.store, chunks.read_all, workers=n,
                              max_queued=len(items) + 1)

                async def main():
                    async with trio.open_nursery() as nursery:
                        await nursery.start(up.run)
                        for item in items:
                            up.enqueue(item)
                        await up.ensure_uploaded(i.digest for i in items)
                        nursery.cancel_scope.cancel()

                trio.run(main)
                assert up.stats["uploaded"] == len(items)

            self.measure("Uploader end to end (HEAD + PUT)", n, run, setup=setup,
                         baseline="put")


def print_table(rows: list[dict]) -> None:
    print("| figure | threads | MiB/s (1 MiB objects) | vs local chunk store | client CPU s/GiB "
          "| server CPU s/GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        ratio = f"{r['vs_local']:.2f}x" if "vs_local" in r else ""
        print(f"| {r['figure']} | {r['threads']} | {r['mib_s']:.1f} | {ratio} | "
              f"{r['client_cpu_s_per_gib']:.1f} | {r['server_cpu_s_per_gib']:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 objects, 1 round, threads 1,4")
    ap.add_argument("--objects", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON ('-': stdout)")
    args = ap.parse_args()
    if args.quick:
        args.objects, args.rounds, args.threads = 32, 1, "1,4"
    thread_counts = [int(t) for t in args.threads.split(",")]
    base = Path(tempfile.mkdtemp(prefix="vfsd-remote-bench-", dir=args.base_dir))
    info = machine_info(base)
    to_stdout = args.json == "-"
    if not to_stdout:
        print_machine(info)
    old_tmp = tempfile.tempdir
    tempfile.tempdir = str(base)  # weed's data on the same disk as the local baseline
    server = S3Server()
    try:
        server.start()
        tempfile.tempdir = old_tmp
        from subprocess import run

        weed_version = run([str(server.weed), "version"], capture_output=True,
                           text=True).stdout.split("\n")[0]
        print(f"server: {weed_version.strip()} (weed mini) on 127.0.0.1", file=sys.stderr)
        bench = Bench(server, base, args.objects, args.rounds)
        bench.local()
        bench.objstore(thread_counts)
        bench.uploader(thread_counts)
        bench.store.close()
    finally:
        tempfile.tempdir = old_tmp
        server.stop()
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    result = {"machine": info, "server": weed_version.strip(), "objects": args.objects,
              "rounds": args.rounds, "rows": bench.rows,
              "loadavg_at_end": load_average(), "cpu_pressure_at_end": cpu_pressure(),
              "threads_alive": threading.active_count()}
    if args.json:
        text = json.dumps(result, indent=2)
        if to_stdout:
            print(text)
        else:
            Path(args.json).write_text(text)
    if not to_stdout:
        print(f"\n{args.objects} objects x 1 MiB, median of {args.rounds} run(s); "
              f"load average at end {result['loadavg_at_end']}\n")
        print_table(bench.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
