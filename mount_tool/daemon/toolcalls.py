"""The tool call running now, so that the files it writes name it (provenance).

vfsd records, for every file, the tool call that created it and the one
that last changed its content. mount_tool tells the daemon which call is
running without any help from the model:

- `VfsdMiddleware` wraps every tool call in `running(tool, id, thread)`;
  the current call lives in a context variable, so concurrent tool calls
  (asyncio tasks, LangChain's worker threads) each see their own.
- Writes through `Mount.write` and the Deep Agents file tools tag the
  descriptor they are about to write with the call (`tag(fd)`: the
  `user.vfsd.call` xattr, one request per written file, no transaction).
- `execute` registers its command's cgroup (or sandbox) with the daemon
  before the command runs (`Sandbox.run(..., on_confined=...)`), so every
  process of the command, background ones and forks included, is
  attributed to the call by its process id.

Outside `running(...)` nothing is tagged: the daemon records "no tool call".
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

logger = logging.getLogger(__name__)

#: the xattr the daemon reads the call from (write-only)
CALL_XATTR = "user.vfsd.call"
#: a tag's largest inline value; a larger call (a long thread id) is recorded
#: once through the control socket and tagged by its key
TAG_INLINE_MAX = 4096
#: (socket path, tool, id, thread) -> key of calls recorded that way
_recorded: dict[tuple, str] = {}

_current: ContextVar[dict[str, Any] | None] = ContextVar("vfsd_tool_call", default=None)


def current() -> dict[str, Any] | None:
    """The running tool call {"tool", "id", "thread", "step"?}, or None."""
    return _current.get()


@contextlib.contextmanager
def running(tool: str, call_id: str, thread: str = "",
            step: int | None = None) -> Iterator[dict[str, Any]]:
    """Make writes inside the block count as tool call `call_id` of `tool`."""
    call: dict[str, Any] = {"tool": str(tool), "id": str(call_id), "thread": str(thread)}
    if step is not None:
        call["step"] = int(step)
    token = _current.set(call)
    try:
        yield call
    finally:
        _current.reset(token)


@contextlib.contextmanager
def for_request(request: Any, step: int | None = None) -> Iterator[dict[str, Any] | None]:
    """`running(...)` for a LangChain ToolCallRequest (nothing if it names no
    call, or if that call is running already: middleware nest)."""
    named = from_request(request)
    now = _current.get()
    if named is None or (now is not None and now["id"] == named[1]):
        yield now
        return
    with running(*named, step=step) as call:
        yield call


def from_request(request: Any) -> tuple[str, str, str] | None:
    """(tool, call id, thread) of a LangChain ToolCallRequest, if it names them."""
    call = getattr(request, "tool_call", None) or {}
    tool, call_id = call.get("name"), call.get("id")
    if not tool or not call_id:
        return None
    runtime = getattr(request, "runtime", None)
    config = getattr(runtime, "config", None) or {}
    thread = (config.get("configurable") or {}).get("thread_id") or ""
    return str(tool), str(call_id), str(thread)


def tag(fd: int, client: Any = None) -> None:
    """Tell the daemon that the running tool call is about to write through `fd`.

    Nothing happens outside a tool call. The daemon takes the tag only from
    a process that has reached its control socket (a command inside
    `execute` cannot name a call): `client`, the mount's ControlClient, is
    pinged once if the daemon refuses for that reason (a daemon restarted
    since this process last spoke to it). A tag still refused loses the
    attribution, with a warning, never the write.
    """
    call = _current.get()
    if call is None:
        return
    try:
        value = _tag_value(call, client)
    except Exception as exc:  # noqa: BLE001 - the write goes on; the attribution is lost
        logger.warning("tool call %s:%s could not be recorded as the author of this "
                       "write: %s", call.get("tool"), call.get("id"), exc)
        return
    for attempt in (0, 1):
        try:
            os.setxattr(fd, CALL_XATTR, value)
            return
        except OSError as exc:
            if exc.errno == errno.EPERM and attempt == 0 and client is not None:
                with contextlib.suppress(Exception):
                    client.ping()
                continue
            if exc.errno == errno.EINVAL and attempt == 0 and value.startswith(b'{"key"'):
                _recorded.clear()  # recorded in a store that is not this mount's now
                with contextlib.suppress(Exception):
                    value = _tag_value(call, client)
                    continue
            logger.warning("the daemon refused to record tool call %s:%s as the author "
                           "of this write: %s", call.get("tool"), call.get("id"), exc)
            return


def _tag_value(call: dict[str, Any], client: Any) -> bytes:
    """The `user.vfsd.call` value for `call`: its JSON, or for one too large
    for an xattr, {"key"} of the call recorded through `client`."""
    value = json.dumps(call).encode()
    if len(value) <= TAG_INLINE_MAX:
        return value
    if client is None:
        raise ValueError(f"its description takes {len(value)} bytes, more than a tag holds, "
                         "and no control client was given to record it")
    ident = (str(client.socket_path), call["tool"], call["id"], call["thread"])
    key = _recorded.get(ident)
    if key is None:
        key = client.call("call_record", call=call)["key"]
        if len(_recorded) >= 1024:
            _recorded.clear()
        _recorded[ident] = key
    return json.dumps({"key": key}).encode()
