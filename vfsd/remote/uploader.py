"""Write-behind upload of chunks to the object store.

`Uploader` takes chunk digests from the daemon and puts each chunk under
`chunks/<hh>/<hex>` (`vfsd.remote`) with put-if-absent, so a chunk that another
worker (or an earlier run) already uploaded is not an error and not sent twice.
Each chunk is read from the local chunk store and checked against its digest
just before upload: a damaged local chunk is never published under a good name.

Durability: the backlog is the caller's. The caller records a chunk as
"pending upload" in its own durable store (LMDB) in the same transaction that
makes the chunk part of the store, then calls `enqueue`. The uploader calls
`on_uploaded(digests)` (on the trio thread, in batches) once those chunks are
in the bucket, and the caller deletes them from its pending set. After a crash,
`load_pending(after, limit)` (a paged scan of the pending set in digest order)
gives the uploader everything that was not confirmed; uploading it again is
harmless (put-if-absent). A digest the caller must not lose can therefore never
be lost: it leaves the durable set only after the bucket has it.

Bounded memory, no blocking of writers: the uploader holds at most `max_queued`
pending entries in memory (about 200 bytes each) and reads chunk bytes only
for the uploads in flight (`workers` x chunk size). `enqueue` never blocks: when
the queue is full it returns False and the chunk simply waits in the durable
backlog, from which the uploader refills its queue as it drains. (Callers that
want backpressure instead await `enqueue_wait`.) So an object store outage costs
disk (the pending set), never memory, and writes go on.

Outages: a failed upload goes back to the front of the queue, and the uploader
switches to probing: one worker retries, after an exponential delay with jitter
(`retry_base_delay` doubling up to `retry_max_delay`), while the others wait;
the first success resumes every worker. A chunk missing or damaged locally is
not retried: `on_failed(digest, reason)` is called and waiters get UploadFailed.

Publishing: `ensure_uploaded(digests)` returns once every digest is confirmed
in the bucket (uploaded or found present by this uploader recently, or found by
a HEAD), uploading from the local store those that are missing; a manifest may
be published after it returns.

Threads and trio: `run()` is the trio task (start it in the daemon's nursery);
`enqueue`, `status` and the callbacks are on the trio thread; the network work
and chunk reads run in worker threads.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog
import trio

from vfsd.errors import CorruptChunk
from vfsd.store.chunks import chunk_hash

from .layout import chunk_key
from .objstore import ObjectStore, RemoteError

log = structlog.get_logger("vfsd.uploader")

#: Confirmations remembered (digest -> when), so `ensure_uploaded` skips a HEAD.
CONFIRMED_MAX = 65536
#: How long a confirmation is trusted. Keep it well under the bucket GC's grace period.
CONFIRMED_TTL = 600.0
#: Uploaded digests are reported to `on_uploaded` in batches of up to this many.
REPORT_BATCH = 256


@dataclass(frozen=True)
class PendingChunk:
    """A chunk waiting for upload, as the caller persists it."""

    digest: bytes
    size: int  # bytes, for the backlog figures
    enqueued_at: float  # wall clock (epoch seconds) when it became pending


class UploadFailed(Exception):
    """Some chunks cannot be uploaded; `reasons` maps digest -> why."""

    def __init__(self, reasons: dict[bytes, str]) -> None:
        shown = "; ".join(f"{d.hex()}: {r}" for d, r in list(reasons.items())[:3])
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        super().__init__(f"{len(reasons)} chunk(s) cannot be uploaded: {shown}{more}")
        self.reasons = reasons


class ChunkGone(Exception):
    """Raised by `read_chunk` for a chunk nobody needs any more (its last
    reference went before it was uploaded): the item is dropped quietly."""


class _LocalChunkBad(Exception):
    """The local copy of a chunk is missing or damaged (permanent for this digest)."""


class Uploader:
    """Bounded write-behind queue of chunk uploads; see the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        read_chunk: Callable[[bytes], bytes],
        *,
        on_uploaded: Callable[[list[bytes]], None] | None = None,
        load_pending: Callable[[bytes | None, int], list[PendingChunk]] | None = None,
        on_failed: Callable[[bytes, str], None] | None = None,
        workers: int = 8,
        max_queued: int = 4096,
        head_first: bool = True,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 30.0,
    ) -> None:
        if workers < 1 or max_queued < 1:
            raise ValueError("workers and max_queued must be at least 1")
        self.store = store
        self.read_chunk = read_chunk
        self.on_uploaded = on_uploaded
        self.load_pending = load_pending
        self.on_failed = on_failed
        self.workers = workers
        self.max_queued = max_queued
        # HEAD before PUT: one small request saves sending a chunk the bucket
        # already has (workers sharing content), at the price of a round trip
        # for new chunks.
        self.head_first = head_first
        self.retry_base_delay = retry_base_delay
        self.retry_max_delay = retry_max_delay

        self._queue: OrderedDict[bytes, PendingChunk] = OrderedDict()
        self._in_flight: dict[bytes, PendingChunk] = {}
        self._events: dict[bytes, trio.Event] = {}
        self._failed: dict[bytes, str] = {}
        self._confirmed: OrderedDict[bytes, float] = OrderedDict()
        # Chunks this uploader created in the bucket (not found there): digest
        # -> time.monotonic() when the PUT was sent, so their Last-Modified is
        # no earlier. The publisher trusts such a chunk's age (vfsd.remote, GC).
        self._created: OrderedDict[bytes, float] = OrderedDict()
        self._report: list[bytes] = []
        self._backlog_bytes = 0
        self._wake = trio.Event()
        self._room = trio.Event()
        self._report_ready = trio.Event()
        self._limiter = trio.CapacityLimiter(workers)
        # Refill from the durable backlog: needed at start and after any refusal.
        self._disk_has_more = load_pending is not None
        self._refused_since_pass = False
        self._scan_after: bytes | None = None
        self._deferred = 0
        # Outage state.
        self._down_since: float | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._up = trio.Event()
        self._up.set()
        self._probing = False
        # uploaded / existed: chunks put by us / found already in the bucket;
        # sent_bytes: chunk bytes put on the wire (a lost race sends without creating).
        self.stats = {"uploaded": 0, "existed": 0, "failed": 0, "retries": 0, "sent_bytes": 0,
                      "dropped": 0}
        self.last_error: str | None = None
        self._last_error_at: float | None = None
        self._running = False

    # ------------------------------------------------------------ intake

    def enqueue(self, item: PendingChunk, *, force: bool = False) -> bool:
        """Queue a chunk for upload; never blocks. Trio thread only.

        True: queued (or already queued, in flight, or just uploaded).
        False: the in-memory queue is full; the chunk waits in the caller's
        durable backlog and is loaded from there when the queue drains.
        `force` queues beyond the bound (for `ensure_uploaded`).
        """
        digest = item.digest
        if digest in self._queue or digest in self._in_flight or self._is_confirmed(digest):
            return True
        self._failed.pop(digest, None)  # a new reason to try (the local copy may be back)
        if not force and len(self._queue) >= self.max_queued:
            self._refused_since_pass = True
            self._disk_has_more = self.load_pending is not None
            self._deferred += 1
            return False
        self._queue[digest] = item
        self._backlog_bytes += max(item.size, 0)
        self._wake.set()
        return True

    async def enqueue_wait(self, item: PendingChunk) -> None:
        """Queue a chunk, waiting for room: for callers that want backpressure."""
        while not self.enqueue(item):
            self._room = trio.Event() if self._room.is_set() else self._room
            await self._room.wait()

    # ------------------------------------------------------------ figures

    def status(self) -> dict:
        """Backlog and error figures for `vfsd status`. Trio thread only."""
        now = time.time()
        pending = [*self._queue.values(), *self._in_flight.values()]
        oldest = min((p.enqueued_at for p in pending), default=None)
        return {
            "queued": len(self._queue),
            "in_flight": len(self._in_flight),
            "backlog": len(pending),
            "backlog_bytes": self._backlog_bytes,
            # Refused by a full queue and not yet loaded back: they wait in the
            # durable backlog, whose own figures are the exact ones.
            "deferred": self._deferred,
            "oldest_pending_age": None if oldest is None else max(0.0, now - oldest),
            **self.stats,
            "last_error": self.last_error,
            "last_error_age": None if self._last_error_at is None
            else time.monotonic() - self._last_error_at,
            "store_down_for": None if self._down_since is None
            else time.monotonic() - self._down_since,
        }

    # ------------------------------------------------------------ publishing

    async def ensure_uploaded(self, digests: Iterable[bytes]) -> None:
        """Return once every digest is in the bucket; raise UploadFailed if some cannot be.

        Digests this uploader confirmed recently cost nothing; queued ones are
        waited for; unknown ones are checked with a HEAD and uploaded from the
        local chunk store if missing. No timeout of its own: wrap it in
        `trio.fail_after` (an outage makes it wait).
        """
        wanted = list(dict.fromkeys(digests))
        failures: dict[bytes, str] = {}

        async def settle(digest: bytes) -> None:
            while True:
                if self._is_confirmed(digest):
                    return
                if digest in self._failed:
                    failures[digest] = self._failed[digest]
                    return
                if digest in self._queue or digest in self._in_flight:
                    await self._event(digest).wait()
                    continue
                if await self._present(digest):
                    return
                # Missing and unknown: upload it from the local store.
                self.enqueue(PendingChunk(digest, -1, time.time()), force=True)

        async with trio.open_nursery() as nursery:
            for digest in wanted:
                nursery.start_soon(settle, digest)
        if failures:
            raise UploadFailed(failures)

    async def _present(self, digest: bytes) -> bool:
        """HEAD the chunk (waiting out an outage like the uploads do)."""
        failures = 0
        while True:
            try:
                found = await trio.to_thread.run_sync(
                    self.store.exists, chunk_key(digest), limiter=self._limiter,
                    abandon_on_cancel=True)
            except RemoteError as exc:
                self._note_error(str(exc))
                failures += 1
                await trio.sleep(self._backoff_delay(failures))
                continue
            if found:
                self._confirm(digest)
            return found

    # ------------------------------------------------------------- the task

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Upload until cancelled. Start it in the daemon's nursery."""
        if self._running:
            raise RuntimeError("Uploader.run is already running")
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.workers):
                    nursery.start_soon(self._worker)
                nursery.start_soon(self._reporter)
                self._refill()
                task_status.started()
        finally:
            self._running = False
            self._flush_report()  # what is confirmed need not be uploaded again

    async def _worker(self) -> None:
        while True:
            item = await self._next_item()
            try:
                started = time.monotonic()
                existed, sent = await trio.to_thread.run_sync(
                    self._upload_one, item, limiter=self._limiter, abandon_on_cancel=True)
            except _LocalChunkBad as exc:
                self._finish(item, failure=str(exc))
                continue
            except ChunkGone:
                self._drop(item)
                continue
            except (RemoteError, OSError) as exc:
                self._retry_later(item, str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - a bug in a callback must not stop uploads
                log.exception("chunk_upload_crashed", digest=item.digest.hex())
                self._retry_later(item, f"{type(exc).__name__}: {exc}")
                continue
            except BaseException:
                self._requeue(item)  # cancelled: it stays pending
                raise
            self.stats["sent_bytes"] += sent
            if not existed:
                self._note_created(item.digest, started)
            self._finish(item, existed=existed)

    async def _next_item(self) -> PendingChunk:
        while True:
            if self._down_since is not None:
                if self._probing:
                    await self._up.wait()  # one worker probes the store at a time
                    continue
                self._probing = True
                try:
                    await trio.sleep(max(0.0, self._retry_at - time.monotonic()))
                except BaseException:
                    self._probing = False
                    raise
                if not self._queue:
                    self._probing = False
                    await self._wait_for_work()
                    continue
            elif not self._queue:
                await self._wait_for_work()
                continue
            digest, item = self._queue.popitem(last=False)
            self._in_flight[digest] = item
            self._refill()
            return item

    async def _wait_for_work(self) -> None:
        if self._wake.is_set():
            self._wake = trio.Event()
        await self._wake.wait()

    def _upload_one(self, item: PendingChunk) -> tuple[bool, int]:
        """In a worker thread: read, verify, upload. Returns (existed, bytes sent)."""
        try:
            data = self.read_chunk(item.digest)
        except ChunkGone:
            raise
        except (CorruptChunk, FileNotFoundError) as exc:
            raise _LocalChunkBad(f"local chunk unusable: {exc}") from None
        if chunk_hash(data) != item.digest:
            raise _LocalChunkBad("local chunk does not match its hash")
        key = chunk_key(item.digest)
        if self.head_first and self.store.exists(key):
            return True, 0
        if self.store.put_if_absent(key, data):
            return False, len(data)
        return True, len(data)  # sent, but another writer had put it there first

    # ---------------------------------------------------------- outcomes

    def _finish(self, item: PendingChunk, *, existed: bool = False,
                failure: str | None = None) -> None:
        digest = item.digest
        self._in_flight.pop(digest, None)
        self._backlog_bytes -= max(item.size, 0)
        if failure is None:
            self.stats["existed" if existed else "uploaded"] += 1
            self._confirm(digest)
            self._report.append(digest)
            self._report_ready.set()
            if self._down_since is not None:
                log.info("object_store_back", down_for=round(time.monotonic() - self._down_since, 1))
            self._down_since = None
            self._failures = 0
            self._probing = False
            self._up.set()
        else:
            self.stats["failed"] += 1
            self._failed[digest] = failure
            log.error("chunk_upload_failed", digest=digest.hex(), reason=failure)
            if self.on_failed is not None:
                try:
                    self.on_failed(digest, failure)
                except Exception:  # noqa: BLE001 - a callback bug must not stop uploads
                    log.exception("on_failed_callback_failed")
            self._probing = False
        event = self._events.pop(digest, None)
        if event is not None:
            event.set()
        self._room.set()

    def _drop(self, item: PendingChunk) -> None:
        """A chunk superseded before its upload: nothing to upload, nothing failed."""
        digest = item.digest
        if self._in_flight.pop(digest, None) is not None:
            self._backlog_bytes -= max(item.size, 0)
        self._not_needed(digest)

    def forget(self, digest: bytes) -> None:
        """Drop a queued chunk whose last reference went (trio thread)."""
        item = self._queue.pop(digest, None)
        if item is not None:
            self._backlog_bytes -= max(item.size, 0)
            self._not_needed(digest)

    def _not_needed(self, digest: bytes) -> None:
        """Count a dropped chunk, tell whoever waits for it, make room."""
        self.stats["dropped"] += 1
        event = self._events.pop(digest, None)
        if event is not None:
            self._failed[digest] = "the chunk is no longer needed"
            event.set()
        self._room.set()

    def _retry_later(self, item: PendingChunk, error: str) -> None:
        self._requeue(item)
        self.stats["retries"] += 1
        self._note_error(error)
        self._failures += 1
        self._retry_at = time.monotonic() + self._backoff_delay(self._failures)
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._up = trio.Event()
            log.warning("object_store_down", error=error)
        self._probing = False
        self._wake.set()

    def _requeue(self, item: PendingChunk) -> None:
        if self._in_flight.pop(item.digest, None) is not None:
            self._queue[item.digest] = item
            self._queue.move_to_end(item.digest, last=False)

    def _backoff_delay(self, failures: int) -> float:
        step = min(self.retry_max_delay, self.retry_base_delay * 2 ** min(failures - 1, 30))
        return step / 2 + random.uniform(0, step / 2)

    def _note_error(self, error: str) -> None:
        self.last_error = error
        self._last_error_at = time.monotonic()

    def _confirm(self, digest: bytes) -> None:
        self._confirmed[digest] = time.monotonic()
        self._confirmed.move_to_end(digest)
        while len(self._confirmed) > CONFIRMED_MAX:
            self._confirmed.popitem(last=False)

    def _note_created(self, digest: bytes, sent: float) -> None:
        self._created[digest] = sent
        self._created.move_to_end(digest)
        while len(self._created) > CONFIRMED_MAX:
            self._created.popitem(last=False)

    def created_at(self, digest: bytes) -> float | None:
        """time.monotonic() at which this uploader sent the PUT that created the
        chunk in the bucket (its Last-Modified is no earlier), or None."""
        return self._created.get(digest)

    def _is_confirmed(self, digest: bytes) -> bool:
        at = self._confirmed.get(digest)
        return at is not None and time.monotonic() - at < CONFIRMED_TTL

    def _event(self, digest: bytes) -> trio.Event:
        event = self._events.get(digest)
        if event is None:
            event = self._events[digest] = trio.Event()
        return event

    # ---------------------------------------------------------- durability

    def _refill(self) -> None:
        """Top the queue up from the durable backlog while it is under half full."""
        if self.load_pending is None:
            return
        rounds = 0
        while self._disk_has_more and len(self._queue) < self.max_queued // 2 + 1 \
                and rounds < 4:
            rounds += 1
            if self._scan_after is None:
                self._refused_since_pass = False  # a new pass sees every refusal so far
            room = self.max_queued - len(self._queue)
            try:
                page = self.load_pending(self._scan_after, room)
            except Exception:  # noqa: BLE001 - the durable store's problem, retried later
                log.exception("load_pending_failed")
                return
            for item in page:
                if item.digest in self._queue or item.digest in self._in_flight \
                        or self._is_confirmed(item.digest) or item.digest in self._failed:
                    continue
                self._queue[item.digest] = item
                self._backlog_bytes += max(item.size, 0)
                self._deferred = max(0, self._deferred - 1)
            if len(page) < room:  # end of the durable backlog: the pass is over
                self._scan_after = None
                if not self._refused_since_pass:
                    self._disk_has_more = False
                    self._deferred = 0
            else:
                self._scan_after = page[-1].digest
            self._wake.set()

    async def _reporter(self) -> None:
        while True:
            await self._report_ready.wait()
            await trio.sleep(0.05)  # gather a batch: one durable transaction for many
            self._flush_report()

    def _flush_report(self) -> None:
        self._report_ready = trio.Event()
        while self._report:
            batch, self._report = self._report[:REPORT_BATCH], self._report[REPORT_BATCH:]
            if self.on_uploaded is None:
                continue
            try:
                self.on_uploaded(batch)
            except Exception:  # noqa: BLE001 - they stay pending and are uploaded again
                log.exception("on_uploaded_callback_failed")
