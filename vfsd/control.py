"""The control socket: newline-delimited JSON requests from the agent side.

See docs/control.md for the protocol. Every failure becomes an error reply;
a bad client never takes down the daemon or another client. Requests are
handled synchronously on the trio thread, like FUSE requests, so each one is
atomic with respect to the filesystem.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import struct
from collections.abc import Callable

import structlog
import trio

from . import __version__, errors
from .inode import STATUS_BY_NAME, STATUS_NAMES, Inode
from .snapshots import SnapshotError, SnapshotNotFound

log = structlog.get_logger("vfsd.control")

MAX_REQUEST = 1 << 20
MAX_CONNECTIONS = 64
MAX_INT = (1 << 63) - 1  # steps and inode numbers are stored as unsigned 64-bit


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


class ControlServer:
    """Serves `RUN_DIR/.vfsd/vfsd.sock` for one daemon."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.store = daemon.store
        self.files = daemon.ops.files
        self.ops = daemon.ops
        self.evictor = daemon.evictor
        self.path = daemon.run.sock
        self.connections = 0
        self.requests = 0
        self.handlers: dict[str, Callable[[dict], dict]] = {
            "ping": self.op_ping, "stats": self.op_stats, "get_step": self.op_get_step,
            "set_step": self.op_set_step, "evict": self.op_evict, "ref": self.op_ref,
            "resolve": self.op_resolve, "set_status": self.op_set_status,
            "pin": self.op_pin, "unpin": self.op_unpin, "changes": self.op_changes,
            "evicted": self.op_evicted, "gc": self.op_gc,
            "snapshot": self.op_snapshot, "snapshots": self.op_snapshots,
            "snapshot_delete": self.op_snapshot_delete, "snapshot_pin": self.op_snapshot_pin,
            "restore": self.op_restore, "diff": self.op_diff, "fork": self.op_fork,
            "locate": self.op_locate,
        }

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
            await sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(128)
        listener = trio.SocketListener(sock)
        task_status.started()
        await trio.serve_listeners(self._handle_conn, [listener])

    def _peer_allowed(self, stream: trio.SocketStream) -> bool:
        raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                       struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", raw)
        return uid in (os.getuid(), 0)

    async def _handle_conn(self, stream: trio.SocketStream) -> None:
        async with stream:
            if not self._peer_allowed(stream):
                await self._send(stream, None, error=("forbidden", "peer uid not allowed"))
                return
            if self.connections >= MAX_CONNECTIONS:
                await self._send(stream, None, error=("busy", "too many connections"))
                return
            self.connections += 1
            try:
                await self._conn_loop(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
                pass
            finally:
                self.connections -= 1

    async def _conn_loop(self, stream: trio.SocketStream) -> None:
        buf = bytearray()
        while True:
            nl = buf.find(b"\n")
            while nl < 0:
                if len(buf) > MAX_REQUEST:
                    await self._send(stream, None, error=(
                        "too_large", f"request exceeds {MAX_REQUEST} bytes"))
                    return
                chunk = await stream.receive_some(65536)
                if not chunk:
                    if buf.strip():
                        await self._send(stream, None, error=(
                            "bad_json", "connection closed inside a request"))
                    return
                start = len(buf)
                buf += chunk
                nl = buf.find(b"\n", start)
            line = bytes(buf[:nl])
            del buf[:nl + 1]
            if len(line) > MAX_REQUEST:
                await self._send(stream, None, error=("too_large",
                                                      f"request exceeds {MAX_REQUEST} bytes"))
                return
            if not line.strip():
                continue
            req_id, result, error = await self.handle_line(line)
            # Names that eviction removed must be gone from the kernel's cache
            # before the client hears back: `ls` right after must not see them.
            # The kernel is told from a worker thread while the reply is encoded.
            pending = self.evictor.take_invalidations()
            async with trio.open_nursery() as nursery:
                if pending:
                    nursery.start_soon(trio.to_thread.run_sync, self.evictor.invalidate_now,
                                       pending)
                reply = self._encode(req_id, result=result, error=error)
            await stream.send_all(reply)

    async def handle_line(self, line: bytes):
        """(id, result, error) for one request line."""
        self.requests += 1
        try:
            req = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            return None, None, ("bad_json", f"not valid JSON: {exc}")
        if not isinstance(req, dict):
            return None, None, ("bad_request", "a request is a JSON object")
        req_id = req.get("id")
        op = req.get("op")
        if not isinstance(op, str):
            return req_id, None, ("bad_request", "missing 'op' (a string)")
        handler = self.handlers.get(op)
        if handler is None:
            return req_id, None, ("unknown_op", f"unknown op {op!r}; known: "
                                  + ", ".join(sorted(self.handlers)))
        try:
            result = handler(req)
            if inspect.isawaitable(result):
                result = await result
            return req_id, result, None
        except RequestError as exc:
            return req_id, None, (exc.code, exc.message)
        except SnapshotNotFound as exc:
            return req_id, None, ("not_found", str(exc))
        except SnapshotError as exc:
            return req_id, None, ("bad_request", str(exc))
        except errors.NotFound as exc:
            return req_id, None, ("not_found", f"no such file: {exc}")
        except errors.StoreError as exc:
            return req_id, None, ("bad_request", str(exc) or type(exc).__name__)
        except Exception as exc:
            log.exception("control_request_failed", op=op)
            return req_id, None, ("internal", f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _encode(req_id, *, result=None, error=None) -> bytes:
        if error is not None:
            msg = {"ok": False, "id": req_id, "error": {"code": error[0], "message": error[1]}}
        else:
            msg = {"ok": True, "id": req_id, "result": result}
        return json.dumps(msg).encode() + b"\n"

    async def _send(self, stream, req_id, *, result=None, error=None) -> None:
        await stream.send_all(self._encode(req_id, result=result, error=error))

    # -------------------------------------------------------------- helpers

    def _inode_for(self, req: dict) -> Inode:
        if "path" in req:
            path = _arg(req, "path", str)
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

    def file_ref(self, ino: int, path: str | None = None) -> dict:
        digest = self.files.content_hash(ino).hex()
        inode = self.files.attrs(ino)
        if path is None:
            path = self.store.path_of(ino)
        return {"ino": ino, "gen": inode.gen, "path": path or "", "size": inode.size,
                "hash": digest, "step": inode.step, "status": STATUS_NAMES[inode.status]}

    # ------------------------------------------------------------ handlers

    def op_ping(self, req: dict) -> dict:
        return {"pong": True, "pid": os.getpid(), "version": __version__}

    def op_stats(self, req: dict) -> dict:
        from .status import live_status

        return live_status(self.daemon)

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

    def op_ref(self, req: dict) -> dict:
        inode = self._inode_for(req)
        return self.file_ref(inode.ino)

    def op_resolve(self, req: dict) -> dict:
        ref = _arg(req, "ref", dict)
        ino, gen = _arg(ref, "ino", int), _arg(ref, "gen", int)
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

    def op_changes(self, req: dict) -> dict:
        since = _arg(req, "since", int)
        changed = [self.file_ref(ino) for _, ino in self.store.scan_index("bystep", since_step=since)]
        return {"step": self.store.get_step(), "changed": changed,
                "removed": self.store.removed_since(since)}

    def op_evicted(self, req: dict) -> dict:
        limit = _arg(req, "limit", int, 100)
        if limit < 0:
            raise RequestError("bad_request", "'limit' must be >= 0")
        return {"records": self.store.eviction_log(limit)}

    def op_gc(self, req: dict) -> dict:
        return self.store.gc_chunks()

    # ----------------------------------------------------------- snapshots

    def _snapshot_id(self, req: dict, name: str = "snapshot") -> str:
        ident = _arg(req, name, str)
        if len(ident) > 32:
            raise RequestError("bad_request", f"{name!r} is not a snapshot id")
        return ident

    async def op_snapshot(self, req: dict) -> dict:
        return await self.daemon.snapservice.snapshot(
            pinned=_arg(req, "pin", bool, False), label=_arg(req, "label", str, ""),
            reuse=_arg(req, "reuse", bool, False))

    def op_snapshots(self, req: dict) -> dict:
        return self.daemon.snapservice.list()

    def op_snapshot_delete(self, req: dict) -> dict:
        return self.daemon.snapservice.delete(self._snapshot_id(req))

    def op_snapshot_pin(self, req: dict) -> dict:
        return self.daemon.snapshots.set_pinned(self._snapshot_id(req),
                                                _arg(req, "pin", bool, True))

    async def op_restore(self, req: dict) -> dict:
        return await self.daemon.snapservice.restore(self._snapshot_id(req))

    def op_diff(self, req: dict) -> dict:
        b = req.get("b")
        if b in (None, "live"):
            b = None
        elif not isinstance(b, str):
            raise RequestError("bad_request", "'b' is a snapshot id or \"live\"")
        return self.daemon.snapservice.diff(self._snapshot_id(req, "a"), b)

    async def op_fork(self, req: dict) -> dict:
        return await self.daemon.snapservice.fork(self._snapshot_id(req),
                                                  _arg(req, "run_dir", str))

    def op_locate(self, req: dict) -> dict:
        ref = _arg(req, "ref", dict)
        found = self.daemon.snapservice.locate(_arg(ref, "ino", int), _arg(ref, "gen", int),
                                               _arg(ref, "hash", str))
        return {"found": found is not None, **(found or {})}
