"""Deep Agents on a vfsd mount: the file tools and the shell see the same files.

    with mount_tool.runs("runs") as runs:     # every thread its own files
        agent = create_vfsd_deep_agent(runs, model, checkpointer=InMemorySaver())
        agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

- `backend`: `VfsdBackend(runs)`, deepagents' `SandboxBackendProtocol` on the
  mounted directory of the running thread (or of one Mount), with `execute`
  in the sandbox; `files` does its file tools' work beneath the mount root.
- `middleware`: `VfsdMiddleware(runs)` keeps graph state down to ~150-byte
  FileRefs, advances the daemon's step once per model turn and keeps large
  `write_file`/`edit_file` arguments out of the conversation.
- `agent`: `create_vfsd_deep_agent(runs, model, ...)` wires both into
  `create_deep_agent`, subagents included.
- `offload` (`OffloadMiddleware`: large tool results saved to the mount, a
  preview in the message; for any LangChain agent), `evictnotes` (what the
  model is told about evicted files), `nospace` (why a write found no room),
  `records` (Deep Agents' records named from input, taken literally).

This package is the top of the integrations: it may import everything of
mount_tool below it (the LangGraph integration, the Runs, the Mount, the
sandbox, the daemon's client); only the demo and the public API's aliases
(`mount_tool.offload`) import it.
"""

from .agent import NOT_OFFLOADED_TOOLS as NOT_OFFLOADED_TOOLS
from .agent import create_vfsd_deep_agent, prompt_note_for
from .backend import DEFAULT_EXECUTE_TIMEOUT as DEFAULT_EXECUTE_TIMEOUT
from .backend import DEFAULT_MAX_OUTPUT_BYTES as DEFAULT_MAX_OUTPUT_BYTES
from .backend import NO_SPACE as NO_SPACE
from .backend import VfsdBackend
from .middleware import BODY_ARGS as BODY_ARGS
from .middleware import DEFAULT_COMPACT_THRESHOLD_CHARS as DEFAULT_COMPACT_THRESHOLD_CHARS
from .middleware import READ_ONLY_TOOLS as READ_ONLY_TOOLS
from .middleware import STAGING_DIR as STAGING_DIR
from .middleware import VfsdAgentState, VfsdMiddleware, virtual_path
from .middleware import append_to_system_message as append_to_system_message
from .middleware import files_delta_reducer as files_delta_reducer

__all__ = [
    "VfsdAgentState",
    "VfsdBackend",
    "VfsdMiddleware",
    "create_vfsd_deep_agent",
    "prompt_note_for",
    "virtual_path",
]
