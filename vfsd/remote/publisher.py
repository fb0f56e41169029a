"""Publishing local snapshots to the bucket, in the background, in order.

After each local snapshot (and at start, for any left over), `Publisher.run`
publishes every retained snapshot newer than the last published one, oldest
first: a manifest (`vfsd.remote.manifest`), full or a delta on the previous published
snapshot, then the run's head. The steps and why they are safe against GC are
in `vfsd.remote` ("Publishing a snapshot"). Nothing here runs on the FUSE
path: manifests are built, compressed and hashed in worker threads, requests
go through worker threads, and the trio thread only does the LMDB writes.

Holding snapshots. The snapshot being published and the last published one
(`base`, the parent of the next delta) are held (`Snapshots.held`), so
retention keeps them and their entries: a delta on `base` then sees every
object that changed since (`sgen` over (base, seq]), deletions included.

Failures never lose anything: an unreachable store, a refused upload or a
slow GC sweep make the publication wait and retry (with backoff); the local
snapshots stay. Losing the lease (another worker took the run) stops
publishing for good (`RemoteTier` turns the mount read-only).
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass

import structlog
import trio

from vfsd.snapshots.snapshots import snapshot_id
from vfsd.store import remotestate
from vfsd.store.chunks import chunk_hash
from vfsd.store.content import LOC_FILE, LOC_LMDB

from .head import Head, HeadError, read_head, write_head
from .layout import (
    GC_LEASE_KEY,
    INTENT_MAX_AGE,
    chunk_key,
    intent_key,
    intent_of_name,
    intents_prefix,
    manifest_key,
    manifests_prefix,
    seq_of_manifest_name,
)
from .lease import Lease, LeaseLost
from .manifest import Manifest, decode, encode, entry_digests
from .objstore import RemoteConflict, RemoteError
from .uploader import UploadFailed

log = structlog.get_logger("vfsd.publisher")

#: a sweep's lease is re-read this often while a publication waits for it
SWEEP_POLL = 1.0


class RunMovedOn(LeaseLost):
    """Another lease generation published in this run: this worker lost it for good."""


class PublishError(Exception):
    """A publication that cannot go on as it is (retried later)."""


class SyncTimeout(Exception):
    """`wait_published` ran out of time; the message says what is left."""


class NotPublishable(Exception):
    """The snapshot will never be published (deleted first, or the lease is lost)."""


@dataclass
class Built:
    """A manifest ready to publish, and what its publication must check."""

    manifest: Manifest
    data: bytes
    changed_chunks: set[bytes]  # chunks named by entries changed since the parent
    all_chunks: set[bytes]  # every chunk the manifest names


def build_manifest(st, snaps, run_id: str, seq: int, parent: int, full: bool,
                   generation: int) -> Built:
    """The manifest of local snapshot `seq` (full, or a delta on `parent`, a
    published snapshot of the same run). Reads only: a worker thread is fine."""
    with st.txn() as txn:
        rec = snaps._get(txn, seq)
        changed = sorted({k for _, k in snaps._written_between(txn, parent, seq)}) \
            if parent else None
        okeys = sorted(snaps._visible_okeys(txn, seq)) if full else changed
        entries = []
        for okey in okeys:
            got = snaps.value_at(txn, okey, seq)
            value = got[1] if got else b""
            if full and not value:
                continue
            entries.append((okey, value))
        blobs = {}
        for digest in entry_digests(entries, LOC_LMDB):
            raw = txn.get(digest, db=st.db["blob"])
            if raw is None:
                raise PublishError(f"small object {digest.hex()} of snapshot s{seq} is "
                                   "missing from the store")
            blobs[digest] = bytes(raw)
        if changed is None:
            changed_entries = entries
        else:
            changed_entries = []
            for okey in changed:
                got = snaps.value_at(txn, okey, seq)
                if got and got[1]:
                    changed_entries.append((okey, got[1]))
    manifest = Manifest(run_id, seq, 0 if full else parent, rec["step"],
                        rec["created_ns"], generation, st.chunk_size,
                        entries, blobs, pinned=bool(rec.get("pinned")),
                        label=rec.get("label", "")[:200])
    data = encode(manifest)
    all_chunks = entry_digests(entries, LOC_FILE)
    return Built(manifest, data, entry_digests(changed_entries, LOC_FILE), all_chunks)


async def _in_thread(fn, *args):
    return await trio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)


async def wait_for_no_sweep(objstore, check=lambda: None) -> tuple[float | None, float]:
    """Step 4 of a publication (`vfsd.remote`): wait while a GC sweep holds
    `gc/lease`, calling `check()` between looks (it raises to give up); then
    (the shortest grace any sweep used, or None if none ever ran; time.monotonic())."""
    gc = Lease(objstore, "gc", key=GC_LEASE_KEY)
    while True:
        state = await _in_thread(gc.read)
        if state is None:
            return None, time.monotonic()  # no sweep ever ran on this prefix
        if state.expired:
            floor = (state.record or {}).get("grace_floor")
            ok = isinstance(floor, int | float) and not isinstance(floor, bool) \
                and floor > 0
            return (float(floor) if ok else 0.0), time.monotonic()
        check()
        await trio.sleep(min(SWEEP_POLL, max(0.05, state.expires_in)))


async def confirm_chunks(objstore, uploader, reupload, digests: set[bytes], b: float,
                         floor: float | None) -> tuple[int, int]:
    """Step 5 of a publication: prove each chunk is in the bucket after `b`
    (a chunk `uploader` created less than `floor / 2` before `b` is proved by
    its age; any other is HEADed), calling `reupload(digest)` (in a worker
    thread) for any that is missing. (chunks HEADed, chunks uploaded again)."""
    if floor is None:
        return 0, 0  # no sweep has ever run: what ensure_uploaded saw still holds
    check = []
    for digest in digests:
        created = uploader.created_at(digest) if uploader is not None else None
        if created is not None and b - created < floor / 2:
            continue
        check.append(digest)
    if not check:
        return 0, 0
    limiter = trio.CapacityLimiter(max(1, uploader.workers if uploader is not None else 8))
    missing: list[bytes] = []

    async def head_one(digest: bytes) -> None:
        found = await trio.to_thread.run_sync(objstore.exists, chunk_key(digest),
                                              limiter=limiter, abandon_on_cancel=True)
        if not found:
            missing.append(digest)

    async with trio.open_nursery() as nursery:
        for digest in check:
            nursery.start_soon(head_one, digest)
    for digest in missing:
        await trio.to_thread.run_sync(reupload, digest, limiter=limiter,
                                      abandon_on_cancel=True)
        log.info("chunk_reuploaded_after_gc", digest=digest.hex())
    return len(check), len(missing)


class Publisher:
    """Publishes the snapshots of one volume; see the module docstring."""

    def __init__(self, tier) -> None:
        self.tier = tier
        self.store = tier.store
        self.snaps = tier.snaps
        self.objstore = tier.objstore
        self.uploader = tier.uploader
        self.full_every = tier.config.remote_full_every
        self.base = 0
        self.published: dict[int, dict] = {}
        self.head: Head | None = None
        self.in_progress: int | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.stats = {"publications": 0, "full": 0, "delta": 0, "manifest_bytes": 0,
                      "heads_checked": 0, "chunks_reuploaded": 0, "waited_for_gc_s": 0.0,
                      "manifests_deleted": 0}
        self._kick = trio.Event()
        self._changed = trio.Event()
        self._cleaned_intents = False
        self._doomed: set[int] = set()

    # ---------------------------------------------------------------- state

    def load(self) -> None:
        """Published snapshots from the store; hold the newest retained one as base."""
        self.published = remotestate.published(self.store)
        retained = {s["seq"] for s in self.snaps.list()}
        candidates = [s for s in self.published if s in retained]
        self._set_base(max(candidates, default=0))

    def close(self) -> None:
        """The run is over: let go of the base snapshot's hold."""
        if self.base:
            self._release(self.base)
            self.base = 0

    def _set_base(self, seq: int) -> None:
        old = self.base
        if seq == old:
            return
        if seq:
            self.snaps.held[seq] += 1
        if old:
            self._release(old)
        self.base = seq

    def _release(self, seq: int) -> None:
        self.snaps.held[seq] -= 1
        if self.snaps.held[seq] <= 0:
            del self.snaps.held[seq]

    def retained(self) -> list[dict]:
        return self.snaps.list()

    def unpublished(self) -> list[int]:
        """Retained snapshots newer than the base that are not published, oldest first."""
        return [s["seq"] for s in self.retained()
                if s["seq"] > self.base and s["seq"] not in self.published]

    def kick(self) -> None:
        """A snapshot was taken (or the lease came back): look for work."""
        self._kick.set()

    def _note_error(self, msg: str) -> None:
        self.last_error = msg
        self.last_error_at = time.monotonic()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # ------------------------------------------------------------- the task

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Publish until cancelled (or the lease is lost)."""
        task_status.started()
        failures = 0
        while True:
            if self.tier.state == "lost":
                self._notify()
                return
            todo = self.unpublished() if self.tier.can_publish() else []
            if not todo:
                self._kick = trio.Event()
                with trio.move_on_after(5.0):  # the lease may come back meanwhile
                    await self._kick.wait()
                continue
            try:
                await self.publish(todo[0])
                failures = 0
            except LeaseLost as exc:
                self._note_error(str(exc))
                self.tier.lease_lost(str(exc), definitive=isinstance(exc, RunMovedOn)
                                     or self.tier.lease_taken_over())
            except Exception as exc:  # noqa: BLE001 - retried; a bug must not stop the daemon
                failures += 1
                self._note_error(str(exc) or type(exc).__name__)
                if not isinstance(exc, RemoteError | UploadFailed | PublishError | HeadError
                                  | OSError):
                    log.exception("publish_crashed", snapshot=snapshot_id(todo[0]))
                delay = min(30.0, 0.5 * 2 ** min(failures - 1, 6))
                log.warning("publish_failed", snapshot=snapshot_id(todo[0]), error=str(exc),
                            retry_in=round(delay, 1))
                with trio.move_on_after(delay * (0.5 + random.random() / 2)):
                    self._kick = trio.Event()
                    await self._kick.wait()
            finally:
                self._notify()

    # ------------------------------------------------------------ one snapshot

    async def publish(self, seq: int) -> None:
        """Publish snapshot `seq` (retained, unpublished, newer than the base)."""
        lease = self.tier.lease
        if lease is None:
            raise PublishError("no lease")
        lease.check()
        self.snaps.held[seq] += 1
        self.in_progress = seq
        done = False
        try:
            if self.head is None:
                self.head = await trio.to_thread.run_sync(read_head, self.objstore,
                                                          self.tier.run_id)
                if self.head is None:
                    raise PublishError(f"the head of run {self.tier.run_id} is missing")
            built = await self._build(seq, lease.generation)
            await self.uploader.ensure_uploaded(built.changed_chunks)
            intents: list[str] = []
            try:
                await self._publish_safely(built, lease, intents)
                await self._commit_head(built, lease)
                done = True
            finally:
                # Published or not, the intent is done with: once the head lists
                # the manifest GC marks its chunks from it, and a failed attempt
                # is retried with a new intent and a new check for sweeps.
                await self._drop_intents(intents)
        finally:
            self.in_progress = None
            if not done:
                self._release(seq)
        self._after_publication(built)

    async def _build(self, seq: int, generation: int) -> Built:
        head = self.head
        parent = self.base if self.base and head.entry(self.base) else 0
        full = not parent or head.chain_length(parent) + 1 >= self.full_every
        built = await trio.to_thread.run_sync(self._build_sync, seq, parent, full, generation)
        if not full:
            root = head.chain_root_entries(parent)
            if root and len(built.manifest.entries) * 2 > root:
                built = await trio.to_thread.run_sync(self._build_sync, seq, parent, True,
                                                      generation)
        return built

    def _build_sync(self, seq: int, parent: int, full: bool, generation: int) -> Built:
        """In a worker thread: the manifest of `seq` (full, or a delta on `parent`)."""
        return build_manifest(self.store, self.snaps, self.tier.run_id, seq, parent, full,
                              generation)

    # -------------------------------------------------------- the GC handshake

    async def _publish_safely(self, built: Built, lease: Lease, intents: list[str]) -> None:
        """Intent, sweep check, chunk confirmation, manifest (see `vfsd.remote`).

        Each intent written gets a key of its own (appended to `intents`, for
        the caller to delete): a renewal never rewrites a key a GC sweep may
        have listed as stale and be about to delete.
        """
        m = built.manifest
        run = self.tier.run_id
        body = b"".join(sorted(built.changed_chunks))
        while True:
            lease.check()
            ikey = intent_key(run, m.seq, m.generation, secrets.token_hex(8))
            intents.append(ikey)
            await self._to_thread(self.objstore.put, ikey, body)
            written = time.monotonic()
            if len(intents) > 1 and await self._drop_intents(intents[:-1]):
                del intents[:-1]  # the new intent covers the same chunks
            if not self._cleaned_intents:
                await self._to_thread(self._drop_stale_intents, ikey)
                self._cleaned_intents = True
            floor, b = await self._wait_for_no_sweep()
            await self._confirm(built.changed_chunks, b, floor)
            if time.monotonic() - written < INTENT_MAX_AGE / 2:
                break
            log.info("intent_renewed", snapshot=snapshot_id(m.seq))
        lease.check()
        await self._to_thread(self._put_manifest, built)

    async def _drop_intents(self, keys: list[str]) -> bool:
        """Delete these intents of ours; True once done. Best effort, even while
        cancelled (ten seconds at most): one left behind is ignored and deleted
        by GC after `INTENT_MAX_AGE`, and by this run's next writer."""
        if not keys:
            return True
        with trio.move_on_after(10) as scope:
            scope.shield = True
            try:
                await self._to_thread(self.objstore.delete, list(keys))
                return True
            except RemoteError as exc:
                log.warning("intent_delete_failed", keys=keys, error=str(exc))
        return False

    async def _to_thread(self, fn, *args):
        return await trio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)

    def _drop_stale_intents(self, keep: str) -> None:
        """Intents of this run left by earlier (crashed) publications."""
        stale = [info.key for info in self.objstore.list(intents_prefix(self.tier.run_id))
                 if info.key != keep and intent_of_name(info.key.rsplit("/", 1)[1])]
        if stale:
            self.objstore.delete(stale)

    async def _wait_for_no_sweep(self) -> tuple[float | None, float]:
        """Wait while a GC sweep holds `gc/lease`; (grace floor or None, time.monotonic())."""
        started = time.monotonic()
        got = await wait_for_no_sweep(self.objstore, lambda: self.tier.lease.check())
        self.stats["waited_for_gc_s"] += round(time.monotonic() - started, 3)
        return got

    async def _confirm(self, digests: set[bytes], b: float, floor: float | None) -> None:
        """Prove each chunk is in the bucket after `b` (or young enough), re-uploading
        any that a sweep took."""
        checked, again = await confirm_chunks(self.objstore, self.uploader, self._reupload,
                                              digests, b, floor)
        self.stats["heads_checked"] += checked
        self.stats["chunks_reuploaded"] += again

    def _reupload(self, digest: bytes) -> None:
        try:
            data = self.store.chunks.read_all(digest)
        except Exception as exc:  # noqa: BLE001 - missing or damaged locally
            raise PublishError(f"chunk {digest.hex()} is neither in the bucket nor usable "
                               f"locally ({exc})") from None
        if chunk_hash(data) != digest:
            raise PublishError(f"local chunk {digest.hex()} does not match its hash")
        self.objstore.put_if_absent(chunk_key(digest), data)

    def _put_manifest(self, built: Built) -> None:
        """PUT the manifest if absent; an orphan left by a stale writer is replaced."""
        m = built.manifest
        key = manifest_key(m.run, m.seq)
        for _ in range(2):
            if self.objstore.put_if_absent(key, built.data):
                return
            existing = self.objstore.get(key, max_bytes=len(built.data) * 4 + (1 << 20))
            if existing.data == built.data:
                return  # our own earlier attempt landed
            try:
                other = decode(existing.data, run=m.run, seq=m.seq)
                other_gen = other.generation
            except Exception:  # noqa: BLE001 - damaged: nobody can use it
                other_gen = 0
            head = self.head
            # Equal generations are one acquisition (`vfsd.remote.lease`): this worker's
            # own earlier attempt, whose head CAS failed, is an orphan like any.
            if other_gen > m.generation or (head is not None and head.entry(m.seq)):
                raise RunMovedOn(f"snapshot s{m.seq} of run {m.run} was published by lease "
                                f"generation {other_gen}; this worker's is {m.generation}")
            log.warning("orphan_manifest_replaced", snapshot=snapshot_id(m.seq),
                        generation=other_gen)
            self.objstore.delete([key])
        raise PublishError(f"manifest s{m.seq} keeps appearing under another writer")

    # ------------------------------------------------------------------ the head

    async def _commit_head(self, built: Built, lease: Lease) -> None:
        """CAS the head to list the new snapshot (and drop what retention retires)."""
        m = built.manifest
        entry = {"seq": m.seq, "parent": m.parent, "full": m.full, "step": m.step,
                 "created_ns": m.created_ns, "pinned": m.pinned, "entries": len(m.entries),
                 "bytes": len(built.data), "generation": m.generation}
        # Local pins are authoritative (a pin may change after publication).
        keep_local = {s["seq"] for s in self.retained() if s.get("pinned")}
        step = self.store.get_step()
        doomed: set[int] = set()
        for _ in range(4):
            lease.check()
            head = self.head
            if head.generation > m.generation:
                raise RunMovedOn(f"the head of run {m.run} was written by generation "
                                 f"{head.generation}")
            if head.generation == m.generation and head.entry(m.seq):
                self._doomed = doomed  # our previous write landed; its answer was lost
                return
            new = head.successor(m.generation, max(head.latest, m.seq),
                                 sorted([dict(s) for s in head.snapshots if s["seq"] != m.seq]
                                        + [entry], key=lambda s: s["seq"]))
            doomed = self._retention(new, keep_local | {m.seq}, step)
            new.snapshots = [s for s in new.snapshots if s["seq"] not in doomed]
            try:
                await self._to_thread(write_head, self.objstore, new)
            except RemoteConflict:
                fresh = await self._to_thread(read_head, self.objstore, m.run)
                if fresh is None:
                    raise PublishError(f"the head of run {m.run} vanished") from None
                self.head = fresh
                continue
            self.head = new
            self._doomed = doomed
            return
        raise PublishError(f"the head of run {m.run} keeps changing")

    def _retention(self, head: Head, keep_local: set[int], step: int) -> set[int]:
        """Seqs the head stops listing: the newest `snapshot_keep_last`, those younger
        than `snapshot_keep_steps` steps and pinned ones stay, with the chains they
        need; the rest go (the same policy as local retention)."""
        cfg = self.tier.config
        seqs = [s["seq"] for s in head.snapshots]
        if getattr(self.tier, "head_follows_local", False):
            return self._follow_local(head, keep_local)
        newest = set(sorted(seqs)[-cfg.snapshot_keep_last:])
        keep = set()
        for s in head.snapshots:
            young = cfg.snapshot_keep_steps and step - s["step"] < cfg.snapshot_keep_steps
            if s["seq"] in keep_local or s["seq"] in newest or s.get("pinned") or young:
                keep.add(s["seq"])
        keep = head.with_ancestors(keep)
        return set(seqs) - keep

    async def follow_local(self) -> list[str]:
        """A shard run's end: make the head list what the volume keeps when
        snapshots were deleted since the last publication (a prune), so every
        replica drops them too. The ids the head stops listing."""
        lease = self.tier.lease
        kept = {s["seq"] for s in self.retained()}
        for _ in range(4):
            head = self.head
            if head is None or all(e["seq"] in kept for e in head.current()):
                return []
            lease.check()
            if head.generation > lease.generation:
                raise RunMovedOn(f"the head of run {head.run} was written by generation "
                                 f"{head.generation}")
            new = head.successor(lease.generation, head.latest,
                                 [dict(e) for e in head.snapshots])
            doomed = self._follow_local(new, set())
            new.snapshots = [e for e in new.snapshots if e["seq"] not in doomed]
            try:
                await self._to_thread(write_head, self.objstore, new)
            except RemoteConflict:
                fresh = await self._to_thread(read_head, self.objstore, head.run)
                if fresh is None:
                    raise PublishError(f"the head of run {head.run} vanished") from None
                self.head = fresh
                continue
            self.head = new
            gone = {e["seq"] for e in head.current()} - {e["seq"] for e in new.current()}
            with self.store.txn(write=True) as txn:
                remotestate.forget_published(txn, self.store, doomed)
            for seq in doomed:
                self.published.pop(seq, None)
            if doomed:
                self.tier.nursery.start_soon(self._cleanup, head.run, head.latest,
                                             lease.generation, doomed)
            log.info("head_follows_volume", run=head.run,
                     dropped=[snapshot_id(x) for x in sorted(gone)])
            return [snapshot_id(x) for x in sorted(gone)]
        raise PublishError(f"the head of run {self.head.run} keeps changing")

    def _follow_local(self, head: Head, publishing: set[int]) -> set[int]:
        """A shard run's head lists the snapshots its volume keeps (its holder's
        retention, budget and deletions decide), so every replica's history
        is the holder's: the others go, but those a kept delta needs, which stay
        marked `retired` (a replica imports no retired snapshot)."""
        wanted = {s["seq"] for s in self.retained()} | publishing
        keep = head.with_ancestors({s["seq"] for s in head.snapshots if s["seq"] in wanted})
        for s in head.snapshots:
            if s["seq"] in keep and s["seq"] not in wanted:
                s["retired"] = True
            else:
                s.pop("retired", None)
        return {s["seq"] for s in head.snapshots} - keep

    # ------------------------------------------------------------ afterwards

    def _after_publication(self, built: Built) -> None:
        m = built.manifest
        doomed, self._doomed = self._doomed, set()
        info = {"seq": m.seq, "parent": m.parent, "full": m.full, "generation": m.generation,
                "entries": len(m.entries), "bytes": len(built.data),
                "published_ns": time.time_ns(), "imported": False}
        st = self.store
        with st.txn(write=True) as txn:
            remotestate.record_published(txn, st, m.seq, info)
            remotestate.forget_published(txn, st, doomed)
            remotestate.covered(txn, st.db, st._bump, built.all_chunks | built.changed_chunks)
        self.published[m.seq] = info
        for seq in doomed:
            self.published.pop(seq, None)
        # The publication's hold becomes the base's; the old base's goes.
        old = self.base
        self.base = m.seq
        if old and old != m.seq:
            self._release(old)
        self.stats["publications"] += 1
        self.stats["full" if m.full else "delta"] += 1
        self.stats["manifest_bytes"] += len(built.data)
        self.last_error = None
        log.info("published", snapshot=snapshot_id(m.seq), kind="full" if m.full else "delta",
                 parent=snapshot_id(m.parent) if m.parent else None, entries=len(m.entries),
                 bytes=len(built.data), chunks=len(built.changed_chunks),
                 retired=[snapshot_id(s) for s in sorted(doomed)])
        self.tier.published_chunks(built.all_chunks)
        if doomed or m.full:
            self.tier.nursery.start_soon(self._cleanup, m.run, m.seq, m.generation, doomed)

    async def _cleanup(self, run: str, seq: int, generation: int, doomed: set[int]) -> None:
        """Best effort: retired manifests, unlisted old manifests."""
        try:
            await self._to_thread(self._cleanup_sync, run, seq, generation, doomed)
        except RemoteError as exc:
            log.warning("manifest_cleanup_failed", error=str(exc))

    def _cleanup_sync(self, run: str, seq: int, generation: int, doomed: set[int]) -> None:
        keys = [manifest_key(run, s) for s in doomed]
        head = self.head
        if head is not None:
            listed = {s["seq"] for s in head.snapshots}
            for info in self.objstore.list(manifests_prefix(run)):
                s = seq_of_manifest_name(info.key.rsplit("/", 1)[1])
                if s is not None and s <= head.latest and s not in listed:
                    keys.append(info.key)
        if keys:
            self.objstore.delete(sorted(set(keys)))
        self.stats["manifests_deleted"] += len(set(keys))

    # ------------------------------------------------------------------ sync

    async def wait_published(self, seq: int, timeout: float) -> dict:
        """Return once snapshot `seq` is published; SyncTimeout / NotPublishable."""
        deadline = trio.current_time() + timeout
        while seq not in self.published:
            if self.tier.state == "lost":
                raise NotPublishable(f"snapshot {snapshot_id(seq)} cannot be published: "
                                     f"{self.tier.reason}")
            if seq <= self.base or not any(s["seq"] == seq for s in self.retained()):
                raise NotPublishable(f"snapshot {snapshot_id(seq)} was deleted locally "
                                     "before it was published")
            self.kick()
            changed = self._changed
            with trio.move_on_at(deadline) as scope:
                await changed.wait()
            if scope.cancelled_caught and seq not in self.published:
                raise SyncTimeout(self._timeout_message(seq, timeout))
        return {"id": snapshot_id(seq), **self.published[seq]}

    def _timeout_message(self, seq: int, timeout: float) -> str:
        counts = remotestate.counts(self.store)
        parts = [f"snapshot {snapshot_id(seq)} is not published after {timeout:g} s"]
        if counts["upload_chunks"]:
            parts.append(f"{counts['upload_chunks']} chunk(s) "
                         f"({counts['upload_bytes']} bytes) still to upload")
        if self.tier.state != "held":
            parts.append(f"lease: {self.tier.state} ({self.tier.reason})")
        err = self.last_error or self.uploader.last_error
        if err:
            parts.append(f"last error: {err}")
        return "; ".join(parts)

    def status(self) -> dict:
        snaps = self.retained()
        unpublished = [s for s in snaps if s["seq"] not in self.published]
        return {
            "published": snapshot_id(max(self.published)) if self.published else None,
            "base": snapshot_id(self.base) if self.base else None,
            "in_progress": snapshot_id(self.in_progress) if self.in_progress else None,
            "unpublished": [s["id"] for s in unpublished],
            "oldest_unpublished_ns": min((s["created_ns"] for s in unpublished), default=None),
            "head_latest": snapshot_id(self.head.latest) if self.head and self.head.latest
            else None,
            **self.stats,
            "last_error": self.last_error,
            "last_error_age": None if self.last_error_at is None
            else round(time.monotonic() - self.last_error_at, 1),
        }
