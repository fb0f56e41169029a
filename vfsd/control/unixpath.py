"""Unix socket paths of any length.

sockaddr_un holds 107 bytes of path, far less than a run dir's path may be.
A longer path is reached through a directory file descriptor instead:
`/proc/self/fd/N/vfsd.sock`, where N is the socket's directory, is short
whatever the real path, and binds or connects the same socket.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

#: the longest path sockaddr_un takes (108 bytes with the terminating NUL)
MAX_SUN_PATH = 107


@contextlib.contextmanager
def reachable_socket_path(path: Path) -> Iterator[str]:
    """A path to bind or connect `path` by, valid inside the `with` block."""
    raw = os.fsencode(path)
    if len(raw) <= MAX_SUN_PATH:
        yield os.fsdecode(raw)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.fsdecode(os.fsencode(path.name))}"
    finally:
        os.close(fd)
