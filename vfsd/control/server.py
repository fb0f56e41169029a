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

Which object answers a request is the host's business (the daemon: a run
dir's serves every op on its one volume, a shard's finds the volume a
request names): `host.handlers_for(op, req)` gives the handler and the
volume it works on (None for ops on the process), or raises RequestError.
"""

from __future__ import annotations

import inspect
import os
import socket
import struct

import structlog
import trio

from .connslots import IDLE, READING, WORKING, Slot, SlotTable
from .handlers import error_of
from .protocol import MAX_REQUEST, ProtocolError, decode_request, encode_reply, is_bulky
from .requests import peer
from .unixpath import reachable_socket_path

log = structlog.get_logger("vfsd.control")

MAX_CONNECTIONS = 64
#: no uid may hold more slots than this (root keeps room next to the owner;
#: a daemon running as root serves root alone, which may hold them all)
MAX_CONNECTIONS_PER_UID = 48
DEFAULT_IDLE_TIMEOUT_S = 300.0
# What a vanished client looks like; not worth more than a debug line.
_CLIENT_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


class ControlServer:
    """Serves `RUN_DIR/.vfsd/vfsd.sock` for one daemon."""

    def __init__(self, host, path, config=None) -> None:
        self.host = host
        self.path = path
        self.idle_timeout = float(getattr(config, "control_idle_timeout", None)
                                  or DEFAULT_IDLE_TIMEOUT_S)
        # Root and the daemon's owner may connect; when they are one uid, it has every slot.
        per_uid = MAX_CONNECTIONS if os.getuid() == 0 else MAX_CONNECTIONS_PER_UID
        self.slots = SlotTable(MAX_CONNECTIONS, per_uid)
        self.requests = 0

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

    def _peer(self, stream: trio.SocketStream) -> tuple[int, int, int]:
        """(pid, uid, gid) of the connecting process (SO_PEERCRED)."""
        raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                       struct.calcsize("3i"))
        return struct.unpack("3i", raw)

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
        pid, uid, gid = self._peer(stream)
        peer.set((pid, uid, gid))  # this connection's task: who asks (`requests.peer`)
        if uid not in (os.getuid(), 0):
            await self._send_bounded(stream, encode_reply(
                None, error=("forbidden", "peer uid not allowed")))
            return
        # A process that reaches the socket may name tool calls (`provenance`).
        self.host.peers.add(pid)
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
            req_id, result, error, volume = await self.handle_line(line)
            if error is not None and error[0] == "too_large":
                await self._send_bounded(stream, encode_reply(req_id, error=error))
                return
            reply = await self._encode(req_id, result, error)
            # Names that eviction removed must be gone from the kernel's cache
            # before the client hears back: `ls` right after must not see them.
            pending = volume.evictor.take_invalidations() if volume is not None else None
            if pending:
                await self._invalidate(volume, pending)
            if not await self._send_bounded(stream, reply):
                return

    async def _encode(self, req_id, result, error) -> bytes:
        """The reply line; a bulky one is encoded in a worker thread, so the
        loop serves other requests meanwhile."""
        if error is None and is_bulky(result):
            try:
                return await trio.to_thread.run_sync(
                    lambda: encode_reply(req_id, result=result))
            except RuntimeError:
                pass  # changed while encoded (a live structure): encode it here
        return encode_reply(req_id, result=result, error=error)

    async def _invalidate(self, volume, pending) -> None:
        try:
            await trio.to_thread.run_sync(volume.evictor.invalidate_now, pending)
        except Exception:
            log.exception("control_invalidation_failed")

    async def handle_line(self, line: bytes):
        """(id, result, error, volume) for one request line. Never raises."""
        self.requests += 1
        try:
            req = decode_request(line)
        except ProtocolError as exc:
            return None, None, (exc.code, exc.message), None
        req_id = req.get("id")
        op = req.get("op")
        if not isinstance(op, str):
            return req_id, None, ("bad_request", "missing 'op' (a string)"), None
        volume = None
        try:
            handler, volume = self.host.handlers_for(op, req)
            if handler is None:
                return req_id, None, ("unknown_op", f"unknown op {op[:100]!r}; known: "
                                      + ", ".join(self.host.known_ops())), None
            if volume is not None and volume.held is not None:
                await volume.wait_free()  # a long operation holds it
            result = handler(req)
            if inspect.isawaitable(result):
                result = await result
            return req_id, result, None, volume
        except Exception as exc:
            coded = error_of(exc, volume)
            if coded is not None:
                return req_id, None, coded, volume
            log.exception("control_request_failed", op=op)
            return req_id, None, ("internal", f"{type(exc).__name__}: {exc}"), volume
