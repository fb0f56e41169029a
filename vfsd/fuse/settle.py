"""Settling hot blocks back into content objects, off the FUSE loop.

A hot block (see `hotfiles`) is hashed and staged as a chunk file in a worker
thread; the loop then checks that no write touched it meanwhile and commits
it in one short transaction (`OpenFiles.commit_settled`). Files are settled
in the background after their last close, all of them before a snapshot,
and the ones left hot by a previous run when the daemon starts.
"""

from __future__ import annotations

import math

import structlog
import trio

from vfsd import errors

from .openfiles import OpenFile, OpenFiles, prepare_blocks

log = structlog.get_logger("vfsd.settle")


class Settler:
    """Settles hot files: one at a time in the background, all at once on demand."""

    def __init__(self, files: OpenFiles) -> None:
        self.files = files
        self.store = files.store
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._queued: set[int] = set()
        self.settled_total = 0
        #: awaited before each settle (the volume's: waits while it is held)
        self.gate = None
        files.on_hot_release = self.enqueue

    def enqueue(self, ino: int) -> None:
        """Settle this inode soon (called when its last handle goes)."""
        if ino not in self._queued:
            self._queued.add(ino)
            self._send.send_nowait(ino)

    async def run(self) -> None:
        """The background task: settle what was queued, starting with what a
        previous run left hot."""
        for ino in self.store.hot_inodes():
            self.enqueue(ino)
        async for ino in self._recv:
            if self.gate is not None:
                await self.gate()  # nothing changes under a long operation
            self._queued.discard(ino)
            try:
                await self.settle_ino(ino)
            except Exception:
                log.exception("settle_failed", ino=ino)

    async def settle(self, of: OpenFile) -> None:
        """Settle the hot blocks of an open file (hashing in a worker thread)."""
        if not of.hot:
            return
        gens, extents, path = self.files.settle_plan(of)
        prepared = await trio.to_thread.run_sync(
            prepare_blocks, self.store, path, extents, self.files.inline_max)
        self.files.commit_settled(of, gens, prepared)
        self.settled_total += len(prepared)

    async def settle_ino(self, ino: int) -> None:
        try:
            of = self.files.acquire(ino)
        except errors.NotFound:
            return  # freed meanwhile
        try:
            await self.settle(of)
        finally:
            self.files.release(of)

    async def settle_all(self) -> None:
        """Settle every hot block of the volume, mostly off the loop."""
        inos = set(self.store.hot_inodes()) | {
            ino for ino, of in self.files.files.items() if of.hot}
        for ino in sorted(inos):
            await self.settle_ino(ino)

    def settle_rest_now(self) -> None:
        """Settle, on this thread, whatever went hot since `settle_all` (few blocks)."""
        for ino in self.store.hot_inodes():
            try:
                of = self.files.acquire(ino)
            except errors.NotFound:
                continue
            try:
                self.files.settle_now(of)
            finally:
                self.files.release(of)
