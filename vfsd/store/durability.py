"""The order of durable writes: files before the records that name them, and
records before the deletes that follow them.

A commit reaches LMDB's file through the page cache and becomes durable at
the next `Store.sync()` (an `fsync()` on the mount, a snapshot, the daemon's
periodic sync, unmount). A machine crash rolls LMDB back to its last sync, so
two orders must hold:

- a sync makes records durable only after the files they name are: chunk
  files made since the last sync, and hot files that received a block's copy
  when it went hot (`hot_copied`);
- a chunk file or a hot file that a commit stopped naming is deleted only
  after a sync made that commit durable: until then the durable records may
  still name it (an `fsync()`ed file overwritten later must come back as it
  was, not as EIO).

The ledger collects both between syncs. `Store.sync()` (any thread) fsyncs
the files, then syncs LMDB, and hands the doomed files of the commits it
covered to `take_ready()`; the daemon deletes them on its loop
(`Store.delete_synced`), after checking that nothing took them back. One sync
runs at a time. A commit that lands while a sync is between its last file
fsync and LMDB's own is caught right after and its files fsynced then: the
one window left is a machine crash within that instant.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Batch:
    """What one sync covers."""

    chunks: set[bytes] = field(default_factory=set)
    hot: set[tuple[int, int]] = field(default_factory=set)
    doomed: set[bytes] = field(default_factory=set)
    doomed_hot: set[tuple[int, int]] = field(default_factory=set)
    #: a write transaction committed (what a periodic sync bounds)
    commits: bool = False

    def merge(self, other: Batch) -> None:
        self.commits |= other.commits
        self.chunks |= other.chunks
        self.hot |= other.hot
        self.doomed |= other.doomed
        self.doomed_hot |= other.doomed_hot

    def has_files(self) -> bool:
        return bool(self.chunks or self.hot)


class Ledger:
    """Files to fsync before the next LMDB sync, files to delete after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = Batch()
        self._ready = Batch()
        # Called (on whatever thread) when something waits for a sync before it
        # can be deleted: the daemon wakes its sync task.
        self.on_doomed = None
        #: serializes syncs: two overlapping ones could each sync LMDB while the
        #: other's files are not durable yet.
        self.sync_lock = threading.Lock()

    # ------------------------------------------------------------ recording

    def committed(self) -> None:
        self._open.commits = True  # a lone store of a bool: no lock needed

    def chunks_made(self, digests) -> None:
        with self._lock:
            self._open.chunks.update(digests)

    def hot_copied(self, vol: int, ino: int) -> None:
        with self._lock:
            self._open.hot.add((vol, ino))

    def doom_chunks(self, digests: list[bytes]) -> None:
        if digests:
            with self._lock:
                self._open.doomed.update(digests)
            self._wake()

    def doom_hot(self, vol: int, ino: int) -> None:
        with self._lock:
            self._open.doomed_hot.add((vol, ino))
        self._wake()

    def _wake(self) -> None:
        if self.on_doomed is not None:
            self.on_doomed()

    # -------------------------------------------------------------- syncing

    def pending(self) -> bool:
        """Anything a sync would make durable or free."""
        with self._lock:
            b = self._open
            return bool(b.commits or b.chunks or b.hot or b.doomed or b.doomed_hot)

    def awaiting_deletion(self) -> bool:
        """Files freed but not deleted yet (they wait for a sync): room on the
        disk that a sync now would give back."""
        with self._lock:
            return bool(self._open.doomed or self._open.doomed_hot
                        or self._ready.doomed or self._ready.doomed_hot)

    def take(self) -> Batch:
        """Everything recorded so far, for a sync to cover."""
        with self._lock:
            batch, self._open = self._open, Batch()
        return batch

    def give_back(self, batch: Batch) -> None:
        """A sync failed: what it took waits for the next one."""
        with self._lock:
            batch.merge(self._open)
            self._open = batch

    def synced(self, batch: Batch) -> None:
        """LMDB was synced after every file of `batch`: its doomed files may go."""
        with self._lock:
            self._ready.doomed |= batch.doomed
            self._ready.doomed_hot |= batch.doomed_hot

    def take_ready(self) -> tuple[set[bytes], set[tuple[int, int]]]:
        """Files whose last naming record is gone from LMDB's durable state."""
        with self._lock:
            ready, self._ready = self._ready, Batch()
        return ready.doomed, ready.doomed_hot
