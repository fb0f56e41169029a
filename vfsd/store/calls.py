"""Tool calls, the authors of files (provenance).

A mixin of `store.Store` (table `call`, whose layout the package docstring
documents). A tool call is named by its key: the xxh3-64 of its thread,
tool name and tool-call id, so the same call gets the same key in every
store and daemon run, and an inode record can name it in 8 bytes (its
`made_by` / `changed_by`). Keys 0 (no tool call) and 2**64-1 (unknown) are
never a call's. The record is written once, when a daemon first sees the
call: one small transaction per tool call, never one per request.
"""

from __future__ import annotations

import json
import struct

import xxhash

from vfsd import errors

from .inode import NO_CALL, UNKNOWN_CALL

_U64 = struct.Struct(">Q")
#: the string fields of a call and their longest accepted length in UTF-8
#: bytes: a thread id is whatever LangGraph was given, and mount_tool's Runs
#: takes any string up to 64 KiB (control characters and lone surrogates
#: too), so the daemon records all of those, as they are; whatever shows them
#: to a person escapes control characters
CALL_FIELDS = {"tool": 128, "id": 1024, "thread": 64 * 1024}


def check_call(desc: object) -> dict:
    """A call description from outside, checked: {"tool", "id", "thread", "step"}.

    `tool` and `id` are needed; `thread` may be "" and `step` absent. Raises
    InvalidArgument naming what is wrong.
    """
    if not isinstance(desc, dict):
        raise errors.InvalidArgument("a tool call is a JSON object")
    out: dict = {}
    for name, limit in CALL_FIELDS.items():
        value = desc.get(name, "" if name == "thread" else None)
        if not isinstance(value, str) or (name != "thread" and not value):
            raise errors.InvalidArgument(f"a tool call's {name!r} must be a non-empty string"
                                         if name != "thread" else
                                         "a tool call's 'thread' must be a string")
        if len(value) > limit // 4 and len(value.encode("utf-8", "surrogatepass")) > limit:
            raise errors.InvalidArgument(
                f"a tool call's {name!r} must be at most {limit} bytes (UTF-8)")
        out[name] = value
    step = desc.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                             or not 0 <= step < 1 << 63):
        raise errors.InvalidArgument("a tool call's 'step' must be a non-negative integer")
    out["step"] = step
    return out


def call_key(desc: dict) -> int:
    """The key of a (checked) call: never NO_CALL or UNKNOWN_CALL."""
    raw = "\0".join((desc["thread"], desc["tool"], desc["id"])).encode("utf-8", "surrogatepass")
    key = xxhash.xxh3_64_intdigest(raw)
    return key if key not in (NO_CALL, UNKNOWN_CALL) else 1


class CallsMixin:
    """The tool-call half of `Store`."""

    def put_call(self, key: int, desc: dict) -> None:
        """Record a call (its first sight by this daemon); the same record twice is harmless."""
        with self.txn(write=True) as txn:
            txn.put(_U64.pack(key), json.dumps(desc, sort_keys=True).encode(),
                    db=self.db["call"])

    def get_call(self, key: int) -> dict | None:
        """The call `key` names; None for no call, an unknown one or one
        recorded elsewhere (a run resumed from another worker's bucket)."""
        if key in (NO_CALL, UNKNOWN_CALL) or self.db.get("call") is None:
            return None
        with self.txn() as txn:
            raw = txn.get(_U64.pack(key), db=self.db["call"])
        return json.loads(bytes(raw)) if raw is not None else None


def describe(key: int, desc: dict | None) -> dict | None:
    """What a reference, `.vfsd/attr` and `vfsd info` show for a call key:
    {"tool", "id", "thread", "step"}, {"key"} alone for a call recorded
    elsewhere, None for no tool call; UNKNOWN_CALL gives {"unknown": True}."""
    if key == NO_CALL:
        return None
    if key == UNKNOWN_CALL:
        return {"unknown": True}
    if desc is None:
        return {"key": f"{key:016x}"}
    return {"tool": desc["tool"], "id": desc["id"], "thread": desc["thread"],
            "step": desc.get("step")}
