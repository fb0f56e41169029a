"""`make demo`: a scripted Deep Agents run on a vfsd mount, told step by step.

A deep agent (`create_deep_agent` with `VfsdBackend`, driven by a scripted chat
model: no LLM, no network) triages a flaky CI build over 35 model turns, one
vfsd step each. It fetches a CI log too large for its context (offloaded to
`large_tool_results/`), greps it from the shell, writes scripts into the mount
and runs them, saves tool outputs with `write_file` and through `execute`,
marks used files `done` and pins what it keeps; the daemon evicts as the steps
advance. The demo prints what the agent did, what the shell saw and what
eviction removed, then the size of the graph state against the same turns on
deepagents' default `StateBackend` (files in state), and leaves the run dir
mounted for exploring.

    .venv/bin/python -m mount_tool.demo        # run dir: ./demo-run, or $VFSD_DEMO_DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepagents import create_deep_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from .deepagents import VfsdBackend, VfsdMiddleware
from .deepagents.offload import OffloadMiddleware
from .errors import MountError, MountToolError
from .langgraph.checkpointer import VfsdCheckpointer
from .langgraph.checkpoints import CountingSerializer
from .mount import Mount, is_mounted, mount

DEMO_DIR_ENV = "VFSD_DEMO_DIR"
DEFAULT_RUN_DIR = "demo-run"
# Small retention so eviction shows within the run.
DONE_RETENTION_STEPS = 2
MAX_AGE_STEPS = 10
BUILD = 4182
CI_LOG = f"large_tool_results/call_fetch_{BUILD}.log"
SHELL_LINES = 5  # lines of command output shown per step


class DemoError(Exception):
    """The demo could not run, or the run did not go as the story says."""


# -- the scripted model -------------------------------------------------------------


class ScriptedChatModel(GenericFakeChatModel):
    """Replays a fixed list of AIMessages; accepts any tools (bind_tools is a no-op)."""

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self


class ConversationChatModel(BaseChatModel):
    """A stand-in chat model whose reply is `reply(messages)`: it depends on the
    conversation only, so one instance serves any number of threads at once
    (a LangGraph server's graph has one model for every thread)."""

    reply: Callable[[list[BaseMessage]], AIMessage]

    @property
    def _llm_type(self) -> str:
        return "vfsd-conversation-script"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.reply(list(messages)))])

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return self._generate(messages)  # no I/O: no need for a worker thread

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self


def conversation_model(reply: Callable[[list[BaseMessage]], AIMessage]) -> ConversationChatModel:
    """A model answering each conversation with `reply(messages)` (see
    ConversationChatModel); the huge context window keeps deepagents'
    summarization from calling it."""
    return ConversationChatModel(reply=reply, profile={"max_input_tokens": 10**9})


def scripted_model(messages: Iterable[AIMessage]) -> ScriptedChatModel:
    """A model replaying `messages`. The huge context window keeps deepagents'
    summarization from ever calling it."""
    return ScriptedChatModel(messages=iter(list(messages)), profile={"max_input_tokens": 10**9})


# -- what the tools and the agent produce (deterministic) -------------------------------

TESTS = [
    f"tests/{area}/test_{area}_{i:02d}.py::test_case_{j}"
    for area in ("api", "cache", "auth", "ui")
    for i in range(20)
    for j in range(6)
]
FLAKY = {
    "tests/api/test_upload.py::test_upload_retry": (
        "TimeoutError: upload did not finish in 30s",
        0.5,
    ),
    "tests/cache/test_lru.py::test_cache_eviction": (
        "AssertionError: expected 128 entries, got 127",
        0.2,
    ),
}


def ci_log(build: int) -> str:
    """A CI log of 4 shards running the suite 3 times (~140 KB, ~35k tokens)."""
    rng = random.Random(build)
    lines = []
    for attempt in range(1, 4):
        for shard in range(1, 5):
            stamp = f"2025-06-03T14:{10 + attempt * 10 + shard:02d}"
            lines.append(f"{stamp}:00.000Z INFO  [shard {shard}] attempt {attempt}: collecting")
            for k, test in enumerate([*TESTS[shard - 1 :: 4], *FLAKY]):
                at = f"{stamp}:{k % 60:02d}.{rng.randrange(1000):03d}Z"
                error, rate = FLAKY.get(test, ("", 0.0))
                if rng.random() < rate:
                    lines.append(
                        f"{at} ERROR [shard {shard}] {test} FAILED (30.0{k % 10}s) {error}"
                    )
                else:
                    lines.append(
                        f"{at} INFO  [shard {shard}] {test} PASSED ({rng.random() * 2:.2f}s)"
                    )
    return "\n".join(lines) + "\n"


@tool
def fetch_ci_log(build: int) -> str:
    """Fetch the full log of a CI build."""
    return ci_log(build)


def history_json(test: str, failure_rate: float) -> str:
    """Recent runs of one test as JSON, one run per line (~150 KB)."""
    rng = random.Random(test)
    runs = []
    for build in range(BUILD - 1400, BUILD):
        failed = rng.random() < failure_rate
        runs.append(
            json.dumps(
                {
                    "build": build,
                    "shard": rng.randrange(1, 5),
                    "runner": f"ci-{rng.randrange(40):02d}",
                    "duration_s": 30.0 if failed else round(rng.uniform(0.5, 4), 2),
                    "outcome": "failed" if failed else "passed",
                }
            )
        )
    # One run per line, so `grep` and `sed -n` on the file show whole runs.
    body = ",\n".join(runs)
    return f'{{"test": {json.dumps(test)}, "runs": [\n{body}\n]}}\n'


FAILURES_PY = """\
#!/usr/bin/env python3
# Failures per test in a CI log: printed, and saved as tool_outputs/failures.csv.
import collections, os, re, sys
failed = collections.Counter()
for line in open(sys.argv[1]):
    m = re.search(r"(\\S+::\\S+) FAILED \\([^)]*\\) (\\w+)", line)
    if m:
        failed[m.groups()] += 1
rows = ["test,error,failures"] + [f"{t},{e},{n}" for (t, e), n in failed.most_common()]
os.makedirs("tool_outputs", exist_ok=True)
with open("tool_outputs/failures.csv", "w") as out:
    out.write("\\n".join(rows) + "\\n")
print("\\n".join(rows))
"""

FLAKY_RATE_PY = """\
# Failure rate of each test over its recorded runs.
import json, sys
for path in sys.argv[1:]:
    history = json.load(open(path))
    runs = history["runs"]
    failed = sum(r["outcome"] == "failed" for r in runs)
    print(f"{history['test']}: {failed}/{len(runs)} runs failed ({100 * failed / len(runs):.1f}%)")
"""

REPRO_SH = """\
#!/usr/bin/env bash
# Replay test_upload_retry's 400 chunk uploads with a per-chunk latency of
# RUN x 25 ms against a timeout (default 30 s); keep the log, print the result.
set -eu
run=$1; timeout=${2:-30}; latency=$((run * 25))
mkdir -p tool_outputs/repro
log=tool_outputs/repro/run_$run.log
awk -v run="$run" -v lat="$latency" -v limit="$timeout" 'BEGIN {
  for (i = 1; i <= 400; i++) printf "run %d chunk %03d sent after %d ms\\n", run, i, lat + i % 7
  total = 400 * lat / 1000
  printf "RESULT run %d: latency %d ms, upload %.1f s, timeout %d s: %s\\n", run, lat, total, limit, (total >= limit ? "TIMEOUT" : "ok")
}' > "$log"
tail -n 1 "$log" | tee -a tool_outputs/repro/summary.txt
"""

PLAN_MD = """\
# Plan: why is build 4182 flaky?
- [ ] fetch the CI log and find the failures
- [ ] compare with each failing test's history
- [ ] reproduce the upload timeout
- [ ] write the report
"""

REPORT_MD = """\
# Build 4182: flaky tests

- test_upload_retry fails with TimeoutError in about half the attempts:
  400 chunk uploads at >= 75 ms each exceed the 30 s timeout (repro runs 3-8).
- test_cache_eviction fails rarely with an off-by-one in the LRU size.
- Fix: upload timeout 30 s -> 90 s with backoff (patches/upload_timeout.diff).
- Verification: pending
"""

PATCH_DIFF = """\
--- a/app/upload.py
+++ b/app/upload.py
@@ -12,3 +12,3 @@
-UPLOAD_TIMEOUT_S = 30
+UPLOAD_TIMEOUT_S = 90  # 400 chunks at up to 200 ms each
"""

MARK_DONE = "setfattr -n user.vfsd.status -v done"
PIN = "setfattr -n user.vfsd.pin -v 1"


def agent_script() -> list[AIMessage]:
    """The agent's 35 turns: 34 tool calls (one per turn), then its final answer."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("write_file", {"file_path": "/notes/plan.md", "content": PLAN_MD}),
        ("execute", {"command": f"{PIN} notes/plan.md && cat .vfsd/attr/notes/plan.md"}),
        ("fetch_ci_log", {"build": BUILD}),
        ("execute", {"command": f"grep -n ERROR {CI_LOG} | head -n 3"}),
        ("write_file", {"file_path": "/scripts/failures.py", "content": FAILURES_PY}),
        ("execute", {"command": f"chmod +x scripts/failures.py && ./scripts/failures.py {CI_LOG}"}),
        ("read_file", {"file_path": "/tool_outputs/failures.csv"}),
    ]
    for test, rate in (
        ("test_upload_retry", 0.12),
        ("test_cache_eviction", 0.04),
        ("test_login_redirect", 0.003),
    ):
        calls.append(
            (
                "write_file",
                {
                    "file_path": f"/tool_outputs/history/{test}.json",
                    "content": history_json(test, rate),
                },
            )
        )
    calls += [
        ("write_file", {"file_path": "/scripts/flaky_rate.py", "content": FLAKY_RATE_PY}),
        (
            "execute",
            {"command": "cd tool_outputs && python3 ../scripts/flaky_rate.py history/*.json"},
        ),
        ("execute", {"command": f"cd tool_outputs && {MARK_DONE} failures.csv history/*.json"}),
        ("write_file", {"file_path": "/scripts/repro.sh", "content": REPRO_SH}),
        ("execute", {"command": f"chmod +x scripts/repro.sh && {PIN} scripts/repro.sh"}),
        ("execute", {"command": "./scripts/repro.sh 1"}),
    ]
    for run in range(2, 9):
        calls.append(
            (
                "execute",
                {
                    "command": f"{MARK_DONE} tool_outputs/repro/run_{run - 1}.log && ./scripts/repro.sh {run}"
                },
            )
        )
    calls += [
        ("execute", {"command": "ls tool_outputs/repro && wc -l < tool_outputs/repro/summary.txt"}),
        (
            "edit_file",
            {
                "file_path": "/notes/plan.md",
                "old_string": "- [ ] reproduce",
                "new_string": "- [x] reproduce",
            },
        ),
        ("write_file", {"file_path": "/report.md", "content": REPORT_MD}),
        ("write_file", {"file_path": "/patches/upload_timeout.diff", "content": PATCH_DIFF}),
        ("execute", {"command": f"{PIN} report.md patches/upload_timeout.diff && ls"}),
        ("execute", {"command": "./scripts/repro.sh 6 90"}),
        ("execute", {"command": "./scripts/repro.sh 8 90"}),
        ("grep", {"pattern": "TIMEOUT", "path": "/tool_outputs/repro"}),
        (
            "edit_file",
            {
                "file_path": "/report.md",
                "old_string": "Verification: pending",
                "new_string": "Verification: runs 6 and 8 pass at 90 s",
            },
        ),
        ("glob", {"pattern": "**/*.md"}),
        ("execute", {"command": "find . -type f | sort"}),
    ]
    turns = [
        AIMessage(
            content="",
            tool_calls=[{"name": name, "args": args, "id": f"call_{i:02d}", "type": "tool_call"}],
        )
        for i, (name, args) in enumerate(calls, start=1)
    ]
    # The offloaded file is named after the tool call id.
    fetch = next(t for t in turns if t.tool_calls[0]["name"] == "fetch_ci_log")
    fetch.tool_calls[0]["id"] = f"call_fetch_{BUILD}"
    final = AIMessage(content="Done: see /report.md (upload timeout 30 s -> 90 s).")
    return [*turns, final]


# -- measuring the graph state ----------------------------------------------------------




@dataclass
class StateSize:
    """What one run left in its checkpointer."""

    state_bytes: int  # the final state, serialized as the checkpointer does
    files_bytes: int  # its `files` channel alone
    files: int  # entries in `files`
    written_bytes: int  # everything the checkpointer serialized over the run


def measure(agent: Any, saver: InMemorySaver, config: dict) -> StateSize:
    """Sizes of the thread's final state, with the saver's own serializer."""
    written = saver.serde.bytes  # before measuring adds to the count
    values = agent.get_state(config).values
    files = values.get("files") or {}
    return StateSize(
        state_bytes=len(saver.serde.dumps_typed(values)[1]),
        files_bytes=len(saver.serde.dumps_typed(files)[1]),
        files=len(files),
        written_bytes=written,
    )


def human(n: float) -> str:
    """A byte count for people: 30.3 KB, 1.2 MB."""
    for unit, size in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


# -- the story -----------------------------------------------------------------------------


class Story:
    """Prints the run as it streams: one block per step (evictions, action, result)."""

    def __init__(self, m: Mount, out: Callable[[str], None] = print) -> None:
        self.mount = m
        self.out = out
        self.seen_evictions: set[tuple[int, int]] = set()
        self.evicted: list[dict[str, Any]] = []
        self.failed_commands: list[str] = []
        self.shell_output: dict[str, str] = {}  # tool call id -> execute output
        self.step = 0
        self.printed_step: int | None = None

    def line(self, tag: str, text: str) -> None:
        """One story line; the first line of each step carries the step number."""
        head = " " * 7
        if self.step != self.printed_step:
            head, self.printed_step = f"step {self.step:>2}", self.step
        self.out(f"{head}  {tag:<6} {text}")

    def on_update(self, node: str, update: Any) -> None:
        if not isinstance(update, dict):
            return
        files = update.get("files") or {}
        for msg in update.get("messages") or []:
            if node == "model" and isinstance(msg, AIMessage):
                self.on_turn(msg, files)
            elif isinstance(msg, ToolMessage):
                self.on_result(msg, files)

    def on_turn(self, msg: AIMessage, files: dict[str, Any]) -> None:
        """A model turn: the step began (eviction ran), then the model answered."""
        self.step = self.mount.get_step()
        self.report_evictions({key for key, ref in files.items() if ref is None})
        if not msg.tool_calls:
            self.line("agent", f"answers: {msg.content}")
        for call in msg.tool_calls:
            self.line("agent", describe_call(call["name"], call["args"]))

    def report_evictions(self, dropped: set[str]) -> None:
        for rec in self.mount.evicted(limit=200):
            key = (rec["ino"], rec.get("evicted_step", self.step))
            if key in self.seen_evictions or rec["path"].startswith(".tool_args"):
                continue
            self.seen_evictions.add(key)
            self.evicted.append(rec)
            reason = rec["reason"].replace("_", " ")  # done, max age, quota
            text = f"{rec['path']} ({reason}, {human(rec['size'])}, from step {rec['step']})"
            if "/" + rec["path"] in dropped:
                text += "; ref dropped from state"
            self.line("evict", text)

    def on_result(self, msg: ToolMessage, files: dict[str, Any]) -> None:
        text = msg.content if isinstance(msg.content, str) else str(msg.content)
        if msg.name == "execute":
            self.shell_output[msg.tool_call_id] = text
            lines = [ln for ln in text.splitlines() if ln and not ln.startswith("[Command ")]
            for ln in lines[:SHELL_LINES]:
                self.line("shell", ln if len(ln) <= 100 else ln[:99] + "…")
            if len(lines) > SHELL_LINES:
                more = len(lines) - SHELL_LINES
                self.line("shell", f"... ({more} more line{'s' if more > 1 else ''})")
            exit_code = (msg.artifact or {}).get("exit_code", 0)
            if exit_code:
                self.failed_commands.append(f"{msg.tool_call_id}: exit {exit_code}: {text[:300]}")
        elif text.startswith("Tool output too large"):
            saved = re.search(
                r"\(([\d,]+) characters.*?~([\d,]+) tokens.*?Saved in full to (\S+)", text, re.S
            )
            if saved:
                chars, tokens, path = saved.groups()
                self.line(
                    "tool", f"{chars} chars (~{tokens} tokens, over 20k): offloaded to {path}"
                )
                self.line("tool", f"the model sees a {human(len(text))} preview instead")
        elif msg.name in ("write_file", "edit_file") and files:
            for key, ref in files.items():
                if ref is not None:
                    self.line(
                        "mount",
                        f"{key}: {ref['size']:,} bytes in the mount, "
                        f"a {len(json.dumps(ref))}-byte ref in state",
                    )
        else:
            # The first line that says something (read_file starts with a "@@ lines" header).
            lines = [ln for ln in text.strip().splitlines() if not ln.startswith("@@")]
            first = lines[0].strip() if lines else ""
            self.line("tool", first if len(first) <= 100 else first[:99] + "…")


def describe_call(name: str, args: dict[str, Any]) -> str:
    """One short line for a tool call."""
    if name == "execute":
        return f"execute $ {args['command']}"
    if name == "write_file":
        content = args["content"]
        marker = re.search(r"\(([\d,]+) characters\) kept in the mount", content)
        size = f"{marker.group(1)} chars" if marker else f"{len(content):,} chars"
        where = ", body kept out of the message" if marker else ""
        return f"write_file {args['file_path']} ({size}{where})"
    if name == "edit_file":
        return f"edit_file {args['file_path']}: {args['old_string']!r} -> {args['new_string']!r}"
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


# -- the two runs -------------------------------------------------------------------------


def run_vfsd_agent(m: Mount, story: Story) -> StateSize:
    """The story's run: the deep agent on the mount, streamed and printed."""
    saver = InMemorySaver(serde=CountingSerializer())
    agent = create_deep_agent(
        scripted_model(agent_script()),
        tools=[fetch_ci_log],
        backend=VfsdBackend(m),
        middleware=[VfsdMiddleware(m), OffloadMiddleware(m)],
        # As the docs recommend: every checkpoint names the snapshot of its files.
        checkpointer=VfsdCheckpointer(saver, m),
    )
    config = {"configurable": {"thread_id": "demo"}, "recursion_limit": 500}
    task = HumanMessage(f"Find out why CI build {BUILD} is flaky and write a report.")
    for chunk in agent.stream({"messages": [task]}, config, stream_mode="updates"):
        for node, update in chunk.items():
            story.on_update(node, update)
    return measure(agent, saver, config)


def run_in_state_baseline() -> StateSize:
    """The same turns on deepagents' default StateBackend: files live in graph state.

    It has no shell, so its `execute` calls return an error and write nothing:
    the comparison favours the baseline.
    """
    saver = InMemorySaver(serde=CountingSerializer())
    agent = create_deep_agent(
        scripted_model(agent_script()), tools=[fetch_ci_log], checkpointer=saver
    )
    config = {"configurable": {"thread_id": "baseline"}, "recursion_limit": 500}
    agent.invoke({"messages": [HumanMessage("go")]}, config)
    return measure(agent, saver, config)


# -- the run directory ------------------------------------------------------------------------


def prepare_run_dir(run_dir: Path) -> None:
    """Unmount and remove a previous demo run at `run_dir` (refusing anything else)."""
    if is_mounted(run_dir / "fs"):
        try:
            Mount(run_dir).unmount()
        except MountError as exc:
            raise DemoError(
                f"cannot unmount the previous demo run at {run_dir / 'fs'}: {exc}\n"
                f"A process may still use it (`fuser -vm {run_dir / 'fs'}`); "
                "close it and run the demo again."
            ) from exc
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise DemoError(f"{run_dir} is not a directory; set {DEMO_DIR_ENV} to another path")
    leftovers = {p.name for p in run_dir.iterdir()} - {"fs", ".vfsd"}
    if leftovers:
        raise DemoError(
            f"{run_dir} exists and is not a demo run dir (it holds {sorted(leftovers)[:5]}); "
            f"remove it or set {DEMO_DIR_ENV} to another path"
        )
    shutil.rmtree(run_dir)


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when under it (shorter to type)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def check_story(story: Story, m: Mount, vfsd: StateSize, baseline: StateSize) -> None:
    """Raise DemoError if the run did not show what the demo is about."""
    problems = list(story.failed_commands)
    if not any(" ERROR " in out for out in story.shell_output.values()):
        problems.append("the shell grep found no ERROR line in the offloaded log")
    if not any(r["path"] == CI_LOG for r in story.evicted):
        problems.append(f"{CI_LOG} was not evicted")
    if not any(r["reason"] == "done" for r in story.evicted):
        problems.append("no `done` file was evicted")
    if m.get_step() < 30:
        problems.append(f"the run ended at step {m.get_step()}, before step 30")
    if not (m.root / "report.md").is_file():
        problems.append("report.md is missing")
    if vfsd.state_bytes >= baseline.state_bytes:
        problems.append("the vfsd state is not smaller than the in-state baseline")
    if problems:
        raise DemoError("the run went wrong:\n  " + "\n  ".join(problems))


def run_demo(run_dir: Path) -> None:
    """Mount `run_dir`, play the agent, print the story and the state sizes."""
    prepare_run_dir(run_dir)
    vfsd_cli = Path(sys.executable).with_name("vfsd")
    umount_cmd = (
        f"{shown_path(vfsd_cli) if vfsd_cli.exists() else 'vfsd'} umount {shown_path(run_dir)}"
    )
    m = mount(run_dir, done_retention_steps=DONE_RETENTION_STEPS, max_age_steps=MAX_AGE_STEPS)
    print(
        f"Mounted {shown_path(m.root)} (done files leave after {DONE_RETENTION_STEPS} steps, "
        f"any unpinned file after {MAX_AGE_STEPS})."
    )
    print("A scripted deep agent (no LLM) triages a flaky CI build; each model turn is one step.\n")
    try:
        story = Story(m)
        vfsd = run_vfsd_agent(m, story)
        baseline = run_in_state_baseline()
        check_story(story, m, vfsd, baseline)
    except BaseException:
        with contextlib.suppress(MountToolError):
            m.unmount()
        raise
    stats = m.stats()
    print(
        f"\nAfter {m.get_step()} steps: {stats['files']} files live in the mount "
        f"({human(stats['logical_bytes'])}), {len(story.evicted)} evicted."
    )
    print("Graph state at the end, serialized by the checkpointer (InMemorySaver's serde):")
    rows = (
        ("vfsd: refs in state", vfsd, "refs"),
        ("deepagents StateBackend: files in state", baseline, "files"),
    )
    for label, size, what in rows:
        print(
            f"  {label:<40} {human(size.state_bytes):>9}   ({size.files} {what}: "
            f"{human(size.files_bytes)}; {human(size.written_bytes)} serialized over the run)"
        )
    print(
        f"  -> {baseline.state_bytes / vfsd.state_bytes:.0f}x smaller state, "
        f"{baseline.written_bytes / vfsd.written_bytes:.0f}x fewer checkpoint bytes "
        "(the baseline has no shell: its execute calls wrote nothing)"
    )
    m.detach()
    print(f"\nThe run dir stays mounted at {shown_path(m.root)}; explore it:")
    print(f"  cd {shown_path(m.root)} && cat report.md tool_outputs/repro/summary.txt")
    print("  cat .vfsd/attr/report.md .vfsd/status.json .vfsd/evicted.ndjson")
    print(f"Unmount it with: {umount_cmd}")


def main() -> int:
    """Run the demo; 0 on success, 1 with a message on stderr if anything failed."""
    run_dir = Path(os.environ.get(DEMO_DIR_ENV) or DEFAULT_RUN_DIR).absolute()
    try:
        run_demo(run_dir)
    except KeyboardInterrupt:
        print("demo interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure ends in one clear message
        if not isinstance(exc, (DemoError, MountToolError)):
            traceback.print_exc()  # unexpected: show where
        print(f"demo failed: {exc}", file=sys.stderr)
        log = run_dir / ".vfsd" / "vfsd.log"
        if log.exists():
            print(f"(the daemon's log: {log})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
