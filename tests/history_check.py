"""The checker the checkpoint-history tests share: does every checkpoint bring back its files?

For a thread, every checkpoint its history lists is run from: a forked run
whose one tool call (`execute`) lists every file under /work with its
checksum (`history_agent.VERIFY`). The listing is compared with the files
the thread had at that checkpoint by the test's own model: the effects of
the tool calls whose results are in the checkpoint's messages
(`history_agent.apply`).

A `Tally` counts checkpoints checked, wrong (the run saw other files) and
unbound (the checkpoint records that its files could not be bound, and a
run from it refuses with SnapshotUnavailable).

In-process, `check_snapshots` also looks at every checkpoint's snapshot
directly (`.vfsd/snapshots/<id>/work`, what a run from it would restore):
the same comparison without a run, cheap enough for every checkpoint of
every thread of a test.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

from history_agent import VERIFY, apply


@dataclass
class Tally:
    checked: int = 0
    wrong: int = 0
    unbound: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.checked += other.checked
        self.wrong += other.wrong
        self.unbound += other.unbound
        self.problems += other.problems

    def __str__(self) -> str:
        return f"{self.checked} checked / {self.wrong} wrong / {self.unbound} unbound"


def expected_files(messages: list[Any], effects: dict[str, Any]) -> dict[str, str]:
    """{"work/a.txt": sha16, "work/d/": "dir"} after the tool calls whose results
    are in `messages` (dicts from the server's API, or LangChain messages)."""
    files: dict[str, str] = {}
    for message in messages:
        if _field(message, "type") != "tool":
            continue
        op = effects.get(_field(message, "tool_call_id"))
        if op is not None:
            apply(files, op)
    return {path: "dir" if text == "dir" else sha16(text) for path, text in files.items()}


def sha16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_listing(text: str) -> dict[str, str]:
    """The files a VERIFY run's `execute` listed."""
    if "\nExit code: " in f"\n{text}":
        raise AssertionError(f"the listing command failed: {text!r}")
    files = {}
    for line in text.splitlines():
        if line.startswith("["):
            continue  # execute's own trailer ("[Command succeeded with exit code 0]")
        if line.endswith("/"):
            files[line] = "dir"
        elif line.strip():
            path, _, digest = line.rpartition(" ")
            files[path] = digest
    return files


def listing_of(messages: list[Any]) -> str:
    """The output of the VERIFY run's `execute` (the last tool message)."""
    tools = [m for m in messages if _field(m, "type") == "tool"]
    return str(_field(tools[-1], "content"))


def judge(tally: Tally, label: str, expected: dict[str, str], seen: dict[str, str] | None,
          unbound: str | None) -> None:
    """Count one checkpoint: `seen` is what the run listed (None: it refused)."""
    tally.checked += 1
    if unbound is not None:
        tally.unbound += 1
        tally.problems.append(f"{label}: unbound ({unbound})")
    elif seen != expected:
        tally.wrong += 1
        tally.problems.append(f"{label}: expected {sorted(expected.items())}, "
                              f"a run from it saw {sorted((seen or {}).items())}")


def unbound_reason(metadata: dict[str, Any] | None) -> str | None:
    """Why a checkpoint's files are unbound, as its metadata says (None: bound)."""
    vfsd = (metadata or {}).get("vfsd") or {}
    return vfsd.get("unbound") if isinstance(vfsd, dict) else None


def _field(message: Any, name: str) -> Any:
    if isinstance(message, dict):
        return message.get(name)
    return getattr(message, name, None)


# -- in-process: a compiled graph ------------------------------------------------------------


def snapshot_listing(mount: Any, snapshot: str) -> dict[str, str]:
    """What VERIFY would list in a run from a checkpoint naming `snapshot`."""
    from pathlib import Path

    files: dict[str, str] = {}
    if snapshot == "s0":  # no files at all
        return files
    top = Path(mount.root) / ".vfsd" / "snapshots" / snapshot
    for path in sorted((top / "work").rglob("*")):
        key = path.relative_to(top).as_posix()
        if path.is_dir():
            files[key + "/"] = "dir"
        else:
            files[key] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return files


def check_snapshots(agent: Any, runs: Any, thread_id: str, effects: dict[str, Any]) -> Tally:
    """Every checkpoint of the thread's history: the snapshot it names holds
    exactly the files of the model (no run)."""
    config = {"configurable": {"thread_id": thread_id}}
    return _judge_snapshots(runs, thread_id, list(agent.get_state_history(config)), effects)


async def acheck_snapshots(agent: Any, runs: Any, thread_id: str,
                           effects: dict[str, Any]) -> Tally:
    """`check_snapshots` through the async API (the files are read in a worker thread)."""
    config = {"configurable": {"thread_id": thread_id}}
    history = [s async for s in agent.aget_state_history(config)]
    return await asyncio.to_thread(_judge_snapshots, runs, thread_id, history, effects)


def _judge_snapshots(runs: Any, thread_id: str, history: list, effects: dict[str, Any]) -> Tally:
    tally = Tally()
    with runs.use(thread_id) as mount:
        for state in history:
            expected = expected_files(state.values.get("messages", []), effects)
            label = (f"{thread_id} step {state.metadata.get('step')} "
                     f"{state.config['configurable']['checkpoint_id']} (its snapshot)")
            reason = unbound_reason(state.metadata)
            seen = None
            if reason is None:
                seen = snapshot_listing(mount, state.metadata["vfsd"]["snapshot"])
            judge(tally, label, expected, seen, reason)
    return tally


def check_thread(agent: Any, thread_id: str, effects: dict[str, Any]) -> Tally:
    """Run from every checkpoint of the thread's history (in-process, sync)."""
    from mount_tool import SnapshotUnavailable

    tally = Tally()
    config = {"configurable": {"thread_id": thread_id}}
    for state in list(agent.get_state_history(config)):
        expected = expected_files(state.values.get("messages", []), effects)
        label = f"{thread_id} step {state.metadata.get('step')} {state.config['configurable']['checkpoint_id']}"
        reason = unbound_reason(state.metadata)
        seen = None
        try:
            out = agent.invoke({"messages": [{"role": "user", "content": VERIFY}]}, state.config,
                               durability="exit")
            seen = parse_listing(listing_of(out["messages"]))
        except SnapshotUnavailable as exc:
            reason = reason or str(exc)
        judge(tally, label, expected, seen, reason)
    return tally


async def acheck_thread(agent: Any, thread_id: str, effects: dict[str, Any]) -> Tally:
    """`check_thread` through the async API."""
    from mount_tool import SnapshotUnavailable

    tally = Tally()
    config = {"configurable": {"thread_id": thread_id}}
    history = [s async for s in agent.aget_state_history(config)]
    for state in history:
        expected = expected_files(state.values.get("messages", []), effects)
        label = f"{thread_id} step {state.metadata.get('step')} {state.config['configurable']['checkpoint_id']}"
        reason = unbound_reason(state.metadata)
        seen = None
        try:
            out = await agent.ainvoke({"messages": [{"role": "user", "content": VERIFY}]},
                                      state.config, durability="exit")
            seen = parse_listing(listing_of(out["messages"]))
        except SnapshotUnavailable as exc:
            reason = reason or str(exc)
        judge(tally, label, expected, seen, reason)
    return tally


# -- under the server: langgraph-sdk ----------------------------------------------------------


async def check_server_thread(client: Any, thread_id: str, effects: dict[str, Any],
                              assistant: str = "agent", *, copies: int = 0) -> Tally:
    """Run from every checkpoint of a server thread's history (langgraph-sdk client).

    With `copies`, that many copies of the thread (`threads.copy`: the same
    checkpoints, a copy of the run dir) take their share of the runs, at
    once: a server starts a run about once a second per thread."""
    history = await client.threads.get_history(thread_id, limit=1000)
    threads = [thread_id]
    for _ in range(copies):
        threads.append((await client.threads.copy(thread_id))["thread_id"])
    shares = [history[i::len(threads)] for i in range(len(threads))]
    tallies = await asyncio.gather(*(
        _check_server_states(client, thread, share, effects, assistant)
        for thread, share in zip(threads, shares, strict=True)))
    total = Tally()
    for tally in tallies:
        total.add(tally)
    return total


async def _check_server_states(client: Any, thread_id: str, states: list[dict],
                               effects: dict[str, Any], assistant: str) -> Tally:
    tally = Tally()
    for state in states:
        checkpoint_id = state["checkpoint"]["checkpoint_id"]
        expected = expected_files((state["values"] or {}).get("messages", []), effects)
        label = f"{thread_id} step {state['metadata'].get('step')} {checkpoint_id}"
        reason = unbound_reason(state["metadata"])
        seen = None
        # durability="exit": one checkpoint per run, the check's cost is the runs
        out = await client.runs.wait(thread_id, assistant,
                                     input={"messages": [{"role": "user", "content": VERIFY}]},
                                     checkpoint_id=checkpoint_id, raise_error=False,
                                     durability="exit")
        if isinstance(out, dict) and "__error__" in out:
            error = out["__error__"]
            if "SnapshotUnavailable" not in str(error):
                raise AssertionError(f"{label}: the run failed: {error}")
            reason = reason or str(error)
        else:
            seen = parse_listing(listing_of(out["messages"]))
        judge(tally, label, expected, seen, reason)
    return tally
