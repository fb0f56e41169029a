"""Reading a request's arguments: each wrong one is a `RequestError` naming it."""

from __future__ import annotations

from contextvars import ContextVar

#: (pid, uid, gid) of the process at the other end of the connection whose
#: request is being handled (`SO_PEERCRED`; pid 0 when it is in a pid namespace
#: the daemon cannot see), set by the control server for each connection
peer: ContextVar[tuple[int, int, int] | None] = ContextVar("peer", default=None)

MAX_INT = (1 << 63) - 1  # steps and inode numbers are stored as unsigned 64-bit


class RequestError(Exception):
    """A request that gets an error reply with `code`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def arg(req: dict, name: str, kind: type | tuple, default=...):
    """Argument `name` of type `kind` (`default` when absent, if given)."""
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


def path_arg(req: dict) -> str:
    """The `path` argument, which must encode to bytes (names that are not
    UTF-8 arrive as surrogate escapes; a lone surrogate names nothing)."""
    path = arg(req, "path", str)
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise RequestError("bad_request", f"path {path!r} is not valid Unicode") from None
    return path
