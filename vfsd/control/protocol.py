"""Decoding requests and encoding replies of the control protocol (docs/control.md).

A request line is checked before it is decoded: its size, and how deeply its
arrays and objects nest (Python's decoder recurses once per level, so a line of
a few thousand `[` would otherwise end in RecursionError). Decoding is strict
JSON: `NaN`, `Infinity` and numbers that overflow a float are refused, so no
value can come back in a reply that is not valid JSON.
"""

from __future__ import annotations

import json
import math
import re

MAX_REQUEST = 1 << 20
#: arrays and objects may nest this deep in a request (requests need 3)
MAX_DEPTH = 32
#: arrays and objects in one request, all levels together
MAX_CONTAINERS = 10_000

# Escapes go first (two bytes each), so a string is then just quote to quote:
# both passes are linear, whatever the line holds.
_ESCAPE = re.compile(rb"\\.", re.S)
_STRING = re.compile(rb'"[^"]*"')
_OPENERS = frozenset(b"[{")
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # everything but brackets


class ProtocolError(Exception):
    """A request line that cannot be taken; `code` is the error reply's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def nesting_problem(line: bytes) -> str | None:
    """Why `line` nests too deeply to decode safely, or None if it does not.

    Brackets inside strings do not count. Cost: a few C-speed passes over the
    line, plus a Python loop over at most MAX_CONTAINERS brackets.
    """
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return None  # cannot nest deeper than it has brackets
    bare = _STRING.sub(b'""', _ESCAPE.sub(b"", line))
    opens = bare.count(b"[") + bare.count(b"{")
    if opens <= MAX_DEPTH:
        return None
    if opens > MAX_CONTAINERS:
        return f"more than {MAX_CONTAINERS} arrays and objects in one request"
    depth = 0
    for byte in bare.translate(None, _BRACKETS):
        if byte in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                return f"arrays and objects nested deeper than {MAX_DEPTH} levels"
        else:
            depth -= 1
    return None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def decode_request(line: bytes) -> dict:
    """The request object in `line`; ProtocolError(code, message) if there is none.

    The reply to a ProtocolError carries no id: the request could not be read.
    """
    if len(line) > MAX_REQUEST:
        raise ProtocolError("too_large", f"request exceeds {MAX_REQUEST} bytes")
    problem = nesting_problem(line)
    if problem is not None:
        raise ProtocolError("bad_json", problem)
    try:
        req = json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("bad_json", f"not valid JSON: {exc}") from None
    except RecursionError:  # a second line of defence; nesting_problem should catch it
        raise ProtocolError("bad_json", "nested too deeply") from None
    if not isinstance(req, dict):
        raise ProtocolError("bad_request", "a request is a JSON object")
    return req


def encode_reply(req_id, *, result=None, error: tuple[str, str] | None = None) -> bytes:
    """One reply line. Never raises: a reply that cannot be encoded becomes an
    `internal` error reply (and an id that cannot be encoded becomes null)."""
    if error is not None:
        msg = {"ok": False, "id": req_id, "error": {"code": error[0], "message": error[1]}}
    else:
        msg = {"ok": True, "id": req_id, "result": result}
    try:
        return json.dumps(msg, allow_nan=False).encode() + b"\n"
    except (TypeError, ValueError, RecursionError) as exc:
        fallback = {"ok": False, "id": _encodable(req_id),
                    "error": {"code": "internal", "message": f"reply not encodable: {exc}"}}
        return json.dumps(fallback).encode() + b"\n"


#: A reply holding more items than this (lists and objects, three levels deep)
#: is encoded off the daemon's loop: 20,000 eviction records take ~0.13 s.
BULKY_ITEMS = 2_000


def is_bulky(result) -> bool:
    """Whether `result` may take long to encode; cheap (stops at BULKY_ITEMS)."""
    seen = 0
    level = [result]
    for _ in range(3):
        below = []
        for value in level:
            if isinstance(value, dict):
                seen += len(value)
                below.extend(v for v in value.values() if isinstance(v, (dict, list)))
            elif isinstance(value, list):
                seen += len(value)
                below.extend(v for v in value[:BULKY_ITEMS] if isinstance(v, (dict, list)))
            if seen > BULKY_ITEMS:
                return True
        level = below
    return False


def _encodable(value):
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return value
