#!/usr/bin/env python3
"""Hand-off between replicas: a thread's next run on the replica that did not run it last.

Usage (from the repo, as root so caches can be dropped):
    .venv/bin/python bench/handoff_bench.py [--rounds N] [--cold N] [--base-dir DIR] [--json FILE|-]

A private SeaweedFS (`weed mini`, tests/s3server.py) runs on 127.0.0.1 with its
data under --base-dir. Two replicas are shard daemons (`vfsd mount --shard DIR
--remote URL`, default lease TTL) with stores of their own on one bucket prefix,
driven through the control socket as a checkpointer drives them. A thread of
100 files, 10 MiB (100 KiB each), is made on replica A. Then its runs go, in
turn, to the other replica and to the same one again; each run rewrites 10
of the files (1 MiB), takes a snapshot and ends. For the next run of each
kind, figures from `remote_begin` to the end of the first file read:

- `remote_begin`: the seconds it answers in (the lease taken, the head fenced,
  the history caught up, the live files made the latest snapshot's);
- the first file read (`cat` of one of the files the last run rewrote: on the
  other replica, content it has never had), caches dropped before it;
- the bytes fetched from the bucket before the read answered (manifests while
  beginning, chunks while reading);
- the lease round trips of a run: `remote_begin`'s (record, lease, fence,
  record again), the renewals while it ran, and `remote_end`'s release.

`--cold N`: N threads made on A and begun on B, which never saw them (the whole
history imported: a full manifest).

Nothing is asserted: a markdown table at the end (progress on stderr), every
sample with --json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from common import (  # noqa: E402
    ControlClient,
    drop_caches,
    evict_file_pages,
    is_mounted,
    machine_info,
    print_machine,
    repo_python,
    rmtree_quiet,
    summary,
)
from s3server import S3Server  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tkey(thread: str) -> str:
    return "t" + hashlib.sha256(thread.encode()).hexdigest()[:32]


class Replica:
    def __init__(self, run_dir: Path, url: str, options: list[str]) -> None:
        self.dir = run_dir
        self.url = url
        self.options = options
        self.ctl: ControlClient | None = None

    def mount(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([repo_python(), "-m", "vfsd.cli", "mount", "--shard",
                               str(self.dir), "--remote", self.url, *self.options],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"vfsd mount --shard {self.dir}: {proc.stderr.strip()}")
        self.ctl = ControlClient(self.dir / ".vfsd" / "vfsd.sock", timeout=300)

    def call(self, op: str, **args) -> dict:
        return self.ctl.request(op, **args)

    def vol(self, thread: str) -> Path:
        return self.dir / "fs" / tkey(thread)

    def fetched(self, thread: str) -> tuple[int, int]:
        """(bytes downloaded by the shard, chunk bytes the fetcher downloaded)."""
        st = self.call("stats", volume=tkey(thread))["remote"]
        return st["requests"]["bytes_down"], st["fetcher"]["downloaded_bytes"]

    def umount(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        subprocess.run([repo_python(), "-m", "vfsd.cli", "umount", str(self.dir)],
                       capture_output=True, timeout=120, cwd=REPO)
        if is_mounted(self.dir / "fs"):
            subprocess.run(["fusermount3", "-u", "-z", str(self.dir / "fs")],
                           capture_output=True)


def write_files(root: Path, names: list[str], size: int, rng: random.Random) -> None:
    for name in names:
        (root / name).write_bytes(rng.randbytes(size))


def cold(*dirs: Path) -> None:
    if drop_caches() == "unavailable":
        for d in dirs:
            evict_file_pages(d)


def one_run(r: Replica, thread: str, read_name: str, rewrite: list[str], size: int,
            rng: random.Random, base_dir: Path) -> dict:
    """A run: begin, the first read, a rewrite of some files, a snapshot, the end."""
    down0, chunks0 = r.fetched(thread) if r.vol(thread).exists() else (None, None)
    cold(base_dir)
    t0 = time.perf_counter()
    begun = r.call("remote_begin", volume=tkey(thread), thread=thread, wait=120)
    t_begin = time.perf_counter() - t0
    down1, chunks1 = r.fetched(thread)
    t1 = time.perf_counter()
    with open(r.vol(thread) / read_name, "rb") as f:
        data = f.read()
    t_read = time.perf_counter() - t1
    down2, chunks2 = r.fetched(thread)
    write_files(r.vol(thread), rewrite, size, rng)
    r.call("snapshot", volume=tkey(thread))
    ended = r.call("remote_end", volume=tkey(thread), timeout=300)
    assert len(data) == size
    return {
        "begin_s": t_begin, "first_read_s": t_read, "to_first_read_s": t_begin + t_read,
        "manifest_bytes": (down1 - down0) if down0 is not None else None,
        "read_bytes": chunks2 - chunks1,
        "fetched_before_read_answered": (down2 - down0) if down0 is not None else None,
        "imported": len(begun["imported"]), "restored": begun["restored"] is not None,
        "begin_daemon_ms": begun["duration_ms"],
        "lease_requests_begin": begun["requests"]["lease"],
        "catch_up_requests": begun["requests"]["catch_up"],
        "renewals": ended["renewals"], "release": int(bool(ended["released"])),
        "lease_requests_run": begun["requests"]["lease"] + ended["renewals"]
        + int(bool(ended["released"])),
    }


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="runs of each kind")
    ap.add_argument("--cold", type=int, default=5, help="threads begun where never seen")
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--size-kib", type=int, default=100, help="bytes of each file, KiB")
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--vfsd-opt", action="append", default=[])
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vfsd-handoff-", dir=args.base_dir))
    info = machine_info(base)
    if args.json != "-":
        print_machine(info)
    server = S3Server()
    os.environ["TMPDIR"] = str(base)
    server.start()
    os.environ.update(server.env)
    url = server.unique_url("handoff")
    a = Replica(base / "a", url, args.vfsd_opt)
    b = Replica(base / "b", url, args.vfsd_opt)
    size = args.size_kib * KiB
    names = [f"f{i:03}.bin" for i in range(args.files)]
    rng = random.Random(29)
    samples: dict[str, list[dict]] = {"other": [], "same": [], "cold": []}
    try:
        a.mount()
        b.mount()
        thread = "handoff-thread"
        say(f"making the thread: {args.files} files of {args.size_kib} KiB on A")
        a.call("remote_begin", volume=tkey(thread), thread=thread)
        write_files(a.vol(thread), names, size, rng)
        a.call("snapshot", volume=tkey(thread))
        a.call("remote_end", volume=tkey(thread), timeout=300)
        b.call("volume_create", volume=tkey(thread), thread=thread)
        last, other = a, b
        changed = names[:10]
        for i in range(-2, args.rounds * 2):  # the first two: B's first sight, warm-up
            kind = "other" if i % 2 == 0 else "same"
            r = other if kind == "other" else last
            rewrite = rng.sample(names, 10)
            s = one_run(r, thread, changed[0], rewrite, size, rng, base)
            if i >= 0:
                samples[kind].append(s)
            say(f"{kind:5} run {i // 2 + 1}: begin {s['begin_s'] * 1000:.0f} ms, first read "
                f"{s['first_read_s'] * 1000:.0f} ms, fetched {s['fetched_before_read_answered']}")
            changed = rewrite
            if r is not last:
                last, other = other, last
        for k in range(args.cold):
            t = f"cold-{k}"
            a.call("remote_begin", volume=tkey(t), thread=t)
            write_files(a.vol(t), names, size, rng)
            a.call("snapshot", volume=tkey(t))
            a.call("remote_end", volume=tkey(t), timeout=300)
            b.call("volume_create", volume=tkey(t), thread=t)
            s = one_run(b, t, names[0], names[:10], size, rng, base)
            samples["cold"].append(s)
            say(f"cold  run {k + 1}: begin {s['begin_s'] * 1000:.0f} ms, first read "
                f"{s['first_read_s'] * 1000:.0f} ms")
        rtt = []
        client = server.client()
        client.put_object(Bucket=server.bucket, Key="rtt-probe", Body=b"x")
        for _ in range(30):
            t0 = time.perf_counter()
            client.get_object(Bucket=server.bucket, Key="rtt-probe")["Body"].read()
            rtt.append(time.perf_counter() - t0)
    finally:
        a.umount()
        b.umount()
        server.stop()
        if not args.keep:
            rmtree_quiet(base)
    doc = {"machine": info, "files": args.files, "size_kib": args.size_kib,
           "rounds": args.rounds, "samples": samples, "s3_get_rtt_s": rtt,
           "summary": {k: {m: summary([s[m] for s in v]) for m in
                           ("begin_s", "first_read_s", "to_first_read_s")}
                       for k, v in samples.items() if v}}
    if args.json:
        out = json.dumps(doc, indent=2)
        if args.json == "-":
            print(out)
            return 0
        Path(args.json).write_text(out)
    print(f"\nthread: {args.files} files, {args.files * size / MiB:.0f} MiB; each run "
          f"rewrites 10 files (1 MiB); a small GET from the object store: p50 "
          f"{pct(rtt, 50) * 1000:.1f} ms, p95 {pct(rtt, 95) * 1000:.1f} ms\n")
    print("| next run on | n | remote_begin p50 / p95 | first read p50 / p95 | both p50 / p95 "
          "| fetched before the read answered (p50) | lease requests per run |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kind, label in (("same", "the replica that ran it last"),
                        ("other", "the other replica"),
                        ("cold", "a replica that never had it")):
        v = samples[kind]
        if not v:
            continue

        def ms(m: str, vals=v) -> str:
            xs = [s[m] * 1000 for s in vals]
            return f"{pct(xs, 50):.0f} / {pct(xs, 95):.0f} ms"

        fetched = [s["fetched_before_read_answered"] for s in v
                   if s["fetched_before_read_answered"] is not None]
        reqs = sorted({s["lease_requests_run"] for s in v})
        print(f"| {label} | {len(v)} | {ms('begin_s')} | {ms('first_read_s')} | "
              f"{ms('to_first_read_s')} | "
              f"{(pct(fetched, 50) / KiB):.0f} KiB | "
              f"{'-'.join(str(x) for x in (reqs[0], reqs[-1])) if reqs[0] != reqs[-1] else reqs[0]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
