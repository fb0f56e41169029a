#!/usr/bin/env python3
"""How long other requests wait while the daemon works on a large tree.

Usage (from the repo):
    .venv/bin/python bench/stall_bench.py [--files N] [--json FILE|-]

The daemon serves every FUSE request and control request from one trio loop:
whatever it does in one go (a transaction, a walk) between two awaits, every
other request to the mount waits for. This bench writes N small files (default
100,000, in 100 directories) through the mount, then runs each whole-tree
operation while `StallProbe` (bench/snapshot_bench.py: an open of a directory
and a statfs, which the kernel never answers from its caches, in a loop) notes
the longest any of its requests waited:

- the first snapshot (it records the whole tree),
- every file rewritten, then a snapshot of all N changes,
- a restore undoing all N changes, and one redoing them,
- a diff of all N changes,
- deleting the snapshot that holds N changed entries,
- a fork of the whole tree into a new run dir.

It reports, per operation, the daemon's own time (`duration_ms` where the reply
has it), the round trip, and the longest wait of a probe request during it,
with the probe's longest wait over the same time with nothing else running as
the floor. Nothing is asserted.

With `--shard`, the tree is one thread (volume) of a shard daemon and the
probe is another thread of the same shard creating 2 KB files (create, write,
close) in a loop: what one thread's long operation costs the others. The
operations are the same plus an eviction pass over every file and the drop
of the whole thread; each row gives the probe's p50, p99 and longest request.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import (  # noqa: E402
    ControlClient,
    VfsdMount,
    add_run_options,
    machine_info,
    print_machine,
    rmtree_quiet,
)
from snapshot_bench import StallProbe, change, write_tree  # noqa: E402


def probed(m: VfsdMount, fn) -> tuple[float, float, dict]:
    """(round trip s, longest probe wait s, reply) of `fn()` under the probe."""
    probe = StallProbe(m.root / "d000")
    probe.start()
    time.sleep(0.2)  # the probe's first requests (cold caches) are not the operation's
    probe.longest = 0.0
    t0 = time.perf_counter()
    res = fn()
    wall = time.perf_counter() - t0
    return wall, probe.stop(), res


def run(base: Path, n: int) -> list[dict]:
    rows = []
    m = VfsdMount(base / "run", ("--snapshot-keep-last", "1000", "--snapshot-keep-steps", "0"))
    m.mount()
    try:
        t0 = time.perf_counter()
        write_tree(m.root, n, "v0")
        print(f"  {n} files written in {time.perf_counter() - t0:.0f} s", flush=True)

        def call(op: str, **args) -> dict:
            # A connection per request: one left idle while files are written
            # is closed by the daemon (control_idle_timeout).
            c = ControlClient(m.socket_path, timeout=3600)
            try:
                return c.request(op, **args)
            finally:
                c.close()

        def row(what: str, fn) -> dict:
            wall, stall, res = probed(m, fn)
            r = {"operation": what, "daemon_ms": res.get("duration_ms"), "wall_ms": wall * 1000,
                 "longest_wait_ms": stall * 1000}
            rows.append(r)
            daemon = f"{r['daemon_ms']:.0f} ms daemon, " if r["daemon_ms"] is not None else ""
            print(f"  {what}: {daemon}{r['wall_ms']:.0f} ms round trip; longest wait of "
                  f"another request {r['longest_wait_ms']:.0f} ms", flush=True)
            return res

        row("nothing (the probe alone, 2 s)", lambda: time.sleep(2) or {})
        first = row("first snapshot", lambda: call("snapshot", label="first"))
        change(m.root, n, n, "v1")
        second = row(f"snapshot of {n:,} changed files", lambda: call("snapshot"))
        row(f"restore undoing {n:,} changes", lambda: call("restore", snapshot=first["id"]))
        row(f"restore redoing {n:,} changes", lambda: call("restore", snapshot=second["id"]))
        row(f"diff of {n:,} changes", lambda: call("diff", a=first["id"], b=second["id"]))
        row(f"deleting a snapshot of {n:,} entries",
            lambda: call("snapshot_delete", snapshot=second["id"]))
        fork_dir = base / "forked"
        row(f"fork of {n:,} files",
            lambda: call("fork", snapshot=first["id"], run_dir=str(fork_dir)))
    finally:
        m.umount()
    return rows


class CreateProbe(threading.Thread):
    """Creates, writes and closes 2 KB files in `path` in a loop, keeping each
    one's latency: what another thread's work costs this one."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.times: list[float] = []
        self._done = threading.Event()
        self._n = 0

    def run(self) -> None:
        data = b"x" * 2048
        while not self._done.is_set():
            self._n += 1
            t0 = time.perf_counter()
            fd = os.open(self.path / f"p{self._n}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.write(fd, data)
            os.close(fd)
            self.times.append(time.perf_counter() - t0)
            time.sleep(0.001)

    def stop(self) -> list[float]:
        self._done.set()
        self.join()
        return self.times


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def run_shard(base: Path, n: int) -> list[dict]:
    rows = []
    m = VfsdMount(base / "shard", ("--shard", "--snapshot-keep-last", "1000",
                                   "--snapshot-keep-steps", "0", "--max-age-steps", "5"))
    m.mount()

    def call(op: str, **args) -> dict:
        c = ControlClient(m.socket_path, timeout=3600)
        try:
            return c.request(op, **args)
        finally:
            c.close()

    try:
        call("volume_create", volume="big")
        call("volume_create", volume="probe")
        tree = m.root / "big"
        t0 = time.perf_counter()
        write_tree(tree, n, "v0")
        print(f"  {n} files written in {time.perf_counter() - t0:.0f} s", flush=True)

        def row(what: str, fn) -> dict:
            probe = CreateProbe(m.root / "probe")
            probe.start()
            time.sleep(0.3)
            probe.times.clear()
            t1 = time.perf_counter()
            res = fn()
            wall = time.perf_counter() - t1
            times = probe.stop()
            r = {"operation": what, "daemon_ms": res.get("duration_ms"), "wall_ms": wall * 1000,
                 "steps": res.get("steps"), "probe_requests": len(times),
                 "p50_ms": _pct(times, 0.5) * 1000, "p99_ms": _pct(times, 0.99) * 1000,
                 "longest_wait_ms": max(times, default=0.0) * 1000}
            rows.append(r)
            print(f"  {what}: {r['wall_ms']:.0f} ms; the other thread's creates: "
                  f"{len(times)}, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                  f"longest {r['longest_wait_ms']:.0f} ms", flush=True)
            return res

        v = {"volume": "big"}
        row("nothing (the probe alone, 2 s)", lambda: time.sleep(2) or {})
        first = row("first snapshot", lambda: call("snapshot", label="first", **v))
        change(tree, n, n, "v1")
        second = row(f"snapshot of {n:,} changed files", lambda: call("snapshot", **v))
        row(f"restore undoing {n:,} changes", lambda: call("restore", snapshot=first["id"], **v))
        row(f"restore redoing {n:,} changes",
            lambda: call("restore", snapshot=second["id"], **v))
        row(f"diff of {n:,} changes", lambda: call("diff", a=first["id"], b=second["id"], **v))
        row(f"copy of the thread ({n:,} files, two snapshots)",
            lambda: call("volume_copy", target="copy", **v))
        row(f"eviction pass over {n:,} files", lambda: call("set_step", step=1000, **v))
        per_dir = -(-n // 100)
        # The newest evictions: the eviction log keeps the last 10,000 of them.
        some = [f"d{i // per_dir:03d}/f{i:06d}.txt" for i in range(max(0, n - 1000), n)]
        row(f"unevict of {len(some):,} files", lambda: call("unevict", paths=some, **v))
        row(f"deleting a snapshot of {n:,} entries",
            lambda: call("snapshot_delete", snapshot=second["id"], **v))
        row("dropping the thread", lambda: call("volume_drop", volume="big"))
    finally:
        m.umount()
    return rows


def table(rows: list[dict]) -> str:
    if rows and "p99_ms" in rows[0]:
        out = ["| operation (one thread) | round trip | steps | another thread's creates: "
               "p50 / p99 / longest |", "| --- | ---: | ---: | ---: |"]
        for r in rows:
            out.append(f"| {r['operation']} | {r['wall_ms']:,.0f} ms | {r['steps'] or '-'} | "
                       f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} / {r['longest_wait_ms']:,.0f} ms |")
        return "\n".join(out)
    out = ["| operation | daemon | round trip | longest wait of another request |",
           "| --- | ---: | ---: | ---: |"]
    for r in rows:
        daemon = f"{r['daemon_ms']:,.0f} ms" if r["daemon_ms"] is not None else "-"
        out.append(f"| {r['operation']} | {daemon} | {r['wall_ms']:,.0f} ms | "
                   f"{r['longest_wait_ms']:,.0f} ms |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--shard", action="store_true",
                    help="one thread of a shard works, another thread's creates are timed")
    add_run_options(ap)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vfsd-stall-", dir=args.base_dir))
    info = machine_info(base)
    print_machine(info)
    try:
        rows = run_shard(base, args.files) if args.shard else run(base, args.files)
    finally:
        if not os.environ.get("VFSD_KEEP"):
            rmtree_quiet(base)
    print(table(rows))
    if args.json:
        doc = json.dumps({"machine": info, "rows": rows}, indent=2)
        if args.json == "-":
            print(doc)
        else:
            Path(args.json).write_text(doc)


if __name__ == "__main__":
    main()
