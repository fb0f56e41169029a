"""The remote tier of one mounted volume: lease, uploads, fetches, cache, publishing.

`RemoteTier` wires the pieces (`objstore`, `lease`, `uploader`, `fetcher`,
`chunkcache`, `publisher`, `resume`) into the daemon:

- Before the mount (blocking, in `Daemon.prepare`): `resume()` imports a
  published snapshot for `--from`; `attach()` checks that the store's remote
  is this one, takes the run's lease and checks the head (did the run move
  on elsewhere?). Both fail with a clear message, or leave the tier in a
  read-only state that says why.
- In the daemon's nursery (`start`): the uploader, the fetcher, the cache, the
  publisher, and the lease keeper.
- For the FUSE layer: `writable()`, `load_chunk()` (fetch on a cache miss,
  with a bounded wait, verified) and `on_read()` (readahead).

Lease states. `held`: this worker writes and publishes. `acquiring` (the
store was unreachable at mount) and `lapsed` (renewals failed for a whole
TTL: the store or the network is down): writes go on locally, nothing is
published, and the lease is taken again as soon as the store answers; if
meanwhile another worker took the run (or its head moved on), the state
becomes `lost`. `lost`: another worker holds the run: the mount is read-only
(EROFS on every write), the log and `vfsd status` say why, and nothing is
published again by this daemon.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import structlog
import trio

from vfsd import errors
from vfsd.snapshots.snapshots import drop_volume, parse_id, snapshot_id
from vfsd.store import remotestate
from vfsd.store.content import seed_pending
from vfsd.store.store import Store

from .chunkcache import ChunkCache
from .chunklink import ChunkLink
from .fetcher import Fetcher, ReadaheadWindow
from .head import Head, HeadError, UnknownRun, UnknownSnapshot, fence, read_head
from .layout import BadResumeSpec, parse_resume_spec
from .lease import Lease, LeaseHeld, Owner
from .manifest import ManifestError
from .objstore import RemoteError, RemoteUnavailable, RemoteURL
from .publisher import Publisher
from .resume import (
    ResumeError,
    check_importable,
    import_snapshot,
    load_snapshot,
    origin_of,
    volume_state,
)
from .uploader import Uploader

log = structlog.get_logger("vfsd.remote")

#: seconds a lease's lapse time may move by without it being a renewal (HTTP
#: dates have one-second resolution, and our own clock reads add a little)
RENEWAL_SEEN = 2.0
#: seconds between two looks at a lease held by another worker, while a mount waits
LEASE_POLL = 2.0


class RemoteStartupError(Exception):
    """The remote tier cannot start; the message is for the user."""


class RemoteTier(ChunkLink):
    """Everything remote for one daemon; see the module docstring."""

    def __init__(self, url: RemoteURL, config) -> None:
        self._open_bucket(url, config, RemoteStartupError)
        self.state = "acquiring"
        self.reason = "the run's lease is not taken yet"
        self.lease: Lease | None = None
        self.owner: Owner | None = None
        self.store = None
        self.snaps = None
        self.run_id = ""
        self.head: Head | None = None
        self.uploader: Uploader | None = None
        self.fetcher: Fetcher | None = None
        self.cache: ChunkCache | None = None
        self.publisher: Publisher | None = None
        self.readahead = ReadaheadWindow(config.remote_readahead_chunks)
        self.nursery: trio.Nursery | None = None
        self.imported: dict | None = None
        self.lease_errors = 0
        self._state_event = trio.Event()
        #: `wait(seconds, text)`: the mount is about to wait up to `seconds` for the
        #: reason `text` (the daemon tells `vfsd mount`, which says it at once)
        self.on_wait = lambda seconds, text: None
        #: `on_progress(phase, done, total)`: an import's entries written so far
        self.on_progress = lambda phase, done, total: None

    def _probe(self) -> RemoteError | None:
        """One bounded request before anything else at mount (HEAD bucket, a single
        attempt: at most connect + read timeout). None if the store answered; the
        error if it is unreachable or silent (transient). Errors that cannot heal
        (no such bucket, access denied, no credentials) raise RemoteStartupError."""
        bound = self.objstore.attempt_bound()
        self.on_wait(bound, f"reaching the object store for {self.url} (up to {bound:g} s)")
        try:
            self.objstore.check(deadline=time.monotonic())  # no retry after the first failure
        except RemoteUnavailable as exc:
            log.warning("remote_unreachable_at_mount", remote=str(self.url), error=str(exc))
            return exc
        except RemoteError as exc:
            raise RemoteStartupError(f"{exc} (remote {self.url}; this will not heal by "
                                     "waiting: fix the configuration)") from None
        return None

    def _acquire_waiting(self, lease: Lease, wait: float) -> None:
        """`lease.acquire()`, waiting up to `wait` seconds for another worker's lease to
        lapse (a crashed worker's does within its TTL), but not once its holder is seen
        renewing it: that worker is alive, and waiting longer is in vain. LeaseHeld if
        it is not taken. Blocks."""
        deadline = time.monotonic() + wait
        lapses_at: float | None = None
        while True:
            try:
                lease.acquire()
                return
            except LeaseHeld as held:
                now = time.monotonic()
                at = now + max(0.0, held.expires_in)
                if lapses_at is not None and at > lapses_at + RENEWAL_SEEN:
                    raise LeaseHeld(f"{held}; its holder renewed it while this mount waited, "
                                    "so it is alive", held.holder, held.expires_in) from None
                left = deadline - now
                if left <= 0:
                    raise
                if lapses_at is None:
                    self.on_wait(min(left, max(0.0, held.expires_in) + LEASE_POLL),
                                 f"{held}: waiting up to {min(left, held.expires_in + 1):.0f} s "
                                 "for it to lapse (a crashed worker's lease does; a live "
                                 "worker renews it, and then this mount is read-only)")
                lapses_at = at
                time.sleep(min(left, max(0.2, held.expires_in + 0.05), LEASE_POLL))

    # ============================================================ before mount

    def resume(self, store_dir: Path, spec: str, open_store) -> Store:
        """`--from RUN[@SNAPSHOT]`: download, check and import it (blocking); the
        store, opened once by `open_store(create=..., chunk_size=...)` (the
        daemon's own handle, which it keeps).

        Refusals before anything is written: a bad spec, a run or snapshot
        the bucket lacks, a manifest that does not check, a store that cannot
        hold it. The lease is taken only once all of that passed. An import
        that fails half way takes back what it wrote.
        """
        try:
            run, seq = parse_resume_spec(spec)
        except BadResumeSpec as exc:
            raise RemoteStartupError(str(exc)) from None
        opened: list[Store] = []

        def open_once(**kwargs) -> Store:
            opened.append(open_store(**kwargs))
            return opened[-1]

        try:
            return self._resume(store_dir, run, seq, open_once)
        except BaseException:
            for st in opened:
                st.close()
            raise

    def _resume(self, store_dir: Path, run: str, seq: int | None, open_store) -> Store:
        st = None
        if (store_dir / "lmdb" / "data.mdb").exists():
            try:
                st = open_store(create=False)
            except errors.NoSuchVolume:
                pass  # a shared store without this run dir's volume yet
        if volume_state(st) == "used":
            origin = origin_of(st)
            if origin and origin.get("run") == run and seq in (None, origin.get("seq")):
                log.info("resume_already_imported", run=run,
                         snapshot=snapshot_id(origin.get("seq") or 0))
                return st  # a restart of a resumed run dir: mount it as it is now
            raise RemoteStartupError(
                f"{store_dir} already holds files for this run dir; --from needs a new run "
                "dir (or one that was resumed from this very snapshot)")
        unreachable = self._probe()
        if unreachable is not None:
            raise RemoteStartupError(f"cannot resume run {run}: {unreachable}")
        try:
            if seq is None:
                seq = self._latest_published(run)
            snap = load_snapshot(self.objstore, run, seq)
            # Everything that can be checked before the lease is taken: a
            # resume bound to fail must not take it from (or fence out) a
            # worker that is only slow to renew. A store that exists gets
            # this run dir's volume now, to be checked (and dropped if refused).
            if st is None and (store_dir / "lmdb" / "data.mdb").exists():
                st = open_store(create=True, chunk_size=snap.chunk_size)
            if st is not None:
                try:
                    check_importable(st, snap, str(self.url))
                except ResumeError:
                    if volume_state(st) != "used":
                        drop_volume(st, st.volume)
                    raise
        except (UnknownRun, UnknownSnapshot, ManifestError, HeadError, ResumeError) as exc:
            raise RemoteStartupError(str(exc)) from None
        except RemoteError as exc:
            raise RemoteStartupError(f"cannot read run {run} from {self.url}: {exc}") from None
        self.owner = Owner.me()
        lease = Lease(self.objstore, run, ttl=self.config.remote_lease_ttl, owner=self.owner)
        generation = 0
        latest = snap.head.latest
        try:
            self._acquire_waiting(lease, self.config.lease_wait)
            self.head, _ = fence(self.objstore, run, lease.generation)
            generation = lease.generation
            latest = self.head.latest
            self.lease = lease
            self._set_state("held", "")
        except LeaseHeld as exc:
            self.run_id = run
            self._lose(f"the run's lease is held by another worker ({exc})")
        except (RemoteError, HeadError) as exc:
            lease.release()  # held but not fenced: the next worker need not wait a TTL
            if st is not None:
                drop_volume(st, st.volume)
            raise RemoteStartupError(f"cannot take the lease of run {run}: {exc}") from None
        try:
            if st is None:
                st = open_store(create=True, chunk_size=snap.chunk_size)
            record = import_snapshot(st, snap, remote_url=str(self.url),
                                     latest=max(latest, seq), owner_token=self.owner.token,
                                     generation=generation, on_progress=self.on_progress)
        except (ResumeError, errors.StoreError, errors.StoreVersionError) as exc:
            if self.lease is not None:
                self.lease.release()
            raise RemoteStartupError(str(exc)) from None
        except BaseException:
            if self.lease is not None:
                self.lease.release()
            raise
        self.imported = {"run": run, "snapshot": snapshot_id(seq), "files": len(snap.state),
                         "manifests": len(snap.chain)}
        log.info("resumed", run=run, snapshot=snapshot_id(seq), objects=len(snap.state),
                 manifests=len(snap.chain), generation=generation, step=record["step"])
        return st

    def _latest_published(self, run: str) -> int:
        """`--from RUN`: the run's latest published snapshot (UnknownRun, UnknownSnapshot)."""
        head = read_head(self.objstore, run)
        if head is None:
            raise UnknownRun(f"run {run} is unknown in {self.url} (no runs/{run}/head); "
                             "`vfsd remote ls` lists the runs there")
        if not head.latest:
            raise UnknownSnapshot(f"run {run} has published no snapshot in {self.url} yet")
        log.info("resume_latest", run=run, snapshot=snapshot_id(head.latest))
        return head.latest

    def attach(self, store, snaps) -> None:
        """Bind to the opened store; take the lease unless `resume` did (blocking)."""
        self.store, self.snaps = store, snaps
        self.run_id = store.run_id
        if snaps.state()["changed"] and store.dirty_since is None:
            store.dirty_since = time.time()  # changed before this process: since when is lost
        current = remotestate.remote_url(store)
        if current is not None and current != str(self.url):
            raise RemoteStartupError(
                f"the store at {store.dir} keeps its chunks in {current}; mount it with "
                f"--remote {current} (a store has one remote)")
        unreachable = None
        if self.lease is None and self.state != "lost":  # (a resume reached the store)
            unreachable = self._probe()
            if unreachable is not None and current is None:
                # Never reached: far more often a wrong endpoint, a firewall (the
                # unit's IPAddressAllow=) or a typo than an outage.
                raise RemoteStartupError(
                    f"{unreachable}; a store goes remote only once its bucket has answered: "
                    "check the endpoint (remote_endpoint_url, AWS_ENDPOINT_URL) and that the "
                    "network reaches it (a systemd unit's IPAddressAllow=)")
        if current is None:
            with store.txn(write=True) as txn:
                remotestate.set_remote_url(txn, store, str(self.url))
            added = seed_pending(store)
            log.info("store_goes_remote", remote=str(self.url), chunks_to_upload=added)
        token = remotestate.volume_meta(store, b"remote_owner")
        if token is None:
            token = (self.owner or Owner.me()).token.encode()
            with store.txn(write=True) as txn:
                remotestate.set_volume_meta(txn, store, b"remote_owner", token)
        if self.owner is None or self.owner.token.encode() != token:
            me = Owner.me()
            self.owner = Owner(me.host, me.pid, token.decode())
        self._make_chunk_pieces(store)
        self.publisher = Publisher(self)
        self.publisher.load()
        if self.lease is None and self.state != "lost":
            try:
                if unreachable is not None:
                    raise unreachable
                self._take_lease_now()
            except RemoteUnavailable as exc:
                self._set_state("acquiring", f"object store unreachable ({exc}); writes stay "
                                             "local until the run's lease is taken")
                log.warning("lease_not_taken_at_mount", error=str(exc))
            except RemoteError as exc:
                raise RemoteStartupError(f"cannot take the lease of run {self.run_id} in "
                                         f"{self.url}: {exc}") from None
        self.publisher.head = self.head

    # ------------------------------------------------------------ lease checks

    def _take_lease_now(self) -> None:
        """Take the lease and check the head, applying the outcome (blocking; the
        LMDB writes happen on the calling thread)."""
        outcome = self._try_lease(self.config.lease_wait)
        self._apply_lease(outcome, blocking=True)

    def _try_lease(self, wait: float = 0.0) -> tuple:
        """In a worker thread: (verdict, lease, head, reason). RemoteError passes up."""
        lease = Lease(self.objstore, self.run_id, ttl=self.config.remote_lease_ttl,
                      owner=self.owner)
        try:
            self._acquire_waiting(lease, wait)
        except LeaseHeld as exc:
            return "lost", None, None, f"the run's lease is held by another worker ({exc})"
        try:
            head = read_head(self.objstore, self.run_id)
        except HeadError as exc:
            lease.release()
            return "lost", None, None, str(exc)
        return "check", lease, head, ""

    def _apply_lease(self, outcome: tuple, *, blocking: bool) -> tuple | None:
        """Decide from the head whether this volume may go on writing the run.
        Returns what still needs a network fence (lease, head) or None."""
        verdict, lease, head, reason = outcome
        if verdict == "lost":
            self._lose(reason)
            return None
        ours = remotestate.generation(self.store)
        mine = {g for g in (ours, self._meta_u64(b"remote_gen_next")) if g}
        if head is None:
            if ours:
                lease.release()
                self._lose(f"the head of run {self.run_id} is gone from {self.url}, though "
                           "this volume published there before")
                return None
        elif head.generation != lease.generation and head.generation not in mine:
            lease.release()
            latest = f"s{head.latest}" if head.latest else "nothing yet"
            self._lose(f"run {self.run_id} moved on elsewhere (its head was written by lease "
                       f"generation {head.generation}; latest published: {latest}); resume it "
                       f"in a new run dir with --from {self.run_id}@s{head.latest or 1}")
            return None
        if head is not None and head.generation == lease.generation:
            self._hold(lease, head)
            return None
        with self.store.txn(write=True) as txn:
            remotestate.set_volume_meta(txn, self.store, b"remote_gen_next",
                                        lease.generation.to_bytes(8, "big"))
        if blocking:
            fenced, _ = fence(self.objstore, self.run_id, lease.generation)
            self._fenced(lease, fenced)
            return None
        return lease, head

    def _fenced(self, lease: Lease, head: Head) -> None:
        with self.store.txn(write=True) as txn:
            remotestate.set_generation(txn, self.store, lease.generation)
        self._hold(lease, head)

    def _hold(self, lease: Lease, head: Head) -> None:
        self.lease = lease
        self.head = head
        if self.publisher is not None:
            self.publisher.head = head
            self.publisher.kick()
        self._set_state("held", "")
        log.info("lease_held", run=self.run_id, generation=lease.generation)

    def _meta_u64(self, key: bytes) -> int:
        raw = remotestate.volume_meta(self.store, key)
        return int.from_bytes(raw, "big") if raw else 0

    def _set_state(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        self._state_event.set()
        self._state_event = trio.Event()

    def _lose(self, reason: str) -> None:
        if self.state != "lost":
            log.error("read_only", run=self.run_id, reason=reason,
                      detail="another worker holds this run: writes now fail with EROFS")
        self._set_state("lost", reason)
        self.lease = None

    def lease_taken_over(self) -> bool:
        return self.lease is not None and self.lease.taken_over

    def lease_lost(self, reason: str, *, definitive: bool) -> None:
        """The publisher or the keeper learnt that the lease is gone."""
        if definitive:
            self._lose(reason)
        elif self.state == "held" and (self.lease is None or not self.lease.valid):
            self._set_state("lapsed", reason)  # the keeper takes it again

    def can_publish(self) -> bool:
        return self.state == "held" and self.lease is not None and self.lease.valid

    # ================================================================== in trio

    async def start(self, nursery: trio.Nursery) -> None:
        """Start every background task of the tier in the daemon's nursery."""
        await self._start_chunk_pieces(nursery)
        self.store.on_chunk_files = self._on_chunk_files
        await nursery.start(self.publisher.run)
        nursery.start_soon(self._keep_lease)

    async def _keep_lease(self) -> None:
        failures = 0
        while self.state != "lost":
            if self.state == "held" and self.lease is not None:
                await self.lease.keep_renewed()
                if self.state == "lost":
                    return
                if self.lease is not None and self.lease.taken_over:
                    self._lose(f"lease taken over: {self.lease.lost_reason}")
                    return
                reason = self.lease.lost_reason if self.lease else "lost"
                self._set_state("lapsed", f"lease lapsed ({reason}); writes stay local until "
                                          "it is taken again")
                log.warning("lease_lapsed", run=self.run_id, reason=reason)
                self.lease = None
            try:
                outcome = await trio.to_thread.run_sync(self._try_lease, abandon_on_cancel=True)
                todo = self._apply_lease(outcome, blocking=False)
                if todo is not None:
                    lease, _ = todo
                    fenced, _ = await trio.to_thread.run_sync(
                        fence, self.objstore, self.run_id, lease.generation,
                        abandon_on_cancel=True)
                    self._fenced(lease, fenced)
                failures = 0
            except Exception as exc:  # noqa: BLE001 - retried; the mount stays up
                failures += 1
                self.lease_errors += 1
                if not isinstance(exc, RemoteError | HeadError):
                    log.exception("lease_keeper_failed")
                self.reason = (f"object store unreachable ({exc}); writes stay local until "
                               "the run's lease is taken")
                await trio.sleep(min(10.0, 0.5 * 2 ** min(failures, 5)))

    # ------------------------------------------------------------- FUSE hooks

    def writable(self) -> bool:
        return self.state != "lost"

    def kick(self) -> None:
        """A snapshot was taken."""
        if self.publisher is not None:
            self.publisher.kick()

    # ------------------------------------------------------------------ sync

    async def sync(self, ident: str | None, timeout: float) -> dict:
        """Wait until a snapshot (default: the latest) is published."""
        if ident is None:
            last = self.snaps.state()["last"]
            if last is None:
                return {"published": None, "run": self.run_id, "remote": str(self.url),
                        "message": "no snapshot yet: nothing to publish"}
            seq = parse_id(last)
        else:
            seq = parse_id(ident)
        done = await self.publisher.wait_published(seq, timeout)
        return {"published": snapshot_id(seq), "run": self.run_id, "remote": str(self.url),
                "snapshot": done}

    # ---------------------------------------------------------------- status

    def status(self) -> dict:
        counts = remotestate.counts(self.store)
        up = self.uploader.status() if self.uploader else {}
        pub = self.publisher.status() if self.publisher else {}
        oldest = [t for t in (
            self.store.dirty_since,
            pub.get("oldest_unpublished_ns") and pub["oldest_unpublished_ns"] / 1e9,
            self._oldest_pending()) if t]
        lease = self.lease
        errors_seen = [e for e in (pub.get("last_error"), up.get("last_error"),
                                   self.fetcher.last_error if self.fetcher else None) if e]
        return {
            "url": str(self.url),
            "run": self.run_id,
            "state": self.state,
            "read_only": self.state == "lost",
            "reason": self.reason or None,
            "lease": {"generation": lease.generation if lease else None,
                      "valid_for_s": round(lease.remaining(), 1) if lease else 0.0,
                      "errors": self.lease_errors},
            "backlog": {"chunks": counts["upload_chunks"], "bytes": counts["upload_bytes"],
                        "unpublished_chunks": counts["unpublished_chunks"],
                        "unpublished_bytes": counts["unpublished_bytes"],
                        "queued": up.get("queued", 0), "in_flight": up.get("in_flight", 0)},
            "oldest_unpublished_change_age_s":
                round(max(0.0, time.time() - min(oldest)), 1) if oldest else None,
            "uploads": {k: up.get(k) for k in ("uploaded", "existed", "failed", "retries",
                                               "sent_bytes", "store_down_for")},
            "publisher": pub,
            "fetcher": self.fetcher.status() if self.fetcher else {},
            "cache": self.cache.status() if self.cache else {},
            "imported": self.imported,
            "last_error": errors_seen[0] if errors_seen else None,
            "requests": dict(self.objstore.stats),
        }

    def _oldest_pending(self) -> float | None:
        with self.store.txn() as txn:
            ns = remotestate.oldest_pending_ns(txn, self.store.db, limit=20_000)
        return ns / 1e9 if ns else None

    def publish_status(self) -> dict:
        """Per snapshot: published or not (for `vfsd sync` and the checkpointer)."""
        pub = self.publisher
        snaps = self.snaps.list()
        return {
            "run": self.run_id, "remote": str(self.url), "state": self.state,
            "reason": self.reason or None,
            "latest": snaps[-1]["id"] if snaps else None,
            "published": pub.status()["published"],
            "snapshots": [{"id": s["id"], "step": s["step"],
                           "published": s["seq"] in pub.published,
                           "full": pub.published.get(s["seq"], {}).get("full")}
                          for s in snaps],
            "backlog": remotestate.counts(self.store),
            "last_error": pub.last_error,
        }

    # -------------------------------------------------------------- shutdown

    def close(self) -> None:
        """Release the lease (bounded wait) and stop the client. After trio ends."""
        lease = self.lease
        if lease is not None and self.state == "held":
            t = threading.Thread(target=lease.release, daemon=True)
            t.start()
            t.join(5.0)
        self.objstore.close()

