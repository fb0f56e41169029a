"""The names the execute sandbox reserves at the root of a run's files.

Inside `execute`'s sandbox, `/usr`, `/proc`, `/run` ... are the system's (or
private to each call), not the run's files: the file tools refuse them, and
the daemon serves them as hidden virtual directories once a sandbox claims
the mount (vfsd/fuse/ctldir.py). The one-thread Mount, the sandbox and the
Deep Agents backend all need these names, so they live here, below all three.
"""

from __future__ import annotations

#: Mount points the sandbox needs at the root of the run's files. The daemon
#: serves exactly these as hidden virtual directories (vfsd/fuse/ctldir.py).
SANDBOX_DIRS = (
    "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "usr",
)
#: The root directory that is the sandbox's /tmp (a real one, with either mode).
TMP_DIR = "tmp"


def reserved_reason(virtual_path: str, tmp: str = "run") -> str | None:
    """Why the file tools may not use `virtual_path`, or None when they may.

    Its first component is one of the sandbox's mount points: inside the
    sandbox that path is the system's (or private), not the run's files.
    /tmp is the run's own directory unless `tmp` is "call".
    """
    top = virtual_path.strip("/").split("/", 1)[0]
    if top == TMP_DIR and tmp == "call":
        return (
            "/tmp is private to each execute call (tmp=\"call\": a fresh tmpfs, emptied when "
            "the call returns), not part of the run's files; keep files under another "
            "top-level directory (for example /work)"
        )
    if top not in SANDBOX_DIRS:
        return None
    if top == "run":
        what = "private to each execute call (a fresh tmpfs, emptied when the call returns)"
    elif top in ("proc", "dev"):
        what = f"the sandbox's own /{top}"
    else:
        what = "a read-only system directory in the execute sandbox"
    return (
        f"/{top} is {what}, not part of the run's files; keep files under another "
        "top-level directory (for example /work)"
    )
