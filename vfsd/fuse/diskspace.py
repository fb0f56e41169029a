"""Room on the store's disk: refuse a write up front when its buffers could
not commit, count every refusal for lack of disk, and say whether the store
is refusing writes now.

Small files commit at release, after close() has returned, so a write the
disk cannot take must be refused at write() while the writer can still see
it. The free space is read with statvfs, cached for 0.1 s only while there
is plenty of room; after a refusal the next write looks again, so the first
write after space is freed goes through. Room freed in the mount (a file
deleted) comes back only when its chunk files are deleted, after the next
sync: a write that does not fit syncs first if anything waits for that.

`full()` is what `vfsd status` (and its `--check`) reports: true from a
refusal until the disk shows the room that refusal lacked again (bounded,
so one oversized request does not keep a disk with room "full"), or while
the disk has less than the reserve itself.
"""

from __future__ import annotations

import os
import time

import structlog

log = structlog.get_logger("vfsd.fs")

#: room kept free on the store's disk for LMDB pages and chunk metadata
DISK_RESERVE = 4 << 20
#: a refusal keeps the disk "full" until at most this much more than the reserve is free
CLEAR_BOUND = 64 << 20


class DiskSpace:
    """The store disk's room, as the write path sees it."""

    def __init__(self, path) -> None:
        self.path = path
        self.refusals = 0  # writes and store changes refused for lack of disk
        self._free = 0
        self._checked = 0.0
        self._lacking: int | None = None  # bytes the last refusal needed, until seen free

    def _statvfs(self) -> int:
        st = os.statvfs(self.path)
        self._free = st.f_bavail * st.f_frsize
        self._checked = time.monotonic()
        return self._free

    def fits(self, need: int) -> bool:
        """True if `need` bytes (with the reserve) fit on the disk now."""
        need += DISK_RESERVE
        # A cached answer is good for 0.1 s only while there is plenty of room.
        if time.monotonic() - self._checked > 0.1 or self._free < need + (64 << 20):
            self._statvfs()
        if need > self._free:
            self._checked = 0.0  # look again next time: space may come back
            return False
        self._lacking = None
        return True

    def refuse(self, need: int) -> None:
        """`need` bytes did not fit: logged and counted."""
        log.warning("store_disk_full", free=self._free, needed=need + DISK_RESERVE)
        self.refused(need + DISK_RESERVE)

    def refused(self, need: int = DISK_RESERVE + (1 << 20)) -> None:
        """A write or store change was refused for lack of disk (ENOSPC)."""
        self.refusals += 1
        self._lacking = min(need, DISK_RESERVE + CLEAR_BOUND)
        self._checked = 0.0

    def full(self) -> bool:
        """True while the store refuses writes for lack of space (a live look)."""
        free = self._statvfs()
        if self._lacking is not None and free >= self._lacking:
            self._lacking = None
        return self._lacking is not None or free < DISK_RESERVE
