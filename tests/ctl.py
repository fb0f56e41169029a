"""A raw client for the vfsd control socket, for tests.

Unlike `vfsd.control.client.ControlClient` it never interprets replies: tests see the
exact reply document, can send arbitrary bytes, and notice a closed connection.
Every read is bounded by the socket timeout, so a test cannot hang on a
daemon that never answers.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

TIMEOUT_S = 10.0


def sock_path(run_dir: Path) -> Path:
    """The control socket of a run dir."""
    return Path(run_dir) / ".vfsd" / "vfsd.sock"


class Conn:
    """One connection to the control socket."""

    def __init__(self, path: Path, timeout: float = TIMEOUT_S) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        # A Unix socket whose listen backlog is full makes a non-blocking
        # connect fail with EAGAIN at once (no EINPROGRESS): retry, bounded.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock.connect(str(path))
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.sock.close()
                    raise
                time.sleep(0.005)
            except OSError:
                self.sock.close()
                raise
        self._buf = b""

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_line(self) -> bytes:
        """The next reply line (without newline); b"" if the daemon closed the connection."""
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                rest, self._buf = self._buf, b""
                return rest
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def recv_reply(self) -> dict:
        line = self.recv_line()
        assert line, "the daemon closed the connection instead of replying"
        reply = json.loads(line)
        assert isinstance(reply, dict), reply
        return reply

    def request(self, op: str | None = None, **args) -> dict:
        """Send one request and return the whole reply document."""
        req = dict(args) if op is None else {"op": op, **args}
        self.send_raw(json.dumps(req).encode() + b"\n")
        return self.recv_reply()

    def call(self, op: str, **args) -> dict:
        """Send one request that must succeed and return its result."""
        reply = self.request(op, **args)
        assert reply.get("ok") is True, f"{op} {args} failed: {reply}"
        return reply["result"]

    def error(self, op: str | None = None, **args) -> dict:
        """Send one request that must fail and return its error object."""
        reply = self.request(op, **args)
        assert reply.get("ok") is False, f"{op} {args} unexpectedly succeeded: {reply}"
        err = reply["error"]
        assert isinstance(err.get("code"), str) and isinstance(err.get("message"), str), reply
        return err

    def is_closed_by_peer(self) -> bool:
        """True once the daemon has closed its side (after any pending replies)."""
        try:
            return self.recv_line() == b"" and not self._buf
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(run_dir: Path, timeout: float = TIMEOUT_S) -> Conn:
    """A fresh connection to the daemon of `run_dir`."""
    return Conn(sock_path(run_dir), timeout)


def call(run_dir: Path, op: str, **args) -> dict:
    """One successful request on a fresh connection; its result."""
    with connect(run_dir) as c:
        return c.call(op, **args)


def error(run_dir: Path, op: str | None = None, **args) -> dict:
    """One failing request on a fresh connection; its error object."""
    with connect(run_dir) as c:
        return c.error(op, **args)
