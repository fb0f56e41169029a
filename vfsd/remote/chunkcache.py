"""The local chunk directory of a remote store as a cache bounded in bytes (LRU).

With a remote tier, a referenced chunk is "present locally or in the bucket"
(`remotestate`). `ChunkCache` keeps the bytes of local chunk files under
`remote_cache_bytes` by deleting the least recently used ones that are safe
in the bucket: never a chunk with an `upload` entry (pending upload, or
uploaded but named by no published manifest yet), so the only copy of
unpublished data never leaves the disk. A deleted chunk is fetched again on
its next read (`fetcher`). If everything local is unpublished (an object
store outage), the cache stays over its bound and says so in its status.

It learns of chunk files from the store's commit hook (made, deleted), from
fetches (installed) and from reads (touched); the order of those events is
the LRU order. Chunk files are deleted inside an LMDB write transaction that
checks the record and the `upload` entry, like every other chunk deletion
(`store`), on the trio thread; the first scan of the directory runs in a
worker thread. Other daemons sharing the store add and remove files this
cache does not hear of: its figures are this daemon's view, and a file
already gone is simply skipped.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import structlog
import trio

from vfsd.store import remotestate
from vfsd.store.content import LOC_FILE, unpack_record

log = structlog.get_logger("vfsd.chunkcache")

#: eviction brings the cache down to this fraction of its bound (hysteresis)
LOW_WATER = 0.9
#: LRU entries examined per eviction transaction
BATCH = 256


class ChunkCache:
    """LRU bound on the local chunk files of one store; see the module docstring."""

    def __init__(self, store, limit: int | None) -> None:
        self.store = store
        self.limit = limit
        self._lru: OrderedDict[bytes, int] = OrderedDict()  # digest -> size, oldest first
        self.total = 0
        self._wake = trio.Event()
        self.stats = {"evicted": 0, "evicted_bytes": 0, "kept_unpublished": 0}

    # --------------------------------------------------------------- events

    def scan(self) -> None:
        """Learn what is on disk, oldest access first (blocking: worker thread)."""
        found = []
        for digest in self.store.chunks.iter_all():
            try:
                st = os.stat(self.store.chunks.path(digest))
            except FileNotFoundError:
                continue
            found.append((max(st.st_atime, st.st_mtime), digest, st.st_size))
        found.sort()
        lru: OrderedDict[bytes, int] = OrderedDict((d, size) for _, d, size in found)
        self._lru, self.total = lru, sum(lru.values())

    def add(self, digest: bytes, size: int) -> None:
        """A chunk file appeared (written or fetched): most recently used."""
        old = self._lru.pop(digest, None)
        if old is not None:
            self.total -= old
        self._lru[digest] = size
        self.total += size
        if self.over():
            self._wake.set()

    def touch(self, digest: bytes) -> None:
        if digest in self._lru:
            self._lru.move_to_end(digest)

    def removed(self, digest: bytes) -> None:
        size = self._lru.pop(digest, None)
        if size is not None:
            self.total -= size

    def over(self) -> bool:
        return self.limit is not None and self.total > self.limit

    # ------------------------------------------------------------- eviction

    def evict(self) -> int:
        """Delete least recently used, safely uploaded chunk files until the cache
        is under its low-water mark or a batch found nothing to delete; how many
        went. One write transaction per batch (trio thread)."""
        if self.limit is None:
            return 0
        target = int(self.limit * LOW_WATER)
        gone = 0
        while self.total > target:
            batch = list(self._lru.items())[:BATCH]
            if not batch:
                break
            deleted = kept = 0
            st = self.store
            with st.txn(write=True) as txn:
                for digest, size in batch:
                    if self.total <= target:
                        break
                    raw = txn.get(digest, db=st.db["content"])
                    if raw is None or unpack_record(raw)[0] == 0:
                        continue  # a tombstone or a stray: the store's own deletion path
                    if unpack_record(raw)[2] != LOC_FILE or \
                            remotestate.entry(txn, st.db, digest) is not None:
                        self._lru.move_to_end(digest)  # unpublished: must stay
                        kept += 1
                        continue
                    st.chunks.delete(digest)
                    self.removed(digest)
                    deleted += 1
                    self.stats["evicted_bytes"] += size
            self.stats["evicted"] += deleted
            self.stats["kept_unpublished"] = kept
            gone += deleted
            if not deleted:
                break
        return gone

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Scan once, then evict whenever the cache passes its bound. Until cancelled."""
        await trio.to_thread.run_sync(self.scan)
        task_status.started()
        while True:
            if self.over():
                try:
                    n = self.evict()
                except Exception:  # noqa: BLE001 - the cache stays over its bound; logged
                    log.exception("chunk_cache_eviction_failed")
                    n = 0
                if n:
                    log.debug("chunk_cache_evicted", chunks=n, total=self.total)
                    await trio.sleep(0.5)  # coalesce: not one transaction per new chunk
                else:
                    # Everything old is unpublished: wait for a publication or news.
                    self._wake = trio.Event()
                    with trio.move_on_after(5.0):
                        await self._wake.wait()
                continue
            self._wake = trio.Event()
            await self._wake.wait()

    def status(self) -> dict:
        return {"bytes": self.total, "chunks": len(self._lru), "limit": self.limit,
                "over_limit": self.over(), **self.stats}
