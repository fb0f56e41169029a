"""Any replica runs any thread: a shard's runs against its bucket.

A shard daemon with a remote (`vfsd mount --shard RUN --remote s3://B/P`)
serves threads whose truth is shared: the bucket's thread record and its
run's published snapshots (`vfsd.remote`), and the saver's checkpoints. Its
store is a cache. A graph run takes its thread for as long as it runs:

- `remote_begin`: the thread's record (made if new; a tombstone gives the id
  a new, empty run), the run's lease (waiting for another replica's run to
  end or lapse), the head fenced with the new lease generation, then the
  volume's history made exactly the head's (`vfsd.remote.history`) and its
  live files the head's latest snapshot. From then on the volume is written
  and its snapshots published.
- `remote_end`: every snapshot published, then the lease given back.
- `remote_delete`: the thread's record becomes a tombstone (taking the run's
  lease first, so no run of it is under way anywhere), its run's objects go,
  and the local volume.
- `remote_copy`: a new run with the source's published snapshots (manifests
  written again under the new run, no chunk copied) and a record for the
  target thread; the source's lease and history are not touched.

The ops' contract is in docs/control.md. Everything that waits on the
network runs in worker threads; long changes of a volume run in short
transactions while the volume is held, so other threads are served.
"""

from __future__ import annotations

import math
import time
from contextvars import ContextVar

import structlog
import trio

from vfsd.control.requests import RequestError, arg, peer
from vfsd.fuse.snapservice import drive
from vfsd.remote import history, threads
from vfsd.remote.bucketgc import delete_run_objects
from vfsd.remote.copyrun import CopyError, copy_run
from vfsd.remote.head import HeadError, fence, fetch_manifest
from vfsd.remote.lease import Lease, LeaseHeld, LeaseLost
from vfsd.remote.manifest import ManifestError
from vfsd.remote.objstore import RemoteError
from vfsd.remote.publisher import NotPublishable, PublishError, SyncTimeout
from vfsd.remote.resume import manifest_memory
from vfsd.remote.shardtier import (
    SEQ_FLOOR_SLACK,
    SEQ_RESERVE,
    Run,
    ShardTier,
    process_start,
    seq_floor,
)
from vfsd.snapshots.snapshots import drop_volume_in_steps, snapshot_id
from vfsd.store import remotestate
from vfsd.store.store import Store

from .errors import Exists, NoSuchVolume

log = structlog.get_logger("vfsd.replicas")

#: seconds between two looks at a lease another run holds, while a begin waits
LEASE_POLL = 0.5
#: a `token` (the caller's name for its run) is at most this long
MAX_TOKEN = 256
#: the requests the op being handled sent to the bucket so far (`ObjectStore.counted`)
_requests: ContextVar[list[int] | None] = ContextVar("requests", default=None)


def _remote_error(exc: Exception) -> RequestError:
    """The error reply for what the bucket said or did."""
    if isinstance(exc, threads.ThreadMismatch):
        return RequestError("wrong_thread", str(exc))
    if isinstance(exc, HeadError | ManifestError | threads.ThreadRecordError
                  | history.HistoryError):
        return RequestError("remote_damaged", str(exc))
    if isinstance(exc, SyncTimeout):
        return RequestError("timeout", str(exc))
    if isinstance(exc, NotPublishable):
        return RequestError("not_publishable", str(exc))
    return RequestError("remote_error", str(exc))


_REMOTE_ERRORS = (RemoteError, HeadError, ManifestError, threads.ThreadRecordError,
                  history.HistoryError)


class ThreadRuns:
    """The remote ops of a shard (see the module docstring)."""

    def __init__(self, shard, tier: ShardTier) -> None:
        self.shard = shard
        self.tier = tier
        self.config = shard.config
        self._locks: dict[str, trio.Lock] = {}
        self.ops = {"remote_begin": self.op_remote_begin, "remote_end": self.op_remote_end,
                    "remote_delete": self.op_remote_delete, "remote_copy": self.op_remote_copy,
                    "remote_runs": self.op_remote_runs, "remote_prune": self.op_remote_prune}

    def _lock(self, name: str) -> trio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = trio.Lock()
        return lock

    async def _in_thread(self, fn, *args):
        box = _requests.get()
        if box is None:
            return await trio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)
        return await trio.to_thread.run_sync(self.tier.objstore.counted, box, fn, *args,
                                             abandon_on_cancel=True)

    # ----------------------------------------------------------- arguments

    def _thread(self, req: dict, key: str = "thread") -> str:
        thread = self.shard._thread_arg(req, key)
        if thread is None:
            raise RequestError("bad_request", f"missing argument {key!r} (the thread's id)")
        return thread

    def _wait(self, req: dict) -> float:
        wait = arg(req, "wait", (int, float), self.config.lease_wait)
        if isinstance(wait, bool) or not 0 <= wait <= 86400 or math.isnan(wait):
            raise RequestError("bad_request", "'wait' must be 0 to 86400 seconds")
        return float(wait)

    def _token(self, req: dict) -> str | None:
        token = arg(req, "token", str, None)
        if token is not None and not 0 < len(token) <= MAX_TOKEN:
            raise RequestError("bad_request", f"'token' is 1 to {MAX_TOKEN} characters")
        return token

    def _running(self, name: str):
        """The served volume's tier while a run holds it here, else None."""
        vt = self.tier.running.get(name)
        return vt if vt is not None and vt.run is not None else None

    def _held_here(self, name: str, vt) -> RequestError:
        r = vt.run
        who = f"pid {r.owner_pid}" if r.owner_pid else "a process this daemon cannot see"
        return RequestError("lease_held", (
            f"thread {name!r} is held by a run on this replica ({self.tier.owner.host}, "
            f"begun by {who}{', token ' + repr(r.token) if r.token else ''}, for "
            f"{time.monotonic() - r.started:.0f} s): it ends with remote_end, or when that "
            "process exits"))

    # ------------------------------------------------------------ begin

    async def op_remote_begin(self, req: dict) -> dict:
        """Catch up with the bucket and hold the thread for one run."""
        name = self.shard._name_arg(req)
        thread = self._thread(req)
        wait = self._wait(req)
        force = arg(req, "force", bool, False)
        token = self._token(req)
        who = peer.get()
        pid = arg(req, "pid", int, who[0] if who else 0)
        if pid and process_start(pid) is None:
            raise RequestError("bad_request", f"'pid': no process {pid} here (the process "
                                              "whose life bounds the run; 0: none)")
        deadline = trio.current_time() + wait
        t0 = time.perf_counter()
        box = [0]
        token_var = _requests.set(box)
        try:
            out = await self._begin_waiting(name, thread, deadline, force, token, pid)
        finally:
            _requests.reset(token_var)
        if "again" not in out:
            out["duration_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            catch_up = out.pop("catch_up_requests", 0)
            out["requests"] = {"lease": box[0] - catch_up, "catch_up": catch_up}
        return out

    async def _begin_waiting(self, name: str, thread: str, deadline: float, force: bool,
                             token: str | None, pid: int) -> dict:
        while True:
            async with self._lock(name):
                vt = self._running(name)
                if vt is None:
                    return await self._begin(name, thread, deadline, force, token, pid)
                if token is not None and vt.run.token == token:
                    self.shard._check_thread(vt.store, thread)
                    return {**self._summary(vt), "again": True}
                done = vt.run.done
            # Another run of this thread on this replica: wait for it to end.
            with trio.move_on_at(deadline):
                await done.wait()
                continue
            raise self._held_here(name, vt)

    async def _begin(self, name: str, thread: str, deadline: float, force: bool,
                     token: str | None, pid: int) -> dict:
        view = self._local_volume(name, thread)
        for _attempt in range(4):
            try:
                rec, how = await self._in_thread(threads.live_record, self.tier.objstore,
                                                 name, thread, view.run_id)
            except _REMOTE_ERRORS as exc:
                raise _remote_error(exc) from None
            lease = await self._take_lease(rec.run, deadline, expect=how == "found",
                                           local_seq=view.meta_u64(b"snap_seq")
                                           if view.run_id == rec.run else 0)
            try:
                got = await self._fenced(rec, lease, name)
                if got is None:
                    await self._release(lease)
                    continue  # the record changed meanwhile (a delete, a new run): again
                head = got
                return await self._catch_up(name, thread, rec, how, lease, head, force,
                                            token, pid)
            except BaseException:
                await self._release(lease)
                raise
        raise RequestError("remote_error", f"the record of thread {name!r} keeps changing "
                                           "under this replica; try again")

    def _local_volume(self, name: str, thread: str) -> Store:
        """The thread's local volume, made (empty) if this replica has none."""
        st = self.shard.store
        try:
            view = st.view(name)
        except NoSuchVolume:
            with st.txn(write=True) as txn:
                try:
                    vol = st.create_volume(txn, name)
                except Exists:
                    vol = None
                if vol is not None:
                    txn.put(b"v" + vol.to_bytes(4, "big") + b":thread",
                            thread.encode("utf-8", "surrogatepass"), db=st.db["meta"])
            view = st.view(name)
        self.shard._check_thread(view, thread)
        if self.shard._recorded_thread(view) is None:
            view.set_meta_bytes(b"thread", thread.encode("utf-8", "surrogatepass"))
        return view

    async def _take_lease(self, run: str, deadline: float, *, expect: bool,
                          local_seq: int = 0) -> Lease:
        """The run's lease, waiting until `deadline` for another holder's to be
        released or to lapse; `lease_held` (naming the holder) after that. It
        announces the snapshot ids this run may use (`seq_floor`: above what
        this volume and the lease's previous holder used)."""
        lease = Lease(self.tier.objstore, run, ttl=self.config.remote_lease_ttl,
                      owner=self.tier.owner, extra_for=lambda previous: {
                          "seq_floor": max(local_seq, seq_floor(
                              previous.record if previous else None)) + SEQ_RESERVE})
        lease.expect_existing = expect
        while True:
            try:
                await self._in_thread(lease.acquire)
                return lease
            except LeaseHeld as held:
                left = deadline - trio.current_time()
                if left <= 0:
                    owner = held.holder.get("owner") if isinstance(held.holder, dict) else None
                    who = (f"{owner.get('host')} pid {owner.get('pid')}"
                           if isinstance(owner, dict) else "an unknown holder")
                    raise RequestError("lease_held", (
                        f"the thread's run {run} is held by {who}: it is released when "
                        "that run ends, or, if its holder has stopped renewing it (a "
                        f"crash), lapses in about {max(0.0, held.expires_in):.0f} s; try "
                        "again then, or wait longer ('wait')")) from None
                await trio.sleep(min(left, LEASE_POLL, max(0.05, held.expires_in + 0.05)))
            except RemoteError as exc:
                raise _remote_error(exc) from None

    async def _fenced(self, rec: threads.ThreadRecord, lease: Lease, name: str):
        """Fence the run's head with the lease's generation; the head, or None if
        the thread's record no longer names this run (read again after the lease,
        since a delete changes it only while holding the lease)."""
        try:
            head, _ = await self._in_thread(fence, self.tier.objstore, rec.run,
                                            lease.generation, name)
            now = await self._in_thread(threads.read_record, self.tier.objstore, name)
        except _REMOTE_ERRORS as exc:
            raise _remote_error(exc) from None
        if now is None or not now.live or now.run != rec.run or now.thread_id != rec.thread_id:
            return None
        return head

    async def _release(self, lease: Lease) -> None:
        with trio.move_on_after(10) as scope:
            scope.shield = True
            try:
                await trio.to_thread.run_sync(lease.release)
            except Exception as exc:  # noqa: BLE001 - it lapses instead
                log.warning("lease_release_failed", error=str(exc))

    async def _catch_up(self, name: str, thread: str, rec, how: str, lease: Lease, head,
                        force: bool, token: str | None, pid: int) -> dict:
        """The volume's history and live files made the head's; the run started."""
        volume, rebuilt = await self._volume_for_run(name, thread, rec.run)
        await volume.wait_free()  # a change a crash cut short is finished first
        st, snaps = volume.store, volume.snapshots
        plan = await self._in_thread(lambda: history.plan(
            st, snaps, head, keep_unpublished=how == "created"))
        if plan.rebuild:
            log.warning("volume_rebuilt", volume=name, why=plan.rebuild, run=rec.run)
            volume = await self._fresh_volume(name, thread, rec.run)
            st, snaps = volume.store, volume.snapshots
            plan = await self._in_thread(history.plan, st, snaps, head)
            rebuilt = True
        for d in plan.dropped:
            log.warning("snapshot_dropped", volume=name, snapshot=d["id"], why=d["why"])
        for d in plan.retired:
            log.info("snapshot_retired", volume=name, snapshot=d["id"], why=d["why"])
        imported = []
        # A planted manifest that would decompress past what memory allows is refused.
        budget = await self._in_thread(manifest_memory)
        source = history.ManifestSource(
            lambda seq: fetch_manifest(self.tier.objstore, rec.run, seq, max_raw=budget)[0])
        outer = _requests.get()
        box = [0]
        token_var = _requests.set(box)
        try:
            async with volume.hold():
                await _steps(history.clean_pending(st, snaps))
                if plan.truncate or plan.dropped:
                    await _steps(history.truncate(st, snaps, plan.above, plan.dropped))
                await _steps(history.retire(snaps, plan.retired))
                importer = history.Importer(st, snaps, head, source, plan.same)
                for seq in plan.imports:
                    prep = await self._in_thread(importer.prepare, seq)
                    await _steps(importer.apply(prep))
                    imported.append(snapshot_id(seq))
                # Ids a crashed predecessor announced are never given to other files.
                floor = seq_floor(lease.replaced)
                if floor > max(head.latest, st.meta_u64(b"snap_seq")) + SEQ_FLOOR_SLACK:
                    log.warning("seq_floor_ignored", volume=name, floor=floor)
                    floor = 0
                history.finish(st, snaps, head, floor)
        except _REMOTE_ERRORS as exc:
            raise _remote_error(exc) from None
        finally:
            _requests.reset(token_var)
            if outer is not None:
                outer[0] += box[0]
        restored = None
        latest = _latest(head)
        if latest and not await self._in_thread(self._live_is, st, snaps, latest):
            res = await volume.snapservice.restore(snapshot_id(latest), force=force)
            restored = res["id"]
        vt = volume.remote
        run = Run(rec.run, name, lease, token=token, owner_pid=pid)
        vt.start_run(run, head)
        return {**self._summary(vt), "record": how, "imported": imported,
                "dropped": [d["id"] for d in plan.dropped],
                "retired": [d["id"] for d in plan.retired], "rebuilt": rebuilt,
                "restored": restored, "manifests_fetched": source.fetched,
                "catch_up_requests": box[0]}

    @staticmethod
    def _live_is(st: Store, snaps, seq: int) -> bool:
        """Whether the live files are exactly snapshot `seq`."""
        state = snaps.state()
        return state["base"] == snapshot_id(seq) and not state["changed"] \
            and snaps.dirty_count() == 0

    def _summary(self, vt) -> dict:
        latest = _latest(vt.head) if vt.head else 0
        run = vt.run
        return {"volume": vt.volume_name, "run": run.run_id, "generation": run.generation,
                "latest": snapshot_id(latest) if latest else None,
                "snapshots": [s["id"] for s in vt.snaps.list()], "token": run.token}

    # ------------------------------------------------- the local volume

    async def _volume_for_run(self, name: str, thread: str, run: str):
        """(the served volume bound to `run`, whether it was made again): a
        volume of another run is made again (empty) unless it is empty
        already (then it takes the run's id)."""
        volume = self.shard.open_volume(name)
        view = volume.store if volume is not None else None
        if view is not None and view.run_id == run:
            return volume, False
        if view is not None and _pristine(view):
            with view.txn(write=True) as txn:
                txn.put(view._vp + b"run", run.encode(), db=view.db["meta"])
                remotestate.forget_published(txn, view, remotestate.published(view))
            return volume, False
        log.info("volume_run_changed", volume=name, run=run,
                 was=view.run_id if view is not None else None)
        return await self._fresh_volume(name, thread, run), True

    async def _fresh_volume(self, name: str, thread: str, run: str):
        """Drop the local volume (refused, naming them, while processes hold its
        files) and make it again, empty, for `run`."""
        shard = self.shard
        volume = shard.loaded.get(name)
        st = shard.store
        with shard.leaving_volume(name):
            if volume is not None:
                await shard._let_go(volume)
            if name in st.volumes():
                await drive(drop_volume_in_steps(st, name))
            with st.txn(write=True) as txn:
                vol = st.create_volume(txn, name, run=run)
                txn.put(b"v" + vol.to_bytes(4, "big") + b":thread",
                        thread.encode("utf-8", "surrogatepass"), db=st.db["meta"])
        volume = shard.open_volume(name)
        if volume is None:
            raise RequestError("internal", f"volume {name!r} could not be served again")
        return volume

    # -------------------------------------------------------------- end

    async def op_remote_end(self, req: dict) -> dict:
        """Publish every snapshot of the run, then give the thread back."""
        name = self.shard._name_arg(req)
        timeout = arg(req, "timeout", (int, float), 60.0)
        if isinstance(timeout, bool) or not 0 < timeout <= 86400:
            raise RequestError("bad_request", "'timeout' must be above 0 and at most 86400 s")
        token = self._token(req)
        t0 = time.perf_counter()
        async with self._lock(name):
            vt = self._running(name)
            if vt is None:
                return {"volume": name, "ended": False, "message": "no run holds it here"}
            if "thread" in req:
                self.shard._check_thread(vt.store, self._thread(req))
            if token is not None and vt.run.token not in (None, token):
                raise RequestError("lease_held", f"thread {name!r} is held by another run "
                                                 f"(token {vt.run.token!r})")
            pub = vt.publisher
            try:
                if vt.state == "lost":
                    raise NotPublishable(f"the run was lost: {vt.reason}")
                pending = pub.unpublished() if pub is not None else []
                if pending:
                    await pub.wait_published(max(pending), float(timeout))
                if vt.state != "held":
                    raise RequestError("timeout", f"the run's lease is not held now "
                                                  f"({vt.reason}): nothing was released; "
                                                  "call remote_end again")
                # Snapshots deleted since the last publication (a prune) go from the
                # head too, so every replica drops them.
                with trio.fail_after(timeout):
                    unlisted = await pub.follow_local() if pub is not None else []
            except trio.TooSlowError:
                raise RequestError("timeout", f"the head of thread {name!r} could not be "
                                              f"rewritten within {timeout:g} s") from None
            except (SyncTimeout, RemoteError, PublishError, HeadError) as exc:
                raise _remote_error(exc) from None
            except (NotPublishable, LeaseLost) as exc:
                await vt.end_run(release=False)
                raise RequestError("not_publishable", str(exc)) from None
            published = remotestate.published(vt.store)
            out = await vt.end_run()
        return {"volume": name, **out, "unlisted": unlisted,
                "published": snapshot_id(max(published)) if published else None,
                "duration_ms": round((time.perf_counter() - t0) * 1000, 1)}

    async def op_remote_prune(self, req: dict) -> dict:
        """Drop the local copies of threads deleted elsewhere (a tombstone), or
        whose record names another run now (a new run after a delete): a
        replica keeps them until the thread's next run here otherwise. One
        request per local volume, `limit` volumes at most (default all)."""
        limit = arg(req, "limit", int, 1 << 30)
        out = {"checked": 0, "dropped": [], "busy": []}
        for raw in self.shard.volume_names():
            if out["checked"] >= limit:
                break
            name = raw.decode()
            async with self._lock(name):
                if self._running(name) is not None:
                    continue
                try:
                    view = self.shard.store.view(name)
                except NoSuchVolume:
                    continue
                out["checked"] += 1
                try:
                    rec = await self._in_thread(threads.read_record, self.tier.objstore, name)
                except _REMOTE_ERRORS as exc:
                    log.warning("prune_record_unreadable", volume=name, error=str(exc))
                    continue
                if rec is None or (rec.live and rec.run == view.run_id):
                    continue
                volume = self.shard.loaded.get(name)
                try:
                    with self.shard.leaving_volume(name):
                        if volume is not None:
                            await self.shard._let_go(volume)
                        await drive(drop_volume_in_steps(self.shard.store, name))
                except RequestError:
                    out["busy"].append(name)
                    continue
                out["dropped"].append(name)
                log.info("volume_pruned", volume=name,
                         why="deleted" if not rec.live else f"its thread runs {rec.run} now")
        return out

    def op_remote_runs(self, req: dict) -> dict:
        """The runs this shard holds now."""
        return {"runs": [{"volume": name, "state": vt.state, "reason": vt.reason or None,
                          **vt.run.describe()}
                         for name, vt in sorted(self.tier.running.items()) if vt.run]}

    # ----------------------------------------------------------- delete

    async def op_remote_delete(self, req: dict) -> dict:
        """Delete the thread everywhere: a tombstone in the bucket, its run's
        objects, the local volume."""
        name = self.shard._name_arg(req)
        thread = self._thread(req)
        wait = self._wait(req)
        deadline = trio.current_time() + wait
        async with self._lock(name):
            vt = self._running(name)
            if vt is not None:
                raise self._held_here(name, vt)
            try:
                view = self.shard.store.view(name)
            except NoSuchVolume:
                view = None
            if view is not None:
                self.shard._check_thread(view, thread)
            old_run, generation = await self._tombstone(name, thread, deadline)
            removed = 0
            if old_run is not None:
                try:
                    removed = await self._in_thread(delete_run_objects, self.tier.objstore,
                                                    old_run)
                except RemoteError as exc:  # GC finishes it
                    log.warning("run_objects_left", run=old_run, error=str(exc))
            dropped = False
            if view is not None:
                volume = self.shard.loaded.get(name)
                with self.shard.leaving_volume(name):
                    if volume is not None:
                        await self.shard._let_go(volume)
                    await drive(drop_volume_in_steps(self.shard.store, name))
                dropped = True
        log.info("thread_deleted", volume=name, run=old_run, generation=generation)
        return {"volume": name, "deleted": True, "run": old_run, "generation": generation,
                "objects_removed": removed, "dropped": dropped}

    async def _tombstone(self, name: str, thread: str, deadline: float):
        """Make the thread's record a tombstone; (the run it had, the record's generation)."""
        store = self.tier.objstore
        for _ in range(8):
            try:
                rec = await self._in_thread(threads.read_record, store, name)
                if rec is not None:
                    threads.check_mine(rec, thread)
                if rec is None:
                    made = threads.ThreadRecord(name, thread, None, 1, threads.DELETED)
                    try:
                        await self._in_thread(threads.create_record, store, made)
                    except RemoteError:
                        continue
                    return None, made.generation
                if not rec.live:
                    return None, rec.generation
            except _REMOTE_ERRORS as exc:
                raise _remote_error(exc) from None
            # No run of the thread may be under way: its lease first.
            lease = await self._take_lease(rec.run, deadline, expect=True)
            try:
                now = await self._in_thread(threads.read_record, store, name)
                if now is None or now.etag != rec.etag:
                    continue
                await self._in_thread(fence, store, rec.run, lease.generation, name)
                gone = rec.deleted()
                try:
                    await self._in_thread(threads.write_record, store, gone)
                except RemoteError:
                    continue
                return rec.run, gone.generation
            except _REMOTE_ERRORS as exc:
                raise _remote_error(exc) from None
            finally:
                await self._release(lease)
        raise RequestError("remote_error", f"the record of thread {name!r} keeps changing")

    # ------------------------------------------------------------- copy

    async def op_remote_copy(self, req: dict) -> dict:
        """A new thread `target` holding the source thread's published snapshots."""
        name = self.shard._name_arg(req)
        thread = self._thread(req)
        target = self.shard._name_arg(req, "target")
        target_thread = self._thread(req, "target_thread")
        if target == name:
            raise RequestError("bad_request", "the target is the source")
        async with self._lock(target):
            try:
                view = self.shard.store.view(target)
            except NoSuchVolume:
                view = None
            if view is not None:
                self.shard._check_thread(view, target_thread)
            try:
                done = await copy_run(self.tier.objstore, name, thread, target,
                                      target_thread, self.tier.uploader,
                                      self.shard.store.chunks)
            except CopyError as exc:
                raise RequestError(exc.code, str(exc)) from None
            except _REMOTE_ERRORS as exc:
                raise _remote_error(exc) from None
            if view is None:
                self._local_volume(target, target_thread)
        log.info("thread_copied", volume=name, target=target, run=done["run"],
                 snapshots=len(done["snapshots"]))
        return {"volume": target, **done}


def _latest(head) -> int:
    """The newest snapshot the head keeps (0: none): what a run starts from."""
    return max((e["seq"] for e in head.current()), default=0)


async def _steps(gen) -> int:
    """Run a generator of short transactions, yielding to the loop between them."""
    n = 0
    for _ in gen:
        n += 1
        await trio.sleep(0)
    return n


def _pristine(view: Store) -> bool:
    """A volume with nothing in it: no snapshot ever, no file."""
    return not view.meta_u64(b"snap_seq") and not view.readdir(view.root_ino, 0, limit=1) \
        and not view.meta_u64(b"incomplete")
