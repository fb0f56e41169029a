"""GC of the bucket across workers: mark from every run's manifests, sweep chunks.

`sweep(store, grace=...)` deletes the chunks (`chunks/`) that no manifest of
any run under the prefix names, that no publication in progress relies on
(intents), and that were last written more than `grace` seconds ago by the
server's clock. The protocol, and why a worker publishing a manifest that
names a chunk GC is looking at never loses it, are in `vfsd.remote` ("GC").
A manifest that does not decode stops the sweep before anything is deleted:
what it names is unknown.

Blocking (network): call it from a worker thread or the command line. One
sweep at a time per prefix (`gc/lease`); a second one gets `GcBusy`. Manifests
themselves are deleted by each run's writer (retention), never here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import structlog

from .head import MAX_HEAD_BYTES
from .lease import Lease, LeaseHeld, LeaseLost
from .manifest import MAX_MANIFEST_BYTES, ManifestError, decode
from .objstore import ObjectStore, RemoteNotFound
from .remote import (
    CHUNKS_DIR,
    GC_LEASE_KEY,
    INTENT_MAX_AGE,
    RUNS_DIR,
    digest_of_chunk_key,
    intent_of_name,
    parse_run_key,
    seq_of_manifest_name,
)

log = structlog.get_logger("vfsd.bucketgc")

MIN_GRACE = 1.0
DELETE_BATCH = 500
#: an intent is a list of 16-byte digests; one larger than this is damaged
MAX_INTENT_BYTES = 256 << 20


class GcError(Exception):
    """The sweep stopped before deleting anything unsafe; the message says why."""


class GcBusy(GcError):
    """Another sweep holds `gc/lease`."""


@dataclass
class SweepReport:
    """What a sweep found and did."""

    url: str
    grace: float
    dry_run: bool
    runs: int = 0
    manifests: int = 0
    intents: int = 0
    stale_intents: int = 0
    marked: int = 0
    chunks: int = 0
    chunk_bytes: int = 0
    young: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    would_delete: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def as_dict(self) -> dict:
        doc = asdict(self)
        doc["would_delete"] = doc["would_delete"][:100]
        return doc


def sweep(store: ObjectStore, *, grace: float, dry_run: bool = False, ttl: float = 30.0,
          workers: int = 8, on_marked: Callable[[], None] | None = None) -> SweepReport:
    """Mark and sweep the bucket prefix of `store`; see the module docstring.

    `on_marked` is called once marking is done, before any deletion (for
    tests that need a sweep to stand still at that point).
    """
    if not isinstance(grace, int | float) or isinstance(grace, bool) or grace < MIN_GRACE:
        raise GcError(f"the grace period must be at least {MIN_GRACE:g} s, got {grace!r}")
    started = time.monotonic()
    report = SweepReport(str(store.url), float(grace), dry_run)
    lease = Lease(store, "gc", key=GC_LEASE_KEY, ttl=ttl)
    previous = lease.read()
    floor = (previous.record or {}).get("grace_floor") if previous else None
    if not isinstance(floor, int | float) or isinstance(floor, bool) or floor <= 0:
        floor = grace
    lease.extra = {"purpose": "vfsd gc sweep", "grace": float(grace),
                   "grace_floor": float(min(floor, grace))}
    try:
        lease.acquire(wait=0)
    except LeaseHeld as exc:
        raise GcBusy(f"another GC sweep is running on {store.url} ({exc})") from None
    try:
        t0 = _server_now(store)
        marked = _mark(store, lease, t0, report, workers)
        report.marked = len(marked)
        if on_marked is not None:
            on_marked()
        _sweep_chunks(store, lease, t0, grace, marked, report)
    except LeaseLost as exc:
        raise GcError(f"the sweep lost its lease and stopped deleting ({exc})") from None
    finally:
        lease.release()
    report.duration_s = round(time.monotonic() - started, 3)
    log.info("bucket_gc", **{k: v for k, v in report.as_dict().items() if k != "would_delete"})
    return report


def _server_now(store: ObjectStore) -> float:
    """The server's clock (Date of a response), else ours."""
    fetched = store.get(GC_LEASE_KEY, max_bytes=MAX_HEAD_BYTES)
    return fetched.server_time if fetched.server_time is not None else time.time()


def _keep_alive(lease: Lease) -> None:
    """Renew when half the lease is gone; LeaseLost once it is not valid."""
    lease.check()
    if lease.remaining() < lease.ttl / 2:
        lease.renew()


def _mark(store: ObjectStore, lease: Lease, t0: float, report: SweepReport,
          workers: int) -> set[bytes]:
    """Digests named by live intents and by every manifest under the prefix."""
    runs: set[str] = set()
    intents: list[str] = []
    stale: list[str] = []
    manifests: list[str] = []
    for n, info in enumerate(store.list(RUNS_DIR + "/")):
        if n % 1000 == 0:
            _keep_alive(lease)
        parsed = parse_run_key(info.key)
        if parsed is None:
            continue
        run, kind, rest = parsed
        runs.add(run)
        if kind == "intents" and intent_of_name(rest):
            if info.last_modified >= t0 - INTENT_MAX_AGE:
                intents.append(info.key)
            else:
                stale.append(info.key)
        elif kind == "snapshots" and seq_of_manifest_name(rest) is not None:
            manifests.append(info.key)
    report.runs, report.intents, report.manifests = len(runs), len(intents), len(manifests)
    report.stale_intents = len(stale)
    marked: set[bytes] = set()

    def read_intent(key: str) -> set[bytes]:
        try:
            data = store.get(key, max_bytes=MAX_INTENT_BYTES).data
        except RemoteNotFound:
            return set()  # its publication finished: its manifest is listed
        if len(data) % 16:
            raise GcError(f"intent {key} is damaged ({len(data)} bytes); nothing deleted")
        return {data[i:i + 16] for i in range(0, len(data), 16)}

    def read_manifest(key: str) -> set[bytes]:
        run, _, rest = parse_run_key(key)
        try:
            data = store.get(key, max_bytes=MAX_MANIFEST_BYTES).data
        except RemoteNotFound:
            return set()  # retired by its run meanwhile: its chunks are named elsewhere
        try:
            return decode(data, run=run, seq=seq_of_manifest_name(rest)).chunk_digests()
        except ManifestError as exc:
            raise GcError(f"{exc}; nothing was deleted (what it names is unknown). "
                          f"Inspect or delete {key} by hand") from None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for got in pool.map(read_intent, intents):
            marked |= got
        _keep_alive(lease)
        for n, got in enumerate(pool.map(read_manifest, manifests)):
            marked |= got
            if n % 64 == 0:
                _keep_alive(lease)
    if stale and not report.dry_run:
        store.delete(stale)
    return marked


def _sweep_chunks(store: ObjectStore, lease: Lease, t0: float, grace: float,
                  marked: set[bytes], report: SweepReport) -> None:
    batch: list[tuple[str, int]] = []

    def flush() -> None:
        if not batch:
            return
        _keep_alive(lease)  # never delete once the lease may look expired to others
        if report.dry_run:
            report.would_delete += [k for k, _ in batch]
        else:
            store.delete([k for k, _ in batch])
        report.deleted += len(batch)
        report.deleted_bytes += sum(size for _, size in batch)
        batch.clear()

    for n, info in enumerate(store.list(CHUNKS_DIR + "/")):
        if n % 1000 == 0:
            _keep_alive(lease)
        digest = digest_of_chunk_key(info.key)
        if digest is None:
            continue
        report.chunks += 1
        report.chunk_bytes += info.size
        if digest in marked:
            continue
        if info.last_modified >= t0 - grace:
            report.young += 1
            continue
        batch.append((info.key, info.size))
        if len(batch) >= DELETE_BATCH:
            flush()
    flush()
