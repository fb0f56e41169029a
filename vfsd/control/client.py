"""A small blocking client for the control socket (used by the CLI).

Every way a request can fail comes out as one of two exceptions with a message
for people: DaemonUnreachable (no daemon, or it went away or stopped answering
during the request) and ControlError (the daemon answered with an error reply,
including `busy` when every connection slot is in the middle of a request).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from .unixpath import reachable_socket_path

#: replies (change lists, eviction logs) may be far larger than requests
MAX_REPLY = 256 << 20


class ControlError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DaemonUnreachable(Exception):
    """No daemon answers on the socket, or it went away during the request."""


class ControlClient:
    def __init__(self, sock_path: Path, timeout: float = 60.0) -> None:
        self.path = Path(sock_path)
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Blocking connect: with a timeout set, a full accept queue fails at
            # once with EAGAIN instead of waiting its turn.
            with reachable_socket_path(self.path) as address:
                self.sock.connect(address)
        except OSError as exc:
            self.sock.close()
            raise DaemonUnreachable(f"no vfsd answers on {self.path} ({exc.strerror})") from None
        self.sock.settimeout(timeout)
        self.rfile = self.sock.makefile("rb")

    def call(self, op: str, **args) -> dict:
        try:
            try:
                self.sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed before the request went out: read the reply
            line = self.rfile.readline(MAX_REPLY)
        except TimeoutError:
            raise DaemonUnreachable(
                f"the daemon did not answer {op!r} within {self.timeout:.0f} s") from None
        except OSError as exc:
            raise DaemonUnreachable(
                f"the connection to the daemon broke during {op!r} ({exc.strerror or exc})"
            ) from None
        if not line.endswith(b"\n"):
            raise DaemonUnreachable(f"the daemon closed the connection before answering {op!r}")
        try:
            reply = json.loads(line)
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except ValueError:
            raise DaemonUnreachable(f"the daemon's reply to {op!r} is not valid JSON") from None
        if not reply.get("ok"):
            err = reply.get("error") or {}
            code, message = str(err.get("code", "unknown")), str(err.get("message", ""))
            raise ControlError(code, message)
        return reply.get("result")

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
