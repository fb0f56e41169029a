"""The sandbox `execute` runs shell commands in: isolated from the host, bounded.

`sandbox` (`Sandbox`: one command under bubblewrap, or on the host with
`isolation="none"`, its limits and what it reports) and `cgroups` (a control
group per call: limits over all of a command's processes, and a sure kill).
The names below are the sandbox's public API, as `mount_tool.sandbox.X`
(the names it reserves at the mount root come from `mount_tool.reserved`).

This package imports nothing of mount_tool but its shared modules (errors,
the reserved names): it knows nothing of the daemon, the mount or the
integrations, which hand it a directory to run in.
"""

from ..reserved import SANDBOX_DIRS, TMP_DIR, reserved_reason
from .sandbox import (
    CLAIM_XATTR,
    CPU_POLL_SECONDS,
    DEFAULT_ENV_ALLOWLIST,
    DRAIN_GRACE_SECONDS,
    HOSTNAME,
    INSTALL_HINT,
    ISOLATION_MODES,
    MASKED_PATHS,
    SANDBOX_PATH,
    SYSTEM_DIRS,
    TMP_MODES,
    ExecLimits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
)

__all__ = [
    "CLAIM_XATTR",
    "CPU_POLL_SECONDS",
    "DEFAULT_ENV_ALLOWLIST",
    "DRAIN_GRACE_SECONDS",
    "HOSTNAME",
    "INSTALL_HINT",
    "ISOLATION_MODES",
    "MASKED_PATHS",
    "SANDBOX_DIRS",
    "SANDBOX_PATH",
    "SYSTEM_DIRS",
    "TMP_DIR",
    "TMP_MODES",
    "ExecLimits",
    "RunResult",
    "Sandbox",
    "SandboxUnavailable",
    "reserved_reason",
]
