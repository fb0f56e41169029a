"""One writer per run: a lease object in the bucket, taken and kept with conditional writes.

`Lease(store, run_id)` is one worker's claim on one run (`runs/<run_id>/lease`,
format in `vfsd.remote`). `acquire()` creates the lease with `If-None-Match: *`,
or takes over an expired or released one with `If-Match: <ETag>`; `renew()`
rewrites it with `If-Match` on the ETag of our last write; `release()` marks it
released (again with `If-Match`) so the next worker need not wait. Every write
is a compare-and-swap, so of two workers racing, exactly one wins, and a worker
whose lease was taken over learns it at its next renewal (RemoteConflict).

Time and clock skew. Whether a lease has expired is judged on the object
store's clock only: the Last-Modified of the lease object against the Date of
the response that returned it. Workers' wall clocks never enter the decision, so
they may be skewed by any amount. (The one exception: a server that sends no
Date header; then the taker's wall clock stands in for it, and must be within
`margin` of the server's.) The holder judges its own validity on its monotonic
clock from the moment it *sent* its last successful write: that write's
Last-Modified is no earlier, so the holder's view runs ahead of everyone
else's. It stops `margin` seconds before `ttl` has passed, and a taker waits
`ttl` + 1 s after Last-Modified (HTTP dates have one-second resolution), so
there is always a gap of at least `margin` between the holder stopping and
another worker starting. Assumed: the server's clock does not step by more than
`margin` within a TTL, and clock rates differ by far less than `margin`/`ttl`.

Generations. Every acquisition writes a generation one above the record it
replaces (1 for a new object), also when a restarted daemon takes back its own
lease (same owner token, a new process): so two holders never share a
generation, and "same generation" means "same acquisition". Each `Lease` also
writes a random `session` of its own; a renewal whose answer was lost is
recognised by it (our session, our generation), never by the owner token
alone, so a stale holder with the same token (an older process of the same
daemon, a copied store) learns at its next renewal that it lost the lease.
A record whose generation is not below `MAX_GENERATION` is damaged (a planted
2**64 - 1 once made the next holder write 2**64, which no u64 holds): it is
taken over once it lapses, like any record that does not parse.

Losing the lease. `valid` turns False, for good, the moment the holder's
validity runs out without a successful renewal, or a renewal finds the lease
changed by another owner; `check()` then raises LeaseLost, which writers call
before each write. The lease alone cannot stop a write already in flight: the
run's mutable objects carry `generation` (the fencing token) and are written
with If-Match, so a stale writer's write fails instead of landing (see
`vfsd.remote`).

Threads and trio: `acquire`, `renew` and `release` block on the network and
run in worker threads; `keep_renewed` is the trio task that renews in the
background (calling `renew` in a worker thread) and reports the loss.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import structlog
import trio

from .layout import check_run_id, lease_key
from .objstore import (
    Fetched,
    ObjectStore,
    RemoteConflict,
    RemoteError,
    RemoteNotFound,
    RemoteTooLarge,
)

log = structlog.get_logger("vfsd.lease")

LEASE_FORMAT = 1
#: Added to the TTL by a taker: HTTP dates are truncated to whole seconds.
TIMESTAMP_GRACE = 1.0
#: A lease object larger than this is damaged (or hostile): not parsed.
MAX_LEASE_BYTES = 64 * 1024
#: generations stay below this, so the next one (and the head's, and the
#: store's u64) always fits; a record at or above it is damaged
MAX_GENERATION = 1 << 62


class LeaseHeld(Exception):
    """Another worker holds the lease; `holder` says who, `expires_in` when it may lapse."""

    def __init__(self, message: str, holder: dict | None, expires_in: float) -> None:
        super().__init__(message)
        self.holder = holder
        self.expires_in = expires_in


class LeaseLost(Exception):
    """This worker no longer holds the lease and must not write to the run."""


@dataclass(frozen=True)
class Owner:
    """Who holds a lease: host and pid for humans, a random token for identity."""

    host: str
    pid: int
    token: str

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), secrets.token_hex(16))


@dataclass(frozen=True)
class LeaseState:
    """The lease as read from the bucket: its parsed body (None if damaged) and ETag."""

    record: dict | None
    etag: str
    expired: bool
    expires_in: float  # server seconds until a taker may take it (<= 0: now)


class Lease:
    """One worker's lease on one run. Thread-safe; see the module docstring."""

    def __init__(self, store: ObjectStore, run_id: str, *, ttl: float = 30.0,
                 renew_every: float | None = None, margin: float | None = None,
                 owner: Owner | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 key: str | None = None, extra: dict | None = None,
                 extra_for: Callable[[LeaseState | None], dict] | None = None) -> None:
        if ttl < 1:
            raise ValueError("a lease ttl under one second cannot work with HTTP dates")
        self.store = store
        self.run_id = check_run_id(run_id)
        # `key`: a lease that is not a run's (the GC's); `extra`: fields its
        # holder adds to the body (the GC's grace period); `extra_for(previous)`
        # computes them at each acquisition attempt from the lease it replaces
        # (None: there is none), so they can depend on exactly that record.
        self.key = key or lease_key(run_id)
        self.extra = dict(extra or {})
        self._extra_for = extra_for
        self.session = secrets.token_hex(8)
        self.ttl = float(ttl)
        self.margin = float(margin if margin is not None else max(1.0, self.ttl / 10))
        if not 0 < self.margin < self.ttl / 2:
            raise ValueError("margin must be positive and under half the ttl")
        self.renew_every = float(renew_every if renew_every is not None else self.ttl / 3)
        if not 0 < self.renew_every < self.ttl - self.margin:
            raise ValueError("renew_every must leave time to renew before the lease lapses")
        self.owner = owner or Owner.me()
        self._wall = wall_clock
        self._lock = threading.Lock()
        # Held across each renewal's or release's write and the ETag it yields,
        # so a release never writes with the ETag an in-flight renewal replaces
        # (an abandoned renewal landing first left the lease renewed, not released).
        self._write_lock = threading.Lock()
        self._etag: str | None = None
        self._generation = 0
        self._seq = 0
        self._acquired_at = 0.0
        self._valid_until = 0.0  # time.monotonic()
        self._renewed_mono = 0.0
        self._held = False
        self._lost_reason: str | None = None
        #: True once the lease is known to be another owner's (taken over,
        #: removed or replaced), not merely lapsed while the store was unreachable
        self.taken_over = False
        #: the lease object very likely exists (a run taken before): `acquire`
        #: reads it first instead of trying to create it, one round trip less
        self.expect_existing = False
        #: successful renewals so far (a figure: one request each)
        self.renewals = 0
        #: the record this lease replaced when it was taken over (None: it made
        #: a new one), for a holder that must know what its predecessor said
        self.replaced: dict | None = None

    # ---------------------------------------------------------------- state

    @property
    def generation(self) -> int:
        """The fencing token: grows by one at every change of owner."""
        return self._generation

    @property
    def valid(self) -> bool:
        """True while this worker holds the lease; once False, False for good."""
        with self._lock:
            return self._valid_locked()

    def _valid_locked(self) -> bool:
        if not self._held or self._lost_reason is not None:
            return False
        if time.monotonic() >= self._valid_until:
            self._lost_reason = (f"not renewed within {self.ttl:g} s (the object store did "
                                 "not answer in time)")
            return False
        return True

    @property
    def lost_reason(self) -> str | None:
        with self._lock:
            self._valid_locked()
            return self._lost_reason

    def deadline(self) -> float:
        """The `time.monotonic()` at which this worker stops holding the lease
        unless it renews first (0.0 if it holds none)."""
        with self._lock:
            return self._valid_until if self._valid_locked() else 0.0

    def remaining(self) -> float:
        """Seconds this worker may still write without a successful renewal."""
        with self._lock:
            if not self._valid_locked():
                return 0.0
            return self._valid_until - time.monotonic()

    def check(self) -> None:
        """Raise LeaseLost unless this worker holds the lease: call before each write."""
        with self._lock:
            if self._valid_locked():
                return
            reason = self._lost_reason or "the lease was never acquired"
        raise LeaseLost(f"lease on run {self.run_id} lost: {reason}")

    # ------------------------------------------------------------- the body

    def _body(self, generation: int, released: bool = False) -> bytes:
        self._seq += 1
        now = self._wall()
        return json.dumps({
            **self.extra,
            "vfsd_lease": LEASE_FORMAT,
            "run": self.run_id,
            "owner": asdict(self.owner),
            "generation": generation,
            "ttl": self.ttl,
            "acquired_at": self._acquired_at or now,
            "renewed_at": now,
            "expires_at": 0 if released else now + self.ttl,
            "released": released,
            "seq": self._seq,  # every write differs, so every ETag differs
            "session": self.session,
        }, sort_keys=True).encode()

    def _is_mine(self, record: dict | None) -> bool:
        """The record names our owner token (this daemon, maybe an earlier process)."""
        owner = (record or {}).get("owner")
        return isinstance(owner, dict) and owner.get("token") == self.owner.token

    def _is_this(self, record: dict | None, generation: int) -> bool:
        """The record was written by this very `Lease`, at `generation`."""
        return self._is_mine(record) and record.get("session") == self.session \
            and record["generation"] == generation

    def _set_extra(self, previous: LeaseState | None) -> None:
        if self._extra_for is not None:
            self.extra = dict(self._extra_for(previous))

    def read(self) -> LeaseState | None:
        """The lease as the bucket has it now, or None if there is none."""
        try:
            fetched = self.store.get(self.key, max_bytes=MAX_LEASE_BYTES)
        except RemoteNotFound:
            return None
        except RemoteTooLarge:
            info = self.store.head(self.key)  # damaged: taken over like an expired one
            fetched = Fetched(b"", info.etag, info.last_modified, None)
        record = _parse(fetched.data)
        ttl = self.ttl
        if record is not None:
            ttl = record["ttl"]
        server_now = fetched.server_time if fetched.server_time is not None else self._wall()
        expires_in = fetched.last_modified + ttl + TIMESTAMP_GRACE - server_now
        released = record is not None and record["released"]
        expired = released or expires_in < 0
        # A damaged body is taken over like an expired lease of our own TTL.
        return LeaseState(record, fetched.etag, expired, 0.0 if released else expires_in)

    # ------------------------------------------------------------ operations

    def acquire(self, wait: float = 0.0) -> None:
        """Take the lease, waiting up to `wait` seconds for another holder's to lapse.

        Raises LeaseHeld (with the holder) if it is still held after `wait`.
        Blocks: run it in a worker thread.
        """
        deadline = time.monotonic() + wait
        while True:
            try:
                self._try_acquire()
                return
            except LeaseHeld as held:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(left, max(0.2, held.expires_in + 0.05), self.renew_every))

    def _try_acquire(self) -> None:
        with self._lock:
            if self._lost_reason is not None:
                raise LeaseLost(f"lease on run {self.run_id} was lost ({self._lost_reason}); "
                                "make a new Lease to try again")
        # generation -> when our write attempt asking for it was sent
        tried: dict[int, float] = {}
        read_first = self.expect_existing
        for _ in range(5):  # the object may vanish or change between our reads
            sent = time.monotonic()
            self._acquired_at = self._wall()
            self._set_extra(None)
            if not read_first:
                try:
                    tried.setdefault(1, sent)
                    etag = self.store.put(self.key, self._body(1), if_none_match=True)
                    self._won(etag, 1, sent)
                    return
                except RemoteConflict:
                    pass  # there is one (or our own write landed and its answer was lost)
            read_first = False
            state = self.read()
            if state is None:
                continue
            if state.record is not None and state.record["generation"] in tried \
                    and self._is_this(state.record, state.record["generation"]) \
                    and not state.record["released"]:
                # One of our own writes landed and its answer was lost.
                self._won(state.etag, state.record["generation"],
                          tried[state.record["generation"]])
                self.renew()  # its Last-Modified may predate `sent`: write a fresh one
                return
            # Our own token from an earlier process (a restart after a crash):
            # taken at once, with a new generation like any takeover.
            if not state.expired and not self._is_mine(state.record):
                raise LeaseHeld(_held_message(self.run_id, state), state.record,
                                state.expires_in)
            generation = (state.record["generation"] if state.record else 0) + 1
            self._set_extra(state)
            sent = time.monotonic()
            try:
                tried.setdefault(generation, sent)
                etag = self.store.put(self.key, self._body(generation), if_match=state.etag)
            except (RemoteConflict, RemoteNotFound):
                continue  # somebody else moved first: look again
            self.replaced = state.record
            self._won(etag, generation, sent)
            log.info("lease_taken_over", run=self.run_id, generation=generation,
                     previous=(state.record or {}).get("owner"))
            return
        state = self.read()
        raise LeaseHeld(f"lease on run {self.run_id} keeps changing; another worker is "
                        "taking it", state.record if state else None, self.ttl)

    def _won(self, etag: str, generation: int, sent: float) -> None:
        with self._lock:
            self._etag = etag
            self._generation = generation
            self._held = True
            self._lost_reason = None
            self._valid_until = sent + self.ttl - self.margin
            self._renewed_mono = sent
        log.info("lease_acquired", run=self.run_id, generation=generation, ttl=self.ttl)

    def renew(self) -> None:
        """Extend the lease (CAS on our last ETag). Blocks: run it in a worker thread.

        Raises LeaseLost if the lease is gone (taken over, or validity ran out
        first), RemoteError if the store could not be reached (try again soon:
        the lease is still valid until `remaining()` runs out).
        """
        with self._write_lock:
            self._renew_writing()

    def _renew_writing(self) -> None:
        for _ in range(3):
            with self._lock:
                if not self._valid_locked():
                    reason = self._lost_reason or "the lease was never acquired"
                    raise LeaseLost(f"lease on run {self.run_id} lost: {reason}")
                etag, generation = self._etag, self._generation
                # Retries stop once the lease would have lapsed anyway.
                deadline = self._valid_until
            sent = time.monotonic()
            try:
                new_etag = self.store.put(self.key, self._body(generation), if_match=etag,
                                          deadline=deadline)
            except (RemoteConflict, RemoteNotFound):
                state = self.read()
                if state is not None and state.record is not None \
                        and self._is_this(state.record, generation) \
                        and not state.record["released"]:
                    # Our previous write landed but its answer was lost: adopt
                    # its ETag and write again, so Last-Modified is fresh.
                    with self._lock:
                        self._etag = state.etag
                    continue
                holder = (state.record or {}).get("owner") if state else None
                reason = (f"taken over by {holder.get('host')} pid {holder.get('pid')} "
                          f"(generation {state.record['generation']})"
                          if isinstance(holder, dict) and state and state.record
                          else "the lease object was removed or replaced")
                self._lose(reason)
                raise LeaseLost(f"lease on run {self.run_id} lost: {reason}") from None
            with self._lock:
                if self._lost_reason is not None:  # declared lost while we waited
                    raise LeaseLost(f"lease on run {self.run_id} lost: {self._lost_reason}")
                self._etag = new_etag
                self._valid_until = sent + self.ttl - self.margin
                self._renewed_mono = sent
                self.renewals += 1
            return
        self._lose("the lease object keeps changing under us")
        raise LeaseLost(f"lease on run {self.run_id} lost: it keeps changing")

    def release(self) -> bool:
        """Give the lease up so the next worker need not wait (best effort):
        True if the bucket now says released, False if it will lapse instead.

        Blocks: run it in a worker thread (it waits for a renewal in flight).
        After this, `valid` is False.
        """
        with self._write_lock:
            with self._lock:
                held = self._valid_locked()
                etag, generation, deadline = self._etag, self._generation, self._valid_until
                self._held = False
                self._lost_reason = self._lost_reason or "released"
            if not held:
                return False
            try:
                # Not after our validity: by then another worker may hold it.
                self.store.put(self.key, self._body(generation, released=True),
                               if_match=etag, deadline=deadline)
            except RemoteError as exc:
                # It will lapse after its TTL instead.
                log.warning("lease_release_failed", run=self.run_id, error=str(exc))
                return False
        log.info("lease_released", run=self.run_id, generation=generation)
        return True

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self._lost_reason is None:
                self._lost_reason = reason
                self.taken_over = True

    # ------------------------------------------------------------ trio task

    async def keep_renewed(self, on_lost: Callable[[str], None] | None = None, *,
                           task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Renew in the background until cancelled or lost; call `on_lost(reason)` once.

        Each renewal runs in a worker thread and is abandoned at the moment the
        lease would lapse, so a hung object store cannot delay the verdict.
        Failed renewals are retried every second or so while time remains.
        """
        task_status.started()
        retry_every = min(1.0, self.renew_every)
        next_try = self._renewed_mono + self.renew_every
        while True:
            await trio.sleep(max(0.0, min(next_try, self._valid_until) - time.monotonic()))
            if not self.valid:
                break
            with trio.move_on_after(max(0.0, self._valid_until - time.monotonic())):
                try:
                    await trio.to_thread.run_sync(self.renew, abandon_on_cancel=True)
                    next_try = self._renewed_mono + self.renew_every
                    continue
                except LeaseLost:
                    break
                except RemoteError as exc:
                    log.warning("lease_renewal_failed", run=self.run_id, error=str(exc),
                                remaining=round(self.remaining(), 1))
                    next_try = time.monotonic() + retry_every
                    continue
            # The lease lapsed while the renewal was still waiting on the store.
            self.valid  # noqa: B018 - records the reason
            break
        reason = self.lost_reason or "lost"
        log.error("lease_lost", run=self.run_id, generation=self._generation, reason=reason)
        if on_lost is not None:
            on_lost(reason)


def _parse(data: bytes) -> dict | None:
    """The lease record if `data` is a well-formed one, else None."""
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or record.get("vfsd_lease") != LEASE_FORMAT:
        return None
    generation, ttl = record.get("generation"), record.get("ttl")
    if not isinstance(generation, int) or isinstance(generation, bool) \
            or not 1 <= generation < MAX_GENERATION:
        return None  # out of range is damage too: its successor could not be stored
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or not 1 <= ttl <= 86400:
        return None
    if not isinstance(record.get("released"), bool) or not isinstance(record.get("owner"), dict):
        return None
    return record


def _held_message(run_id: str, state: LeaseState) -> str:
    owner = (state.record or {}).get("owner") or {}
    who = f"{owner.get('host')} pid {owner.get('pid')}" if owner else "a damaged lease object"
    return (f"run {run_id} is held by {who}; it may be taken over in "
            f"{max(0.0, state.expires_in):.0f} s if not renewed")
