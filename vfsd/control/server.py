"""The control socket: newline-delimited JSON requests from the agent side.

See docs/control.md for the protocol. Every failure becomes an error reply;
a bad client never takes down the daemon or another client: anything a
connection's task raises ends that connection only (and is logged), and the
accept loop survives whatever accept() says. Requests are handled
synchronously on the trio thread, like FUSE requests, so each one is atomic
with respect to the filesystem.

Connections are bounded in number (connslots: idle ones make room for new
ones, so idle clients cannot lock anyone out) and in time: a connection that
sends no complete request, or does not take its reply, within the idle
timeout is closed.
"""

from __future__ import annotations

import inspect
import os
import socket
import struct
from collections.abc import Callable

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
from vfsd.store.inode import STATUS_BY_NAME, STATUS_NAMES, Inode

from .connslots import IDLE, READING, WORKING, Slot, SlotTable
from .protocol import MAX_REQUEST, ProtocolError, decode_request, encode_reply
from .unixpath import reachable_socket_path

log = structlog.get_logger("vfsd.control")

MAX_CONNECTIONS = 64
#: no uid may hold more slots than this (root keeps room next to the owner;
#: a daemon running as root serves root alone, which may hold them all)
MAX_CONNECTIONS_PER_UID = 48
DEFAULT_IDLE_TIMEOUT_S = 300.0
MAX_INT = (1 << 63) - 1  # steps and inode numbers are stored as unsigned 64-bit
# What a vanished client looks like; not worth more than a debug line.
_CLIENT_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


class RequestError(Exception):
    """A request that gets an error reply with `code`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _arg(req: dict, name: str, kind: type | tuple, default=...):
    if name not in req:
        if default is ...:
            raise RequestError("bad_request", f"missing argument {name!r}")
        return default
    value = req[name]
    if isinstance(value, bool) and kind is int:
        raise RequestError("bad_request", f"{name!r} must be an integer")
    if not isinstance(value, kind):
        raise RequestError("bad_request", f"{name!r} has the wrong type ({type(value).__name__})")
    if kind is int and not 0 <= value <= MAX_INT:
        raise RequestError("bad_request", f"{name!r} must be between 0 and {MAX_INT}")
    return value


def _path_arg(req: dict) -> str:
    """The `path` argument, which must encode to bytes (names that are not
    UTF-8 arrive as surrogate escapes; a lone surrogate names nothing)."""
    path = _arg(req, "path", str)
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise RequestError("bad_request", f"path {path!r} is not valid Unicode") from None
    return path


class ControlServer:
    """Serves `RUN_DIR/.vfsd/vfsd.sock` for one daemon."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.store = daemon.store
        self.files = daemon.ops.files
        self.ops = daemon.ops
        self.evictor = daemon.evictor
        self.path = daemon.run.sock
        config = getattr(daemon, "config", None)
        self.idle_timeout = float(getattr(config, "control_idle_timeout", None)
                                  or DEFAULT_IDLE_TIMEOUT_S)
        # Root and the daemon's owner may connect; when they are one uid, it has every slot.
        per_uid = MAX_CONNECTIONS if os.getuid() == 0 else MAX_CONNECTIONS_PER_UID
        self.slots = SlotTable(MAX_CONNECTIONS, per_uid)
        self.requests = 0
        self.handlers: dict[str, Callable[[dict], dict]] = {
            "ping": self.op_ping, "stats": self.op_stats, "get_step": self.op_get_step,
            "set_step": self.op_set_step, "evict": self.op_evict, "ref": self.op_ref,
            "resolve": self.op_resolve, "set_status": self.op_set_status,
            "pin": self.op_pin, "unpin": self.op_unpin, "changes": self.op_changes,
            "evicted": self.op_evicted, "eviction": self.op_eviction, "gc": self.op_gc,
            "snapshot": self.op_snapshot, "snapshots": self.op_snapshots,
            "snapshot_delete": self.op_snapshot_delete, "snapshot_pin": self.op_snapshot_pin,
            "restore": self.op_restore, "unevict": self.op_unevict,
            "diff": self.op_diff, "fork": self.op_fork,
            "copy": self.op_copy,
            "locate": self.op_locate, "sync": self.op_sync,
            "publish_status": self.op_publish_status,
            "perf": self.op_perf, "info": self.op_info, "timeline": self.op_timeline,
            "warmup_plan": self.op_warmup_plan, "warmup_fetch": self.op_warmup_fetch,
            "call_begin": self.op_call_begin, "call_record": self.op_call_record,
            "call_end": self.op_call_end, "stop": self.op_stop,
            "note_unbound": self.op_note_unbound,
        }
        # Requests that change files: refused once another worker holds the run.
        self.mutating = {"set_step", "evict", "set_status", "pin", "unpin", "restore", "unevict"}

    @property
    def connections(self) -> int:
        return len(self.slots)

    # ------------------------------------------------------------ serving

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Created owner-only from the start: no window where others can connect.
        old = os.umask(0o177)
        try:
            with reachable_socket_path(self.path) as address:
                await sock.bind(address)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(128)
        listener = trio.SocketListener(sock)
        task_status.started()
        async with listener, trio.open_nursery() as nursery:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    # Out of file descriptors or memory: wait, never give up the socket.
                    log.warning("control_accept_failed", error=str(exc))
                    await trio.sleep(0.1)
                    continue
                nursery.start_soon(self._handle_conn, stream)

    def _peer(self, stream: trio.SocketStream) -> tuple[int, int]:
        """(pid, uid) of the connecting process (SO_PEERCRED)."""
        raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                       struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", raw)
        return pid, uid

    async def _handle_conn(self, stream: trio.SocketStream) -> None:
        """One connection, start to end. Nothing it raises reaches the nursery."""
        try:
            async with stream:
                await self._serve_conn(stream)
        except _CLIENT_GONE:
            log.debug("control_client_gone")
        except Exception:
            log.exception("control_connection_failed")

    async def _serve_conn(self, stream: trio.SocketStream) -> None:
        pid, uid = self._peer(stream)
        if uid not in (os.getuid(), 0):
            await self._send_bounded(stream, encode_reply(
                None, error=("forbidden", "peer uid not allowed")))
            return
        # A process that reaches the socket may name tool calls (`provenance`).
        self.ops.provenance.peers.add(pid)
        slot = self.slots.admit(uid)
        if slot is None:
            await self._send_bounded(stream, encode_reply(None, error=(
                "busy", f"the daemon is saturated: all {MAX_CONNECTIONS} control connections "
                        "are in the middle of a request; retry shortly")))
            return
        try:
            with slot.scope:
                await self._conn_loop(stream, slot)
        finally:
            self.slots.release(slot)
        if slot.evicted:
            log.debug("control_idle_connection_closed", uid=uid, reason="slot needed")

    async def _send_bounded(self, stream: trio.SocketStream, data: bytes) -> bool:
        """Send within the idle timeout; False if the client did not take it."""
        with trio.move_on_after(self.idle_timeout):
            await stream.send_all(data)
            return True
        log.info("control_client_not_reading", timeout_s=self.idle_timeout)
        return False

    async def _read_line(self, stream: trio.SocketStream, slot: Slot, buf: bytearray):
        """The next request line, or None when the connection ends (end of
        input, or an error reply that closes it: too large, cut off)."""
        nl = buf.find(b"\n")
        while nl < 0:
            if len(buf) > MAX_REQUEST:
                await self._send_bounded(stream, encode_reply(None, error=(
                    "too_large", f"request exceeds {MAX_REQUEST} bytes")))
                return None
            slot.set_state(READING if buf else IDLE)
            chunk = await stream.receive_some(65536)
            if not chunk:
                if buf.strip():
                    await self._send_bounded(stream, encode_reply(None, error=(
                        "bad_json", "connection closed inside a request")))
                return None
            start = len(buf)
            buf += chunk
            nl = buf.find(b"\n", start)
        line = bytes(buf[:nl])
        del buf[:nl + 1]
        return line

    async def _conn_loop(self, stream: trio.SocketStream, slot: Slot) -> None:
        buf = bytearray()
        while True:
            with trio.move_on_after(self.idle_timeout) as waiting:
                line = await self._read_line(stream, slot, buf)
            if waiting.cancelled_caught:
                log.debug("control_connection_timed_out", timeout_s=self.idle_timeout)
                return
            if line is None:
                return
            if not line.strip():
                continue
            slot.set_state(WORKING)
            slot.requests += 1
            req_id, result, error = await self.handle_line(line)
            if error is not None and error[0] == "too_large":
                await self._send_bounded(stream, encode_reply(req_id, error=error))
                return
            reply = encode_reply(req_id, result=result, error=error)
            # Names that eviction removed must be gone from the kernel's cache
            # before the client hears back: `ls` right after must not see them.
            pending = self.evictor.take_invalidations()
            if pending:
                await self._invalidate(pending)
            if not await self._send_bounded(stream, reply):
                return

    async def _invalidate(self, pending) -> None:
        try:
            await trio.to_thread.run_sync(self.evictor.invalidate_now, pending)
        except Exception:
            log.exception("control_invalidation_failed")

    async def handle_line(self, line: bytes):
        """(id, result, error) for one request line. Never raises."""
        self.requests += 1
        try:
            req = decode_request(line)
        except ProtocolError as exc:
            return None, None, (exc.code, exc.message)
        req_id = req.get("id")
        op = req.get("op")
        if not isinstance(op, str):
            return req_id, None, ("bad_request", "missing 'op' (a string)")
        handler = self.handlers.get(op)
        if handler is None:
            return req_id, None, ("unknown_op", f"unknown op {op[:100]!r}; known: "
                                  + ", ".join(sorted(self.handlers)))
        try:
            if op in self.mutating and not (op == "evict" and req.get("dry_run") is True):
                self._check_writable()
            result = handler(req)
            if inspect.isawaitable(result):
                result = await result
            return req_id, result, None
        except RequestError as exc:
            return req_id, None, (exc.code, exc.message)
        except SnapshotNotFound as exc:
            return req_id, None, ("not_found", str(exc))
        except FilesOpenForWriting as exc:
            return req_id, None, ("files_open", str(exc))
        except SnapshotError as exc:
            return req_id, None, (getattr(exc, "code", "bad_request"), str(exc))
        except errors.NotFound as exc:
            return req_id, None, ("not_found", f"no such file: {exc}")
        except errors.Corrupt as exc:  # the store's fault, not the request's
            return req_id, None, ("damaged", f"the store is damaged: {exc}; "
                                  "`vfsd fsck --verify RUN_DIR` lists what is affected")
        except errors.StoreError as exc:
            return req_id, None, ("bad_request", str(exc) or type(exc).__name__)
        except Exception as exc:
            coded = self._remote_failure(exc)
            if coded is not None:
                return req_id, None, coded
            log.exception("control_request_failed", op=op)
            return req_id, None, ("internal", f"{type(exc).__name__}: {exc}")

    # -------------------------------------------------------------- helpers

    def _remote_failure(self, exc: Exception) -> tuple[str, str] | None:
        """The error reply for a remote tier's failure, None for anything else.

        Only a daemon with a remote tier can fail this way, and only it has
        the remote modules loaded (boto3 with them): the others never import them.
        """
        if self.daemon.remote is None:
            return None
        from vfsd.remote.bucketgc import GcError
        from vfsd.remote.objstore import RemoteError
        from vfsd.remote.publisher import NotPublishable, SyncTimeout

        for kind, code in ((SyncTimeout, "timeout"), (NotPublishable, "not_publishable"),
                           (GcError, "gc_failed"), (RemoteError, "remote_error")):
            if isinstance(exc, kind):
                return code, str(exc)
        return None

    def _check_writable(self) -> None:
        remote = self.daemon.remote
        if remote is not None and not remote.writable():
            raise RequestError("read_only", f"this mount is read-only: {remote.reason}")

    def _remote(self):
        remote = self.daemon.remote
        if remote is None:
            raise RequestError("no_remote", "this run dir has no remote tier (mount it with "
                                            "--remote s3://BUCKET/PREFIX)")
        return remote

    def _inode_for(self, req: dict) -> Inode:
        if "path" in req:
            path = _path_arg(req)
            parts = [p for p in path.split("/") if p not in ("", ".")]
            if ".." in parts:
                raise RequestError("forbidden", f"path {path!r} leaves the mount")
            inode = self.store.resolve_path("/".join(parts))
        elif "ino" in req:
            ino = _arg(req, "ino", int)
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

    def op_ping(self, req: dict) -> dict:
        return {"pong": True, "pid": os.getpid(), "version": __version__}

    async def op_stop(self, req: dict) -> dict:
        """Stop a daemon whose mount `vfsd umount` removed, but which another
        mount namespace still holds (a process that copied the mount table:
        `unshare -m`, a container or a service with private mounts, a sandbox
        cut short): the kernel keeps such a mount alive, so the daemon never
        learns it is unmounted. Refused while the mount is still here."""
        mountpoint = self.daemon.run.mountpoint
        # In a worker thread: resolving our own mount point is answered by our loop.
        if await trio.to_thread.run_sync(is_mount_point, mountpoint):
            raise RequestError("mounted", f"{mountpoint} is still mounted: `vfsd umount` "
                                          "unmounts it first")
        log.warning("stop_requested",
                    detail="unmounted here, but another mount namespace still holds the "
                           "mount; ending the session ends it there too")
        self.daemon.stop_serving()
        return {"stopping": True}

    def op_stats(self, req: dict) -> dict:
        from vfsd.status import live_status

        return live_status(self.daemon)

    def op_perf(self, req: dict) -> dict:
        """Cumulative request figures for `vfsd stats`, which diffs two of them;
        requests are timed for `watch` seconds from now (default 5)."""
        watch = _arg(req, "watch", (int, float), 5)
        if isinstance(watch, bool) or not 0 <= watch <= 3600:
            raise RequestError("bad_request", "'watch' must be 0 to 3600 seconds")
        from vfsd.status import perf_status

        tracer = self.ops.tracer
        if watch:
            tracer.watch(float(watch))
        return perf_status(self.daemon)

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
        return file_info(self.store, self.daemon.snapshots, self.files.attrs(ino),
                         ref["path"], config=self.daemon.config, step=self.store.get_step(),
                         describe_call=self.ops.provenance.describe,
                         content_hash=ref["hash"],
                         open_handles=of.handles if of is not None else 0,
                         remote=self.daemon.remote is not None)

    def op_timeline(self, req: dict) -> dict:
        """`vfsd timeline` of the mounted volume (the running step's record written first)."""
        from vfsd.timeline import timeline

        self.ops.journal.flush()
        return timeline(self.store, self.daemon.snapshots,
                        describe_call=self.ops.provenance.describe)

    async def op_warmup_plan(self, req: dict) -> dict:
        """Which chunks of `paths` (default: every file) are local, and which a
        warm-up fetches within the cache's bound (`remote.warmup`)."""
        from vfsd.remote import warmup

        remote = self._remote()
        paths = _arg(req, "paths", list, [])
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
        cgroup = _arg(req, "cgroup", str, None)
        pidns = _arg(req, "pidns", str, None)
        session = _arg(req, "session", int, None)
        if cgroup is None and pidns is None and session is None:
            raise RequestError("bad_request", "give 'cgroup', 'pidns' or 'session'")
        if cgroup is not None and (not 0 < len(cgroup) <= 255 or "/" in cgroup
                                   or cgroup in (".", "..")):
            raise RequestError("bad_request", "'cgroup' is the name of one cgroup directory")
        if pidns is not None and (len(pidns) > 64 or not pidns.startswith("pid:[")):
            raise RequestError("bad_request", "'pidns' looks like pid:[4026531836]")
        key = self.ops.provenance.begin(_arg(req, "call", dict), cgroup=cgroup, pidns=pidns,
                                        session=session)
        return {"key": f"{key:016x}"}

    def op_call_record(self, req: dict) -> dict:
        """Record `call` (one whose description is too large for a
        `user.vfsd.call` tag: a long thread id); a tag then names it by key."""
        return {"key": f"{self.ops.provenance.intern(_arg(req, 'call', dict)):016x}"}

    def op_call_end(self, req: dict) -> dict:
        text = _arg(req, "key", str)
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
        checkpoint = _arg(req, "checkpoint", str, "")
        count = self.store.bump_meta(b"unbound_checkpoints")
        log.warning("unbound_checkpoint", checkpoint=checkpoint[:200], count=count)
        return {"count": count}

    def op_get_step(self, req: dict) -> dict:
        return {"step": self.store.get_step()}

    def op_set_step(self, req: dict) -> dict:
        step = _arg(req, "step", int)
        if step < 0:
            raise RequestError("bad_request", "'step' must be >= 0")
        current = self.store.get_step()
        if step < current:
            raise RequestError("bad_request", f"step {step} is before the current step {current}")
        return self.evictor.set_step(step)

    def op_evict(self, req: dict) -> dict:
        return self.evictor.run(dry_run=_arg(req, "dry_run", bool, False))

    async def op_ref(self, req: dict) -> dict:
        ino = self._inode_for(req).ino
        hashed = await self.ops.content_ref(ino)
        if "path" in req and self._inode_for(req).ino != ino:
            return self.file_ref(self._inode_for(req).ino)  # moved while it hashed: here
        return self.file_ref(ino, hashed=hashed)

    async def op_resolve(self, req: dict) -> dict:
        ref = _arg(req, "ref", dict)
        ino, gen = _arg(ref, "ino", int), _arg(ref, "gen", int)
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
        status = _arg(req, "status", str)
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
        since = _arg(req, "since", int)
        limit = min(_arg(req, "limit", int, self.CHANGES_PAGE), 10_000) or 1
        after = _arg(req, "after", list, None)
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
        limit = _arg(req, "limit", int, 100)
        if limit < 0:
            raise RequestError("bad_request", "'limit' must be >= 0")
        return {"records": self.store.eviction_log(limit)}

    async def op_eviction(self, req: dict) -> dict:
        """Why `path` is missing: its eviction record (with the snapshot that
        holds it and the words to say), or the evicted files below it."""
        parts = [p for p in _path_arg(req).split("/") if p not in ("", ".")]
        if ".." in parts:
            raise RequestError("forbidden", f"path {req['path']!r} leaves the mount")
        path = "/".join(parts)
        limit = min(_arg(req, "limit", int, 20), 1000)
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
        if not _arg(req, "remote", bool, False):
            # Tombstones go once durable (see `durability`): sync off the loop first.
            await trio.to_thread.run_sync(self.store.sync)
            return self.store.gc_chunks()
        remote = self._remote()
        grace = _arg(req, "grace", (int, float), self.daemon.config.remote_gc_grace)
        if isinstance(grace, bool) or not 1 <= grace <= 365 * 86400:
            raise RequestError("bad_request", "'grace' must be 1 to 31536000 seconds")
        dry_run = _arg(req, "dry_run", bool, False)
        from vfsd.remote.bucketgc import sweep

        report = await trio.to_thread.run_sync(
            lambda: sweep(remote.objstore, grace=float(grace), dry_run=dry_run))
        return report.as_dict()

    async def op_sync(self, req: dict) -> dict:
        remote = self._remote()
        timeout = _arg(req, "timeout", (int, float), 60.0)
        if isinstance(timeout, bool) or not 0 < timeout <= 86400:
            raise RequestError("bad_request",
                               "'timeout' must be above 0 and at most 86400 seconds")
        ident = self._snapshot_id(req) if "snapshot" in req else None
        return await remote.sync(ident, float(timeout))

    def op_publish_status(self, req: dict) -> dict:
        return self._remote().publish_status()

    # ----------------------------------------------------------- snapshots

    def _snapshot_id(self, req: dict, name: str = "snapshot") -> str:
        ident = _arg(req, name, str)
        if len(ident) > 32:
            raise RequestError("bad_request", f"{name!r} is not a snapshot id")
        return ident

    async def op_snapshot(self, req: dict) -> dict:
        label = _arg(req, "label", str, "")
        if len(label) > 200:  # checked here: a run's first snapshot takes another path
            raise RequestError("bad_request", "'label' must be at most 200 characters")
        return await self.daemon.snapservice.snapshot(
            pinned=_arg(req, "pin", bool, False), label=label,
            reuse=_arg(req, "reuse", bool, False))

    def op_snapshots(self, req: dict) -> dict:
        return self.daemon.snapservice.list()

    def op_snapshot_delete(self, req: dict) -> dict:
        return self.daemon.snapservice.delete(self._snapshot_id(req))

    def op_snapshot_pin(self, req: dict) -> dict:
        return self.daemon.snapshots.set_pinned(self._snapshot_id(req),
                                                _arg(req, "pin", bool, True))

    async def op_restore(self, req: dict) -> dict:
        force = _arg(req, "force", bool, False)
        if "paths" not in req:
            return await self.daemon.snapservice.restore(self._snapshot_id(req), force=force)
        ident = self._snapshot_id(req)
        paths = self._paths_arg(req)
        seq = parse_id(ident)
        self.daemon.snapshots.get(ident)  # a clear error before any work
        return await self.daemon.snapservice.restore_paths(
            lambda: [(seq, p, p) for p in paths], force=force)

    def _paths_arg(self, req: dict) -> list[str]:
        """`paths`: 1 to 1,000 mount-relative paths, none leaving the tree or the root."""
        paths = _arg(req, "paths", list)
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
        paths = self._paths_arg(req)
        force = _arg(req, "force", bool, False)
        index = self.ops.evicted
        await self.ops.evicted_index_current()
        lost: list[str] = []
        # Where each file is kept is looked up first, yielding between
        # batches (a few thousand files take a while); the restore checks again
        # that each snapshot is still retained.
        out: dict[str, tuple[int, str, str]] = {}
        for path in paths:
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
        res = await self.daemon.snapservice.restore_paths(lambda: items, force=force)
        return {**res, "lost": sorted(set(lost))}

    async def op_diff(self, req: dict) -> dict:
        b = req.get("b")
        if b in (None, "live"):
            b = None
        elif not isinstance(b, str):
            raise RequestError("bad_request", "'b' is a snapshot id or \"live\"")
        return await self.daemon.snapservice.diff(self._snapshot_id(req, "a"), b)

    async def op_fork(self, req: dict) -> dict:
        return await self.daemon.snapservice.fork(self._snapshot_id(req),
                                                  _arg(req, "run_dir", str))

    async def op_copy(self, req: dict) -> dict:
        return await self.daemon.snapservice.copy(_arg(req, "run_dir", str))

    def op_locate(self, req: dict) -> dict:
        ref = _arg(req, "ref", dict)
        found = self.daemon.snapservice.locate(_arg(ref, "ino", int), _arg(ref, "gen", int),
                                               _arg(ref, "hash", str))
        return {"found": found is not None, **(found or {})}
