"""mount_tool: what an agent program imports to keep its files in a vfsd mount.

    with mount_tool.mount("runs/42") as m:
        ref = m.write("notes/plan.md", "...")   # a ~150-byte FileRef for graph state
        m.read(ref)                              # checked against the ref's hash

    with mount_tool.runs("runs") as runs:        # every graph thread its own files,
        m = runs.get(thread_id)                  # a directory of a few shard daemons

The folders are the parts, lowest first (docs/architecture.md;
`tests/test_layers.py` checks that imports run down this list only):
`errors`, `refs`, `paths`, `beneath` and `reserved` (what every part shares),
then `daemon/` (talking to vfsd: the control client, starting daemons, the
running tool call) and `sandbox/` (the sandbox `execute` runs commands in),
then `mount` (`Mount`: one run dir), `runs/` (`Runs`: every thread of a graph
from a few shard daemons), `langgraph/` (FilesChannel, the step nodes,
VfsdCheckpointer), `deepagents/` (VfsdBackend, VfsdMiddleware,
create_vfsd_deep_agent, tool-output offloading), and `cli`, `demo`. This
module is the public API; `mount_tool.checkpointer`, `.boundary`, `.client`,
`.offload` and `.toolcalls` are documented paths kept as re-exports.

mount_tool never imports vfsd: it runs the `vfsd` command line and talks to
the daemon through the mount and its control socket.
"""

from .daemon.client import ControlClient
from .daemon.mountinfo import is_mounted
from .errors import (
    ControlError,
    Damaged,
    Evicted,
    EvictedPath,
    Missing,
    MountError,
    MountToolError,
    RefError,
    SnapshotNotPublished,
    SnapshotUnavailable,
    StaleRef,
    ThreadBindingError,
    ThreadBusy,
)
from .mount import Mount, mount
from .refs import FileRef, as_ref, content_hash, is_ref
from .runs import Runs, RunsConfigError, ThreadIdError, runs

__all__ = [
    "ControlClient",
    "ControlError",
    "Damaged",
    "Evicted",
    "EvictedPath",
    "FileRef",
    "Missing",
    "Mount",
    "MountError",
    "MountToolError",
    "RefError",
    "Runs",
    "RunsConfigError",
    "SnapshotNotPublished",
    "SnapshotUnavailable",
    "StaleRef",
    "ThreadBindingError",
    "ThreadBusy",
    "ThreadIdError",
    "as_ref",
    "content_hash",
    "is_mounted",
    "is_ref",
    "mount",
    "runs",
]


def __getattr__(name: str):
    # verify_history needs LangGraph (an optional dependency), which `import
    # mount_tool` does not: it is loaded on first use, and not in __all__.
    if name == "verify_history":
        from .langgraph.history import verify_history

        return verify_history
    raise AttributeError(f"module 'mount_tool' has no attribute {name!r}")
