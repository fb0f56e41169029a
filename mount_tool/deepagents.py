"""Deep Agents on a vfsd mount: the file tools and the shell see the same files.

    with mount_tool.mount("runs/42") as m:
        agent = create_vfsd_deep_agent(m, model)
        agent.invoke({"messages": [...]})

Three pieces:

- `VfsdBackend(mount)` implements deepagents' `SandboxBackendProtocol` on the
  mounted directory: `ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`,
  `upload_files`, `download_files` (and their async twins), plus `execute`, a
  shell command run with the mount root as working directory. Paths are the
  agent's virtual paths ("/notes/plan.md" is `RUN_DIR/fs/notes/plan.md`) and are
  confined to the mount before anything is touched.
- `VfsdMiddleware(mount)` keeps graph state small. It holds a `files` channel of
  ~150-byte FileRefs (kept in step with the mount after every tool call and
  pruned when the daemon evicts), advances the daemon's step once per model
  turn, and keeps large `write_file`/`edit_file` arguments out of the
  conversation (see "Large tool-call arguments" below).
- `create_vfsd_deep_agent(mount, model, ...)` wires both into `create_deep_agent`.

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
import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, NotRequired

from deepagents.backends.filesystem import FilesystemBackend
from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    PERMISSION_DENIED,
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    WriteResult,
)
from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import ExtendedModelResponse, ModelResponse
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from .checkpointer import VfsdCheckpointer, warn_if_unwrapped
from .errors import ControlError, MountToolError
from .langgraph import files_reducer
from .mount import Mount
from .offload import DEFAULT_THRESHOLD_TOKENS, offload_tool_output, safe_file_stem
from .refs import FileRef

logger = logging.getLogger(__name__)

DEFAULT_EXECUTE_TIMEOUT = 120
DEFAULT_MAX_OUTPUT_BYTES = 4 << 20
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


# -- the backend ----------------------------------------------------------------


class VfsdBackend(SandboxBackendProtocol):
    """deepagents backend whose files live in a vfsd mount, with a shell on it.

    File operations follow deepagents' own local-filesystem semantics (glob and
    grep rules, line windows, error texts) by delegating to a `FilesystemBackend`
    rooted at the mount in virtual mode, after `Mount.resolve_path` has confined
    the path. Writes go through `Mount.write`, which checks the daemon's hash of
    what landed.

    `execute` runs `command` with bash (sh if absent) in the mount root, stdout
    and stderr merged, in its own process group so a timeout kills everything
    it started. At most `max_output_bytes` of output are kept; output over
    `offload_threshold_tokens` is saved to `large_tool_results/` in the mount
    and replaced by a descriptive preview (`offload_tool_output`).
    """

    def __init__(
        self,
        mount: Mount,
        *,
        default_timeout: int = DEFAULT_EXECUTE_TIMEOUT,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        offload_threshold_tokens: int | float = DEFAULT_THRESHOLD_TOKENS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if default_timeout <= 0:
            raise ValueError(f"default_timeout must be positive, got {default_timeout}")
        if max_output_bytes <= 0:
            raise ValueError(f"max_output_bytes must be positive, got {max_output_bytes}")
        self.mount = mount
        self.root = Path(os.path.realpath(mount.root))
        self.default_timeout = default_timeout
        self.max_output_bytes = max_output_bytes
        self.offload_threshold_tokens = offload_threshold_tokens
        self.env = {**os.environ, **(env or {}), "VFSD_ROOT": str(self.root)}
        self.shell = shutil.which("bash") or "/bin/sh"
        self._files = FilesystemBackend(root_dir=self.root, virtual_mode=True)
        self._id = f"vfsd-{uuid.uuid4().hex[:8]}"

    @property
    def id(self) -> str:
        """Identifier of this backend instance (`vfsd-<hex>`)."""
        return self._id

    # -- paths --------------------------------------------------------------

    def _confine(self, path: str | None) -> str:
        """The normalized virtual path of `path`; ValueError if it leaves the mount.

        Accepts virtual paths ("/a/b", "a/b") and real absolute paths under the
        mount root (what `execute` output shows).
        """
        raw = "/" if path in (None, "") else str(path)
        root = str(self.root)
        if raw == root or raw.startswith(root + "/"):
            raw = raw[len(root) :] or "/"
        relative = raw.lstrip("/") or "."
        # Raises ValueError for `..` escapes, NUL bytes and symlinks leading out.
        self.mount.resolve_path(relative)
        normalized = os.path.normpath("/" + relative)
        return "/" if normalized in ("/.", "//") else normalized

    def _real(self, virtual: str) -> Path:
        return self.mount.resolve_path(virtual.lstrip("/") or ".")

    # -- BackendProtocol ------------------------------------------------------

    def ls(self, path: str) -> LsResult:
        """List the direct children of a directory in the mount."""
        try:
            virtual = self._confine(path)
        except ValueError as exc:
            return LsResult(error=f"Cannot list '{path}': {exc}")
        return self._files.ls(virtual)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Read a window of lines (text) or the whole file (binary, base64)."""
        try:
            virtual = self._confine(file_path)
        except ValueError as exc:
            return ReadResult(error=f"Error reading file '{file_path}': {exc}")
        return self._files.read(virtual, offset, limit)

    def grep(
        self,
        pattern: str,
        path: str | None = None,
        glob: str | None = None,
        *,
        max_count: int | None = None,
    ) -> GrepResult:
        """Literal (not regex) search in the files under `path` (default: the whole mount)."""
        try:
            virtual = self._confine(path)
        except ValueError as exc:
            return GrepResult(error=f"Error searching path '{path}': {exc}", matches=[])
        return self._files.grep(pattern, virtual, glob, max_count=max_count)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Files matching `pattern` under `path`, with deepagents' glob rules."""
        try:
            virtual = self._confine(path)
        except ValueError as exc:
            return GlobResult(error=f"Error: '{path}': {exc}")
        return self._files.glob(pattern, virtual)

    def write(self, file_path: str, content: str) -> WriteResult:
        """Create or overwrite a file (parent directories are created)."""
        try:
            virtual = self._confine(file_path)
            if virtual == "/":
                raise IsADirectoryError("/ is the mount root")
            self.mount.write(virtual.lstrip("/"), content)
        except (ValueError, OSError, ControlError) as exc:
            return WriteResult(error=f"Error writing file '{file_path}': {exc}")
        return WriteResult(path=virtual)

    def edit(
        self,
        file_path: str,
        old_string: str,
        new_string: str,
        replace_all: bool = False,  # noqa: FBT001, FBT002 - the protocol's signature
    ) -> EditResult:
        """Replace `old_string` (unique unless `replace_all`) with `new_string`."""
        try:
            virtual = self._confine(file_path)
        except ValueError as exc:
            return EditResult(error=f"Error editing file '{file_path}': {exc}")
        return self._files.edit(virtual, old_string, new_string, replace_all)

    def delete(self, file_path: str) -> DeleteResult:
        """Delete a file, or a directory and everything under it."""
        try:
            virtual = self._confine(file_path)
        except ValueError as exc:
            return DeleteResult(error=f"Error deleting '{file_path}': {exc}")
        if virtual == "/":
            return DeleteResult(error="Error: refusing to delete the mount root")
        return self._files.delete(virtual)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each (path, bytes) pair; one response per input, in order."""
        responses = []
        for path, data in files:
            try:
                virtual = self._confine(path)
                if virtual == "/":
                    raise IsADirectoryError(path)
                self.mount.write(virtual.lstrip("/"), data)
                responses.append(FileUploadResponse(path=path))
            except Exception as exc:  # noqa: BLE001 - reported per file, as the protocol asks
                responses.append(FileUploadResponse(path=path, error=_error_code(exc)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each path's bytes; one response per input, in order."""
        responses = []
        for path in paths:
            try:
                real = self._real(self._confine(path))
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    if os.path.isdir(real):
                        raise IsADirectoryError(path)
                    responses.append(FileDownloadResponse(path=path, content=f.read()))
            except Exception as exc:  # noqa: BLE001 - reported per file, as the protocol asks
                responses.append(FileDownloadResponse(path=path, error=_error_code(exc)))
        return responses

    # -- SandboxBackendProtocol ---------------------------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run a shell command in the mount root; stdout and stderr merged.

        `timeout` in seconds (None: the default; 0: no limit). A timed-out
        command's process group is killed and exit code 124 returned.
        """
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        limit = self.default_timeout if timeout is None else timeout
        if limit < 0:
            raise ValueError(f"timeout must be non-negative, got {limit}")
        try:
            proc = subprocess.Popen(  # noqa: S603 - running the agent's command is the point
                [self.shell, "-c", command],
                cwd=self.root,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return ExecuteResponse(output=f"Error: cannot start {self.shell}: {exc}", exit_code=1)
        capture = _BoundedCapture(proc.stdout, self.max_output_bytes)
        timed_out = False
        try:
            proc.wait(timeout=limit or None)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
        if not capture.finish(grace=1.0):
            # Something the command left running still holds the pipe open.
            _kill_group(proc)
            capture.finish(grace=5.0)
        output = capture.text()
        if capture.dropped:
            output += (
                f"\n... [output truncated: {capture.total:,} bytes produced, "
                f"the first {self.max_output_bytes:,} kept]"
            )
        if timed_out:
            output += f"\nError: Command timed out after {limit} seconds."
        output = offload_tool_output(
            self.mount,
            output,
            f"execute-{uuid.uuid4().hex[:12]}",
            threshold_tokens=self.offload_threshold_tokens,
        )
        return ExecuteResponse(
            output=output,
            exit_code=124 if timed_out else proc.returncode,
            truncated=capture.dropped > 0,
        )


class _BoundedCapture:
    """Drain a pipe in a thread, keeping the first `limit` bytes and counting the rest."""

    def __init__(self, pipe: Any, limit: int) -> None:
        self.pipe = pipe
        self.limit = limit
        self.kept = bytearray()
        self.total = 0
        self.dropped = 0
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := self.pipe.read1(1 << 16):
                self.total += len(chunk)
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
                self.dropped += max(0, len(chunk) - max(room, 0))

    def finish(self, grace: float) -> bool:
        """Wait up to `grace` s for end of output; True when the pipe is drained."""
        self.thread.join(grace)
        if self.thread.is_alive():
            return False
        self.pipe.close()
        return True

    def text(self) -> str:
        return bytes(self.kept).decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _error_code(exc: Exception) -> str:
    """The protocol's standard error code for a per-file failure."""
    if isinstance(exc, FileNotFoundError):
        return FILE_NOT_FOUND
    if isinstance(exc, IsADirectoryError):
        return IS_DIRECTORY
    if isinstance(exc, PermissionError):
        return PERMISSION_DENIED
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return INVALID_PATH
    if isinstance(exc, (ValueError, NotADirectoryError, FileExistsError)):
        return INVALID_PATH
    return f"{type(exc).__name__}: {exc}"


# -- the middleware ---------------------------------------------------------------


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
    """

    files: NotRequired[
        Annotated[dict[str, FileRef], DeltaChannel(files_delta_reducer, snapshot_frequency=50)]
    ]


class VfsdMiddleware(AgentMiddleware):
    """Keeps a deep agent's graph state down to references into the vfsd mount.

    - at the start of each model call: advance the daemon's step by one (one
      step per model turn), record refs for files changed during the turn that
      just ended, and drop refs of files the daemon evicted;
    - after each tool call that can change files: put refs of files the tool
      (or the shell, or a subagent) wrote under their virtual paths in `files`,
      and None for files it deleted;
    - around the model call: `write_file`/`edit_file` arguments longer than
      `compact_threshold_chars` move to the mount and the AIMessage keeps a
      marker (see the module docstring).
    """

    state_schema = VfsdAgentState

    def __init__(
        self,
        mount: Mount,
        *,
        compact_threshold_chars: int = DEFAULT_COMPACT_THRESHOLD_CHARS,
        advance_step: bool = True,
    ) -> None:
        super().__init__()
        if compact_threshold_chars < 1:
            raise ValueError("compact_threshold_chars must be positive")
        self.mount = mount
        self.compact_threshold_chars = compact_threshold_chars
        self.advance_step = advance_step
        self.tools = []

    # -- keeping `files` true --------------------------------------------------

    def sync_files(self, files: Mapping[str, Any], since_step: int) -> dict[str, FileRef | None]:
        """The `files` update for what changed in the mount from `since_step` on.

        Changed files get their current ref; a ref whose inode was removed
        (unlinked or evicted) gets None unless the same update re-creates its path.
        """
        # The daemon's `since` is inclusive: files stamped with since_step are listed.
        delta = self.mount.changes(since_step)
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

    def _turn_update(self, state: Mapping[str, Any]) -> dict[str, Any] | None:
        warn_if_unwrapped(self.mount)
        files = state.get("files") or {}
        step = self.mount.get_step()
        updates = self.sync_files(files, step)
        if self.advance_step:
            report = self.mount.set_step(step + 1)
            evicted = {rec["ino"] for rec in report.get("evicted", [])}
            view = {**files, **updates}
            for key, ref in view.items():
                if ref and ref.get("ino") in evicted:
                    updates[key] = None
        return {"files": updates} if updates else None

    # -- model calls: advance the step, keep large arguments out of the message ----

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Start a turn (step, sync, prune), call the model, stage large arguments.

        The turn's `files` update rides on the model node's own write (as an
        ExtendedModelResponse command) instead of a node of its own: one
        superstep, hence one checkpoint, fewer per turn.
        """
        update = self._turn_update(request.state)
        response = self._compact_response(handler(request))
        return _with_command(response, update)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Async `wrap_model_call`; mount I/O runs in worker threads."""
        update = await asyncio.to_thread(self._turn_update, request.state)
        response = await handler(request)
        response = await asyncio.to_thread(self._compact_response, response)
        return _with_command(response, update)

    def _compact_response(self, response: Any) -> Any:
        if isinstance(response, AIMessage):
            return self._compact_message(response)
        if isinstance(response, ModelResponse):
            return ModelResponse(
                result=[self._compact_message(m) for m in response.result],
                structured_response=response.structured_response,
            )
        if isinstance(response, ExtendedModelResponse):
            return ExtendedModelResponse(
                model_response=self._compact_response(response.model_response),
                command=response.command,
            )
        return response

    def _compact_message(self, message: Any) -> Any:
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
                    markers[n] = self._stage(call, n, text)
                except (OSError, ValueError, MountToolError) as exc:
                    # A full mount must not fail the model call: keep the text inline.
                    logger.warning("could not stage %s of %s: %s", n, call["id"], exc)
            if markers:
                replaced[call["id"]] = markers
        if not replaced:
            return message
        return message.model_copy(update=_with_markers(message, replaced))

    def _stage(self, call: Mapping[str, Any], arg: str, text: str) -> str:
        staged = f"/{STAGING_DIR}/{safe_file_stem(call['id'])}.{arg}"
        ref = self.mount.write(staged.lstrip("/"), text)
        # A call that never runs leaves its staged copy to eviction.
        with contextlib.suppress(ControlError):
            self.mount.set_status(ref, "done")
        target = (call.get("args") or {}).get("file_path", "?")
        what = "content written to" if arg == "content" else f"{arg} of the edit to"
        return (
            f"[vfsd: {what} {target} ({len(text):,} characters) kept in the mount; "
            f"staged={staged} xxh3={ref['hash']}]"
        )

    # -- tool calls: restore arguments, sync refs --------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Restore staged arguments, run the tool, record the files it changed."""
        restored = self._restore(request)
        if isinstance(restored, ToolMessage):
            return restored
        request, staged = restored
        before = self.mount.get_step()
        try:
            result = handler(request)
        finally:
            self._unstage(staged)
        return self._with_files(result, request, before)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Async `wrap_tool_call`; mount I/O runs in worker threads."""
        restored = await asyncio.to_thread(self._restore, request)
        if isinstance(restored, ToolMessage):
            return restored
        request, staged = restored
        before = await asyncio.to_thread(self.mount.get_step)
        try:
            result = await handler(request)
        finally:
            await asyncio.to_thread(self._unstage, staged)
        return await asyncio.to_thread(self._with_files, result, request, before)

    def _restore(self, request: Any) -> tuple[Any, list[str]] | ToolMessage:
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
                data = self._real_path(path).read_bytes()
            except (OSError, ValueError):
                data = None
            if data is None or self.mount.hash_of(data) != expected:
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

    def _unstage(self, staged: Iterable[str]) -> None:
        for path in staged:
            with contextlib.suppress(OSError, ValueError):
                self._real_path(path).unlink()
        if staged:
            with contextlib.suppress(OSError, ValueError):
                self._real_path("/" + STAGING_DIR).rmdir()  # only when empty

    def _real_path(self, virtual: str) -> Path:
        return self.mount.resolve_path(virtual.lstrip("/"))

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


def _is_staged(key: str) -> bool:
    return key == f"/{STAGING_DIR}" or key.startswith(f"/{STAGING_DIR}/")


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


# -- wiring -------------------------------------------------------------------------


def create_vfsd_deep_agent(
    mount: Mount,
    model: Any,
    *,
    middleware: Iterable[Any] = (),
    compact_threshold_chars: int = DEFAULT_COMPACT_THRESHOLD_CHARS,
    backend_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """`create_deep_agent` with a `VfsdBackend` on `mount` and a `VfsdMiddleware`.

    A `checkpointer` is wrapped in a `VfsdCheckpointer` on `mount` (unless it
    is one already), so a replayed, forked or resumed thread finds its files as
    they were. Other keyword arguments go to `create_deep_agent` unchanged.
    """
    from deepagents import create_deep_agent

    saver = kwargs.get("checkpointer")
    if isinstance(saver, BaseCheckpointSaver) and not isinstance(saver, VfsdCheckpointer):
        kwargs["checkpointer"] = VfsdCheckpointer(saver, mount)
    backend = VfsdBackend(mount, **dict(backend_options or {}))
    return create_deep_agent(
        model,
        backend=backend,
        middleware=[
            VfsdMiddleware(mount, compact_threshold_chars=compact_threshold_chars),
            *middleware,
        ],
        **kwargs,
    )


__all__ = [
    "VfsdAgentState",
    "VfsdBackend",
    "VfsdMiddleware",
    "create_vfsd_deep_agent",
    "virtual_path",
]
