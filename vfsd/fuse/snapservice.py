"""Snapshot, restore and fork on a mounted volume: the store and the kernel in step.

`snapshots` changes the store; this module makes the mount agree with it.
Before a snapshot or a restore, whatever programs wrote must be in the store:
the kernel's dirty pages are written back (`syncfs` on the mount, from a
worker thread, while the loop serves the WRITE requests that causes), then the
daemon's own buffers are committed. After a restore, the kernel forgets every
name and page that changed (from a worker thread: the calls block), and open
files reload their block maps, so the shell never sees a mix of two trees.
Operations are serialized by one lock; each store change is one transaction.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import structlog
import trio

from vfsd import STATE_DIRNAME, errors
from vfsd.latency import Latencies
from vfsd.rundir import RunDir, syncfs, write_back
from vfsd.snapshots.pathrestore import restore_paths, restore_paths_in_steps
from vfsd.snapshots.snapshots import (
    FilesOpenForWriting,
    SnapshotError,
    Snapshots,
    drop_volume,
    parse_id,
    snapshot_id,
)
from vfsd.steps import drive, make_way

from .writers import writers

log = structlog.get_logger("vfsd.snapshots")


class SnapshotService:
    """What the control socket calls for snapshots of the mounted volume."""

    def __init__(self, daemon, snaps: Snapshots) -> None:
        self.daemon = daemon
        self.snaps = snaps
        self.store = snaps.store
        self.ops = daemon.ops
        self.lock = trio.Lock()
        self.latency = Latencies()  # "snapshot", "restore": from the request to the reply
        #: a first snapshot built in steps, while it runs: {"objects": N, "about": M}
        self.first_progress: dict | None = None

    async def _quiesce(self) -> None:
        """Get programs' writes into the store, as content objects.

        Hot blocks are hashed in worker threads first; whatever went hot
        again meanwhile is settled by the caller with `_settle_rest` in the
        same loop turn as the snapshot or restore itself.
        """
        place = self.daemon.run
        if place.mount_root != place.mountpoint:
            # A volume of a shard: syncfs would write back every thread's
            # pages, and hold them all. Only open files can have dirty pages
            # (the kernel writes a file back when it is closed and when its
            # last handle goes, mappings included), so those of this volume
            # opened for writing are written back, one by one.
            paths = [place.mountpoint / p for p in (
                self.store.path_of(ino) for ino, of in list(self.ops.files.files.items())
                if of.writer is not None and of.handles) if p]
            if paths:
                await trio.to_thread.run_sync(write_back, paths)
        else:
            try:
                await trio.to_thread.run_sync(syncfs, place.mountpoint)
            except OSError as exc:  # unit tests without a mount
                log.debug("syncfs_failed", error=str(exc))
        self.ops.flush_all()
        await self.daemon.settler.settle_all()

    def _settle_rest(self) -> None:
        self.ops.flush_all()
        self.daemon.settler.settle_rest_now()

    # ------------------------------------------------------------- create

    #: a first snapshot of more objects than this is built in steps (see below)
    FIRST_IN_ONE_GO = 1000
    #: a path restore (an unevict) of more items than this is made in steps
    PATHS_IN_ONE_GO = 64
    #: a later snapshot or a restore of more changed objects than this is made
    #: in steps, with the volume held (`Snapshots.create_in_steps`)
    STEPS_ABOVE = 2000
    #: objects per step of such a build
    FIRST_BATCH = 100

    async def snapshot(self, *, pinned: bool = False, label: str = "",
                       reuse: bool = False) -> dict:
        """Take a snapshot; with `reuse`, answer the base snapshot instead when
        the live tree has not changed since it (exact, and no new record)."""
        t0 = time.perf_counter()
        remote = getattr(self.daemon, "remote", None)
        async with self.lock:
            before = getattr(remote, "before_snapshot", None)
            if before is not None:
                await before()  # a shard run's next id announced (`shardtier`)
            rec = await self._snapshot_locked(pinned, label, reuse)
            if rec.get("reused"):
                return rec
        self.latency["snapshot"].observe(time.perf_counter() - t0)
        self.ops.journal.snapshot_taken(rec["id"])
        if remote is not None:
            remote.kick()  # published in the background (vfsd.remote.publisher)
        log.info("snapshot", id=rec["id"], entries=rec["entries"],
                 duration_ms=rec["duration_ms"], deleted=rec["deleted"])
        return rec

    async def _snapshot_locked(self, pinned: bool, label: str, reuse: bool) -> dict:
        """`snapshot` with the lock held."""
        await self._quiesce()
        self._settle_rest()
        rec = self._unchanged_base(pinned) if reuse else None
        if rec is not None:
            return rec
        if not self.store.tracking and \
                self.store.counters()["inodes_allocated"] > self.FIRST_IN_ONE_GO:
            rec = await self._first_in_steps(pinned, label)
        elif self.store.tracking and self.snaps.dirty_count() > self.STEPS_ABOVE:
            async with self.daemon.hold():
                self._settle_rest()
                rec = await drive(self.snaps.create_in_steps(pinned=pinned, label=label))
        else:
            rec = self.snaps.create(pinned=pinned, label=label)
        rec["deleted"] = self._retention()
        return rec

    async def _first_in_steps(self, pinned: bool, label: str) -> dict:
        """The first snapshot of a large tree: read from one consistent view in
        worker threads, written a batch per short transaction, so the FUSE
        loop keeps answering (`Snapshots.first_begin`). `first_progress` says
        how far it got meanwhile (objects: an inode and a name per file)."""
        t0 = time.perf_counter()
        snaps = self.snaps
        view = snaps.first_begin()
        written = 0
        inodes = self.store.counters()["inodes_allocated"]
        self.first_progress = {"objects": 0, "about": max(1, 2 * inodes - 1)}
        try:
            after = None
            while True:
                items, after = await trio.to_thread.run_sync(
                    snaps.first_read, view, after, self.FIRST_BATCH)
                t1 = time.perf_counter()
                snaps.first_write(items)
                await make_way(time.perf_counter() - t1)
                written += len(items)
                self.first_progress = {**self.first_progress, "objects": written}
                if after is None:
                    break
            rec = snaps.first_finish(view, written=written, pinned=pinned, label=label)
        except BaseException:
            snaps.first_abort(view)
            raise
        finally:
            self.first_progress = None
        rec["duration_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        rec["in_steps"] = True
        return rec

    def _unchanged_base(self, pinned: bool) -> dict | None:
        """The base snapshot's record (marked `reused`) if the live tree still
        equals it and it is retained; None otherwise. Call after `_quiesce`."""
        if not self.store.base_clean:
            return None
        base = self.snaps.state()["base"]
        if base is None:
            return None
        try:
            rec = self.snaps.get(base)
            if pinned and not rec["pinned"]:
                rec = self.snaps.set_pinned(base, True)
        except SnapshotError:
            return None  # deleted by retention since: take a new one
        return {**rec, "id": base, "reused": True, "deleted": [], "entries": 0,
                "duration_ms": 0.0, "live_step": self.store.get_step()}

    def _retention(self) -> list[str]:
        deleted = self.snaps.apply_retention()
        for ident in deleted:
            self._forget_view(ident)
        if self.snaps.budget_deleted:
            log.warning("snapshot_budget", deleted=self.snaps.budget_deleted,
                        keep_bytes=self.snaps.keep_bytes,
                        recorded_bytes=self.store.meta_u64(b"snap_bytes"))
        return deleted

    def apply_retention(self) -> list[str]:
        """After a step advance: snapshots too old for the policy go."""
        return self._retention()

    def _forget_view(self, ident: str) -> None:
        view = self.ops.snapview
        if view is None:
            return
        view.forget_snapshot(ident)
        try:
            from . import snapview

            self.ops.kernel.invalidate_entry_async(snapview.DIR_INO, ident.encode(),
                                                   ignore_enoent=True)
        except Exception as exc:  # not mounted (unit tests)
            log.debug("invalidate_failed", error=str(exc))

    def delete(self, ident: str) -> dict:
        rec = self.snaps.delete(ident)
        self._forget_view(ident)
        return rec

    # ------------------------------------------------------------ restore

    async def restore(self, ident: str, *, force: bool = False) -> dict:
        """Make the live tree snapshot `ident`. Refused (FilesOpenForWriting,
        naming the processes) when it would change a file a process holds
        open for writing, unless `force`."""
        t0 = time.perf_counter()
        async with self.lock:
            self.snaps.get(ident)  # a clear error before any work
            await self._quiesce()
            async with self.daemon.hold():
                # From here on nothing else changes the volume: its requests
                # wait, the other volumes' go on between the steps below.
                self._settle_rest()
                plan = await trio.to_thread.run_sync(self.snaps.restore_plan, ident)
                changes = await trio.to_thread.run_sync(self._changed_inodes, plan)
                if not force and self._open_among(changes):
                    # Only then is /proc read (~1 ms a process): who writes them?
                    held = await trio.to_thread.run_sync(writers, self.daemon.run.mount_root)
                    self._refuse_writers(self._own_inodes(held), changes)
                from_step = self.store.get_step()
                self.ops.journal.flush()  # the step being left, as it was
                if len(plan["targets"]) > self.STEPS_ABOVE:
                    res = await drive(self.snaps.restore_in_steps(plan))
                else:
                    res = self.snaps.restore(ident)
                files = self.ops.files
                held_open = [ino for ino in res["inodes"] if ino in files.files]
                for ino in res["inodes"]:
                    files.reload(ino)
                await drive(self.ops.free_in_steps(res["unlinked"]))
                if self.ops.evicted is not None:
                    self.ops.evicted.reset()  # records changed in place: built again when asked
            await trio.to_thread.run_sync(self._tell_kernel, res["dentries"], res["inodes"])
        self.latency["restore"].observe(time.perf_counter() - t0)
        self.ops.journal.restored(res["id"], from_step, res["step"])
        log.info("restored", id=res["id"], changed=res["changed"],
                 duration_ms=res["duration_ms"])
        # The kernel keeps its own size of a file held open (writeback cache)
        # until it is closed: say which ones.
        open_files = sorted(p for p in (self.store.path_of(i) for i in held_open) if p)
        return {"id": res["id"], "step": res["step"], "changed": res["changed"],
                "inodes": len(res["inodes"]), "names": len(res["dentries"]),
                "open_files": open_files, "duration_ms": res["duration_ms"],
                "steps": res.get("steps", 1)}

    async def restore_paths(self, items_of, *, force: bool = False) -> dict:
        """Restore single files or subtrees (`pathrestore`), nothing else.

        `items_of()` gives [(snapshot seq, path there, live target path)]; it
        is called with the lock held, after programs' writes are in the store.
        """
        t0 = time.perf_counter()
        async with self.lock:
            await self._quiesce()
            async with self.daemon.hold():
                self._settle_rest()
                items = items_of()
                if len(items) > self.PATHS_IN_ONE_GO:
                    # Checked first, then placed a few per transaction.
                    res = await drive(restore_paths_in_steps(self.snaps, items, force=force))
                else:
                    res = restore_paths(self.snaps, items, force=force)
                files = self.ops.files
                for ino in res["inodes"]:
                    files.reload(ino)
                await drive(self.ops.free_in_steps(res["unlinked"]))
            index = self.ops.evicted
            if index is not None:
                index.forget(target for _, _, target in items)
                index.forget(res["restored"])
            await trio.to_thread.run_sync(self._tell_kernel, res["dentries"], res["inodes"])
        took = round((time.perf_counter() - t0) * 1000, 3)
        log.info("restored_paths", paths=[t for _, _, t in items][:20], files=len(res["restored"]),
                 duration_ms=took)
        return {"restored": res["restored"], "unchanged": res["unchanged"],
                "from": sorted({snapshot_id(seq) for seq, _, _ in items}),
                "step": self.store.get_step(), "duration_ms": took}

    def _changed_inodes(self, plan: dict) -> set[int]:
        """The inodes a restore by `plan` changes (reads; a worker thread)."""
        out = set()
        with self.store.txn() as txn:
            for okey, target in plan["targets"].items():
                if okey[:1] == b"i" and self.snaps.live_value(txn, okey) != target:
                    out.add(int.from_bytes(okey[1:9], "big"))
        return out

    def _own_inodes(self, held: dict[int, list]) -> dict[int, list]:
        """`writers`' answer (kernel numbers over the whole mount) in this
        volume's own numbers, the other volumes' files left out."""
        from_kernel = self.ops.kernel.from_kernel
        out = {}
        for kernel_no, who in held.items():
            ino = from_kernel(kernel_no)
            if ino is not None:
                out[ino] = who
        return out

    def _open_among(self, inodes: set[int]) -> bool:
        """Whether any of `inodes` is open (a descriptor or a mapping keeps a
        handle): no process can be writing a file nobody has open."""
        files = self.ops.files.files
        return any(files[ino].handles for ino in inodes if ino in files)

    def _refuse_writers(self, held: dict[int, list[tuple[int, str]]], changes: set[int]) -> None:
        """FilesOpenForWriting if a restore changing `changes` would change a
        file in `held` (inode -> its writers, `writers.writers`)."""
        busy = sorted(set(held) & changes)
        if not busy:
            return
        shown = []
        for ino in busy[:10]:
            who = ", ".join(f"pid {pid} {cmd}" for pid, cmd in held[ino][:5])
            shown.append(f"{self.store.path_of(ino) or f'<inode {ino}>'} ({who})")
        more = f" and {len(busy) - 10} more" if len(busy) > 10 else ""
        raise FilesOpenForWriting(
            f"the restore would change {len(busy)} file(s) that processes hold open for "
            f"writing: {'; '.join(shown)}{more}. What they write next would land in (or "
            "corrupt) the restored files: stop them or close the files first, or restore "
            "with --force (force=true)")

    def _tell_kernel(self, dentries: list[tuple[int, bytes]], inodes: list[int]) -> None:
        kernel = self.ops.kernel
        for parent, name in dentries:
            try:
                kernel.invalidate_entry(parent, name)
            except OSError:
                pass  # not in the kernel's cache
        for ino in inodes:
            try:
                kernel.invalidate_inode(ino, attr_only=False)
            except OSError:
                pass

    # --------------------------------------------------------------- fork

    async def fork(self, ident: str, run_dir: str) -> dict:
        """A new volume holding snapshot `ident`, for the run dir `run_dir`."""
        seq = parse_id(ident)
        new = self._check_fork_path(run_dir)
        # Looking at the target touches the filesystem, which may be this very
        # mount or a hung one: never from the loop.
        await trio.to_thread.run_sync(self._check_fork_target, new)
        store = self.store
        name = str(new.path)
        async with self.lock:
            rec = self.snaps.get(ident)
            self.snaps.held[seq] += 1
            try:
                dest = self._new_volume(name, rec)
                okeys = await trio.to_thread.run_sync(self._visible, seq)
                await drive(self.snaps.copy_into(seq, dest, okeys))
                with store.txn(write=True) as txn:
                    txn.put(dest._vp + b"step", rec["step"].to_bytes(8, "big"),
                            db=store.db["meta"])
                    txn.delete(dest._vp + b"incomplete", db=store.db["meta"])
            finally:
                self.snaps.held[seq] -= 1
                if not self.snaps.held[seq]:
                    del self.snaps.held[seq]
        await trio.to_thread.run_sync(self._record_run_dir, new, name)
        log.info("forked", snapshot=ident, run_dir=name, files=dest.counters()["files"])
        return {"run_dir": name, "store": str(store.dir), "volume": name,
                "run": dest.run_id, "snapshot": ident, "files": dest.counters()["files"]}

    async def copy(self, run_dir: str) -> dict:
        """A new volume for the run dir `run_dir` holding this one's files as
        they are now and its whole snapshot history, under the same snapshot
        ids (a copied graph thread: its checkpoints name those snapshots).
        Content is shared, never copied."""
        new = self._check_fork_path(run_dir)
        await trio.to_thread.run_sync(self._check_fork_target, new)
        name = str(new.path)
        dest, rec, kept = await self._copy_into(name)
        await trio.to_thread.run_sync(self._record_run_dir, new, name)
        log.info("copied", run_dir=name, snapshot=rec["id"], snapshots=kept)
        return {"run_dir": name, "store": str(self.store.dir), "volume": name,
                "run": dest.run_id, "snapshot": rec["id"], "snapshots": kept,
                "files": dest.counters()["files"]}

    async def copy_to_volume(self, name: str, *, thread: str | None = None) -> dict:
        """As `copy`, into a new volume `name` of this store (a shard's thread
        copied to another thread), recording `thread` as the one it serves."""
        if name in self.store.volumes():
            view = self.store.view(name)
            if not view.meta_u64(b"incomplete"):
                raise SnapshotError(f"volume {name!r} exists already: copy into a new one")
        extra = {b"thread": thread.encode("utf-8", "surrogatepass")} if thread else {}
        dest, rec, kept = await self._copy_into(name, extra)
        log.info("copied", volume=name, snapshot=rec["id"], snapshots=kept)
        return {"volume": name, "run": dest.run_id, "snapshot": rec["id"], "snapshots": kept,
                "files": dest.counters()["files"]}

    async def _copy_into(self, name: str, extra: dict[bytes, bytes] | None = None):
        """(the new volume `name`, the snapshot copied, how many snapshots)."""
        store, snaps = self.store, self.snaps
        async with self.lock:
            rec = await self._snapshot_locked(False, "copied", True)
            seq = parse_id(rec["id"])
            retained = [s["seq"] for s in snaps.list()]
            for s in retained:
                snaps.held[s] += 1
            try:
                origins = self._copied_from() + [{"run": store.run_id, "upto": seq}]
                dest = self._new_volume(name, rec, copied_from=origins)
                okeys = await trio.to_thread.run_sync(self._visible, seq)
                await drive(snaps.copy_into(seq, dest, okeys))
                await drive(snaps.copy_history(dest, seq))
                with store.txn(write=True) as txn:
                    meta = store.db["meta"]
                    txn.put(dest._vp + b"step", int(rec.get("live_step", rec["step"])).to_bytes(8, "big"), db=meta)
                    for key in (b"snap_seq", b"snap_base"):
                        txn.put(dest._vp + key, seq.to_bytes(8, "big"), db=meta)
                    for key, value in (extra or {}).items():
                        txn.put(dest._vp + key, value, db=meta)
                    txn.delete(dest._vp + b"incomplete", db=meta)
            finally:
                for s in retained:
                    snaps.held[s] -= 1
                    if not snaps.held[s]:
                        del snaps.held[s]
        return dest, rec, len(retained)

    def _record_run_dir(self, new: RunDir, volume: str) -> None:
        new.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        new.record_store(self.store.dir, volume)

    def _visible(self, seq: int) -> list[bytes]:
        with self.store.txn() as txn:
            return self.snaps._visible_okeys(txn, seq)

    def _check_fork_path(self, run_dir: str) -> RunDir:
        """Checks that need no filesystem access (done on the loop)."""
        if not isinstance(run_dir, str) or not run_dir or "\0" in run_dir:
            raise SnapshotError("the new run dir must be a non-empty path")
        if len(run_dir) > 4000:
            raise SnapshotError("the new run dir's path is too long")
        path = Path(run_dir)
        if not path.is_absolute():
            raise SnapshotError("the new run dir must be an absolute path")
        new = RunDir(path)
        self._refuse_inside(new.path)
        return new

    def _refuse_inside(self, path: Path) -> None:
        mine = self.daemon.run
        for other in (mine.path, mine.mountpoint, self.store.dir):
            if path == other or other in path.parents:
                raise SnapshotError(f"{path} is inside {other}: pick a directory elsewhere")

    def _check_fork_target(self, new: RunDir) -> None:
        """Checks that look at the filesystem (in a worker thread). The target
        must not exist or be an empty directory: a run dir with a store of
        its own (`.vfsd/` without `store.json`) would otherwise be pointed at
        the fork, hiding its own files."""
        self._refuse_inside(Path(os.path.realpath(new.path)))
        try:
            with os.scandir(new.path) as it:
                held = sorted(e.name for e in it)
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise SnapshotError(f"{new.path} exists and is not a directory") from None
        if held:
            shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
            what = "a run dir" if STATE_DIRNAME in held else "a directory"
            raise SnapshotError(f"{new.path} is not empty ({what} holding {shown}): fork "
                                "into a new or empty directory")

    def _new_volume(self, name: str, rec: dict, *, copied_from: list | None = None):
        store = self.store
        if name in store.volumes():
            view = store.view(name)
            if not view.meta_u64(b"incomplete"):
                raise SnapshotError(f"the store already has a volume for {name}")
            drop_volume(store, name)  # a fork that died half way: start over
        with store.txn(write=True) as txn:
            store.create_volume(txn, name, with_root=False)
        dest = store.view(name)
        with store.txn(write=True) as txn:
            txn.put(dest._vp + b"incomplete", (1).to_bytes(8, "big"), db=store.db["meta"])
            if copied_from is None:
                txn.put(dest._vp + b"forked_from",
                        json.dumps({"run": self.store.run_id, "snapshot": rec["id"]}).encode(),
                        db=store.db["meta"])
            else:
                txn.put(dest._vp + b"copied_from", json.dumps(copied_from).encode(),
                        db=store.db["meta"])
        return dest

    # --------------------------------------------------------- read-only

    def list(self) -> dict:
        return {"snapshots": self.snaps.list(), **self.snaps.state(),
                "run": self.store.run_id, "forked_from": self._forked_from(),
                "copied_from": self._copied_from()}

    def _copied_from(self) -> list[dict]:
        """[{"run", "upto"}]: the runs whose snapshots up to `upto` this volume
        holds as its own (a copy, or a copy of a copy), oldest first."""
        with self.store.txn() as txn:
            raw = txn.get(self.store._vp + b"copied_from", db=self.store.db["meta"])
        try:
            got = json.loads(bytes(raw)) if raw is not None else []
        except ValueError:
            return []
        return [o for o in got if isinstance(o, dict)] if isinstance(got, list) else []

    def _forked_from(self) -> dict | None:
        """{"run", "snapshot"} this volume was forked from, or None."""
        with self.store.txn() as txn:
            raw = txn.get(self.store._vp + b"forked_from", db=self.store.db["meta"])
        if raw is None:
            return None
        try:
            return json.loads(bytes(raw))
        except ValueError:
            return None

    async def diff(self, a: str, b: str | None) -> dict:
        # Only reads, from one LMDB read transaction: in a worker thread, so a
        # diff of 100,000 changes (10 s) no longer holds every other request.
        changes = await trio.to_thread.run_sync(self.snaps.diff, a, b)
        return {"a": a, "b": b or "live", "changes": changes}

    def locate(self, ino: int, gen: int, digest_hex: str) -> dict | None:
        try:
            digest = bytes.fromhex(digest_hex)
        except ValueError:
            raise errors.InvalidArgument("'hash' must be 32 hex digits") from None
        if len(digest) != 16:
            raise errors.InvalidArgument("'hash' must be 32 hex digits")
        return self.snaps.locate(ino, gen, digest)
