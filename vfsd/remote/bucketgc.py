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

from .head import MAX_HEAD_BYTES, HeadError, read_head
from .layout import (
    CHUNKS_DIR,
    GC_LEASE_KEY,
    INTENT_MAX_AGE,
    RUNS_DIR,
    digest_of_chunk_key,
    intent_of_name,
    parse_run_key,
    run_objects_prefix,
    seq_of_manifest_name,
    thread_of_key,
    threads_prefix,
)
from .lease import Lease, LeaseHeld, LeaseLost, LeaseState
from .manifest import MAX_MANIFEST_BYTES, ManifestError, decode
from .objstore import ObjectStore, RemoteConflict, RemoteError, RemoteNotFound
from .threads import ThreadRecordError, read_record, write_record

log = structlog.get_logger("vfsd.bucketgc")

MIN_GRACE = 1.0
DELETE_BATCH = 500
#: an intent is a list of 16-byte digests; one larger than this is damaged
MAX_INTENT_BYTES = 256 << 20
#: listings of `runs/` after which a prefix whose runs keep changing is given up
MAX_MARK_ROUNDS = 20
#: the sweep's lease lasts at least this many request attempts (`attempt_bound`),
#: so a delete request always fits in it between two renewals
LEASE_ATTEMPTS = 3


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
    mark_rounds: int = 0
    threads: int = 0
    tombstones: int = 0
    runs_deleted: list[str] = field(default_factory=list)
    run_objects_deleted: int = 0
    runs_refused: list[dict] = field(default_factory=list)
    deleted: int = 0
    deleted_bytes: int = 0
    would_delete: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def as_dict(self) -> dict:
        doc = asdict(self)
        doc["would_delete"] = doc["would_delete"][:100]
        return doc


def sweep(store: ObjectStore, *, grace: float, dry_run: bool = False, ttl: float = 30.0,
          workers: int = 8, wait: float = 0.0,
          on_marked: Callable[[], None] | None = None,
          on_progress: Callable[[str, int, int | None], None] | None = None) -> SweepReport:
    """Mark and sweep the bucket prefix of `store`; see the module docstring.

    `wait`: seconds to wait for another sweep's lease (or a damaged lease
    object) to lapse before giving up with GcBusy. The lease lasts `ttl`
    seconds, raised to `LEASE_ATTEMPTS` request attempts of `store`. Every
    delete request is given up before the lease would lapse (GcError then:
    nothing is deleted after it). `on_marked` is called once marking is done,
    before any deletion (for tests that need a sweep to stand still there).
    `on_progress(phase, done, total)` is told how far each phase got
    ("manifests": read of those listed, "chunks": listed, total unknown), for
    a progress bar.
    """
    tell = on_progress or (lambda phase, done, total: None)
    if not isinstance(grace, int | float) or isinstance(grace, bool) or grace < MIN_GRACE:
        raise GcError(f"the grace period must be at least {MIN_GRACE:g} s, got {grace!r}")
    started = time.monotonic()
    report = SweepReport(str(store.url), float(grace), dry_run)
    ttl = max(float(ttl), LEASE_ATTEMPTS * store.attempt_bound())
    lease = Lease(store, "gc", key=GC_LEASE_KEY, ttl=ttl,
                  extra_for=lambda previous: _lease_fields(previous, float(grace)))
    try:
        lease.acquire(wait=wait)
    except LeaseHeld as exc:
        raise GcBusy(f"another GC sweep is running on {store.url} ({exc})") from None
    try:
        t0 = _server_now(store)
        doomed = _deleted_threads(store, lease, report)
        marked, stale = _mark(store, lease, t0, report, workers, tell, set(doomed))
        report.marked = len(marked)
        if on_marked is not None:
            on_marked()
        if stale and not dry_run:
            _delete(store, lease, stale)
        _delete_runs(store, lease, doomed, report)
        _sweep_chunks(store, lease, t0, grace, marked, report, tell)
    except LeaseLost as exc:
        raise GcError(f"the sweep lost its lease and stopped deleting ({exc})") from None
    finally:
        lease.release()
    report.duration_s = round(time.monotonic() - started, 3)
    log.info("bucket_gc", **{k: v for k, v in report.as_dict().items() if k != "would_delete"})
    return report


def _lease_fields(previous: LeaseState | None, grace: float) -> dict:
    """The GC's fields in `gc/lease`, replacing `previous`: the floor is never raised.

    Computed from the very record the acquisition replaces (its CAS fails if
    another sweep wrote in between, and this runs again on the new record).
    A damaged record, or one without a usable floor, may have hidden any
    grace: the floor falls to MIN_GRACE.
    """
    if previous is None:
        floor = grace  # no sweep ever ran here
    else:
        floor = (previous.record or {}).get("grace_floor")
        if not isinstance(floor, int | float) or isinstance(floor, bool) or not floor > 0 \
                or floor != floor:
            floor = MIN_GRACE
    return {"purpose": "vfsd gc sweep", "grace": grace,
            "grace_floor": float(min(floor, grace))}


def _server_now(store: ObjectStore) -> float:
    """The server's clock (Date of a response), else ours."""
    fetched = store.get(GC_LEASE_KEY, max_bytes=MAX_HEAD_BYTES)
    return fetched.server_time if fetched.server_time is not None else time.time()


def _keep_alive(lease: Lease) -> None:
    """Renew when half the lease is gone; LeaseLost once it is not valid."""
    lease.check()
    if lease.remaining() < lease.ttl / 2:
        lease.renew()


def _delete(store: ObjectStore, lease: Lease, keys: list[str]) -> None:
    """Delete `keys` while the lease holds: no request outlives it (see `ObjectStore.delete`)."""
    _keep_alive(lease)
    try:
        store.delete(keys, deadline=lease.deadline())
    except RemoteError as exc:
        raise GcError(f"the sweep stopped deleting: a delete could not be done within its "
                      f"lease on {store.url} ({exc}); run it again once the store answers "
                      "promptly") from None


def _deleted_threads(store: ObjectStore, lease: Lease,
                     report: SweepReport) -> dict[str, list]:
    """Runs of deleted threads, to delete: run -> [tombstone records listing it].

    Only a run a tombstone lists, that no live record names, and whose head
    is gone or names that very thread (`thread` in the head, written when a
    shard fences it): a tombstone planted by a tenant of the prefix can delete
    the thread it is the record of, never another thread's run nor a run
    dir's run. A record that does not parse deletes nothing.
    """
    live: set[str] = set()
    tombstones = []
    for n, info in enumerate(store.list(threads_prefix())):
        if n % 1000 == 0:
            _keep_alive(lease)
        key = thread_of_key(info.key)
        if key is None:
            continue
        report.threads += 1
        try:
            rec = read_record(store, key)
        except ThreadRecordError as exc:
            log.warning("gc_thread_record_damaged", key=info.key, error=str(exc))
            continue
        if rec is None:
            continue
        if rec.live:
            live.add(rec.run)
        elif rec.old_runs:
            tombstones.append(rec)
    report.tombstones = len(tombstones)
    doomed: dict[str, list] = {}
    for rec in tombstones:
        for run in rec.old_runs:
            why = None
            if run in live:
                why = "a live thread's record names it"
            else:
                try:
                    head = read_head(store, run)
                except HeadError as exc:
                    head, why = None, f"its head is damaged ({exc})"
                if head is not None and head.thread != rec.key:
                    why = f"its head belongs to {head.thread or 'no thread (a run dir)'}"
            if why is not None:
                report.runs_refused.append({"run": run, "tombstone": rec.key, "why": why})
                log.warning("gc_run_not_deleted", run=run, tombstone=rec.key, why=why)
                continue
            doomed.setdefault(run, []).append(rec)
    return doomed


def delete_run_objects(store: ObjectStore, run: str, deadline: float | None = None) -> int:
    """Delete every object of a run (lease, head, manifests, intents); how many.
    Blocks. For a deleted thread's run, whose record is a tombstone already."""
    keys = [info.key for info in store.list(run_objects_prefix(run), deadline=deadline)]
    if keys:
        store.delete(keys, deadline=deadline)
    return len(keys)


def _delete_runs(store: ObjectStore, lease: Lease, doomed: dict[str, list],
                 report: SweepReport) -> None:
    """Delete the doomed runs' objects; then the tombstones stop listing them."""
    for run in sorted(doomed):
        keys = [info.key for info in store.list(run_objects_prefix(run))]
        if keys and not report.dry_run:
            _delete(store, lease, keys)
        report.runs_deleted.append(run)
        report.run_objects_deleted += len(keys)
    if report.dry_run:
        return
    records = {}
    for recs in doomed.values():
        for rec in recs:
            records.setdefault(rec.key, rec)
    for rec in records.values():
        rec.old_runs = [r for r in rec.old_runs if r not in doomed]
        try:
            write_record(store, rec)
        except (RemoteConflict, RemoteError) as exc:  # the next sweep does it
            log.info("gc_tombstone_not_pruned", key=rec.key, error=str(exc))


def _list_runs(store: ObjectStore, lease: Lease, t0: float, runs: set[str],
               stale: set[str], skip: set[str]) -> tuple[list[str], list[str]]:
    """One listing of `runs/`: (live intents, manifests); stale intents go to
    `stale`; the runs in `skip` (deleted threads') count for nothing."""
    intents: list[str] = []
    manifests: list[str] = []
    for n, info in enumerate(store.list(RUNS_DIR + "/")):
        if n % 1000 == 0:
            _keep_alive(lease)
        parsed = parse_run_key(info.key)
        if parsed is None:
            continue
        run, kind, rest = parsed
        if run in skip:
            continue
        runs.add(run)
        if kind == "intents" and intent_of_name(rest):
            if info.last_modified >= t0 - INTENT_MAX_AGE:
                intents.append(info.key)
            else:
                stale.add(info.key)
        elif kind == "snapshots" and seq_of_manifest_name(rest) is not None:
            manifests.append(info.key)
    return intents, manifests


def _mark(store: ObjectStore, lease: Lease, t0: float, report: SweepReport,
          workers: int, tell: Callable[[str, int, int | None], None], skip: set[str]
          ) -> tuple[set[bytes], list[str]]:
    """(digests named by live intents and every manifest under the prefix, stale intents).

    Lists `runs/` again until a listing shows no intent or manifest that was
    not read yet (the fixpoint): an object gone when read (an intent whose
    manifest got published, a manifest retention retired) had a successor
    that names its chunks, PUT before it went, so the next listing shows it.
    """
    runs: set[str] = set()
    stale: set[str] = set()
    seen: set[str] = set()
    marked: set[bytes] = set()

    def read_intent(key: str) -> set[bytes]:
        try:
            data = store.get(key, max_bytes=MAX_INTENT_BYTES).data
        except RemoteNotFound:
            return set()  # its publication finished: the next listing shows its manifest
        if len(data) % 16:
            raise GcError(f"intent {key} is damaged ({len(data)} bytes); nothing deleted")
        return {data[i:i + 16] for i in range(0, len(data), 16)}

    def read_manifest(key: str) -> set[bytes]:
        run, _, rest = parse_run_key(key)
        try:
            data = store.get(key, max_bytes=MAX_MANIFEST_BYTES).data
        except RemoteNotFound:
            return set()  # retired meanwhile: the next listing shows its successor
        try:
            return decode(data, run=run, seq=seq_of_manifest_name(rest),
                          keep_entries=False).chunk_digests()
        except ManifestError as exc:
            raise GcError(f"{exc}; nothing was deleted (what it names is unknown). "
                          f"Inspect or delete {key} by hand") from None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for rounds in range(1, MAX_MARK_ROUNDS + 1):
            report.mark_rounds = rounds
            intents, manifests = _list_runs(store, lease, t0, runs, stale, skip)
            intents = [k for k in intents if k not in seen]
            manifests = [k for k in manifests if k not in seen]
            if not intents and not manifests:
                break
            seen.update(intents)
            seen.update(manifests)
            report.intents += len(intents)
            report.manifests += len(manifests)
            for got in pool.map(read_intent, intents):
                marked |= got
            _keep_alive(lease)
            done = report.manifests - len(manifests)
            for n, got in enumerate(pool.map(read_manifest, manifests)):
                marked |= got
                tell("manifests", done + n + 1, report.manifests)
                if n % 64 == 0:
                    _keep_alive(lease)
        else:
            raise GcError(f"the runs under {store.url} kept changing: {MAX_MARK_ROUNDS} "
                          "listings in a row each showed intents or manifests the one before "
                          "did not; nothing was deleted. Run the sweep again later")
    stale -= seen
    report.runs, report.stale_intents = len(runs), len(stale)
    return marked, sorted(stale)


def _sweep_chunks(store: ObjectStore, lease: Lease, t0: float, grace: float,
                  marked: set[bytes], report: SweepReport,
                  tell: Callable[[str, int, int | None], None]) -> None:
    batch: list[tuple[str, int]] = []

    def flush() -> None:
        if not batch:
            return
        if report.dry_run:
            _keep_alive(lease)
            report.would_delete += [k for k, _ in batch]
        else:
            _delete(store, lease, [k for k, _ in batch])
        report.deleted += len(batch)
        report.deleted_bytes += sum(size for _, size in batch)
        batch.clear()

    for n, info in enumerate(store.list(CHUNKS_DIR + "/")):
        if n % 1000 == 0:
            _keep_alive(lease)
        if n % 100 == 0:
            tell("chunks", n, None)
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
    tell("chunks", report.chunks, report.chunks)
