"""VfsdMiddleware: a deep agent's graph state kept down to references into the mount.

It holds a `files` channel of ~150-byte FileRefs (kept in step with the
mount after every tool call and pruned when the daemon evicts), advances the
daemon's step once per model turn, and keeps large `write_file`/`edit_file`
arguments out of the conversation.

Large tool-call arguments. A model that writes a 1 MB file puts 1 MB into its
AIMessage, and LangGraph stores that message in the checkpoint and again in the
`Send` packet that carries the call to the tool node. The middleware therefore
acts where the message is born (`wrap_model_call`): each argument over
`compact_threshold_chars` is saved to the mount under `/.tool_args/` and the
message gets a short marker naming the target file instead. When the tool runs,
`wrap_tool_call` puts the real text back (checked against its hash), so the
tool, permission rules and any other middleware see normal arguments; the staged
copy is deleted once the call has run. The marker that stays in history says
where the content went. Staged files are marked `done`, so a call that never
runs (a rejected human-in-the-loop review) is evicted by the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import ExtendedModelResponse, ModelResponse, PrivateStateAttr
from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.types import Command

from ..daemon import toolcalls
from ..errors import ControlError, MountToolError
from ..langgraph.boundary import BoundaryChannel, await_capture, wait_for_capture
from ..langgraph.channel import files_reducer
from ..langgraph.checkpointer import warn_if_unwrapped
from ..mount import Mount
from ..refs import FileRef
from ..reserved import TMP_DIR
from ..runs import Runs, lease
from ..sandbox import Sandbox
from .evictnotes import turn_note
from .offload import safe_file_stem

logger = logging.getLogger(__name__)

DEFAULT_COMPACT_THRESHOLD_CHARS = 2_000
STAGING_DIR = ".tool_args"
# Which arguments of which tools may carry file bodies.
BODY_ARGS: dict[str, tuple[str, ...]] = {
    "write_file": ("content",),
    "edit_file": ("old_string", "new_string"),
}
# Tools that cannot change the mount: no sync needed after them.
READ_ONLY_TOOLS = frozenset({"ls", "read_file", "glob", "grep", "write_todos"})
_MARKER = re.compile(r"staged=(/\.tool_args/[A-Za-z0-9._-]+) xxh3=([0-9a-f]{32})\]$")


def virtual_path(path: str) -> str:
    """The agent-facing form of a mount-relative path ("out/a.txt" -> "/out/a.txt")."""
    return "/" + path.strip("/")


def _updates_for(files: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, FileRef | None]:
    """The `files` update for a `changes` answer: changed files get their
    current ref; a ref whose inode was removed (unlinked or evicted) gets
    None unless the same update re-creates its path."""
    view: dict[str, Any] = dict(files)
    updates: dict[str, FileRef | None] = {}
    for ref in delta["changed"]:
        key = virtual_path(ref["path"])
        if _is_staged(key):
            continue
        if view.get(key) != ref:
            view[key] = updates[key] = ref
    removed = {rec["ino"] for rec in delta["removed"]}
    for key, ref in view.items():
        if ref and ref.get("ino") in removed:
            updates[key] = None
    return updates


def _as_update(updates: dict[str, FileRef | None]) -> dict[str, Any] | None:
    return {"files": updates} if updates else None


def files_delta_reducer(
    left: Mapping[str, FileRef] | None, writes: Iterable[Mapping[str, FileRef | None]]
) -> dict[str, FileRef]:
    """`files_reducer` over a batch of writes, for LangGraph's DeltaChannel."""
    merged: dict[str, FileRef] = dict(left or {})
    for update in writes:
        merged = files_reducer(merged, update)
    return merged


class VfsdAgentState(AgentState):
    """Agent state with a `files` map of FileRefs (never file bodies).

    A DeltaChannel, as deepagents uses for `messages`: a checkpoint stores the
    refs that changed in its step, plus a full snapshot every 50 updates,
    instead of the whole map each time.

    `vfsd_boundary` is private (in neither the input nor the output schema)
    and holds nothing: LangGraph checkpoints it at every step boundary, which
    is where `VfsdCheckpointer` captures the checkpoint's files, whoever
    compiles the graph (see `mount_tool.langgraph.boundary`). A new thread's first
    checkpoint and the tasks of its first step read it as None.
    """

    files: NotRequired[
        Annotated[dict[str, FileRef], DeltaChannel(files_delta_reducer, snapshot_frequency=50)]
    ]
    vfsd_boundary: NotRequired[Annotated[None, BoundaryChannel, PrivateStateAttr]]


class VfsdMiddleware(AgentMiddleware):
    """Keeps a deep agent's graph state down to references into the vfsd mount.

    - at the start of each model call, in one request to the daemon: record
      refs for files changed since the last one, advance the daemon's step by
      one (one step per model turn), and drop refs of files the daemon evicted;
    - after each tool call that can change files: put refs of files the tool
      (or the shell, or a subagent) wrote under their virtual paths in `files`,
      and None for files it deleted (one request);
    - around the model call: `write_file`/`edit_file` arguments longer than
      `compact_threshold_chars` move to the mount and the AIMessage keeps a
      marker (see the module docstring);
    - the system prompt gets `prompt_note`: how paths work for the file tools
      and `execute`, and the command limits (default: the note of a default
      `VfsdBackend`; pass `backend.prompt_note()` for another configuration,
      "" for none).
    """

    state_schema = VfsdAgentState

    def __init__(
        self,
        files: Mount | Runs,
        *,
        compact_threshold_chars: int = DEFAULT_COMPACT_THRESHOLD_CHARS,
        advance_step: bool = True,
        prompt_note: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(files, Mount | Runs):
            raise TypeError(f"files must be a mount_tool Mount or Runs, not {type(files)!r}")
        if compact_threshold_chars < 1:
            raise ValueError("compact_threshold_chars must be positive")
        self.files = files
        self.compact_threshold_chars = compact_threshold_chars
        self.advance_step = advance_step
        self.prompt_note = Sandbox(files.root).prompt_note() if prompt_note is None else prompt_note
        self.tools = []

    @property
    def mount(self) -> Mount:
        """The Mount of the one-mount form (AttributeError with a Runs)."""
        if not isinstance(self.files, Mount):
            raise AttributeError("this VfsdMiddleware serves a Runs: runs.get(thread_id)")
        return self.files

    # -- keeping `files` true --------------------------------------------------

    def sync_files(self, files: Mapping[str, Any], since_step: int,
                   mount: Mount | None = None) -> dict[str, FileRef | None]:
        """The `files` update for what changed in the mount (default: the
        running thread's) from `since_step` on.

        Changed files get their current ref; a ref whose inode was removed
        (unlinked or evicted) gets None unless the same update re-creates its path.
        """
        if mount is None:
            with lease(self.files) as m:
                return self.sync_files(files, since_step, m)
        # The daemon's `since` is inclusive: files stamped with since_step are listed.
        return _updates_for(files, mount.changes(since_step))

    def _turn_update(self, state: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        with lease(self.files) as m:
            return self._turn_update_on(m, state)

    def _turn_update_on(self, m: Mount, state: Mapping[str, Any]
                        ) -> tuple[dict[str, Any] | None, str | None]:
        """The `files` update of the turn that ended, and the note for the model
        when the step advance evicted files it had used (refs in `files`, or
        opened since they were written)."""
        warn_if_unwrapped(self.files)
        files = state.get("files") or {}
        note = None
        if not self.advance_step:
            return _as_update(self.sync_files(files, m.get_step(), m)), None
        # One round trip: the turn's changes, then the step advanced (eviction).
        delta, report = m.advance_step()
        updates = _updates_for(files, delta)
        records = report.get("evicted", [])
        evicted = {rec["ino"] for rec in records}
        view = {**files, **updates}
        touched = set()
        for key, ref in view.items():
            if ref and ref.get("ino") in evicted:
                updates[key] = None
                touched.add(ref["ino"])
        # Files the run only read (inputs put there before it) have no ref;
        # one opened after its last write was read by the agent's tools.
        # (Staged arguments and /tmp are the middleware's and the sandbox's.)
        touched.update(rec["ino"] for rec in records
                       if rec.get("used_step", 0) > rec.get("step", 0)
                       and not _is_staged(virtual_path(rec.get("path", ""))))
        if touched:
            note = turn_note(m, records, touched)
        return _as_update(updates), note

    # -- model calls: advance the step, keep large arguments out of the message ----

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Start a turn (step, sync, prune), call the model, stage large arguments.

        The turn's `files` update rides on the model node's own write (as an
        ExtendedModelResponse command) instead of a node of its own: one
        superstep, hence one checkpoint, fewer per turn.
        """
        wait_for_capture()  # the files of the checkpoint this step starts from
        update, note = self._turn_update(request.state)
        response = self._compact_response(handler(self._with_note(request, note)))
        return _with_command(response, update)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Async `wrap_model_call`; mount I/O runs in worker threads."""
        await await_capture()
        update, note = await asyncio.to_thread(self._turn_update, request.state)
        response = await handler(self._with_note(request, note))
        response = await asyncio.to_thread(self._compact_response, response)
        return _with_command(response, update)

    def _with_note(self, request: Any, evicted_note: str | None = None) -> Any:
        """`request` with the path-convention note at the end of its system
        message, and this turn's eviction note (said once: only the step
        advance that evicted the files produces it)."""
        message = request.system_message
        for text in (self.prompt_note, evicted_note):
            if text:
                message = append_to_system_message(message, text)
        if message is request.system_message:
            return request
        return request.override(system_message=message)

    def _compact_response(self, response: Any) -> Any:
        if not _has_big_args(response, self.compact_threshold_chars):
            return response  # nothing to stage: no mount needed
        with lease(self.files) as m:
            return self._compact(m, response)

    def _compact(self, m: Mount, response: Any) -> Any:
        if isinstance(response, AIMessage):
            return self._compact_message(m, response)
        if isinstance(response, ModelResponse):
            return ModelResponse(
                result=[self._compact_message(m, msg) for msg in response.result],
                structured_response=response.structured_response,
            )
        if isinstance(response, ExtendedModelResponse):
            return ExtendedModelResponse(
                model_response=self._compact(m, response.model_response),
                command=response.command,
            )
        return response

    def _compact_message(self, m: Mount, message: Any) -> Any:
        if not isinstance(message, AIMessage) or not message.tool_calls:
            return message
        replaced: dict[str, dict[str, str]] = {}  # tool call id -> {arg: marker}
        for call in message.tool_calls:
            names = BODY_ARGS.get(call["name"], ())
            args = call.get("args") or {}
            big = {
                n: args[n]
                for n in names
                if isinstance(args.get(n), str) and len(args[n]) > self.compact_threshold_chars
            }
            markers = {}
            for n, text in big.items() if call.get("id") else ():
                try:
                    markers[n] = self._stage(m, call, n, text)
                except (OSError, ValueError, MountToolError) as exc:
                    # A full mount must not fail the model call: keep the text inline.
                    logger.warning("could not stage %s of %s: %s", n, call["id"], exc)
            if markers:
                replaced[call["id"]] = markers
        if not replaced:
            return message
        return message.model_copy(update=_with_markers(message, replaced))

    def _stage(self, m: Mount, call: Mapping[str, Any], arg: str, text: str) -> str:
        staged = f"/{STAGING_DIR}/{safe_file_stem(call['id'])}.{arg}"
        ref = m.write(staged.lstrip("/"), text)
        # A call that never runs leaves its staged copy to eviction.
        with contextlib.suppress(ControlError):
            m.set_status(ref, "done")
        target = (call.get("args") or {}).get("file_path", "?")
        what = "content written to" if arg == "content" else f"{arg} of the edit to"
        return (
            f"[vfsd: {what} {target} ({len(text):,} characters) kept in the mount; "
            f"staged={staged} xxh3={ref['hash']}]"
        )

    # -- tool calls: restore arguments, sync refs --------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Restore staged arguments, run the tool, record the files it changed.

        First, the files of the checkpoint this step starts from are captured
        (a tool may change the mount by any means: `execute`, a user's tool)."""
        wait_for_capture()
        begun = self._begin_tool(request)
        if isinstance(begun, ToolMessage):
            return begun
        request, staged, before = begun
        try:
            with toolcalls.for_request(request, step=before):
                result = handler(request)
        finally:
            self._unstage(staged)
        return self._with_files(result, request, before)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Async `wrap_tool_call`; mount I/O runs in worker threads."""
        await await_capture()
        begun = await asyncio.to_thread(self._begin_tool, request)
        if isinstance(begun, ToolMessage):
            return begun
        request, staged, before = begun
        try:
            with toolcalls.for_request(request, step=before):
                result = await handler(request)
        finally:
            await asyncio.to_thread(self._unstage, staged)
        return await asyncio.to_thread(self._with_files, result, request, before)

    def _begin_tool(self, request: Any) -> tuple[Any, list[str], int] | ToolMessage:
        """Before a tool runs: its staged arguments put back, and the step it starts at."""
        with lease(self.files) as m:
            restored = self._restore(m, request)
            if isinstance(restored, ToolMessage):
                return restored
            return (*restored, m.step_hint())

    def _restore(self, m: Mount, request: Any) -> tuple[Any, list[str]] | ToolMessage:
        call = request.tool_call
        names = BODY_ARGS.get(call.get("name"), ())
        args = dict(call.get("args") or {})
        staged: list[str] = []
        for name in names:
            value = args.get(name)
            match = _MARKER.search(value) if isinstance(value, str) else None
            if match is None:
                continue
            path, expected = match.groups()
            try:
                data = m.read_bytes(path.lstrip("/"))
            except (OSError, ValueError):
                data = None
            if data is None or m.hash_of(data) != expected:
                return ToolMessage(
                    content=(
                        f"Error: the {name} argument was kept in the mount at {path}, "
                        "but that copy is gone or changed. Send the full text again."
                    ),
                    name=call.get("name"),
                    tool_call_id=call.get("id"),
                    status="error",
                )
            args[name] = data.decode("utf-8")
            staged.append(path)
        if not staged:
            return request, []
        return request.override(tool_call={**call, "args": args}), staged

    def _unstage(self, staged: list[str]) -> None:
        if not staged:
            return
        with lease(self.files) as m:
            for path in staged:
                with contextlib.suppress(OSError, ValueError):
                    m.remove(path.lstrip("/"))
            with contextlib.suppress(OSError, ValueError):
                m.remove(STAGING_DIR, directory=True)  # only when empty

    def _with_files(self, result: Any, request: Any, since_step: int) -> Any:
        if request.tool_call.get("name") in READ_ONLY_TOOLS:
            return result
        state = request.state if isinstance(request.state, Mapping) else {}
        files = state.get("files") or {}
        if isinstance(result, Command) and isinstance(result.update, Mapping):
            # A subagent may return its own `files` map: apply it, then the mount's truth.
            returned = result.update.get("files") or {}
            updates = {**returned, **self.sync_files({**files, **returned}, since_step)}
            if not updates:
                return result
            return Command(
                graph=result.graph,
                update={**result.update, "files": updates},
                resume=result.resume,
                goto=result.goto,
            )
        if isinstance(result, ToolMessage):
            updates = self.sync_files(files, since_step)
            if updates:
                return Command(update={"messages": [result], "files": updates})
        return result


def append_to_system_message(message: SystemMessage | None, text: str) -> SystemMessage:
    """`message` with `text` added as a last text block (a new message if None)."""
    blocks = list(message.content_blocks) if message is not None else []
    if blocks:
        text = f"\n\n{text}"
    return SystemMessage(content_blocks=[*blocks, {"type": "text", "text": text}])


def _with_command(response: Any, update: dict[str, Any] | None) -> Any:
    """`response` carrying the state `update` as an ExtendedModelResponse command.

    Handlers hand middleware a ModelResponse (or an AIMessage from the model
    itself); inner middleware commands travel separately, so ours is the only one.
    """
    if not update:
        return response
    if isinstance(response, AIMessage):
        response = ModelResponse(result=[response])
    return ExtendedModelResponse(model_response=response, command=Command(update=update))


def _messages_of(response: Any) -> list[Any]:
    if isinstance(response, AIMessage):
        return [response]
    if isinstance(response, ModelResponse):
        return list(response.result)
    if isinstance(response, ExtendedModelResponse):
        return _messages_of(response.model_response)
    return []


def _has_big_args(response: Any, threshold: int) -> bool:
    """Whether a model response has a file-body argument longer than `threshold`."""
    for message in _messages_of(response):
        for call in getattr(message, "tool_calls", None) or ():
            args = call.get("args") or {}
            for name in BODY_ARGS.get(call.get("name"), ()):
                if isinstance(args.get(name), str) and len(args[name]) > threshold:
                    return True
    return False


def _is_staged(key: str) -> bool:
    """Staged arguments and the sandbox's /tmp: the mount's, never the state's."""
    return any(key == f"/{d}" or key.startswith(f"/{d}/") for d in (STAGING_DIR, TMP_DIR))


def _with_markers(message: AIMessage, replaced: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Field updates for `message` with the staged arguments replaced everywhere.

    Tool-call arguments live in up to three places: `tool_calls` (parsed),
    `additional_kwargs["tool_calls"]` (OpenAI's raw JSON strings) and content
    blocks (Anthropic `tool_use`, OpenAI Responses `function_call`, standard
    `tool_call` blocks). Leaving any copy would keep the body in the checkpoint.
    """
    tool_calls = [
        {**c, "args": {**c["args"], **replaced[c["id"]]}} if c.get("id") in replaced else c
        for c in message.tool_calls
    ]
    update: dict[str, Any] = {"tool_calls": tool_calls}
    raw_calls = message.additional_kwargs.get("tool_calls")
    if isinstance(raw_calls, list):
        update["additional_kwargs"] = {
            **message.additional_kwargs,
            "tool_calls": [_patch_raw_call(c, replaced) for c in raw_calls],
        }
    if isinstance(message.content, list):
        update["content"] = [_patch_block(b, replaced) for b in message.content]
    return update


def _patch_raw_call(call: Any, replaced: dict[str, dict[str, str]]) -> Any:
    if not isinstance(call, Mapping) or call.get("id") not in replaced:
        return call
    function = call.get("function")
    if not isinstance(function, Mapping):
        return call
    return {
        **call,
        "function": {
            **function,
            "arguments": _patch_json(function.get("arguments"), replaced[call["id"]]),
        },
    }


def _patch_block(block: Any, replaced: dict[str, dict[str, str]]) -> Any:
    if not isinstance(block, Mapping):
        return block
    call_id = block.get("id") if block.get("id") in replaced else block.get("call_id")
    if call_id not in replaced:
        return block
    markers = replaced[call_id]
    patched = dict(block)
    for field in ("input", "args"):
        if isinstance(block.get(field), Mapping):
            patched[field] = {**block[field], **markers}
    if isinstance(block.get("arguments"), str):
        patched["arguments"] = _patch_json(block["arguments"], markers)
    return patched


def _patch_json(arguments: Any, markers: Mapping[str, str]) -> Any:
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError):
        return arguments
    if not isinstance(parsed, dict):
        return arguments
    return json.dumps({**parsed, **markers})
