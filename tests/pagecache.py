"""Make reads reach the daemon: without this, reads right after writes are
served by the kernel's page cache and the daemon's read path is never tested."""

from __future__ import annotations

import os
from pathlib import Path


def drop_page_cache(path: Path | str) -> None:
    """Flush `path` and evict it from the page cache, so the next read asks the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
