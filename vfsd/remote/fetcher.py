"""Fetch chunks from the object store into the local chunk directory, on demand and ahead.

`Fetcher.fetch(digest)` returns a chunk's verified bytes: from the local chunk
store if it is there, else from the bucket (`chunks/<hh>/<hex>`, `vfsd.remote`),
checked against its xxh3-128, written to a temporary file and renamed into the
local store (by the `install` callback, on the trio thread, so the caller can
do it inside its own LMDB transaction). A chunk whose bytes do not match its
name is never installed nor returned.

Bounded waits: a fetch gives up after `timeout` seconds (FetchTimeout, an EIO
for the FUSE layer), whatever the object store does; it never hangs. The
download itself goes on in the background (bounded by the store's own
timeouts), so a later read of the same chunk may find it done. Concurrent
fetches of one chunk share one download.

Readahead: `prefetch(digests)` queues background downloads of chunks a
sequential reader will want next; they run behind demand fetches (one worker
serves demand fetches only) and their bytes are not kept in memory.
`ReadaheadWindow` tells the read path when a file is read sequentially and
which chunk indexes to prefetch; it knows nothing of FUSE or of the store.

Threads and trio: `run()` is the trio task (the daemon's nursery); `fetch`,
`prefetch` and `status` are called on the trio thread; downloads, hashing and
temporary-file writes run in worker threads.
"""

from __future__ import annotations

import errno
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog
import trio

from vfsd.errors import CorruptChunk
from vfsd.store.chunks import ChunkStore, chunk_hash

from .layout import chunk_key
from .objstore import ObjectStore, RemoteError, RemoteNotFound, RemoteTooLarge

log = structlog.get_logger("vfsd.fetcher")

#: Readahead hints waiting beyond this many are dropped, oldest first.
MAX_QUEUED_READAHEAD = 256


class FetchError(Exception):
    """A chunk could not be had; `errno` is what a reader should see."""

    errno = errno.EIO


class FetchTimeout(FetchError):
    """The chunk did not arrive within the bounded wait."""


class ChunkUnavailable(FetchError):
    """The bucket does not have the chunk, has a damaged copy, or refused it."""


class _Job:
    __slots__ = ("digest", "done", "data", "error", "demand", "started", "deadline")

    def __init__(self, digest: bytes, demand: bool, deadline: float) -> None:
        self.digest = digest
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: FetchError | None = None
        self.demand = demand
        self.started = False
        self.deadline = deadline  # trio.current_time() after which no new attempt starts


class Fetcher:
    """On-demand and readahead chunk downloads; see the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        chunks: ChunkStore,
        *,
        install: Callable[[Path, bytes], None] | None = None,
        workers: int = 4,
        timeout: float = 30.0,
        max_chunk_bytes: int = 64 << 20,
    ) -> None:
        if workers < 1 or timeout <= 0:
            raise ValueError("workers must be at least 1 and timeout positive")
        self.store = store
        self.chunks = chunks
        self.install = install or chunks.install
        self.workers = workers
        self.timeout = timeout
        self.max_chunk_bytes = max_chunk_bytes
        self._jobs: dict[bytes, _Job] = {}
        self._demand: deque[_Job] = deque()
        self._ahead: deque[_Job] = deque()
        self._wake = trio.Event()
        self.stats = {"local": 0, "downloads": 0, "downloaded_bytes": 0, "readahead": 0,
                      "timeouts": 0, "errors": 0, "dropped_hints": 0}
        self.last_error: str | None = None

    # --------------------------------------------------------------- reads

    async def fetch(self, digest: bytes, timeout: float | None = None) -> bytes:
        """The chunk's verified bytes, fetched from the bucket if not local.

        Raises FetchTimeout after `timeout` seconds (default: the fetcher's),
        ChunkUnavailable if the bucket cannot provide it. Trio thread only.
        """
        limit = self.timeout if timeout is None else timeout
        with trio.move_on_after(limit):
            job = self._jobs.get(digest)
            if job is None:
                data = await self._read_local(digest)
                if data is not None:
                    self.stats["local"] += 1
                    return data
                job = self._jobs.get(digest)  # one may have started meanwhile
            if job is None:
                job = self._start(digest, demand=True, deadline=trio.current_time() + limit)
            elif not job.demand:
                self._promote(job, trio.current_time() + limit)
            await job.done.wait()
            if job.error is not None:
                raise job.error
            if job.data is not None:
                return job.data
            # A readahead job: installed, not kept. Read the local copy.
            data = await self._read_local(digest)
            if data is not None:
                return data
            raise ChunkUnavailable(f"chunk {digest.hex()} vanished from the local store "
                                   "right after it was fetched")
        self.stats["timeouts"] += 1
        last = f" (last error: {self.last_error})" if self.last_error else ""
        raise FetchTimeout(f"chunk {digest.hex()} not fetched from {self.store.url} within "
                           f"{limit:g} s{last}")

    def prefetch(self, digests: Iterable[bytes]) -> int:
        """Queue background downloads of chunks not local and not on their way.

        Returns how many were queued. Cheap; never blocks (a stat per digest).
        """
        queued = 0
        for digest in digests:
            if digest in self._jobs or self.chunks.exists(digest):
                continue
            self._start(digest, demand=False, deadline=trio.current_time() + self.timeout)
            queued += 1
        while len(self._ahead) > MAX_QUEUED_READAHEAD:
            job = self._ahead.popleft()  # the oldest hint is the least useful
            self._jobs.pop(job.digest, None)
            job.error = FetchTimeout("readahead dropped")
            job.done.set()
            self.stats["dropped_hints"] += 1
        return queued

    def status(self) -> dict:
        return {"in_progress": len(self._jobs), "queued_demand": len(self._demand),
                "queued_readahead": len(self._ahead), **self.stats,
                "last_error": self.last_error}

    async def _read_local(self, digest: bytes) -> bytes | None:
        if not self.chunks.exists(digest):
            return None
        try:
            return await trio.to_thread.run_sync(self.chunks.read_all, digest)
        except CorruptChunk as exc:
            # Damaged (or deleted just now) locally: fetch a good copy instead.
            log.warning("local_chunk_unusable", digest=digest.hex(), error=str(exc))
            return None

    # ------------------------------------------------------------------ jobs

    def _start(self, digest: bytes, demand: bool, deadline: float) -> _Job:
        job = _Job(digest, demand, deadline)
        self._jobs[digest] = job
        (self._demand if demand else self._ahead).append(job)
        self._wake.set()
        return job

    def _promote(self, job: _Job, deadline: float) -> None:
        """A reader now waits for a readahead job: serve it first."""
        job.demand = True
        job.deadline = max(job.deadline, deadline)
        if not job.started:
            try:
                self._ahead.remove(job)
            except ValueError:
                pass
            else:
                self._demand.append(job)
                self._wake.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Download until cancelled. Start it in the daemon's nursery."""
        async with trio.open_nursery() as nursery:
            for i in range(self.workers):
                # Worker 0 takes demand fetches only: readahead never delays a reader.
                nursery.start_soon(self._worker, i == 0 and self.workers > 1)
            task_status.started()

    async def _worker(self, demand_only: bool) -> None:
        while True:
            job = self._next_job(demand_only)
            if job is None:
                if self._wake.is_set():
                    self._wake = trio.Event()
                await self._wake.wait()
                continue
            job.started = True
            await self._run_job(job)

    def _next_job(self, demand_only: bool) -> _Job | None:
        if self._demand:
            return self._demand.popleft()
        if not demand_only and self._ahead:
            return self._ahead.popleft()
        return None

    async def _run_job(self, job: _Job) -> None:
        # The store's retries stop at the job's deadline (as a time.monotonic() value).
        deadline = time.monotonic() + max(0.0, job.deadline - trio.current_time())
        try:
            data, tmp = await trio.to_thread.run_sync(self._download, job.digest, deadline,
                                                      abandon_on_cancel=True)
            try:
                self.install(tmp, job.digest)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        except FetchError as exc:
            job.error = exc
            self.stats["errors"] += 1
            self.last_error = str(exc)
        except OSError as exc:
            job.error = FetchError(f"chunk {job.digest.hex()} fetched but not stored "
                                   f"locally: {exc}")
            self.stats["errors"] += 1
            self.last_error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a reader gets EIO, the daemon lives on
            log.exception("chunk_fetch_crashed", digest=job.digest.hex())
            job.error = FetchError(f"chunk {job.digest.hex()}: {type(exc).__name__}: {exc}")
            self.stats["errors"] += 1
            self.last_error = str(exc)
        else:
            self.stats["downloads"] += 1
            self.stats["downloaded_bytes"] += len(data)
            if job.demand:
                job.data = data  # only demand jobs keep bytes: readers are waiting
            else:
                self.stats["readahead"] += 1
        finally:
            if self._jobs.get(job.digest) is job:
                del self._jobs[job.digest]
            job.done.set()

    def _download(self, digest: bytes, deadline: float) -> tuple[bytes, Path]:
        """In a worker thread: GET, verify, write a temporary file."""
        try:
            fetched = self.store.get(chunk_key(digest), max_bytes=self.max_chunk_bytes,
                                     deadline=deadline)
        except RemoteNotFound:
            raise ChunkUnavailable(f"chunk {digest.hex()} is not in {self.store.url}") from None
        except RemoteTooLarge as exc:
            raise ChunkUnavailable(f"chunk {digest.hex()} in the bucket is damaged: {exc}") \
                from None
        except RemoteError as exc:
            raise ChunkUnavailable(f"chunk {digest.hex()} cannot be fetched: {exc}") from None
        if chunk_hash(fetched.data) != digest:
            log.error("remote_chunk_corrupt", digest=digest.hex(), size=len(fetched.data))
            raise ChunkUnavailable(f"chunk {digest.hex()} in {self.store.url} does not match "
                                   "its hash; it was not used")
        return fetched.data, self.chunks.write_temp(fetched.data)


class ReadaheadWindow:
    """Sequential-read detection per file, for `Fetcher.prefetch`.

    `on_read(file, index)` is called with the chunk index of each read of a
    file (any hashable file key: an inode number). While reads move forward
    chunk by chunk, the window grows 1, 2, 4... up to `max_chunks`, and the
    method returns the chunk indexes to prefetch now (each index once); a
    jump elsewhere resets it. Remembers the last `max_files` files.
    """

    def __init__(self, max_chunks: int = 4, max_files: int = 1024) -> None:
        self.max_chunks = max_chunks
        self.max_files = max_files
        # file -> (last index read, window, highest index already requested)
        self._files: OrderedDict[object, tuple[int, int, int]] = OrderedDict()

    def on_read(self, file: object, index: int) -> range:
        if self.max_chunks <= 0:
            return range(0)
        last = self._files.get(file)
        if last is None or not last[0] <= index <= last[0] + 1:
            # A new file or a jump: no readahead until the next chunk is read.
            window, ahead = (1, index) if index == 0 else (0, index)
        elif index == last[0]:
            window, ahead = last[1], last[2]  # another piece of the same chunk
        else:
            window, ahead = min(max(1, last[1] * 2), self.max_chunks), last[2]
        self._files[file] = (index, window, ahead)
        self._files.move_to_end(file)
        while len(self._files) > self.max_files:
            self._files.popitem(last=False)
        if window == 0:
            return range(0)
        wanted = range(max(ahead, index) + 1, index + window + 1)
        if wanted:
            self._files[file] = (index, window, wanted[-1])
        return wanted

    def forget(self, file: object) -> None:
        self._files.pop(file, None)
