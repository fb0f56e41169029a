"""Client for the daemon's control socket (newline-delimited JSON, docs/control.md)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import ControlError

# The daemon refuses request lines above 1 MiB; refusing them here gives a clearer error.
MAX_REQUEST_BYTES = 1 << 20
# Replies (stats, eviction reports, change lists) may be larger than requests.
MAX_REPLY_BYTES = 64 << 20
# A daemon whose every connection is busy answers `busy`: wait this long in
# all (doubling pauses) before giving up with a clear error.
BUSY_RETRY_SECONDS = (0.1, 0.2, 0.4, 0.8)


def _connect(sock: socket.socket, path: Path) -> None:
    """Connect to `path`, through its directory's fd when the path is longer
    than a socket address holds (107 bytes)."""
    if len(os.fsencode(path)) <= 107:
        sock.connect(os.fspath(path))
        return
    dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.connect(f"/proc/self/fd/{dir_fd}/{path.name}")
    finally:
        os.close(dir_fd)


def _error_code(reply: dict[str, Any]) -> str | None:
    if reply.get("ok"):
        return None
    error = reply.get("error")
    return str(error.get("code")) if isinstance(error, dict) else "internal"


class ControlClient:
    """One persistent connection to `RUN_DIR/.vfsd/vfsd.sock`.

    Thread-safe: requests are serialized under a lock (the protocol answers in
    order on one connection). The connection is opened lazily and reopened once
    after a broken pipe, so a client survives a daemon restart between calls.
    """

    def __init__(self, socket_path: str | Path, timeout: float = 30.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and return its `result`; raise ControlError on an error reply."""
        request_id = next(self._ids)
        line = json.dumps({"op": op, "id": request_id, **args}, separators=(",", ":"))
        data = line.encode() + b"\n"
        if len(data) > MAX_REQUEST_BYTES:
            raise ControlError("too_large", f"request of {len(data)} bytes exceeds 1 MiB")
        with self._lock:
            reply = self._exchange_retrying_busy(op, data)
            if reply.get("id") != request_id:
                self._close_locked()
                raise self._unmatched_reply(reply, request_id)
        if not reply.get("ok"):
            error = reply.get("error") or {}
            raise ControlError(str(error.get("code", "internal")), str(error.get("message", "")))
        result = reply.get("result")
        return result if isinstance(result, dict) else {"value": result}

    def ping(self) -> bool:
        """True when the daemon answers `ping`, False when nothing answers.

        A daemon that answers `busy` is there: that raises ControlError("busy").
        """
        try:
            return bool(self.call("ping").get("pong"))
        except ControlError as exc:
            if exc.code == "busy":
                raise
            return False

    def close(self) -> None:
        """Close the connection (a later call reopens it)."""
        with self._lock:
            self._close_locked()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (caller holds the lock) ---------------------------------

    def _exchange_retrying_busy(self, op: str, data: bytes) -> dict[str, Any]:
        for pause in (*BUSY_RETRY_SECONDS, None):
            reply = self._exchange(op, data)
            if _error_code(reply) != "busy" or reply.get("id") is not None or pause is None:
                return reply
            # Refused before the request was read: nothing ran, asking again is safe.
            self._close_locked()
            time.sleep(pause)
        raise AssertionError("unreachable")

    def _unmatched_reply(self, reply: dict[str, Any], request_id: int) -> ControlError:
        """The error for a reply that does not answer our request."""
        code = _error_code(reply)
        message = str((reply.get("error") or {}).get("message", ""))
        if reply.get("id") is None and code == "busy":
            waited = sum(BUSY_RETRY_SECONDS)
            return ControlError("busy", (
                f"the vfsd daemon on {self.socket_path} is saturated: every control "
                f"connection is in the middle of a request, still after {waited:.1f} s "
                f"of retries ({message})"))
        if reply.get("id") is None and code is not None:
            # Refused before our request was read (forbidden, too_large, ...).
            return ControlError(code, message)
        return ControlError(
            "internal", f"the daemon answered request {reply.get('id')!r}, not {request_id}")

    def _exchange(self, op: str, data: bytes) -> dict[str, Any]:
        for attempt in (1, 2):
            fresh = self._sock is None
            try:
                sock = self._connect()
                try:
                    sock.sendall(data)
                except (BrokenPipeError, ConnectionResetError):
                    # A daemon that refuses a newcomer (busy, forbidden) replies
                    # and closes at once, maybe before the request went out:
                    # its reply is still there to read. Reading tells.
                    pass
                reply = json.loads(self._read_line(sock))
                if not isinstance(reply, dict):
                    raise ValueError("the daemon's reply is not a JSON object")
                return reply
            except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
                self._close_locked()
                # Retry only on a reused connection that the daemon may have dropped.
                if fresh or attempt == 2:
                    raise ControlError("connection", f"{self.socket_path}: {exc}") from exc
            except TimeoutError as exc:
                # Closed: a late reply must not answer the next request.
                self._close_locked()
                raise ControlError("connection", (
                    f"the vfsd daemon on {self.socket_path} did not answer {op!r} within "
                    f"{self.timeout:g} s (hung, stopped or overloaded); the connection "
                    "was closed")) from exc
            except (OSError, ValueError) as exc:
                self._close_locked()
                raise ControlError("connection", f"{self.socket_path}: {exc}") from exc
        raise AssertionError("unreachable")

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                _connect(sock, self.socket_path)
            except OSError:
                sock.close()
                raise
            self._sock = sock
            self._buffer = bytearray()
        else:
            self._sock.settimeout(self.timeout)  # `timeout` may have changed since
        return self._sock

    def _read_line(self, sock: socket.socket) -> bytes:
        scanned = 0
        while (end := self._buffer.find(b"\n", scanned)) < 0:
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise ValueError("reply line too long")
            scanned = len(self._buffer)
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise EOFError("daemon closed the connection")
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    def _close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buffer = bytearray()
