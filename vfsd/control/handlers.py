"""The control ops: what each request does.

`VolumeHandlers` serves the ops on one volume's files, snapshots and policy;
`ProcessHandlers` the few that concern the daemon process itself (`ping`,
`stop`). A daemon says which object serves a request (`server.ControlServer`
asks its host); this module reads a request's arguments and answers it, and
never sees the socket.
"""

from __future__ import annotations

import inspect
import os

import structlog
import trio

from vfsd import __version__, errors
from vfsd.rundir import is_mount_point
from vfsd.snapshots.snapshots import (
    FilesOpenForWriting,
    SnapshotError,
    SnapshotNotFound,
    parse_id,
)
from vfsd.steps import drive
from vfsd.store.inode import STATUS_BY_NAME, STATUS_NAMES, Inode

from .requests import MAX_INT, RequestError, arg, path_arg

log = structlog.get_logger("vfsd.control")


def error_of(exc: Exception, volume=None) -> tuple[str, str] | None:
    """The error reply (code, message) for what a handler raised; None for an
    unexpected failure (the caller logs it and answers `internal`)."""
    if isinstance(exc, RequestError):
        return exc.code, exc.message
    if isinstance(exc, SnapshotNotFound):
        return "not_found", str(exc)
    if isinstance(exc, FilesOpenForWriting):
        return "files_open", str(exc)
    if isinstance(exc, SnapshotError):
        return getattr(exc, "code", "bad_request"), str(exc)
    if isinstance(exc, errors.NotFound):
        return "not_found", f"no such file: {exc}"
    if isinstance(exc, errors.Corrupt):  # the store's fault, not the request's
        return "damaged", (f"the store is damaged: {exc}; `vfsd fsck --verify RUN_DIR` lists "
                           "what is affected")
    if isinstance(exc, errors.StoreError):
        return "bad_request", str(exc) or type(exc).__name__
    if volume is not None:
        return volume.control.failure(exc)
    return None


def handler_table(obj) -> dict:
    """op name -> bound method, for every `op_<name>` method of `obj`."""
    return {name[3:]: getattr(obj, name) for name in dir(obj) if name.startswith("op_")}


class ProcessHandlers:
    """`ping` and `stop`: the daemon process, whatever it serves."""

    def __init__(self, mountpoint, stop_serving) -> None:
        self.mountpoint = mountpoint
        self.stop_serving = stop_serving
        self.table = handler_table(self)

    def op_ping(self, req: dict) -> dict:
        return {"pong": True, "pid": os.getpid(), "version": __version__}

    async def op_stop(self, req: dict) -> dict:
        """Stop a daemon whose mount `vfsd umount` removed, but which another
        mount namespace still holds (a process that copied the mount table:
        `unshare -m`, a container or a service with private mounts, a sandbox
        cut short): the kernel keeps such a mount alive, so the daemon never
        learns it is unmounted. Refused while the mount is still here."""
        mountpoint = self.mountpoint
        # In a worker thread: resolving our own mount point is answered by our loop.
        if await trio.to_thread.run_sync(is_mount_point, mountpoint):
            raise RequestError("mounted", f"{mountpoint} is still mounted: `vfsd umount` "
                                          "unmounts it first")
        log.warning("stop_requested",
                    detail="unmounted here, but another mount namespace still holds the "
                           "mount; ending the session ends it there too")
        self.stop_serving()
        return {"stopping": True}


class VolumeHandlers:
    """The ops on one volume (`volume.Volume`, or a daemon of one volume)."""

    #: ops that change files: refused once another worker holds the run
    MUTATING = frozenset({"set_step", "evict", "set_status", "pin", "unpin", "restore",
                          "unevict"})
    #: ops that change a volume's snapshots: refused where its remote tier says
    #: so (a shard's volume outside a run: nothing it did could be published)
    HISTORY = frozenset({"snapshot", "snapshot_delete", "snapshot_pin"})

    def __init__(self, volume) -> None:
        self.volume = volume
        self.store = volume.store
        self.files = volume.ops.files
        self.ops = volume.ops
        self.evictor = volume.evictor
        self.table = handler_table(self)

    def handler(self, op: str):
        """The handler of `op` (None: no such op), checked for the run's lease."""
        fn = self.table.get(op)
        if fn is None or (op not in self.MUTATING and op not in self.HISTORY):
            return fn

        def checked(req: dict):
            if op in self.HISTORY:
                self._check_history()
            elif not (op == "evict" and req.get("dry_run") is True):
                self._check_writable()
            return fn(req)

        return checked

    def ops_known(self) -> list[str]:
        return sorted(self.table)

    @classmethod
    def names(cls) -> list[str]:
        """Every op a volume answers (without making handlers)."""
        return sorted(name[3:] for name in dir(cls) if name.startswith("op_"))

    def failure(self, exc: Exception) -> tuple[str, str] | None:
        """The error reply for what a handler of this volume raised, or None
        for an unexpected failure (logged by the server)."""
        return self._remote_failure(exc)

    def _remote_failure(self, exc: Exception) -> tuple[str, str] | None:
        """The error reply for a remote tier's failure, None for anything else.

        Only a daemon with a remote tier can fail this way, and only it has
        the remote modules loaded (boto3 with them): the others never import them.
        """
        if self.volume.remote is None:
            return None
        from vfsd.remote.bucketgc import GcError
        from vfsd.remote.head import HeadError
        from vfsd.remote.manifest import ManifestError
        from vfsd.remote.objstore import RemoteError
        from vfsd.remote.publisher import NotPublishable, SyncTimeout

        for kind, code in ((SyncTimeout, "timeout"), (NotPublishable, "not_publishable"),
                           (GcError, "gc_failed"), (RemoteError, "remote_error"),
                           (HeadError | ManifestError, "remote_damaged")):
            if isinstance(exc, kind):
                return code, str(exc)
        return None

    def _check_writable(self) -> None:
        remote = self.volume.remote
        if remote is not None and not remote.writable():
            raise RequestError("read_only", f"this mount is read-only: {remote.reason}")

    def _check_history(self) -> None:
        remote = self.volume.remote
        check = getattr(remote, "snapshots_writable", None)
        if check is not None and not check():
            raise RequestError("read_only", f"this volume's snapshots cannot change now: "
                                            f"{remote.reason}")

    def _remote(self):
        remote = self.volume.remote
        if remote is None:
            raise RequestError("no_remote", "this volume has no remote tier (mount it with "
                                            "--remote s3://BUCKET/PREFIX)")
        return remote

    def _inode_for(self, req: dict) -> Inode:
        if "path" in req:
            path = path_arg(req)
            parts = [p for p in path.split("/") if p not in ("", ".")]
            if ".." in parts:
                raise RequestError("forbidden", f"path {path!r} leaves the mount")
            inode = self.store.resolve_path("/".join(parts))
        elif "ino" in req:
            ino = arg(req, "ino", int)
            try:
                inode = self.store.get_inode(ino)
            except errors.NotFound:
                raise RequestError("not_found", f"no inode {ino}") from None
            if inode.vol != self.store.vol or inode.nlink == 0:
                raise RequestError("not_found", f"no inode {ino}")
        else:
            raise RequestError("bad_request", "give 'path' or 'ino'")
        if not inode.is_reg:
            raise RequestError("not_a_file", "not a regular file")
        return inode

    def file_ref(self, ino: int, path: str | None = None,
                 hashed: tuple[Inode, bytes] | None = None) -> dict:
        """The FileRef of a regular file; `hashed`: its (attributes, hash) of
        one moment, from `ops.content_ref` (else both are read here)."""
        inode, digest = hashed or (self.files.attrs(ino), self.files.content_hash(ino))
        digest = digest.hex()
        if path is None:
            path = self.store.path_of(ino)
        prov = self.ops.provenance
        return {"ino": ino, "gen": inode.gen, "path": path or "", "size": inode.size,
                "hash": digest, "step": inode.step, "status": STATUS_NAMES[inode.status],
                "made_by": prov.describe(inode.made_by),
                "changed_by": prov.describe(inode.changed_by)}

    # ------------------------------------------------------------ handlers

    #: requests one `batch` may carry
    BATCH_MAX = 32

    async def op_batch(self, req: dict) -> dict:
        """Several ops on this volume in one round trip, run in order. Each
        answers as a request of its own would ({"ok": true, "result": ...} or
        {"ok": false, "error": {"code", "message"}}); one that fails stops
        the rest only with `stop_on_error`."""
        reqs = arg(req, "requests", list)
        if not 1 <= len(reqs) <= self.BATCH_MAX:
            raise RequestError("bad_request", f"'requests' holds 1 to {self.BATCH_MAX} requests")
        stop = arg(req, "stop_on_error", bool, False)
        out = []
        for sub in reqs:
            answer = await self._one_of_batch(sub)
            out.append(answer)
            if stop and not answer["ok"]:
                break
        return {"results": out}

    async def _one_of_batch(self, sub) -> dict:
        op = sub.get("op") if isinstance(sub, dict) else None
        fn = self.handler(op) if isinstance(op, str) and op != "batch" else None
        if fn is None:
            shown = repr(op)[:100]
            return {"ok": False, "error": {"code": "unknown_op",
                                           "message": f"no op {shown} in a batch"}}
        try:
            result = fn(sub)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            coded = error_of(exc, self.volume)
            if coded is None:
                log.exception("control_request_failed", op=op)
                coded = ("internal", f"{type(exc).__name__}: {exc}")
            return {"ok": False, "error": {"code": coded[0], "message": coded[1]}}
        return {"ok": True, "result": result}

    def op_stats(self, req: dict) -> dict:
        from vfsd.status import live_status

        return live_status(self.volume)

    def op_perf(self, req: dict) -> dict:
        """Cumulative request figures for `vfsd stats`, which diffs two of them;
        requests are timed for `watch` seconds from now (default 5)."""
        watch = arg(req, "watch", (int, float), 5)
        if isinstance(watch, bool) or not 0 <= watch <= 3600:
            raise RequestError("bad_request", "'watch' must be 0 to 3600 seconds")
        from vfsd.status import perf_status

        tracer = self.ops.tracer
        if watch:
            tracer.watch(float(watch))
        return perf_status(self.volume)

    async def op_info(self, req: dict) -> dict:
        """`vfsd info`: provenance, tier, content placement, snapshots, eviction rule."""
        from vfsd.fileinfo import file_info

        ino = self._inode_for(req).ino
        if await self.ops.hash_hot_blocks(ino):
            ino = self._inode_for(req).ino
        ref = self.file_ref(ino)
        of = self.files.get(ino)
        if of is not None:
            self.files.flush(of)  # what the store says is then what programs see
        self.evictor.flush_uses()
        return file_info(self.store, self.volume.snapshots, self.files.attrs(ino),
                         ref["path"], config=self.volume.config, step=self.store.get_step(),
                         describe_call=self.ops.provenance.describe,
                         content_hash=ref["hash"],
                         open_handles=of.handles if of is not None else 0,
                         remote=self.volume.remote is not None)

    def op_timeline(self, req: dict) -> dict:
        """`vfsd timeline` of the mounted volume (the running step's record written first)."""
        from vfsd.timeline import timeline

        self.ops.journal.flush()
        return timeline(self.store, self.volume.snapshots,
                        describe_call=self.ops.provenance.describe)

    async def op_warmup_plan(self, req: dict) -> dict:
        """Which chunks of `paths` (default: every file) are local, and which a
        warm-up fetches within the cache's bound (`remote.warmup`)."""
        from vfsd.remote import warmup

        remote = self._remote()
        paths = arg(req, "paths", list, [])
        if len(paths) > 10_000 or not all(isinstance(p, str) for p in paths):
            raise RequestError("bad_request", "'paths' is a list of at most 10,000 paths")
        roots = []
        for path in paths or ["."]:
            parts = [p for p in path.split("/") if p not in ("", ".")]
            if ".." in parts:
                raise RequestError("forbidden", f"path {path!r} leaves the mount")
            roots.append(self.store.resolve_path("/".join(parts)))
        return await warmup.plan(self.store, remote.cache, roots)

    async def op_warmup_fetch(self, req: dict) -> dict:
        from vfsd.remote import warmup

        remote = self._remote()
        return await warmup.fetch(remote, self.store,
                                  warmup.parse_digests(req.get("digests")))

    def op_call_begin(self, req: dict) -> dict:
        """From now on, requests of the processes in `cgroup` (a cgroup
        directory's name), pid namespace `pidns` or `session` belong to `call`."""
        cgroup = arg(req, "cgroup", str, None)
        pidns = arg(req, "pidns", str, None)
        session = arg(req, "session", int, None)
        if cgroup is None and pidns is None and session is None:
            raise RequestError("bad_request", "give 'cgroup', 'pidns' or 'session'")
        if cgroup is not None and (not 0 < len(cgroup) <= 255 or "/" in cgroup
                                   or cgroup in (".", "..")):
            raise RequestError("bad_request", "'cgroup' is the name of one cgroup directory")
        if pidns is not None and (len(pidns) > 64 or not pidns.startswith("pid:[")):
            raise RequestError("bad_request", "'pidns' looks like pid:[4026531836]")
        key = self.ops.provenance.begin(arg(req, "call", dict), cgroup=cgroup, pidns=pidns,
                                        session=session)
        return {"key": f"{key:016x}"}

    def op_call_record(self, req: dict) -> dict:
        """Record `call` (one whose description is too large for a
        `user.vfsd.call` tag: a long thread id); a tag then names it by key."""
        return {"key": f"{self.ops.provenance.intern(arg(req, 'call', dict)):016x}"}

    def op_call_end(self, req: dict) -> dict:
        text = arg(req, "key", str)
        try:
            if len(text) != 16:
                raise ValueError(text)
            key = int(text, 16)
        except ValueError:
            raise RequestError("bad_request", "'key' is the hex key call_begin answered") from None
        return {"ended": self.ops.provenance.end(key)}

    def op_note_unbound(self, req: dict) -> dict:
        """Count a graph checkpoint whose files its checkpointer could not bind
        to a snapshot (shown by `vfsd status`: there should be none)."""
        checkpoint = arg(req, "checkpoint", str, "")
        count = self.store.bump_meta(b"unbound_checkpoints")
        log.warning("unbound_checkpoint", volume=self.store.volume,
                    checkpoint=checkpoint[:200], count=count)
        return {"count": count}

    def op_get_step(self, req: dict) -> dict:
        return {"step": self.store.get_step()}

    async def op_set_step(self, req: dict) -> dict:
        step = arg(req, "step", int)
        if step < 0:
            raise RequestError("bad_request", "'step' must be >= 0")
        current = self.store.get_step()
        expect = arg(req, "expect", int, None)
        if expect is not None and expect != current:
            # A client that advances the step it last saw learns it moved meanwhile.
            raise RequestError("step_moved", f"the step is {current}, not {expect}")
        if step < current:
            raise RequestError("bad_request", f"step {step} is before the current step {current}")
        # Removals in short transactions, the volume held meanwhile: a pass that
        # evicts thousands of files holds no other volume of a shard.
        async with self.volume.hold():
            return await drive(self.evictor.set_step_in_steps(step))

    async def op_evict(self, req: dict) -> dict:
        if arg(req, "dry_run", bool, False):
            return self.evictor.run(dry_run=True)
        async with self.volume.hold():
            return await drive(self.evictor.run_in_steps())

    async def op_ref(self, req: dict) -> dict:
        ino = self._inode_for(req).ino
        hashed = await self.ops.content_ref(ino)
        if "path" in req and self._inode_for(req).ino != ino:
            return self.file_ref(self._inode_for(req).ino)  # moved while it hashed: here
        return self.file_ref(ino, hashed=hashed)

    async def op_resolve(self, req: dict) -> dict:
        ref = arg(req, "ref", dict)
        ino, gen = arg(ref, "ino", int), arg(ref, "gen", int)
        await self.ops.hash_hot_blocks(ino)  # first: what follows must not await
        try:
            inode = self.store.get_inode(ino)
        except errors.NotFound:
            inode = None
        if inode is not None and inode.gen == gen and inode.nlink > 0 \
                and inode.vol == self.store.vol:
            cur = self.file_ref(ino)
            matches = "hash" not in ref or ref["hash"] == cur["hash"]
            return {"state": "live" if matches else "changed", "ref": cur,
                    "matches": matches, "evicted": None}
        record = self.store.eviction_record(ino)
        if record is not None and record.get("gen") == gen:
            return {"state": "evicted", "ref": None, "matches": False, "evicted": record}
        return {"state": "missing", "ref": None, "matches": False, "evicted": None}

    def _update(self, req: dict, **changes) -> dict:
        ino = self._inode_for(req).ino
        self.ops.set_attrs(ino, **changes)
        return self.file_ref(ino)

    def op_set_status(self, req: dict) -> dict:
        status = arg(req, "status", str)
        if status not in STATUS_BY_NAME:
            raise RequestError("bad_request", f"status must be one of {sorted(STATUS_BY_NAME)}")
        return self._update(req, status=STATUS_BY_NAME[status])

    def op_pin(self, req: dict) -> dict:
        return self._update(req, pinned=True)

    def op_unpin(self, req: dict) -> dict:
        return self._update(req, pinned=False)

    #: files per `changes` reply: each costs a block-map read on the loop
    CHANGES_PAGE = 2000

    def op_changes(self, req: dict) -> dict:
        """Files changed since a step, a page at a time (`next` resumes)."""
        since = arg(req, "since", int)
        limit = min(arg(req, "limit", int, self.CHANGES_PAGE), 10_000) or 1
        after = arg(req, "after", list, None)
        if after is not None:
            if len(after) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                          and 0 <= x <= MAX_INT for x in after):
                raise RequestError("bad_request", "'after' is [step, ino] from a `next`")
            page = self.store.scan_index("bystep", since_step=after[0], after_ino=after[1],
                                         limit=limit)
        else:
            page = self.store.scan_index("bystep", since_step=since, limit=limit)
        changed = [self.file_ref(ino) for _, ino in page]
        return {"step": self.store.get_step(), "changed": changed,
                "removed": self.store.removed_since(since) if after is None else [],
                "next": list(page[-1]) if len(page) == limit else None}

    def op_evicted(self, req: dict) -> dict:
        limit = arg(req, "limit", int, 100)
        if limit < 0:
            raise RequestError("bad_request", "'limit' must be >= 0")
        return {"records": self.store.eviction_log(limit)}

    async def op_eviction(self, req: dict) -> dict:
        """Why `path` is missing: its eviction record (with the snapshot that
        holds it and the words to say), or the evicted files below it."""
        parts = [p for p in path_arg(req).split("/") if p not in ("", ".")]
        if ".." in parts:
            raise RequestError("forbidden", f"path {req['path']!r} leaves the mount")
        path = "/".join(parts)
        limit = min(arg(req, "limit", int, 20), 1000)
        index = self.ops.evicted
        await self.ops.evicted_index_current()
        rec = index.record(path) if path else None
        below, total = index.below(path, limit) if rec is None else ([], 0)
        below = [index.explain(r) for r in below]
        message = None
        if rec is not None:
            rec = index.explain(rec)
            message = rec["message"]
        elif total:
            newest = below[0]
            message = (f"{total} file(s) below it were evicted (the newest at step "
                       f"{newest['evicted_step']}, {newest['reason']}); `vfsd unevict RUN "
                       f"{path or '.'}` (Mount.unevict) brings back what a retained snapshot holds")
        return {"path": path, "evicted": rec, "below": below, "below_total": total,
                "message": message}

    async def op_gc(self, req: dict) -> dict:
        if not arg(req, "remote", bool, False):
            # Tombstones go once durable (see `durability`): sync off the loop first.
            await trio.to_thread.run_sync(self.store.sync)
            return self.store.gc_chunks()
        remote = self._remote()
        grace = arg(req, "grace", (int, float), self.volume.config.remote_gc_grace)
        if isinstance(grace, bool) or not 1 <= grace <= 365 * 86400:
            raise RequestError("bad_request", "'grace' must be 1 to 31536000 seconds")
        dry_run = arg(req, "dry_run", bool, False)
        from vfsd.remote.bucketgc import sweep

        report = await trio.to_thread.run_sync(
            lambda: sweep(remote.objstore, grace=float(grace), dry_run=dry_run))
        return report.as_dict()

    async def op_sync(self, req: dict) -> dict:
        remote = self._remote()
        timeout = arg(req, "timeout", (int, float), 60.0)
        if isinstance(timeout, bool) or not 0 < timeout <= 86400:
            raise RequestError("bad_request",
                               "'timeout' must be above 0 and at most 86400 seconds")
        ident = self._snapshot_id(req) if "snapshot" in req else None
        return await remote.sync(ident, float(timeout))

    def op_publish_status(self, req: dict) -> dict:
        return self._remote().publish_status()

    # ----------------------------------------------------------- snapshots

    def _snapshot_id(self, req: dict, name: str = "snapshot") -> str:
        ident = arg(req, name, str)
        if len(ident) > 32:
            raise RequestError("bad_request", f"{name!r} is not a snapshot id")
        return ident

    async def op_snapshot(self, req: dict) -> dict:
        label = arg(req, "label", str, "")
        if len(label) > 200:  # checked here: a run's first snapshot takes another path
            raise RequestError("bad_request", "'label' must be at most 200 characters")
        return await self.volume.snapservice.snapshot(
            pinned=arg(req, "pin", bool, False), label=label,
            reuse=arg(req, "reuse", bool, False))

    def op_snapshots(self, req: dict) -> dict:
        return self.volume.snapservice.list()

    def op_snapshot_delete(self, req: dict) -> dict:
        return self.volume.snapservice.delete(self._snapshot_id(req))

    def op_snapshot_pin(self, req: dict) -> dict:
        return self.volume.snapshots.set_pinned(self._snapshot_id(req),
                                                arg(req, "pin", bool, True))

    async def op_restore(self, req: dict) -> dict:
        force = arg(req, "force", bool, False)
        if "paths" not in req:
            return await self.volume.snapservice.restore(self._snapshot_id(req), force=force)
        ident = self._snapshot_id(req)
        paths = self._pathsarg(req)
        seq = parse_id(ident)
        self.volume.snapshots.get(ident)  # a clear error before any work
        return await self.volume.snapservice.restore_paths(
            lambda: [(seq, p, p) for p in paths], force=force)

    def _pathsarg(self, req: dict) -> list[str]:
        """`paths`: 1 to 1,000 mount-relative paths, none leaving the tree or the root."""
        paths = arg(req, "paths", list)
        if not 1 <= len(paths) <= 1000 or not all(isinstance(p, str) for p in paths):
            raise RequestError("bad_request", "'paths' is a list of 1 to 1,000 paths")
        out = []
        for path in paths:
            try:
                path.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise RequestError("bad_request", f"path {path!r} is not valid Unicode") from None
            parts = [p for p in path.split("/") if p not in ("", ".")]
            if ".." in parts or "\0" in path:
                raise RequestError("forbidden", f"path {path!r} leaves the mount")
            if not parts:
                raise RequestError("bad_request", "the root is not a path to bring back: "
                                   "restore the whole snapshot instead")
            rel = "/".join(parts)
            if rel not in out:
                out.append(rel)
        return out

    async def op_unevict(self, req: dict) -> dict:
        """Bring evicted files (or every evicted file below a directory) back
        from the retained snapshots that hold their evicted versions."""
        paths = self._pathsarg(req)
        force = arg(req, "force", bool, False)
        index = self.ops.evicted
        await self.ops.evicted_index_current()
        lost: list[str] = []
        # Where each file is kept is looked up first, yielding between
        # batches (a few thousand files take a while); the restore checks again
        # that each snapshot is still retained.
        out: dict[str, tuple[int, str, str]] = {}
        for n, path in enumerate(paths):
            if n % 50 == 49:
                await trio.sleep(0)  # other volumes' requests between lookups
            rec = index.record(path, even_if_live=force)
            recs = [rec] if rec else index.below(path, 100_000, even_if_live=force)[0]
            if not recs:
                try:
                    self.store.resolve_path(path)
                except errors.StoreError:
                    raise RequestError("not_found", f"eviction never removed {path!r} "
                                       "(nor anything below it)") from None
                raise RequestError("exists", f"{path!r} was not evicted: it is in the "
                                   "live tree")
            found = []
            for n, r in enumerate(recs):
                found.append((r, index.where(r)))
                if n % 200 == 199:
                    await trio.sleep(0)
            kept = [(r, f) for r, f in found if f]
            if not kept:
                r = recs[0]
                raise RequestError("not_found", (
                    f"{path!r} was evicted at step {r.get('evicted_step')} "
                    f"({r.get('reason')}), but no retained snapshot holds "
                    + ("that version" if rec else f"any of the {len(recs)} files below it")
                    + ": its content is gone"))
            lost.extend(r["path"] for r, f in found if not f)
            for r, f in kept:
                out.setdefault(r["path"], (parse_id(f["id"]), f["path"], r["path"]))
        items = list(out.values())
        res = await self.volume.snapservice.restore_paths(lambda: items, force=force)
        return {**res, "lost": sorted(set(lost))}

    async def op_diff(self, req: dict) -> dict:
        b = req.get("b")
        if b in (None, "live"):
            b = None
        elif not isinstance(b, str):
            raise RequestError("bad_request", "'b' is a snapshot id or \"live\"")
        return await self.volume.snapservice.diff(self._snapshot_id(req, "a"), b)

    async def op_fork(self, req: dict) -> dict:
        return await self.volume.snapservice.fork(self._snapshot_id(req),
                                                  arg(req, "run_dir", str))

    async def op_copy(self, req: dict) -> dict:
        return await self.volume.snapservice.copy(arg(req, "run_dir", str))

    def op_locate(self, req: dict) -> dict:
        ref = arg(req, "ref", dict)
        found = self.volume.snapservice.locate(arg(ref, "ino", int), arg(ref, "gen", int),
                                               arg(ref, "hash", str))
        return {"found": found is not None, **(found or {})}
