#!/usr/bin/env python3
"""Many threads on one machine: what a LangGraph server with thousands of threads costs.

Usage (from the repo):
    .venv/bin/python bench/threads_bench.py [--only shapes|threads] [--threads 1,50,1000]
                                            [--active 50] [--json FILE|-]

`--only shapes` measures the two ways vfsd could serve many threads, by the
costs that decide between them:

- one daemon per thread run dir (what `mount_tool.runs` does): a thread's
  first mount (`Runs.use` of a new thread, run dir created), the unmount of an
  idle one, the mount of an idle thread again, and the memory of N idle
  daemons (RssAnon and Pss summed over the daemons);
- one daemon serving many threads as volumes of one store: in one process,
  the objects a daemon builds for its volume (store view, open-file table,
  FUSE operations, evictor, settler, snapshots and their service and view),
  built again for each extra volume of a shared store. pyfuse3 serves one
  mount per process, so this shape would show the volumes as directories of
  one mount; the probe measures what each extra volume costs that process in
  memory and time, the mount itself aside.

`--only threads` runs a Deep Agents agent (`create_vfsd_deep_agent` on a Runs,
VfsdCheckpointer over InMemorySaver, a scripted model) for T threads, at most
`--active` at once, each doing four tool calls (write a script, run it with
`execute`, read its output, write a report), all async on one event loop as a
server runs them; the same threads with deepagents' default StateBackend
beside them (no `execute` there: that call returns the tool's error). For
each T: the memory of every vfsd process on the machine (Pss summed: daemons
and mount_tool's helper) at its peak and at the end; the time from a thread's
first `ainvoke` to its first file write landing; p50/p95 of a file tool call
(write_file, read_file, execute); then `--active` threads whose run dirs went
idle (unmounted) each get one more turn: the time to their first file call's
answer.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, load_average, machine_info, print_machine, rmtree_quiet  # noqa: E402

sys.path.insert(0, str(REPO))


# -- memory of processes ---------------------------------------------------------------


def _smaps(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    out[parts[0][:-1]] = int(parts[1]) * 1024
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    out["RssAnon"] = int(line.split()[1]) * 1024
    except OSError:
        return {}
    return out


def vfsd_processes(work: Path) -> list[int]:
    """This benchmark's vfsd processes: the daemons of the run dirs under `work`
    (by their pid files: a daemon forked by mount_tool's helper shows the
    helper's command line) and mount_tool's helper itself. Other vfsd
    processes on the machine are not counted."""
    pids = set()
    for pidfile in work.glob("*/threads/*/.vfsd/vfsd.pid"):
        try:
            pid = int(pidfile.read_text())
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{pid}").exists():
            pids.add(pid)
    me = str(os.getpid())
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1] != me:
                continue
            if b"vfsd.cli.spawner" in Path(f"/proc/{name}/cmdline").read_bytes():
                pids.add(int(name))
        except (OSError, IndexError):
            continue
    return sorted(pids)


def vfsd_memory(pids: list[int]) -> dict[str, float]:
    """Pss and RssAnon summed over `pids` (MiB), and how many there are."""
    total = {"Pss": 0, "RssAnon": 0}
    for pid in pids:
        got = _smaps(pid)
        for key in total:
            total[key] += got.get(key, 0)
    return {"processes": len(pids), "pss_mib": total["Pss"] / 2**20,
            "rss_anon_mib": total["RssAnon"] / 2**20}


def pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# -- shapes ------------------------------------------------------------------------------


def shapes(work: Path, daemons: int, volumes: int) -> dict:
    """The costs that decide between a daemon per thread and one daemon for many."""
    import mount_tool

    out: dict = {}
    root = work / "shapes"
    first, remount, unmount = [], [], []
    with mount_tool.runs(root, max_mounted=0) as runs:
        runs.get("warm-up")  # starts mount_tool's helper: not a thread's cost
        threads = [f"t{i}" for i in range(daemons)]
        for t in threads:
            t0 = time.perf_counter()
            with runs.use(t) as m:
                m.write("hello.txt", "x")
            first.append(time.perf_counter() - t0)
        time.sleep(2.0)  # idle: what an idle daemon holds
        daemon_pids = [int((runs.run_dir(t) / ".vfsd" / "vfsd.pid").read_text()) for t in threads]
        idle = vfsd_memory(daemon_pids)
        for t in threads:
            t0 = time.perf_counter()
            runs.release(t)
            unmount.append(time.perf_counter() - t0)
        for t in threads:
            t0 = time.perf_counter()
            with runs.use(t) as m:
                (m.root / "hello.txt").read_text()
            remount.append(time.perf_counter() - t0)
    out["daemon_per_thread"] = {
        "daemons": daemons,
        "first_mount_ms": {"p50": pct(first, 0.5) * 1e3, "p95": pct(first, 0.95) * 1e3},
        "unmount_ms": {"p50": pct(unmount, 0.5) * 1e3, "p95": pct(unmount, 0.95) * 1e3},
        "remount_and_read_ms": {"p50": pct(remount, 0.5) * 1e3, "p95": pct(remount, 0.95) * 1e3},
        "idle_daemon_rss_anon_mib": idle["rss_anon_mib"] / daemons,
        "idle_daemon_pss_mib": idle["pss_mib"] / daemons,
    }
    out["one_daemon_many_volumes"] = _volumes_probe(work / "volumes", volumes)
    out["parallel_files"] = _parallel_probe(work / "parallel", workers=4, files=500)
    return out


SHELL_WORK = ('for i in $(seq {files}); do printf "line %s\\n" $i > f$i.txt; done; '
              'cat f*.txt > /dev/null; grep -c line f1*.txt > /dev/null; rm f*.txt')


def _parallel_probe(root: Path, workers: int, files: int) -> dict:
    """The same shell work by `workers` threads at once: each on its own
    daemon (a daemon per thread), or all on one daemon (one directory each,
    as one daemon serving many threads would): wall time, median of 3."""
    import subprocess

    import mount_tool

    def run_all(dirs: list[Path]) -> float:
        t0 = time.perf_counter()
        procs = [subprocess.Popen(["sh", "-c", SHELL_WORK.format(files=files)], cwd=d)
                 for d in dirs]
        for p in procs:
            p.wait()
        return time.perf_counter() - t0

    with mount_tool.runs(root, max_mounted=0) as runs:
        own = []
        for i in range(workers):
            m = runs.get(f"p{i}")
            own.append(m.root)
        shared = runs.get("shared")
        dirs = []
        for i in range(workers):
            (shared.root / f"w{i}").mkdir()
            dirs.append(shared.root / f"w{i}")
        per_thread, one = [], []
        for _ in range(3):
            per_thread.append(run_all(own))
            one.append(run_all(dirs))
    return {"workers": workers, "files": files,
            "daemon_per_thread_s": statistics.median(per_thread),
            "one_daemon_s": statistics.median(one)}


def _volumes_probe(store_dir: Path, volumes: int) -> dict:
    """Build a daemon's per-volume objects for `volumes` volumes of one store in
    this process: memory and time per extra volume."""
    import subprocess

    code = f"""
import json, os, sys, time, gc
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from vfsd.config import Config
from vfsd.eviction import Evictor
from vfsd.fuse.fs import VfsdOperations
from vfsd.fuse.openfiles import OpenFiles
from vfsd.fuse.settle import Settler
from vfsd.fuse.snapservice import SnapshotService
from vfsd.fuse.snapview import SnapshotView
from vfsd.snapshots.snapshots import Snapshots
from vfsd.store.store import Store

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

store_dir = Path({str(store_dir)!r})
config = Config()
base = Store(store_dir, "v0")
class Stub:  # what SnapshotService asks of its daemon
    pass
held = []
def volume(name):
    st = base.view(name) if name in base.volumes() else None
    if st is None:
        with base.txn(write=True) as txn:
            base.create_volume(txn, name)
        st = base.view(name)
    files = OpenFiles(st, chunk_size=config.chunk_size, inline_max=config.inline_max)
    ops = VfsdOperations(st, files, entry_timeout=config.entry_timeout,
                         durability=config.durability, xattr_reads=config.xattr_reads)
    d = Stub(); d.ops = ops; d.settler = Settler(files); d.run = None
    ev = Evictor(st, ops, config)
    snaps = Snapshots(st, keep_last=config.snapshot_keep_last, keep_steps=config.snapshot_keep_steps)
    svc = SnapshotService(d, snaps)
    ops.snapview = SnapshotView(snaps, ops)
    return (st, files, ops, d, ev, snaps, svc)
volume("warm")  # the first one loads code, not a volume's cost
gc.collect()
a0 = anon(); t0 = time.perf_counter()
for i in range({volumes}):
    held.append(volume(f"v{{i + 1}}"))
t1 = time.perf_counter(); gc.collect(); a1 = anon()
print(json.dumps({{"volumes": {volumes}, "per_volume_kib": (a1 - a0) / {volumes} / 1024,
                  "per_volume_open_ms": (t1 - t0) / {volumes} * 1e3}}))
"""
    store_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the threads workload ---------------------------------------------------------------------


def script(messages):
    """The scripted model's next turn, from the conversation alone (one model for all threads)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    task = next((m.content for m in messages if isinstance(m, HumanMessage)), "0")
    n = int(str(task).split()[-1]) if str(task).split()[-1].isdigit() else 0
    done = sum(1 for m in messages if isinstance(m, ToolMessage))
    human_turns = sum(1 for m in messages if isinstance(m, HumanMessage))
    turns = [
        ("write_file", {"file_path": f"/work/job{human_turns}.py",
                        "content": f"print({n} * {n})\n" + "# padding\n" * 200}),
        ("execute", {"command": f"python3 /work/job{human_turns}.py > /work/out.txt; "
                                "cat /work/out.txt"}),
        ("read_file", {"file_path": "/work/out.txt"}),
        ("write_file", {"file_path": f"/work/report{human_turns}.md",
                        "content": f"# Report\n{n}^2 computed\n"}),
    ]
    k = done - 4 * (human_turns - 1)
    if 0 <= k < len(turns):
        name, args = turns[k]
        return AIMessage("", tool_calls=[{"name": name, "args": args,
                                          "id": f"call_{human_turns}_{k}"}])
    return AIMessage(f"done with task {n}")


class Timings:
    """File tool calls as the agents made them: per thread, start and duration."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[float]] = {}
        self.first_write: dict[str, float] = {}
        self.first_call: dict[str, float] = {}

    def record(self, kind: str, thread: str, started: float, ended: float) -> None:
        with self.lock:
            self.calls.setdefault(kind, []).append(ended - started)
            self.first_call.setdefault(thread, ended)
            if kind == "write_file":
                self.first_write.setdefault(thread, ended)


def _thread_now() -> str:
    from langgraph.config import get_config

    return str(get_config()["configurable"]["thread_id"])


def timed_backend(base: type, timings: Timings) -> type:
    """`base` (a backend class) with its file tool calls timed."""

    class Timed(base):  # type: ignore[misc, valid-type]
        async def awrite(self, *a, **k):
            return await self._timed("write_file", super().awrite, *a, **k)

        async def aread(self, *a, **k):
            return await self._timed("read_file", super().aread, *a, **k)

        async def aexecute(self, *a, **k):
            return await self._timed("execute", super().aexecute, *a, **k)

        async def _timed(self, kind, fn, *a, **k):
            thread = _thread_now()
            t0 = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                timings.record(kind, thread, t0, time.perf_counter())

    return Timed


def _fd_kinds() -> dict[str, int]:
    """This process's open descriptors by kind (socket, pipe, anon_inode, a path's top dirs)."""
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":")[0] if ":" in target else "/".join(target.split("/")[:3])
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


async def _run_threads(agent, threads: list[str], active: int, starts: dict, turn: int,
                       sampler) -> None:
    gate = asyncio.Semaphore(active)

    async def one(thread: str) -> None:
        async with gate:
            starts[thread] = time.perf_counter()
            cfg = {"configurable": {"thread_id": thread}}
            await agent.ainvoke({"messages": [{"role": "user", "content": f"task {turn}"}]}, cfg)
            sampler()

    await asyncio.gather(*(one(t) for t in threads))


def threads_workload(work: Path, counts: list[int], active: int, max_mounted: int) -> list[dict]:
    from deepagents import create_deep_agent
    from deepagents.backends import StateBackend
    from langgraph.checkpoint.memory import InMemorySaver

    import mount_tool
    from mount_tool.checkpointer import VfsdCheckpointer
    from mount_tool.deepagents import VfsdBackend, VfsdMiddleware
    from mount_tool.demo import conversation_model

    results = []
    for count in counts:
        row: dict = {"threads": count, "active": active, "max_mounted": max_mounted}
        for variant in ("vfsd", "state"):
            timings = Timings()
            starts: dict[str, float] = {}
            peak = {"pss_mib": 0.0, "rss_anon_mib": 0.0, "processes": 0}
            last_sample = [0.0]

            def sample(force: bool = False, peak=peak, last_sample=last_sample) -> None:
                now = time.monotonic()
                if not force and now - last_sample[0] < 1.0:
                    return
                last_sample[0] = now
                got = vfsd_memory(vfsd_processes(work))
                for key in peak:
                    peak[key] = max(peak[key], got[key])

            model = conversation_model(script)
            gc.collect()
            own_before = _smaps(os.getpid()).get("RssAnon", 0)
            threads = [f"bench-{count}-{uuid.uuid4().hex[:8]}-{i}" for i in range(count)]
            loop = asyncio.new_event_loop()
            loop.set_default_executor(ThreadPoolExecutor(max_workers=active + 8))
            t_all = time.perf_counter()
            if variant == "vfsd":
                runs = mount_tool.runs(work / f"runs-{count}", max_mounted=max_mounted)
                backend = timed_backend(VfsdBackend, timings)(runs)
                agent = create_deep_agent(
                    model, backend=backend,
                    middleware=[VfsdMiddleware(runs, prompt_note=backend.prompt_note())],
                    checkpointer=VfsdCheckpointer(InMemorySaver(), runs))
            else:
                runs = None
                agent = create_deep_agent(model, backend=timed_backend(StateBackend, timings)(),
                                          checkpointer=InMemorySaver())
            try:
                # Not timed: mount_tool's helper and the sandbox's first probe start here.
                loop.run_until_complete(_run_threads(agent, [f"warm-up-{count}"], 1, {}, 1,
                                                     lambda: None))
                timings.__init__()
                loop.run_until_complete(_run_threads(agent, threads, active, starts, 1, sample))
                elapsed = time.perf_counter() - t_all
                sample(force=True)
                end_memory = vfsd_memory(vfsd_processes(work))
                fds = _fd_kinds()
                gc.collect()
                own_growth = (_smaps(os.getpid()).get("RssAnon", 0) - own_before) / 2**20
                first_write = [timings.first_write[t] - starts[t] for t in threads
                               if t in timings.first_write]
                out = {
                    "elapsed_s": elapsed,
                    "peak_vfsd_pss_mib": peak["pss_mib"],
                    "peak_vfsd_rss_anon_mib": peak["rss_anon_mib"],
                    "peak_vfsd_processes": peak["processes"],
                    "end_vfsd_pss_mib": end_memory["pss_mib"],
                    # The agent's own process: where StateBackend keeps the files (in the
                    # checkpoints), and what a Runs costs the server in bookkeeping.
                    "agent_process_growth_mib": own_growth,
                    # Descriptors the agents' process holds once every thread is done.
                    "agent_process_fds": fds,
                    "first_write_ms": {"p50": pct(first_write, 0.5) * 1e3,
                                       "p95": pct(first_write, 0.95) * 1e3},
                    "calls_ms": {kind: {"n": len(v), "p50": pct(v, 0.5) * 1e3,
                                        "p95": pct(v, 0.95) * 1e3}
                                 for kind, v in sorted(timings.calls.items())},
                }
                # Threads whose run dirs went idle come back for one more turn.
                if variant == "vfsd" and count > max_mounted:
                    mounted = set(runs.mounted())
                    idle = [t for t in threads if t not in mounted][:active]
                    timings2 = Timings()
                    backend.__class__ = timed_backend(VfsdBackend, timings2)
                    starts2: dict[str, float] = {}
                    loop.run_until_complete(
                        _run_threads(agent, idle, active, starts2, 2, sample))
                    resumed = [timings2.first_call[t] - starts2[t] for t in idle
                               if t in timings2.first_call]
                    out["resumed_idle_first_call_ms"] = {
                        "n": len(resumed), "p50": pct(resumed, 0.5) * 1e3,
                        "p95": pct(resumed, 0.95) * 1e3}
                    out["unmounts"] = runs.counts["unmounts"]
                row[variant] = out
            finally:
                if runs is not None:
                    loop.run_until_complete(asyncio.to_thread(runs.close))
                loop.close()
                gc.collect()
            print(json.dumps({"threads": count, "variant": variant, **row[variant]}),
                  file=sys.stderr)
        results.append(row)
    return results


# -- report --------------------------------------------------------------------------------


def print_shapes(s: dict) -> None:
    a, b = s["daemon_per_thread"], s["one_daemon_many_volumes"]
    print(f"\ndaemon per thread ({a['daemons']} daemons):")
    print(f"  first mount of a thread   p50 {a['first_mount_ms']['p50']:.0f} ms, "
          f"p95 {a['first_mount_ms']['p95']:.0f} ms")
    print(f"  unmount of an idle one    p50 {a['unmount_ms']['p50']:.0f} ms")
    print(f"  remount + first read      p50 {a['remount_and_read_ms']['p50']:.0f} ms, "
          f"p95 {a['remount_and_read_ms']['p95']:.0f} ms")
    print(f"  idle daemon               {a['idle_daemon_rss_anon_mib']:.1f} MiB RssAnon, "
          f"{a['idle_daemon_pss_mib']:.1f} MiB Pss")
    print(f"one daemon, many volumes ({b['volumes']} volumes in one process):")
    print(f"  per extra volume          {b['per_volume_kib']:.0f} KiB anonymous, "
          f"{b['per_volume_open_ms']:.2f} ms to open")
    p = s["parallel_files"]
    print(f"{p['workers']} threads' shell work at once ({p['files']} files each: create, cat, "
          f"grep, rm): on a daemon each {p['daemon_per_thread_s']:.2f} s, on one daemon "
          f"{p['one_daemon_s']:.2f} s ({p['one_daemon_s'] / p['daemon_per_thread_s']:.2f}x)")


def print_threads(rows: list[dict]) -> None:
    print("\n| threads (active) | backend | vfsd processes, Pss peak / end | first write p50 / p95 "
          "| agent process growth | write_file p50 / p95 | read_file p50 / p95 | execute p50 / p95 | idle thread's "
          "first call p50 / p95 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        for variant in ("vfsd", "state"):
            r = row[variant]
            calls = r["calls_ms"]

            def cell(kind: str, calls=calls) -> str:
                c = calls.get(kind)
                return f"{c['p50']:.1f} / {c['p95']:.1f} ms" if c else "-"

            resumed = r.get("resumed_idle_first_call_ms")
            print(f"| {row['threads']:,} ({row['active']}) | {variant} | "
                  f"{r['peak_vfsd_pss_mib']:.0f} / {r['end_vfsd_pss_mib']:.0f} MiB "
                  f"({r['peak_vfsd_processes']} processes) | "
                  f"{r['first_write_ms']['p50']:.0f} / {r['first_write_ms']['p95']:.0f} ms | "
                  f"{r['agent_process_growth_mib']:+.0f} MiB | "
                  f"{cell('write_file')} | {cell('read_file')} | {cell('execute')} | "
                  + (f"{resumed['p50']:.0f} / {resumed['p95']:.0f} ms |" if resumed else "- |"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["shapes", "threads"], help="run one part only")
    ap.add_argument("--threads", default="1,50,1000", help="thread counts [1,50,1000]")
    ap.add_argument("--active", type=int, default=50, help="threads in flight at once [50]")
    ap.add_argument("--max-mounted", type=int, default=64,
                    help="Runs' bound on mounted run dirs [64]")
    ap.add_argument("--daemons", type=int, default=20, help="daemons for the shapes probe [20]")
    ap.add_argument("--volumes", type=int, default=1000,
                    help="volumes for the one-daemon probe [1000]")
    ap.add_argument("--dir", type=Path, default=None, help="work directory [a temporary one]")
    ap.add_argument("--json", dest="json_out", help="write the results as JSON (- for stdout)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vfsd-threads-", dir=args.dir))
    info = machine_info(work)
    print_machine(info)
    results: dict = {"machine": info}
    try:
        if args.only in (None, "shapes"):
            results["shapes"] = shapes(work, args.daemons, args.volumes)
            print_shapes(results["shapes"])
        if args.only in (None, "threads"):
            counts = [int(c) for c in args.threads.split(",")]
            results["threads"] = threads_workload(work, counts, args.active, args.max_mounted)
            print_threads(results["threads"])
        results["loadavg_at_end"] = load_average()
        print(f"\nload average at the end: {results['loadavg_at_end']}")
    finally:
        rmtree_quiet(work)
    if args.json_out:
        text = json.dumps(results, indent=2, default=str)
        if args.json_out == "-":
            print(text)
        else:
            Path(args.json_out).write_text(text)


if __name__ == "__main__":
    main()
