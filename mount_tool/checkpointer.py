"""A documented import path: re-exports `mount_tool.langgraph.checkpointer`.

`from mount_tool.checkpointer import VfsdCheckpointer` keeps working; the
checkpointer lives with the rest of the LangGraph integration.
"""

from .langgraph.checkpointer import (
    NO_FILES_VERSION,
    NOT_CAPTURED,
    ON_MISSING,
    PUBLISH_MODES,
    THREADS_KEPT,
    BadFilesMetadata,
    FilesVersion,
    VfsdCheckpointer,
    snapshot_seq,
    warn_if_unwrapped,
)

__all__ = [
    "NO_FILES_VERSION",
    "NOT_CAPTURED",
    "ON_MISSING",
    "PUBLISH_MODES",
    "THREADS_KEPT",
    "BadFilesMetadata",
    "FilesVersion",
    "VfsdCheckpointer",
    "snapshot_seq",
    "warn_if_unwrapped",
]
