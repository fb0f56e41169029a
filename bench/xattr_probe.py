#!/usr/bin/env python3
"""What the kernel's per-write getxattr("security.capability") costs, and each way out.

Usage (as root, from the repo):
    .venv/bin/python bench/xattr_probe.py [--quick] [--json FILE] [--vfsd]

Under FUSE's writeback cache every write() runs `file_remove_privs()`, which asks
the daemon for `security.capability` unless the superblock is marked SB_NOSEC
(only FUSE_HANDLE_KILLPRIV_V2 does that, and libfuse 3.14 cannot negotiate it).
This script mounts a minimal in-memory pyfuse3 filesystem (`serve`, below) in
several variants and runs the same flushed-write programs on each and on a native
directory of the same disk, in one run:

- `enodata`: getxattr answers "no such attribute" (a round trip per write);
- `enosys`: getxattr answers ENOSYS once; the kernel stops asking for good;
- `no-writeback`: no writeback cache (every write() is a WRITE request);
- `vfsd` (with --vfsd): the real daemon, as mounted by `vfsd mount`.

It also counts the requests each variant received, so the round trips are
visible, not only inferred from the times.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import VfsdMount, is_mounted, machine_info, print_machine, summary  # noqa: E402

HERE = Path(__file__).resolve()

# --------------------------------------------------------------------------- the probe fs


def serve(mountpoint: str, getxattr_mode: str, writeback: bool, counts_file: str) -> None:
    """A minimal in-memory filesystem: enough for open/write/close/stat/unlink."""
    import pyfuse3
    import trio

    class Probe(pyfuse3.Operations):
        enable_writeback_cache = writeback

        def __init__(self) -> None:
            super().__init__()
            now = time.time_ns()
            self.attrs: dict[int, dict] = {
                pyfuse3.ROOT_INODE: {"mode": stat.S_IFDIR | 0o755, "size": 0, "t": now}}
            self.names: dict[bytes, int] = {}
            self.data: dict[int, bytearray] = {}
            self.next_ino = pyfuse3.ROOT_INODE + 1
            self.counts: dict[str, int] = {}

        def count(self, op: str) -> None:
            self.counts[op] = self.counts.get(op, 0) + 1

        def entry(self, ino: int) -> pyfuse3.EntryAttributes:
            a = self.attrs[ino]
            e = pyfuse3.EntryAttributes()
            e.st_ino = ino
            e.st_mode = a["mode"]
            e.st_nlink = 1
            e.st_uid, e.st_gid = os.getuid(), os.getgid()
            e.st_size = len(self.data.get(ino, b""))
            e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = a["t"]
            e.entry_timeout = e.attr_timeout = 3600
            e.st_blksize = 4096
            return e

        async def lookup(self, parent, name, ctx):
            self.count("lookup")
            ino = self.names.get(name)
            if parent != pyfuse3.ROOT_INODE or ino is None:
                miss = pyfuse3.EntryAttributes()
                miss.st_ino = 0
                miss.entry_timeout = 3600
                return miss
            return self.entry(ino)

        async def getattr(self, inode, ctx):
            self.count("getattr")
            return self.entry(inode)

        async def setattr(self, inode, attr, fields, fh, ctx):
            self.count("setattr")
            if fields.update_size:
                d = self.data.setdefault(inode, bytearray())
                del d[attr.st_size:]
                d.extend(bytes(attr.st_size - len(d)))
            if fields.update_mtime:
                self.attrs[inode]["t"] = attr.st_mtime_ns
            return self.entry(inode)

        async def create(self, parent, name, mode, flags, ctx):
            self.count("create")
            ino = self.next_ino
            self.next_ino += 1
            self.attrs[ino] = {"mode": stat.S_IFREG | (mode & 0o7777), "t": time.time_ns()}
            self.data[ino] = bytearray()
            self.names[name] = ino
            return pyfuse3.FileInfo(fh=ino), self.entry(ino)

        async def open(self, inode, flags, ctx):
            self.count("open")
            if flags & os.O_TRUNC:
                self.data[inode] = bytearray()
            return pyfuse3.FileInfo(fh=inode)

        async def read(self, fh, off, size):
            self.count("read")
            return bytes(self.data[fh][off:off + size])

        async def write(self, fh, off, buf):
            self.count("write")
            d = self.data[fh]
            if len(d) < off:
                d.extend(bytes(off - len(d)))
            d[off:off + len(buf)] = buf
            return len(buf)

        async def flush(self, fh):
            self.count("flush")
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def release(self, fh):
            self.count("release")

        async def unlink(self, parent, name, ctx):
            self.count("unlink")
            # Kept until unmount: the kernel may still write back and set the
            # mtime of an unlinked file it holds open.
            self.names.pop(name)

        async def getxattr(self, inode, name, ctx):
            self.count(f"getxattr {name.decode(errors='replace')}")
            if getxattr_mode == "enosys":
                raise pyfuse3.FUSEError(errno.ENOSYS)
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

        async def statfs(self, ctx):
            self.count("statfs")
            s = pyfuse3.StatvfsData()
            s.f_bsize = s.f_frsize = 4096
            s.f_namemax = 255
            return s

    ops = Probe()
    pyfuse3.init(ops, mountpoint, {"fsname=xattrprobe", "default_permissions"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)
        Path(counts_file).write_text(json.dumps(ops.counts))


# --------------------------------------------------------------------------- workloads

LINE = "2025-06-03T14:00:00Z INFO request handled in 12 ms, status 200, bytes 5120\n"


def work_line_writes(path: str, n: int) -> float:
    """n line-buffered write() calls to one file (Python, buffering=1)."""
    start = time.perf_counter()
    with open(path, "w", buffering=1) as f:
        for _ in range(n):
            f.write(LINE)
    return time.perf_counter() - start


def work_logging(path: str, n: int) -> float:
    """n records through logging.FileHandler (it flushes after each record)."""
    import logging

    logger = logging.getLogger(f"probe{os.getpid()}")
    logger.propagate = False
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    start = time.perf_counter()
    for i in range(n):
        logger.info("request %d handled in %d ms", i, i % 97)
    handler.close()
    return time.perf_counter() - start


WORKLOADS = {"line_writes": work_line_writes, "logging": work_logging}


def run_work(name: str, path: Path, n: int) -> float:
    """Run one workload in a fresh interpreter (its own loop only is timed)."""
    out = subprocess.run([sys.executable, str(HERE), "work", name, str(path), str(n)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


# --------------------------------------------------------------------------- driver


class ProbeMount:
    """The probe filesystem in a subprocess."""

    def __init__(self, base: Path, mode: str, writeback: bool) -> None:
        self.root = base / f"mnt-{mode}-{'wb' if writeback else 'nowb'}"
        self.root.mkdir()
        self.counts_file = base / f"counts-{self.root.name}.json"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "serve", str(self.root), mode,
             "1" if writeback else "0", str(self.counts_file)])
        deadline = time.monotonic() + 20
        while not is_mounted(self.root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("probe filesystem did not mount")
            time.sleep(0.05)

    def close(self) -> dict:
        subprocess.run(["fusermount3", "-u", str(self.root)], check=False)
        self.proc.wait(timeout=30)
        try:
            return json.loads(self.counts_file.read_text())
        except (OSError, ValueError):
            return {}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "work":
        print(WORKLOADS[sys.argv[2]](sys.argv[3], int(sys.argv[4])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 writes, 3 reps")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--base-dir", default="/var/tmp")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--vfsd", action="store_true", help="also measure the real daemon")
    ap.add_argument("--vfsd-opt", action="append", default=[])
    args = ap.parse_args()
    n = 2_000 if args.quick else 20_000
    reps = args.reps or (3 if args.quick else 5)
    base = Path(tempfile.mkdtemp(prefix="vfsd-xattr-", dir=args.base_dir))
    info = machine_info(base)
    print_machine(info)
    native = base / "native"
    native.mkdir()
    variants: dict[str, object] = {}
    mounts = []
    try:
        for mode, wb in (("enodata", True), ("enosys", True), ("enodata", False)):
            m = ProbeMount(base, mode, wb)
            mounts.append(m)
            variants[f"{mode}" if wb else "no-writeback"] = m
        vm = None
        if args.vfsd:
            vm = VfsdMount(base / "run", tuple(args.vfsd_opt))
            vm.mount()
            variants["vfsd"] = vm
        sides = {"native": native, **{k: v.root for k, v in variants.items()}}
        samples: dict[str, dict[str, list[float]]] = {}
        for work in WORKLOADS:
            for rep in range(reps):
                order = list(sides.items())
                if rep % 2:
                    order.reverse()
                for name, root in order:
                    path = root / f"{work}-{rep}.log"
                    t = run_work(work, path, n)
                    samples.setdefault(work, {}).setdefault(name, []).append(t)
                    path.unlink()
            print(f"  {work}: " + ", ".join(
                f"{k} {summary(v)['median'] * 1000:.0f} ms" for k, v in samples[work].items()),
                file=sys.stderr)
        counts = {}
        for key, m in list(variants.items()):
            if isinstance(m, ProbeMount):
                counts[key] = m.close()
                mounts.remove(m)
        if vm is not None:
            vm.umount()
    finally:
        for m in mounts:
            m.close()
    print(f"\n{n:,} writes per run, median of {reps}\n")
    names = list(sides)
    print("| workload | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for work, by in samples.items():
        nat = summary(by["native"])["median"]
        cells = []
        for name in names:
            med = summary(by[name])["median"]
            cells.append(f"{med * 1000:.0f} ms" + ("" if name == "native" else
                                                   f" ({med / nat:.1f}x)"))
        print(f"| {work} | " + " | ".join(cells) + " |")
    print("\nrequests received by the probe filesystem (whole run):")
    for key, c in counts.items():
        print(f"  {key}: " + ", ".join(f"{op} {k}" for op, k in sorted(c.items())))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": info, "writes": n, "reps": reps, "samples": samples,
             "requests": counts}, indent=2))
    subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
