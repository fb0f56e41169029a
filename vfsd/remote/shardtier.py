"""The remote tier of a shard daemon: one set of chunk pieces, one run tier per volume.

A shard (`vfsd.shard`) serves many threads from one store. With a remote,
its store is a cache of the bucket (`vfsd.remote`): the truth about a thread
is the bucket's thread record, its run's head and manifests, and the saver's
checkpoints. What the store's chunks need is shared: one object store client,
uploader, fetcher and chunk cache per shard (`ShardTier`), since chunks are
content-addressed and store-wide. What a run needs is per volume
(`VolumeTier`): its run id, lease, head and publisher, which exist only while
a run holds the thread (`start_run` .. `end_run`, driven by the control ops
`remote_begin` and `remote_end`, `vfsd.replicas`). An idle thread costs no
request to the bucket.

A volume is written only while a run holds it: outside a run its files can
be read (chunks it lacks are fetched), but every write is EROFS and every
change of its snapshots is refused (`read_only`), since nothing written
then could be published, and another replica would never see it. During a
run: `held` (the lease is ours: snapshots are published in the background),
`lapsed` (renewals failed for a whole TTL, the store being unreachable:
writes stay local, nothing is published, the lease is taken again when the
store answers, unless another replica took the run meanwhile), `lost`
(another replica holds the run: EROFS, and every publication, `sync` and
`remote_end` says so).

Each run has its own tasks in the shard's nursery, under one cancel scope:
the publisher, the lease keeper, and a watch on the process that began the
run (its pid from the control socket's peer credentials): a run whose
process is gone without `remote_end` is ended by the shard, publishing what
it can within one lease TTL, so the thread is free for its next run at once.
"""

from __future__ import annotations

import os
import threading
import time

import structlog
import trio

from vfsd.snapshots.snapshots import parse_id, snapshot_id
from vfsd.store import remotestate
from vfsd.store.content import seed_pending

from .chunkcache import ChunkCache
from .chunklink import ChunkLink
from .fetcher import Fetcher, ReadaheadWindow
from .head import Head, HeadError, fence, read_head
from .lease import Lease, LeaseHeld, Owner
from .objstore import RemoteError, RemoteUnavailable, RemoteURL
from .publisher import NotPublishable, Publisher
from .uploader import Uploader

log = structlog.get_logger("vfsd.remote")

#: store-wide meta key (the base handle's own): the lease owner token of this shard
OWNER_KEY = b"remote_owner"
#: snapshot ids a run announces ahead in its lease (`seq_floor`), so a snapshot
#: seldom waits for a lease write
SEQ_RESERVE = 8
#: a predecessor's floor further than this above what is known is damaged: ignored
SEQ_FLOOR_SLACK = 1_000_000


def seq_floor(record: dict | None) -> int:
    """The `seq_floor` a lease record announces (0: none, or damaged)."""
    got = (record or {}).get("seq_floor")
    if not isinstance(got, int) or isinstance(got, bool) or not 0 <= got < 1 << 62:
        return 0
    return got


class ShardTierError(Exception):
    """The shard's remote tier cannot start; the message is for the user."""


class ShardTier(ChunkLink):
    """The chunk pieces one shard shares; see the module docstring."""

    def __init__(self, url: RemoteURL, config) -> None:
        self._open_bucket(url, config, ShardTierError)
        self.store = None
        self.owner: Owner | None = None
        self.uploader: Uploader | None = None
        self.fetcher: Fetcher | None = None
        self.cache: ChunkCache | None = None
        self.readahead = ReadaheadWindow(0)  # per volume: `VolumeTier`
        self.nursery: trio.Nursery | None = None
        #: volume name -> its tier, while a run holds it
        self.running: dict[str, VolumeTier] = {}

    def attach(self, store) -> None:
        """Bind to the shard's store (blocking: before the mount). The store's
        bucket must be this one; a store goes remote only once the bucket answered."""
        self.store = store
        current = remotestate.remote_url(store)
        if current is not None and current != str(self.url):
            raise ShardTierError(f"the store at {store.dir} keeps its chunks in {current}; "
                                 f"serve it with --remote {current} (a store has one remote)")
        try:
            self.objstore.check(deadline=time.monotonic())
        except RemoteUnavailable as exc:
            if current is None:
                raise ShardTierError(
                    f"{exc}; a store goes remote only once its bucket has answered: check "
                    "the endpoint (remote_endpoint_url, AWS_ENDPOINT_URL) and that the "
                    "network reaches it") from None
            log.warning("remote_unreachable_at_start", remote=str(self.url), error=str(exc))
        except RemoteError as exc:
            raise ShardTierError(f"{exc} (remote {self.url}; this will not heal by waiting: "
                                 "fix the configuration)") from None
        if current is None:
            with store.txn(write=True) as txn:
                remotestate.set_remote_url(txn, store, str(self.url))
            added = seed_pending(store)
            log.info("store_goes_remote", remote=str(self.url), chunks_to_upload=added)
        token = remotestate.volume_meta(store, OWNER_KEY)
        if token is None:
            token = Owner.me().token.encode()
            with store.txn(write=True) as txn:
                remotestate.set_volume_meta(txn, store, OWNER_KEY, token)
        me = Owner.me()
        self.owner = Owner(me.host, me.pid, token.decode())
        self._make_chunk_pieces(store)
        # Before any volume's view is made: views copy the hook.
        store.on_chunk_files = self._on_chunk_files

    async def start(self, nursery: trio.Nursery) -> None:
        await self._start_chunk_pieces(nursery)

    def volume_tier(self, volume) -> VolumeTier:
        return VolumeTier(self, volume)

    def status(self) -> dict:
        return {"url": str(self.url), "runs": sorted(self.running),
                "uploads": self.uploader.status() if self.uploader else {},
                "fetcher": self.fetcher.status() if self.fetcher else {},
                "cache": self.cache.status() if self.cache else {},
                "backlog": remotestate.counts(self.store) if self.store else {},
                "requests": dict(self.objstore.stats)}

    def close(self) -> None:
        """Give back every lease still held (bounded wait), stop the client. After
        trio ends: snapshots not published stay local (the next run here drops
        them, as after a crash); releasing lets the thread's next run start at once."""
        leases = [t.lease for t in self.running.values() if t.lease is not None]
        threads = [threading.Thread(target=lease.release, daemon=True) for lease in leases]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.objstore.close()


class Run:
    """One run holding one thread on this shard."""

    def __init__(self, run_id: str, key: str, lease: Lease, *, token: str | None,
                 owner_pid: int) -> None:
        self.run_id = run_id
        self.key = key
        self.lease = lease
        self.generation = lease.generation
        self.token = token
        #: the process that began the run, and when it started (a pid can be reused)
        self.owner_pid = owner_pid
        self.owner_start = process_start(owner_pid) if owner_pid else None
        self.started = time.monotonic()
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.renewals = 0
        self.extending = False
        self.announcing = trio.Lock()

    def floor(self) -> int:
        """The highest snapshot id the run's lease announces it may use."""
        return seq_floor(self.lease.extra)

    def describe(self) -> dict:
        return {"run": self.run_id, "generation": self.generation, "token": self.token,
                "pid": self.owner_pid or None,
                "held_for_s": round(time.monotonic() - self.started, 1)}


class VolumeTier(ChunkLink):
    """The remote tier as one served volume of a shard sees it (module docstring)."""

    def __init__(self, shard: ShardTier, volume) -> None:
        self.shard = shard
        self.volume_name = volume.name
        self.store = volume.store
        self.snaps = volume.snapshots
        self.config = shard.config
        self.url = shard.url
        self.objstore = shard.objstore
        self.uploader = shard.uploader
        self.fetcher = shard.fetcher
        self.cache = shard.cache
        self.readahead = ReadaheadWindow(shard.config.remote_readahead_chunks)
        self.state = "idle"
        self.reason = "no run holds this thread here: writes wait for remote_begin"
        self.run: Run | None = None
        self.publisher: Publisher | None = None
        self.head: Head | None = None
        self.lease_errors = 0
        self.imported = None

    # ---------------------------------------------------------- for Publisher

    @property
    def lease(self) -> Lease | None:
        return self.run.lease if self.run is not None else None

    @property
    def run_id(self) -> str:
        return self.run.run_id if self.run is not None else self.store.run_id

    @property
    def nursery(self) -> trio.Nursery:
        return self.shard.nursery

    def can_publish(self) -> bool:
        return self.state == "held" and self.lease is not None and self.lease.valid

    def lease_taken_over(self) -> bool:
        return self.lease is not None and self.lease.taken_over

    def lease_lost(self, reason: str, *, definitive: bool) -> None:
        """The publisher learnt that the lease is gone."""
        if definitive:
            self._lose(reason)
        elif self.state == "held" and (self.lease is None or not self.lease.valid):
            self._set_state("lapsed", reason)  # the keeper takes it again

    def published_chunks(self, digests: set[bytes]) -> None:
        if self.cache.over():
            self.cache._wake.set()

    # ------------------------------------------------------------ FUSE hooks

    def writable(self) -> bool:
        return self.state in ("held", "lapsed")

    def snapshots_writable(self) -> bool:
        """Whether snapshots may be taken, deleted or pinned (only during a run)."""
        return self.writable()

    def kick(self) -> None:
        """A snapshot was taken: publish it; announce more ids ahead if few are left."""
        if self.publisher is not None:
            self.publisher.kick()
        run = self.run
        if run is not None and self.state == "held" and not run.extending and \
                run.floor() - self.store.meta_u64(b"snap_seq") < SEQ_RESERVE // 2:
            run.extending = True
            self.nursery.start_soon(self._extend_floor, run)

    async def before_snapshot(self) -> None:
        """Before a snapshot takes the next id: that id must be announced in the
        run's lease (`seq_floor`), so a successor after a crash never gives the
        same id to other files (a checkpoint may name it before it is published).
        NotPublishable when it cannot be announced now."""
        run = self.run
        if run is None:
            return
        need = self.store.meta_u64(b"snap_seq") + 1
        if need <= run.floor():
            return
        try:
            await self._announce(run, need + SEQ_RESERVE - 1)
        except Exception as exc:  # noqa: BLE001 - said to the caller, nothing taken
            raise NotPublishable(f"snapshot id s{need} cannot be announced in the run's "
                                 f"lease ({exc}); no snapshot was taken") from None

    async def _extend_floor(self, run: Run) -> None:
        try:
            await self._announce(run, self.store.meta_u64(b"snap_seq") + SEQ_RESERVE)
        except Exception as exc:  # noqa: BLE001 - the next snapshot tries again
            log.info("seq_floor_not_extended", volume=self.volume_name, error=str(exc))
        finally:
            run.extending = False

    async def _announce(self, run: Run, floor: int) -> None:
        """Write `floor` into the run's lease (a renewal). Until one lands, the
        run uses no id above what the bucket has (a failed write falls back)."""
        async with run.announcing:
            lease = run.lease
            old = seq_floor(lease.extra)
            if floor <= old:
                return
            lease.extra["seq_floor"] = floor
            try:
                await trio.to_thread.run_sync(lease.renew, abandon_on_cancel=True)
            except BaseException:
                if lease.extra.get("seq_floor") == floor:
                    lease.extra["seq_floor"] = old
                raise

    # ---------------------------------------------------------------- states

    def _set_state(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason

    def _lose(self, reason: str) -> None:
        if self.state != "lost":
            log.error("run_lost", volume=self.volume_name, run=self.run_id, reason=reason,
                      detail="another replica holds the thread's run: writes fail with EROFS")
        self._set_state("lost", reason)

    # ------------------------------------------------------------ a run

    def start_run(self, run: Run, head: Head) -> None:
        """The thread's run is ours from now on (its lease taken, its head fenced
        and this volume's history made the head's): publish, keep the lease, and
        watch the process that began it."""
        self.run = run
        self.head = head
        self._set_state("held", "")
        self.publisher = Publisher(self)
        self.publisher.load()
        self.publisher.head = head
        self.shard.running[self.volume_name] = self
        self.nursery.start_soon(self._run_tasks, run)
        log.info("run_begun", volume=self.volume_name, run=run.run_id,
                 generation=run.generation, pid=run.owner_pid or None)

    async def _run_tasks(self, run: Run) -> None:
        try:
            with run.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.publisher.run)
                    nursery.start_soon(self._keep_lease, run)
                    if run.owner_pid:
                        nursery.start_soon(self._watch_owner, run)
        except Exception as exc:  # noqa: BLE001 - a bug ends this run, never the shard
            log.exception("run_tasks_failed", volume=self.volume_name, run=run.run_id)
            self._lose(f"internal error ({type(exc).__name__}: {exc}); nothing more is "
                       "published by this run")
        finally:
            run.done.set()

    async def end_run(self, *, release: bool = True) -> dict:
        """Stop the run's tasks and give its lease back (if still ours). Idempotent."""
        run = self.run
        if run is None:
            return {"ended": False}
        run.scope.cancel()
        await run.done.wait()
        if self.publisher is not None:
            self.publisher.close()
        lease = run.lease
        released = False
        if release and lease is not None and lease.valid:
            if not (self.publisher and self.publisher.unpublished()):
                # Every id used is published: the next run goes on from the last.
                lease.extra["seq_floor"] = self.store.meta_u64(b"snap_seq")
            released = await trio.to_thread.run_sync(lease.release)
        self.run = None
        self.publisher = None
        self.shard.running.pop(self.volume_name, None)
        state = self.state
        self._set_state("idle", "no run holds this thread here: writes wait for remote_begin")
        log.info("run_ended", volume=self.volume_name, run=run.run_id, released=released,
                 state=state)
        return {"ended": True, "run": run.run_id, "generation": run.generation,
                "released": released, "state": state,
                "renewals": run.renewals + (lease.renewals if lease is not None else 0)}

    async def _keep_lease(self, run: Run) -> None:
        """Renew the run's lease; after a lapse, take it again unless another
        replica took the run (then the run is lost)."""
        failures = 0
        while self.state != "lost":
            lease = run.lease
            await lease.keep_renewed()
            if lease.taken_over:
                self._lose(f"lease taken over: {lease.lost_reason}")
                return
            self._set_state("lapsed", f"lease lapsed ({lease.lost_reason}); writes stay "
                                      "local, nothing is published until it is taken again")
            log.warning("run_lease_lapsed", volume=self.volume_name, run=run.run_id)
            while True:
                try:
                    got = await trio.to_thread.run_sync(self._take_again, run,
                                                        abandon_on_cancel=True)
                except (RemoteError, HeadError) as exc:
                    failures += 1
                    self.lease_errors += 1
                    self.reason = f"object store unreachable ({exc}); writes stay local"
                    await trio.sleep(min(10.0, 0.5 * 2 ** min(failures, 5)))
                    continue
                if got is None:
                    return  # lost: said by _take_again
                new, head = got
                run.renewals += lease.renewals
                run.lease, run.generation = new, new.generation
                self.head = head
                self.publisher.head = head
                self._set_state("held", "")
                self.publisher.kick()
                failures = 0
                break

    def _take_again(self, run: Run) -> tuple[Lease, Head] | None:
        """In a worker thread: the lease again, if nobody else wrote the head since
        this run fenced it; None (the run lost) otherwise."""
        lease = Lease(self.objstore, run.run_id, ttl=self.config.remote_lease_ttl,
                      owner=self.shard.owner, extra={"seq_floor": run.floor()})
        try:
            lease.acquire()
        except LeaseHeld as exc:
            self._lose(f"another replica holds the thread's run now ({exc})")
            return None
        head = read_head(self.objstore, run.run_id)
        if head is None or head.generation != run.generation:
            lease.release()
            self._lose(f"the run moved on while this replica could not reach the store "
                       f"(head written by generation {head.generation if head else '?'})")
            return None
        fenced, _ = fence(self.objstore, run.run_id, lease.generation, thread=run.key)
        return lease, fenced

    async def _watch_owner(self, run: Run) -> None:
        """End the run once the process that began it is gone (no remote_end came)."""
        if run.owner_start is None:
            await trio.sleep_forever()  # not a process this daemon can see
        await wait_for_exit(run.owner_pid, run.owner_start)
        if self.run is not run:
            return
        log.warning("run_owner_gone", volume=self.volume_name, run=run.run_id,
                    pid=run.owner_pid, detail="ending the run: publishing what it "
                    "snapshotted (one lease TTL at most), then releasing the thread")
        self.nursery.start_soon(self._end_orphan, run)

    async def _end_orphan(self, run: Run) -> None:
        if self.run is not run:
            return
        last = self.snaps.state()["last"]
        if last is not None and self.publisher is not None:
            try:
                await self.publisher.wait_published(parse_id(last),
                                                    self.config.remote_lease_ttl)
            except Exception as exc:  # noqa: BLE001 - what is left is lost, as in a crash
                log.warning("orphan_run_unpublished", volume=self.volume_name, error=str(exc))
        if self.run is run:
            await self.end_run()

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
        published = remotestate.published(self.store)
        if seq in published:
            return {"published": snapshot_id(seq), "run": self.run_id,
                    "remote": str(self.url), "snapshot": {"id": snapshot_id(seq),
                                                          **published[seq]}}
        if self.publisher is None:
            raise NotPublishable(f"snapshot {snapshot_id(seq)} is not published and no run "
                                 "holds this thread here (remote_begin starts one)")
        done = await self.publisher.wait_published(seq, timeout)
        return {"published": snapshot_id(seq), "run": self.run_id, "remote": str(self.url),
                "snapshot": done}

    # ---------------------------------------------------------------- status

    def status(self) -> dict:
        pub = self.publisher.status() if self.publisher else {}
        lease = self.lease
        return {
            "url": str(self.url), "run": self.run_id, "state": self.state,
            "read_only": not self.writable(), "reason": self.reason or None,
            "holder": self.run.describe() if self.run else None,
            "lease": {"generation": lease.generation if lease else None,
                      "valid_for_s": round(lease.remaining(), 1) if lease else 0.0,
                      "errors": self.lease_errors},
            "backlog": remotestate.counts(self.store),
            "publisher": pub,
            "fetcher": self.fetcher.status() if self.fetcher else {},
            "cache": self.cache.status() if self.cache else {},
            "last_error": pub.get("last_error"),
            "requests": dict(self.objstore.stats),
        }

    def publish_status(self) -> dict:
        published = remotestate.published(self.store)
        snaps = self.snaps.list()
        return {
            "run": self.run_id, "remote": str(self.url), "state": self.state,
            "reason": self.reason or None,
            "latest": snaps[-1]["id"] if snaps else None,
            "published": snapshot_id(max(published)) if published else None,
            "snapshots": [{"id": s["id"], "step": s["step"],
                           "published": s["seq"] in published,
                           "full": published.get(s["seq"], {}).get("full")}
                          for s in snaps],
            "backlog": remotestate.counts(self.store),
            "last_error": self.publisher.last_error if self.publisher else None,
        }


# ------------------------------------------------------------------ processes


def process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        return int(raw.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


async def wait_for_exit(pid: int, start: int | None = None) -> None:
    """Return once process `pid` has exited (a pidfd where the kernel has them,
    else a look at /proc every second)."""
    start = start if start is not None else process_start(pid)
    if start is None:
        return
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            if process_start(pid) != start:
                return  # gone, and its pid already reused
            await trio.lowlevel.wait_readable(fd)
            return
        finally:
            os.close(fd)
    while process_start(pid) == start:
        await trio.sleep(1.0)
