"""A small blocking client for the control socket (used by the CLI)."""

from __future__ import annotations

import json
import socket
from pathlib import Path


class ControlError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DaemonUnreachable(Exception):
    """No daemon answers on the socket."""


class ControlClient:
    def __init__(self, sock_path: Path, timeout: float = 60.0) -> None:
        self.path = Path(sock_path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Blocking connect: with a timeout set, a full accept queue fails at
            # once with EAGAIN instead of waiting its turn.
            self.sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self.sock.close()
            raise DaemonUnreachable(f"no vfsd answers on {self.path} ({exc.strerror})") from None
        self.sock.settimeout(timeout)
        self.rfile = self.sock.makefile("rb")

    def call(self, op: str, **args) -> dict:
        self.sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
        line = self.rfile.readline()
        if not line:
            raise DaemonUnreachable("the daemon closed the connection")
        reply = json.loads(line)
        if not reply.get("ok"):
            err = reply.get("error", {})
            raise ControlError(err.get("code", "unknown"), err.get("message", ""))
        return reply["result"]

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
