"""A documented import path: re-exports `mount_tool.daemon.client`.

`from mount_tool.client import ControlClient` keeps working (so does
`mount_tool.ControlClient`); the client lives with the rest of what talks to
the daemon.
"""

from .daemon.client import (
    BUSY_RETRY_SECONDS,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    ControlClient,
)

__all__ = ["BUSY_RETRY_SECONDS", "MAX_REPLY_BYTES", "MAX_REQUEST_BYTES", "ControlClient"]
