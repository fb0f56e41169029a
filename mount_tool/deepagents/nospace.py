"""Why a write found no room: the words for an ENOSPC from the mount.

The kernel carries only the errno, so "No space left on device" is all a
program sees. The daemon knows why: the disk holding its store is full, or
the quota (max_files) refused the write, and then what held the room: files
a pin keeps, open files, or records a built-in eviction rule keeps (Deep
Agents' summarized history), which eviction never drops to make room. The
file tools and the offloading ask it, only after an ENOSPC.
"""

from __future__ import annotations

import errno
import logging

from ..errors import MountToolError
from ..mount import Mount

logger = logging.getLogger(__name__)


def is_no_space(exc: BaseException) -> bool:
    """Whether `exc` is an ENOSPC (or EDQUOT) from the mount."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def why_no_room(mount: Mount) -> str | None:
    """What the daemon says kept the last write from finding room, or None."""
    try:
        doc = mount.stats()
    except (MountToolError, OSError, ValueError) as exc:
        logger.debug("asking why a write found no room failed: %s", exc)
        return None
    if doc.get("disk_full"):
        return "the disk holding the run's store is full"
    refusal = doc.get("quota_refusal") or {}
    return refusal.get("message")


def explained(exc: OSError, mount: Mount) -> OSError:
    """`exc` itself, or for an ENOSPC the same error with the daemon's reason
    in its message ("No space left on device: quota of ... exceeded: ...")."""
    if not is_no_space(exc):
        return exc
    why = why_no_room(mount)
    if not why:
        return exc
    return OSError(exc.errno, f"{exc.strerror or 'No space left on device'}: {why}",
                   *([exc.filename] if exc.filename is not None else []))
