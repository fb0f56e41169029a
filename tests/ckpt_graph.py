"""The graph the checkpointer tests run (also imported by a second Python process).

Four `work` iterations, each followed by `make_step_node` (eviction by steps):

    i=0  writes a.txt "v1" and c.txt (marked done: evicted at superstep 6)
    i=1  writes a.txt "v2"
    i=2  writes a.txt "v3"
    i=3  writes b.txt "late"

Every `work` first looks at the mount through a shell (`cat a.txt; ls`) and
appends what it saw to `seen`, so a test can tell what the first node of a
replay found. A `variant` in state changes what is written (forks), and
`pause_at` makes the node wait at an `interrupt()` before writing.

Supersteps: 0 input, 1 work i=0, 2 step, 3 work i=1, 4 step, 5 work i=2,
6 step (c.txt evicted), 7 work i=3, 8 step. The checkpoint "after v2" is the
one of superstep 4: a.txt is v2, c.txt is there, b.txt is not.
"""

from __future__ import annotations

import operator
import subprocess
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from mount_tool import Mount, Runs
from mount_tool.langgraph import FilesChannel, make_step_node, write_artifact

#: mount options the graph's eviction timing assumes
MOUNT_OPTIONS = {"done_retention_steps": 5, "max_age_steps": 1000}
AFTER_V2 = 4  # metadata step of the checkpoint after v2 (next: work i=2)
AFTER_V3 = 6  # after v3 and c.txt's eviction (next: work i=3)


class State(TypedDict, total=False):
    files: FilesChannel
    i: int
    variant: str
    pause_at: int
    seen: Annotated[list[str], operator.add]


def observe(mount: Mount) -> str:
    """What a shell in the mount sees: `a=<a.txt>;ls=<names>`."""
    out = subprocess.run(
        ["sh", "-c", "cat a.txt 2>/dev/null; echo '|'; ls"],
        cwd=mount.root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    content, _, listing = out.partition("|\n")
    return f"a={content.strip()};ls={','.join(sorted(listing.split()))}"


def build(mount: Mount | Runs) -> StateGraph:
    """The graph builder (compile it with a checkpointer). With a Runs, each
    thread works on its own run dir."""

    def work(state: State) -> dict[str, Any]:
        i = state.get("i", 0)
        seen = observe(mount.current() if isinstance(mount, Runs) else mount)
        if state.get("pause_at") == i:
            interrupt(f"about to run iteration {i}")
        variant = state.get("variant", "")
        files: dict[str, Any] = {}
        if i == 0:
            files.update(write_artifact(mount, "a.txt", "v1")["files"])
            files.update(write_artifact(mount, "c.txt", "evict me", status="done")["files"])
        elif i in (1, 2):
            files.update(write_artifact(mount, "a.txt", f"v{i + 1}{variant}")["files"])
        elif i == 3:
            files.update(write_artifact(mount, "b.txt", f"late{variant}")["files"])
        return {"files": files, "i": i + 1, "seen": [f"{i}:{seen}"]}

    builder = StateGraph(State)
    builder.add_node("work", work)
    builder.add_node("step", make_step_node(mount))
    builder.add_edge(START, "work")
    builder.add_edge("work", "step")
    builder.add_conditional_edges("step", lambda s: END if s["i"] >= 4 else "work")
    return builder


def at_step(app: Any, config: dict, step: int, **values: Any) -> Any:
    """The checkpoint of the thread with metadata step `step` (and these values)."""
    found = [
        s
        for s in app.get_state_history(config)
        if s.metadata.get("step") == step
        and all(s.values.get(k) == v for k, v in values.items())
    ]
    assert found, f"no checkpoint at step {step} with {values}"
    return found[0]


async def aat_step(app: Any, config: dict, step: int, **values: Any) -> Any:
    """`at_step` through the async API."""
    async for s in app.aget_state_history(config):
        if s.metadata.get("step") == step and all(
            s.values.get(k) == v for k, v in values.items()
        ):
            return s
    raise AssertionError(f"no checkpoint at step {step} with {values}")
