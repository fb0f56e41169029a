"""The Deep Agents agent of the checkpoint-history tests, in-process and under `langgraph dev`.

Its scripted model makes the tool calls a user message spells out, one per
model turn, so a test knows what every checkpoint's files must be:

- a plan (`plan_message(tag, ops)`): `ops` are `write`/`edit` (the file
  tools), `sh` (one `execute` whose command is built from file effects:
  put, append, rm, mkdir, rmtree, and `sleep`, which has none), `task` (a
  subagent that carries out a plan of its own), `ask` (a tool that waits at
  an `interrupt()`; resume with `Command(resume=...)`) and `par` (several of
  these in one model turn: tool calls run in parallel, as one step). Tool
  call ids are `<tag>-<i>` (`<tag>-<i>.<j>` in a `par`).
- `VERIFY`: one `execute` that lists every file under /work with its
  checksum (`history_check.LIST_COMMAND`), then "listed".

Every file lives under /work. `apply(files, op)` is the model of what an op
does to the files; `history_check` compares it with what a run from a
checkpoint lists.

As the server's graph module (`langgraph.json` names `agent` and
`checkpointer`): VFSD_RUNS is the root of the threads' run dirs, VFSD_POSTGRES
a PostgreSQL connection string (AsyncPostgresSaver; else InMemorySaver), and
VFSD_REMOTE a bucket the server is one replica of (`replica_options`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import interrupt

VERIFY = "verify"
#: lists directories (`work/d/`) and files (`work/a.txt <16 hex of sha256>`), sorted
LIST_COMMAND = (
    "cd / && { find work -mindepth 1 -type d -printf '%p/\\n'; "
    "find work -type f -exec sha256sum {} + | "
    "sed -E 's/^([0-9a-f]{16})[0-9a-f]* +(.*)$/\\2 \\1/'; } 2>/dev/null | LC_ALL=C sort"
)
#: mount options: nothing is evicted while a test runs
MOUNT_OPTIONS = {"max_age_steps": 100_000}


# -- plans ------------------------------------------------------------------------------


def plan_message(tag: str, ops: list[Any]) -> str:
    """The user message that makes the model carry out `ops` (call ids `<tag>-<i>`)."""
    return json.dumps({"plan": tag, "calls": [tool_call_of(op) for op in ops]})


def tool_call_of(op: Any) -> list[Any]:
    """[tool name, args] of one op (["par", [[name, args], ...]] for a `par`)."""
    kind = op[0]
    if kind == "par":
        return ["par", [tool_call_of(sub) for sub in op[1]]]
    if kind == "write":
        return ["write_file", {"file_path": "/" + op[1], "content": op[2]}]
    if kind == "edit":
        return ["edit_file", {"file_path": "/" + op[1], "old_string": op[2], "new_string": op[3]}]
    if kind == "sh":
        return ["execute", {"command": command_of(op[1])}]
    if kind == "task":
        return ["task", {"description": plan_message(op[1], op[2]),
                         "subagent_type": "general-purpose"}]
    if kind == "ask":
        return ["ask", {"question": op[1]}]
    raise ValueError(f"unknown op {op!r}")


def command_of(effects: list[tuple[str, ...]]) -> str:
    """A shell command that has `effects` on /work."""
    parts = []
    for effect in effects:
        kind = effect[0]
        if kind == "sleep":  # ("sleep", seconds): a step that takes a while
            parts.append(f"sleep {float(effect[1]):g}")
            continue
        path = "/" + effect[1]
        if kind == "put":
            parts.append(f"printf %s {shlex.quote(effect[2])} > {path}")
        elif kind == "append":
            parts.append(f"printf %s {shlex.quote(effect[2])} >> {path}")
        elif kind == "rm":
            parts.append(f"rm {path}")
        elif kind == "mkdir":
            parts.append(f"mkdir -p {path}")
        elif kind == "rmtree":
            parts.append(f"rm -r {path}")
        else:
            raise ValueError(f"unknown effect {effect!r}")
    return " && ".join(parts)


def effects_of(tag: str, ops: list[Any]) -> dict[str, Any]:
    """{tool call id: op} for a plan (what `apply` needs to replay it)."""
    out = {}
    for i, op in enumerate(ops):
        if op[0] == "par":
            out.update({f"{tag}-{i}.{j}": sub for j, sub in enumerate(op[1])})
        else:
            out[f"{tag}-{i}"] = op
    return out


def apply(files: dict[str, str], op: Any) -> None:
    """What `op` does to `files` ({"work/a.txt": text, "work/d/": "dir"})."""
    kind = op[0]
    if kind == "write":
        _parents(files, op[1])
        files[op[1]] = op[2]
    elif kind == "edit":
        files[op[1]] = files[op[1]].replace(op[2], op[3], 1)
    elif kind == "sh":
        for effect in op[1]:
            _effect(files, effect)
    elif kind == "task":
        for sub in op[2]:
            apply(files, sub)
    elif kind == "par":
        for sub in op[1]:
            apply(files, sub)
    elif kind != "ask":
        raise ValueError(f"unknown op {op!r}")


def _effect(files: dict[str, str], effect: tuple[str, ...]) -> None:
    kind, path = effect[0], effect[1]
    if kind == "sleep":
        return
    if kind == "put":
        files[path] = effect[2]
    elif kind == "append":
        files[path] = files.get(path, "") + effect[2]
    elif kind == "rm":
        del files[path]
    elif kind == "mkdir":
        _parents(files, path + "/x")
    elif kind == "rmtree":
        for key in [k for k in files if k == path + "/" or k.startswith(path + "/")]:
            del files[key]


def _parents(files: dict[str, str], path: str) -> None:
    parts = path.split("/")[:-1]
    for i in range(2, len(parts) + 1):  # work/ itself is not listed
        files["/".join(parts[:i]) + "/"] = "dir"


# -- the model ----------------------------------------------------------------------------


def scripted_turn(messages: list) -> AIMessage:
    """The next tool call of the plan in the last user message, or the last word."""
    last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    text = str(messages[last_human].content)
    done = sum(1 for m in messages[last_human:] if isinstance(m, ToolMessage))
    if text == VERIFY:
        if done:
            return AIMessage("listed")
        return AIMessage("", tool_calls=[{"name": "execute", "args": {"command": LIST_COMMAND},
                                          "id": f"verify-{len(messages)}"}])
    plan = json.loads(text)
    calls = plan["calls"]
    # The model's turns so far (a `par` turn has several tool results).
    turns = sum(1 for m in messages[last_human:] if isinstance(m, AIMessage) and m.tool_calls)
    if turns < len(calls):
        name, args = calls[turns]
        tag = f"{plan['plan']}-{turns}"
        if name == "par":
            return AIMessage("", tool_calls=[{"name": sub_name, "args": sub_args,
                                              "id": f"{tag}.{j}"}
                                             for j, (sub_name, sub_args) in enumerate(args)])
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": tag}])
    return AIMessage(f"{plan['plan']}: done")


@tool
def ask(question: str) -> str:
    """Ask the user `question` and wait for the answer."""
    return str(interrupt(question))


def make_agent(runs: Any, **kwargs: Any) -> Any:
    """The agent on `runs` (keyword arguments go to create_vfsd_deep_agent)."""
    from mount_tool.deepagents import create_vfsd_deep_agent
    from mount_tool.demo import conversation_model

    return create_vfsd_deep_agent(runs, conversation_model(scripted_turn), tools=[ask], **kwargs)


# -- as the server's graph module ------------------------------------------------------------


def replica_options() -> dict[str, Any]:
    """A Runs' options for one replica of VFSD_REMOTE (s3://BUCKET/PREFIX),
    with the lease's TTL and a run's wait for it from VFSD_LEASE_TTL and
    VFSD_LEASE_WAIT (seconds); {} without VFSD_REMOTE."""
    if not os.environ.get("VFSD_REMOTE"):
        return {}
    options: dict[str, Any] = {"remote": os.environ["VFSD_REMOTE"]}
    if os.environ.get("VFSD_LEASE_TTL"):
        options["remote_lease_ttl"] = float(os.environ["VFSD_LEASE_TTL"])
    if os.environ.get("VFSD_LEASE_WAIT"):
        options["remote_lease_wait"] = float(os.environ["VFSD_LEASE_WAIT"])
    return options


if os.environ.get("VFSD_RUNS"):
    import mount_tool
    from mount_tool.langgraph import VfsdCheckpointer

    runs = mount_tool.runs(Path(os.environ["VFSD_RUNS"]), max_mounted=64, **MOUNT_OPTIONS,
                           **replica_options())
    agent = make_agent(runs)

    @contextlib.asynccontextmanager
    async def checkpointer():
        """The checkpointer the server uses for every thread."""
        async with runs:
            dsn = os.environ.get("VFSD_POSTGRES")
            if not dsn:
                from langgraph.checkpoint.memory import InMemorySaver

                yield VfsdCheckpointer(InMemorySaver(), runs)
                return
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
                await saver.setup()
                yield VfsdCheckpointer(saver, runs)
