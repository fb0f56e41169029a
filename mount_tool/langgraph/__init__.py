"""LangGraph integration: a `files` channel of FileRefs, the nodes that keep it
true, and a checkpointer whose checkpoints bring their files back.

    class State(TypedDict):
        files: FilesChannel

    runs = mount_tool.runs("runs")                       # every thread its own files
    graph.add_node("vfsd_step", make_step_node(runs))   # advance step, evict, prune refs
    graph.add_node("vfsd_sync", make_sync_node(runs))   # refs for files the shell wrote
    app = graph.compile(checkpointer=VfsdCheckpointer(InMemorySaver(), runs))

Each takes a `Runs` (every call works on the files of the running node's
thread) or one `Mount` (a graph with one thread). Graph state holds only
~150-byte references, so a checkpoint's size depends on the number of files,
not on their size.

`channel` (`FilesChannel`, `files_reducer`), `nodes` (`make_step_node`,
`make_sync_node`, `write_artifact`), `checkpointer` (`VfsdCheckpointer`: the
wrapper around any saver), `threadfiles` (what the wrapper decides and keeps
for one thread's files), `boundary` (step boundaries: where a checkpoint's
files are captured), `runhooks` (`run_hooks`: the callbacks by which the
wrapper learns that a run ended, which a Runs with a remote needs),
`history` (`verify_history`: does time travel give the right files) and
`checkpoints` (measuring what checkpoints cost).

This package imports the one-thread Mount, the Runs and what is below them,
never the Deep Agents integration; `langgraph` (the library) is needed here
and nowhere below.
"""

from ..errors import SnapshotUnavailable, ThreadBindingError
from .channel import FilesAggregate, FilesChannel, files_reducer
from .checkpointer import VfsdCheckpointer
from .history import verify_history
from .nodes import EVICTION_LOG_WINDOW as EVICTION_LOG_WINDOW  # not in __all__, as before
from .nodes import (
    langgraph_step,
    make_step_node,
    make_sync_node,
    write_artifact,
)
from .runhooks import run_hooks

__all__ = [
    "FilesAggregate",
    "FilesChannel",
    "SnapshotUnavailable",
    "ThreadBindingError",
    "VfsdCheckpointer",
    "files_reducer",
    "langgraph_step",
    "make_step_node",
    "make_sync_node",
    "run_hooks",
    "verify_history",
    "write_artifact",
]
