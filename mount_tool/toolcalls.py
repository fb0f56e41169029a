"""A documented import path: re-exports `mount_tool.daemon.toolcalls`.

`from mount_tool import toolcalls; toolcalls.running(...)` keeps working; the
module lives with the rest of what talks to the daemon.
"""

from .daemon.toolcalls import (
    CALL_XATTR,
    TAG_INLINE_MAX,
    current,
    for_request,
    from_request,
    running,
    tag,
)

__all__ = ["CALL_XATTR", "TAG_INLINE_MAX", "current", "for_request", "from_request", "running",
           "tag"]
