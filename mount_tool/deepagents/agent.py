"""create_vfsd_deep_agent: `create_deep_agent` wired to a vfsd mount.

A `VfsdBackend` and a `VfsdMiddleware` on the same Mount or Runs, for the
agent and its subagents, the offloading of large tool results, the path
convention in the system prompts, and the checkpointer wrapped in a
`VfsdCheckpointer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langgraph.checkpoint.base import BaseCheckpointSaver

from ..langgraph.checkpointer import VfsdCheckpointer
from ..langgraph.runhooks import run_hooks
from ..mount import Mount
from ..runs import Runs
from .backend import VfsdBackend
from .middleware import DEFAULT_COMPACT_THRESHOLD_CHARS, VfsdMiddleware
from .offload import OffloadMiddleware

# Tools whose results OffloadMiddleware leaves alone in create_vfsd_deep_agent:
# the ones deepagents never offloads either (their output is bounded or is a
# window of a file already in the mount), and `execute`, which offloads its own
# output with the paths the sandbox sees.
NOT_OFFLOADED_TOOLS = frozenset(
    {"ls", "glob", "grep", "read_file", "edit_file", "write_file", "delete", "execute"}
)


def prompt_note_for(backend: Any) -> str:
    """The path-convention note for `backend`: a VfsdBackend, or a deepagents
    `CompositeBackend` whose default is one (its routed prefixes, "/memories/",
    are named as paths the shell does not see)."""
    from deepagents.backends.composite import CompositeBackend

    if isinstance(backend, VfsdBackend):
        return backend.prompt_note()
    if isinstance(backend, CompositeBackend) and isinstance(backend.default, VfsdBackend):
        return backend.default.prompt_note(routed=backend.routes)
    raise TypeError(
        "backend must be a VfsdBackend or a CompositeBackend whose default is a VfsdBackend, "
        f"not {type(backend).__name__}"
    )


def _vfsd_backend_of(backend: Any) -> VfsdBackend:
    prompt_note_for(backend)  # the same TypeError for anything else
    return backend if isinstance(backend, VfsdBackend) else backend.default


def create_vfsd_deep_agent(
    files: Mount | Runs,
    model: Any,
    *,
    middleware: Iterable[Any] = (),
    compact_threshold_chars: int = DEFAULT_COMPACT_THRESHOLD_CHARS,
    backend_options: Mapping[str, Any] | None = None,
    backend: Any = None,
    subagents: Iterable[Any] | None = None,
    offload_tool_outputs: bool = True,
    **kwargs: Any,
) -> Any:
    """`create_deep_agent` with a `VfsdBackend` and a `VfsdMiddleware` on `files`
    (a `Runs`: every thread its own run dir; or one `Mount`).

    Subagents run the same middleware: the general-purpose subagent (which
    deepagents would otherwise build with its default middleware only) and
    every declarative `SubAgent` spec in `subagents` that does not list a
    `VfsdMiddleware` itself. Compiled and async subagents are built elsewhere
    and are passed on unchanged. The system prompts get the backend's path
    convention (`VfsdBackend.prompt_note`). A `checkpointer` is wrapped in a
    `VfsdCheckpointer` on `files` (unless it is one already), so a replayed,
    forked or resumed thread finds its files as they were.

    With a Runs that has a remote (replicas sharing a bucket), the graph
    comes with the callbacks that tell the checkpointer when each run ends
    (`mount_tool.langgraph.run_hooks()`), so the thread is free for its next
    run, on any replica, as soon as a run is over.

    `backend`, instead of `backend_options`: a ready VfsdBackend on `files`, or
    a deepagents `CompositeBackend` whose default is one (`routes={"/memories/":
    StoreBackend(...)}`); the note then names the routed prefixes as paths the
    shell does not see.

    With `offload_tool_outputs` (the default) an `OffloadMiddleware` right
    after the `VfsdMiddleware` gives every tool's large result (custom tools,
    `task`, MCP tools) vfsd's preview (JSON shape, log error lines, a file
    named by its kind) at the backend's `offload_threshold_tokens`, before
    deepagents' own offloading (the first characters, in a file without an
    extension) would see it; the file tools and `execute` are left as they are
    (`NOT_OFFLOADED_TOOLS`). Not added when `middleware` holds an
    `OffloadMiddleware` already. Other keyword arguments go to
    `create_deep_agent` unchanged.
    """
    from deepagents import create_deep_agent
    from deepagents.middleware.subagents import GENERAL_PURPOSE_SUBAGENT

    saver = kwargs.get("checkpointer")
    if isinstance(saver, BaseCheckpointSaver) and not isinstance(saver, VfsdCheckpointer):
        kwargs["checkpointer"] = VfsdCheckpointer(saver, files)
    if backend is None:
        backend = VfsdBackend(files, **dict(backend_options or {}))
    elif backend_options:
        raise ValueError("pass either backend or backend_options, not both")
    vfsd_backend = _vfsd_backend_of(backend)
    if vfsd_backend.files is not files:
        raise ValueError("the backend's VfsdBackend must serve the same Mount or Runs as files")
    note = prompt_note_for(backend)
    middleware = list(middleware)
    offload = offload_tool_outputs and not any(
        isinstance(m, OffloadMiddleware) for m in middleware
    )

    def vfsd_middleware() -> list[AgentMiddleware]:
        stack: list[AgentMiddleware] = [
            VfsdMiddleware(files, compact_threshold_chars=compact_threshold_chars, prompt_note=note)
        ]
        if offload:
            # Inside VfsdMiddleware, so the saved file is in the call's `files` update.
            stack.append(OffloadMiddleware(
                files, vfsd_backend.offload_threshold_tokens, exclude_tools=NOT_OFFLOADED_TOOLS,
                root_shown="/" if vfsd_backend.sandbox.isolation == "bwrap" else None,
            ))
        return stack

    specs = [_with_vfsd_middleware(spec, vfsd_middleware) for spec in subagents or ()]
    if not any(spec.get("name") == GENERAL_PURPOSE_SUBAGENT["name"] for spec in specs):
        specs.insert(0, {**GENERAL_PURPOSE_SUBAGENT, "middleware": vfsd_middleware()})
    graph = create_deep_agent(
        model,
        backend=backend,
        middleware=[*vfsd_middleware(), *middleware],
        subagents=specs,
        **kwargs,
    )
    if isinstance(files, Runs) and files.remote is not None:
        # Replicas: a run holds its thread until its end, which these report.
        graph = graph.with_config(callbacks=run_hooks())
    return graph


def _with_vfsd_middleware(spec: Any, make: Callable[[], list[AgentMiddleware]]) -> Any:
    """A declarative subagent spec with a VfsdMiddleware (and the offloading) first in
    its middleware."""
    if not isinstance(spec, Mapping) or "runnable" in spec or "graph_id" in spec:
        return spec  # compiled or async: its middleware is not ours to set
    own = list(spec.get("middleware") or [])
    if any(isinstance(m, VfsdMiddleware) for m in own):
        return spec
    added = make()
    if any(isinstance(m, OffloadMiddleware) for m in own):
        added = [m for m in added if not isinstance(m, OffloadMiddleware)]
    return {**spec, "middleware": [*added, *own]}
