#!/usr/bin/env python3
"""Many threads on one machine: what a LangGraph server with thousands of threads costs.

Usage (from the repo):
    .venv/bin/python bench/threads_bench.py [--only threads|turn|write|floor]
                                            [--threads 1,50,1000] [--active 50]
                                            [--shards K] [--json FILE|-]

Every part runs vfsd and, in the same run, what it is compared with:

- `threads`: a Deep Agents agent (`create_deep_agent` with VfsdBackend,
  VfsdMiddleware and VfsdCheckpointer over InMemorySaver on a Runs, a scripted
  model) for T threads, at most `--active` at once, each doing four tool calls
  (write a script, run it with `execute`, read its output, write a report),
  all async on one event loop as a server runs them; the same threads with
  deepagents' StateBackend beside them (no `execute` there: that call returns
  the tool's error). For each T: the memory of every vfsd process of the run
  (Pss summed: shard daemons and mount_tool's helper) at its peak and at the
  end, the agents' process growth, the time from a thread's first `ainvoke` to
  its first file write landing, p50/p95 of each tool call; then `--active`
  threads that went idle each get one more turn: the time to their first
  file call's answer.
- `turn`: one thread, one turn of ten file tool calls (one per model call:
  write, read, edit, write, ls, glob, grep, read, write, read), timed over
  five turns against StateBackend; the control round trips of each turn, by op.
- `write`: `VfsdBackend.write` inside a tool call (its provenance tag
  included) against open/write/close of the same 2 KB on the same mount.
- `floor`: a shard daemon's small-file rate (8 processes at once, each
  creating, writing 2 KB and closing files in its own thread's directory)
  against bench/floorfs.py (a pyfuse3 filesystem doing nothing) and one run
  dir's daemon in the same run, with each daemon's CPU time per file.

With a Runs of the earlier layout (a daemon per thread: check out an older
mount_tool with PYTHONPATH), `threads`, `turn` and `write` run unchanged, for
before/after figures on one machine.
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
    helper's command line; shards, or the earlier layout's run dir per
    thread) and mount_tool's helper itself. Other vfsd processes on the
    machine are not counted."""
    pids = set()
    for pidfile in [*work.glob("*/shards/*/.vfsd/vfsd.pid"),
                    *work.glob("*/threads/*/.vfsd/vfsd.pid")]:
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
            if Path(f"/proc/{name}/cmdline").read_bytes().startswith(b"vfsd spawner "):
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


# -- the threads workload ---------------------------------------------------------------------


#: whether the threads' second tool call is `execute` (else `ls`: `--no-execute`)
WITH_EXECUTE = True


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
                                "cat /work/out.txt"}) if WITH_EXECUTE else
        ("ls", {"path": "/work"}),
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


def runs_options(shards: int | None) -> dict:
    """The Runs' options: `shards` for this version; for the earlier layout
    (a daemon per thread), its bound on mounted run dirs as it ran."""
    import inspect

    import mount_tool

    if "shards" in inspect.signature(mount_tool.Runs.__init__).parameters:
        return {"shards": shards} if shards else {}
    return {"max_mounted": 64}


def threads_workload(work: Path, counts: list[int], active: int, options: dict) -> list[dict]:
    from deepagents import create_deep_agent
    from deepagents.backends import StateBackend
    from langgraph.checkpoint.memory import InMemorySaver

    import mount_tool
    from mount_tool.deepagents import VfsdBackend, VfsdMiddleware
    from mount_tool.demo import conversation_model
    from mount_tool.langgraph import VfsdCheckpointer

    results = []
    for count in counts:
        row: dict = {"threads": count, "active": active, "runs_options": options,
                     "execute": WITH_EXECUTE}
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
                runs = mount_tool.runs(work / f"runs-{count}", **options)
                backend = timed_backend(VfsdBackend, timings)(runs)
                agent = create_deep_agent(
                    model, backend=backend,
                    middleware=[VfsdMiddleware(runs, prompt_note=backend.prompt_note())],
                    checkpointer=VfsdCheckpointer(InMemorySaver(), runs))
            else:
                runs = None
                state_backend = timed_backend(StateBackend, timings)()
                agent = create_deep_agent(model, backend=state_backend,
                                          checkpointer=InMemorySaver())
            try:
                # Not timed: mount_tool's helper and the sandbox's first probe start here.
                loop.run_until_complete(_run_threads(agent, [f"warm-up-{count}"], 1, {}, 1,
                                                     lambda: None))
                timings.__init__()
                cpu0 = os.times()
                vfsd_cpu0 = sum(_cpu_seconds(p) for p in vfsd_processes(work))
                loop.run_until_complete(_run_threads(agent, threads, active, starts, 1, sample))
                elapsed = time.perf_counter() - t_all
                cpu1 = os.times()
                # Daemons alive through the run (shards; the earlier layout's are
                # partly gone by now, so its figure is a floor).
                vfsd_cpu = sum(_cpu_seconds(p) for p in vfsd_processes(work)) - vfsd_cpu0
                sample(force=True)
                end_memory = vfsd_memory(vfsd_processes(work))
                fds = _fd_kinds()
                gc.collect()
                own_growth = (_smaps(os.getpid()).get("RssAnon", 0) - own_before) / 2**20
                first_write = [timings.first_write[t] - starts[t] for t in threads
                               if t in timings.first_write]
                out = {
                    "elapsed_s": elapsed,
                    # Where the CPU went: the agents' process, its children (the
                    # sandboxes, reaped), the vfsd processes.
                    "cpu_s": {"agents": cpu1.user + cpu1.system - cpu0.user - cpu0.system,
                              "sandboxes": cpu1.children_user + cpu1.children_system
                              - cpu0.children_user - cpu0.children_system,
                              "vfsd": vfsd_cpu},
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
                # Threads that went idle come back for one more turn (with the
                # earlier layout: threads whose run dirs were unmounted).
                if count > active:
                    mounted = set(runs.mounted()) if hasattr(runs, "mounted") else set()
                    idle = [t for t in threads if t not in mounted][:active]
                    timings2 = Timings()
                    if variant == "vfsd":
                        backend.__class__ = timed_backend(VfsdBackend, timings2)
                    else:
                        state_backend.__class__ = timed_backend(StateBackend, timings2)
                    starts2: dict[str, float] = {}
                    loop.run_until_complete(
                        _run_threads(agent, idle, active, starts2, 2, sample))
                    resumed = [timings2.first_call[t] - starts2[t] for t in idle
                               if t in timings2.first_call]
                    out["resumed_idle_first_call_ms"] = {
                        "n": len(resumed), "p50": pct(resumed, 0.5) * 1e3,
                        "p95": pct(resumed, 0.95) * 1e3}
                    if hasattr(runs, "counts"):
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


# -- control round trips ---------------------------------------------------------------


class RoundTrips:
    """Counts the control requests mount_tool sends (every one goes through
    `ControlClient.call`), by op, while active."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: dict[str, int] = {}
        self._original = None

    def __enter__(self) -> RoundTrips:
        from mount_tool.daemon.client import ControlClient

        original = self._original = ControlClient.call
        counts = self

        def counted(client, op, **args):
            with counts.lock:
                counts.ops[op] = counts.ops.get(op, 0) + 1
            return original(client, op, **args)

        ControlClient.call = counted
        return self

    def __exit__(self, *exc) -> None:
        from mount_tool.daemon.client import ControlClient

        ControlClient.call = self._original

    def take(self) -> dict[str, int]:
        with self.lock:
            out, self.ops = dict(sorted(self.ops.items())), {}
        return out


# -- one thread: a ten-tool-call turn, and one write ------------------------------------------

PAD = "".join(f"line {i}: some notes the agent keeps\n" for i in range(50))  # ~1.8 KB


def turn_calls(k: int) -> list[tuple[str, dict]]:
    """Turn k's ten file tool calls, one per model call."""
    a, b, c = f"/notes/a{k}.md", f"/notes/b{k}.md", f"/notes/c{k}.md"
    return [
        ("write_file", {"file_path": a, "content": PAD}),
        ("read_file", {"file_path": a}),
        ("edit_file", {"file_path": a, "old_string": "line 1:", "new_string": "LINE 1:"}),
        ("write_file", {"file_path": b, "content": PAD}),
        ("ls", {"path": "/notes"}),
        ("glob", {"pattern": "**/*.md"}),
        ("grep", {"pattern": "LINE 1:"}),
        ("read_file", {"file_path": b}),
        ("write_file", {"file_path": c, "content": PAD}),
        ("read_file", {"file_path": c}),
    ]


def turn_script(messages):
    """The next model call of a ten-tool-call turn, from the conversation alone."""
    from langchain_core.messages import AIMessage, HumanMessage

    last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    k = sum(1 for m in messages if isinstance(m, HumanMessage))
    done = len(messages) - last_human - 1  # AI and tool messages since, two per call
    calls = turn_calls(k)
    if done // 2 < len(calls):
        name, args = calls[done // 2]
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"c{k}_{done}"}])
    return AIMessage(f"turn {k} done")


def one_thread(work: Path, turns: int, options: dict) -> dict:
    """A ten-tool-call turn on vfsd and on StateBackend, and its round trips."""
    from deepagents import create_deep_agent
    from deepagents.backends import StateBackend
    from langgraph.checkpoint.memory import InMemorySaver

    import mount_tool
    from mount_tool.deepagents import VfsdBackend, VfsdMiddleware
    from mount_tool.demo import conversation_model
    from mount_tool.langgraph import VfsdCheckpointer

    out: dict = {"turns": turns, "tool_calls_per_turn": 10, "model_calls_per_turn": 11}
    for variant in ("vfsd", "state"):
        model = conversation_model(turn_script)
        runs = None
        if variant == "vfsd":
            runs = mount_tool.runs(work / "turn", **options)
            backend = VfsdBackend(runs)
            agent = create_deep_agent(
                model, backend=backend,
                middleware=[VfsdMiddleware(runs, prompt_note=backend.prompt_note())],
                checkpointer=VfsdCheckpointer(InMemorySaver(), runs))
        else:
            agent = create_deep_agent(model, backend=StateBackend(), checkpointer=InMemorySaver())
        cfg = {"configurable": {"thread_id": f"turn-{uuid.uuid4().hex[:8]}"}}
        loop = asyncio.new_event_loop()
        try:
            with RoundTrips() as trips:
                loop.run_until_complete(agent.ainvoke(
                    {"messages": [{"role": "user", "content": "turn 1"}]}, cfg))  # warm-up
                first = trips.take()
                times = []
                for k in range(2, turns + 2):
                    t0 = time.perf_counter()
                    state = loop.run_until_complete(agent.ainvoke(
                        {"messages": [{"role": "user", "content": f"turn {k}"}]}, cfg))
                    times.append(time.perf_counter() - t0)
                    assert state["messages"][-1].content == f"turn {k} done", state["messages"][-1]
                ops = trips.take()
        finally:
            if runs is not None:
                loop.run_until_complete(asyncio.to_thread(runs.close))
            loop.close()
        per_turn = {op: n / turns for op, n in ops.items()}
        out[variant] = {"turn_ms": {"p50": pct(times, 0.5) * 1e3, "min": min(times) * 1e3,
                                    "max": max(times) * 1e3},
                        "round_trips_per_turn": per_turn,
                        "round_trips_per_model_call": sum(per_turn.values()) / 11,
                        "first_turn_round_trips": first}
        print(json.dumps({"part": "turn", "variant": variant, **out[variant]}), file=sys.stderr)
    return out


def write_vs_open(work: Path, n: int, options: dict) -> dict:
    """VfsdBackend.write inside a tool call against open/write/close, same mount."""
    from langchain_core.runnables.config import var_child_runnable_config

    import mount_tool
    from mount_tool.daemon import toolcalls
    from mount_tool.deepagents import VfsdBackend

    data = PAD
    out: dict = {"writes": n, "bytes": len(data)}
    with mount_tool.runs(work / "write", **options) as runs:
        thread = "writer"
        root = runs.get(thread).root
        backend = VfsdBackend(runs)
        result: dict = {}

        def in_a_tool_call() -> None:
            var_child_runnable_config.set({"configurable": {"thread_id": thread}})
            with toolcalls.running("write_file", "call-w", thread), RoundTrips() as trips:
                backend.write("/w/warm.md", data)
                trips.take()
                times = []
                for i in range(n):
                    t0 = time.perf_counter()
                    res = backend.write(f"/w/f{i}.md", data)
                    times.append(time.perf_counter() - t0)
                    assert res.error is None, res.error
                result["backend"] = times
                result["round_trips"] = trips.take()

        worker = threading.Thread(target=in_a_tool_call)
        worker.start()
        worker.join()
        (root / "o").mkdir()
        raw = data.encode()
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            with open(root / "o" / f"f{i}.md", "wb") as f:
                f.write(raw)
            times.append(time.perf_counter() - t0)
        result["open"] = times
    for key in ("backend", "open"):
        v = result[key]
        out[key] = {"p50_ms": pct(v, 0.5) * 1e3, "p95_ms": pct(v, 0.95) * 1e3,
                    "mean_ms": statistics.mean(v) * 1e3}
    out["round_trips_per_write"] = {op: c / n for op, c in result["round_trips"].items()}
    print(json.dumps({"part": "write", **out}), file=sys.stderr)
    return out


# -- a shard against the pyfuse3 floor --------------------------------------------------------

SMALL_FILES = """
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
data = b"x" * 2048
t0 = time.perf_counter()
for i in range(n):
    fd = os.open(f"{d}/f{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.close(fd)
print(time.perf_counter() - t0)
"""


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _small_files_at_once(dirs: list[Path], n: int) -> float:
    import subprocess

    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", SMALL_FILES, str(d), str(n)],
                              stdout=subprocess.DEVNULL) for d in dirs]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("a small-file writer failed")
    return time.perf_counter() - t0


def shard_floor(work: Path, files: int, workers: int, reps: int) -> dict:
    """Files/s and daemon CPU per file: one shard (a volume per writer) and the floor."""
    from floor_bench import FloorMount

    import mount_tool

    out: dict = {"workers": workers, "files_per_worker": files, "reps": reps}
    floor = FloorMount(work)
    runs = mount_tool.runs(work / "floor-runs", shards=1)
    single = mount_tool.mount(work / "floor-rundir")
    try:
        mounts = [runs.get(f"w{i}") for i in range(workers)]
        shard_pid = mounts[0].shard.pid
        single_pid = int((single.state_dir / "vfsd.pid").read_text())
        sides = {"floor": (floor.proc.pid, lambda rep: [floor.root / f"r{rep}-{i}"
                                                       for i in range(workers)]),
                 "shard": (shard_pid, lambda rep: [m.root / f"r{rep}" for m in mounts]),
                 # One run dir's daemon (`vfsd mount RUN`), the writers in directories of it.
                 "rundir": (single_pid, lambda rep: [single.root / f"r{rep}-{i}"
                                                     for i in range(workers)])}
        got: dict = {k: {"seconds": [], "cpu": []} for k in sides}
        order = list(sides)
        for rep in range(reps):
            for name in order[rep % len(order):] + order[:rep % len(order)]:
                pid, dirs_of = sides[name]
                dirs = dirs_of(rep)
                for d in dirs:
                    d.mkdir()
                cpu0 = _cpu_seconds(pid)
                got[name]["seconds"].append(_small_files_at_once(dirs, files))
                got[name]["cpu"].append(_cpu_seconds(pid) - cpu0)
        total = files * workers
        for name, g in got.items():
            secs = statistics.median(g["seconds"])
            out[name] = {"files_per_s": total / secs, "seconds": secs,
                         "daemon_cpu_ms_per_file": statistics.median(g["cpu"]) / total * 1e3}
        out["shard_vs_floor"] = out["shard"]["files_per_s"] / out["floor"]["files_per_s"]
        out["rundir_vs_floor"] = out["rundir"]["files_per_s"] / out["floor"]["files_per_s"]
    finally:
        runs.close()
        single.unmount()
        floor.close()
    print(json.dumps({"part": "floor", **out}), file=sys.stderr)
    return out


def print_turn(t: dict) -> None:
    v, st = t["vfsd"], t["state"]
    print(f"\none thread, a {t['tool_calls_per_turn']}-tool-call turn ({t['turns']} turns): "
          f"vfsd p50 {v['turn_ms']['p50']:.0f} ms, StateBackend {st['turn_ms']['p50']:.0f} ms "
          f"({v['turn_ms']['p50'] / st['turn_ms']['p50']:.2f}x)")
    rt = v["round_trips_per_turn"]
    print(f"  control round trips per turn: {sum(rt.values()):.0f} "
          f"({v['round_trips_per_model_call']:.1f} per model call): "
          + ", ".join(f"{n:g} {op}" for op, n in sorted(rt.items(), key=lambda kv: -kv[1])))


def print_write(w: dict) -> None:
    b, o = w["backend"], w["open"]
    rt = sum(w["round_trips_per_write"].values())
    print(f"\nVfsdBackend.write of {w['bytes']:,} bytes in a tool call: p50 {b['p50_ms']:.2f} ms "
          f"(mean {b['mean_ms']:.2f}), open/write/close p50 {o['p50_ms']:.2f} ms (mean "
          f"{o['mean_ms']:.2f}): {b['p50_ms'] / o['p50_ms']:.2f}x; {rt:g} control round trips")


def print_floor(f: dict) -> None:
    print(f"\n{f['workers']} processes at once, create+write 2 KB+close, "
          f"{f['files_per_worker']:,} files each:")
    for name in ("shard", "rundir", "floor"):
        r = f[name]
        print(f"  {name:6} {r['files_per_s']:,.0f} files/s, daemon CPU "
              f"{r['daemon_cpu_ms_per_file']:.3f} ms per file")
    print(f"  shard / floor: {f['shard_vs_floor']:.2f}; one run dir's daemon / floor: "
          f"{f['rundir_vs_floor']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["threads", "turn", "write", "floor"],
                    help="run one part only")
    ap.add_argument("--threads", default="1,50,1000", help="thread counts [1,50,1000]")
    ap.add_argument("--active", type=int, default=50, help="threads in flight at once [50]")
    ap.add_argument("--shards", type=int, default=None,
                    help="the Runs' shard daemons [the number of CPUs]")
    ap.add_argument("--turns", type=int, default=5, help="timed ten-tool-call turns [5]")
    ap.add_argument("--no-execute", action="store_true",
                    help="threads: `ls` instead of `execute` (no sandboxes on the CPUs)")
    ap.add_argument("--writes", type=int, default=300, help="timed writes [300]")
    ap.add_argument("--floor-files", type=int, default=2000,
                    help="files per writer process in the floor part [2000]")
    ap.add_argument("--dir", type=Path, default=None, help="work directory [a temporary one]")
    ap.add_argument("--json", dest="json_out", help="write the results as JSON (- for stdout)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vfsd-threads-", dir=args.dir))
    info = machine_info(work)
    print_machine(info)
    results: dict = {"machine": info}
    options = runs_options(args.shards)
    global WITH_EXECUTE
    WITH_EXECUTE = not args.no_execute
    results["runs_options"] = options
    try:
        if args.only in (None, "turn"):
            results["turn"] = one_thread(work, args.turns, options)
            print_turn(results["turn"])
        if args.only in (None, "write"):
            results["write"] = write_vs_open(work, args.writes, options)
            print_write(results["write"])
        if args.only in (None, "floor"):
            results["floor"] = shard_floor(work, args.floor_files, 8, 3)
            print_floor(results["floor"])
        if args.only in (None, "threads"):
            counts = [int(c) for c in args.threads.split(",")]
            results["threads"] = threads_workload(work, counts, args.active, options)
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
