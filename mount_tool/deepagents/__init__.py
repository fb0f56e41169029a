"""Deep Agents on a vfsd mount: the file tools and the shell see the same files.

    with mount_tool.runs("runs") as runs:     # every thread its own run dir
        agent = create_vfsd_deep_agent(runs, model, checkpointer=InMemorySaver())
        agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

Three pieces:

- `VfsdBackend(runs)` implements deepagents' `SandboxBackendProtocol` on the
  mounted directory of the running thread (or of one Mount): `ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`,
  `upload_files`, `download_files` (and their async twins), plus `execute`, a
  shell command run in a sandbox whose `/` is the mount root (mount_tool/
  sandbox/). Paths are the agent's paths ("/notes/plan.md" is
  `RUN_DIR/fs/notes/plan.md`, for the file tools and the shell alike) and are
  confined to the mount before anything is touched.
- `VfsdMiddleware(runs)` keeps graph state small. It holds a `files` channel of
  ~150-byte FileRefs (kept in step with the mount after every tool call and
  pruned when the daemon evicts), advances the daemon's step once per model
  turn, and keeps large `write_file`/`edit_file` arguments out of the
  conversation (see "Large tool-call arguments" below).
- `create_vfsd_deep_agent(runs, model, ...)` wires both into `create_deep_agent`,
  subagents included.

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
import dataclasses
import errno
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, NotRequired

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
from deepagents.backends.sandbox import MAX_BINARY_BYTES
from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import (
    ExtendedModelResponse,
    ModelResponse,
    PrivateStateAttr,
)
from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from ..daemon import toolcalls
from ..errors import ControlError, MountToolError
from ..langgraph import files_reducer
from ..langgraph.boundary import BoundaryChannel, await_capture, wait_for_capture
from ..langgraph.checkpointer import VfsdCheckpointer, warn_if_unwrapped
from ..mount import Mount
from ..refs import FileRef
from ..runs import Runs, lease
from ..sandbox import (
    DEFAULT_ENV_ALLOWLIST,
    TMP_DIR,
    ExecLimits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    reserved_reason,
)
from .evictnotes import glob_note, turn_note, why_missing
from .files import MountFiles
from .nospace import explained, why_no_room
from .offload import (
    DEFAULT_THRESHOLD_TOKENS,
    OffloadMiddleware,
    cut_unsaved,
    offload_tool_output,
    safe_file_stem,
)
from .records import is_record, record_path

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
# Tools whose results OffloadMiddleware leaves alone in create_vfsd_deep_agent:
# the ones deepagents never offloads either (their output is bounded or is a
# window of a file already in the mount), and `execute`, which offloads its own
# output with the paths the sandbox sees.
NOT_OFFLOADED_TOOLS = frozenset(
    {"ls", "glob", "grep", "read_file", "edit_file", "write_file", "delete", "execute"}
)
# Tools that cannot change the mount: no sync needed after them.
READ_ONLY_TOOLS = frozenset({"ls", "read_file", "glob", "grep", "write_todos"})
#: how an OSError's text ends for ENOSPC (MountFiles' errors carry no errno)
NO_SPACE = os.strerror(errno.ENOSPC)
_MARKER = re.compile(r"staged=(/\.tool_args/[A-Za-z0-9._-]+) xxh3=([0-9a-f]{32})\]$")


def virtual_path(path: str) -> str:
    """The agent-facing form of a mount-relative path ("out/a.txt" -> "/out/a.txt")."""
    return "/" + path.strip("/")


# -- the backend ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _RunView:
    """One run dir as a VfsdBackend works on it: the mount, its sandbox, its file tools."""

    mount: Mount
    root: Path
    sandbox: Sandbox
    files: MountFiles


class VfsdBackend(SandboxBackendProtocol):
    """deepagents backend whose files live in a vfsd mount, with a sandboxed shell on it.

    `files` is a `Runs` (every call works on the running thread's own run
    dir, found from the config LangGraph sets for the tool call: one backend
    serves every thread of a graph) or one `Mount`.

    File operations follow deepagents' own local-filesystem semantics (glob and
    grep rules, line windows, error texts), but resolve every path beneath the
    mount root in the same step that uses it (`mount_tool.deepagents.files`), so a
    symlink swapped in at any moment cannot lead them outside. Writes go
    through `Mount.write`, which does the same and checks the daemon's hash of
    what landed. Nothing they do raises: failures are the results' errors.
    Paths are absolute: `/` is the mount root.

    `execute` runs a command in a `Sandbox` (mount_tool/sandbox/). By default
    (`isolation="bwrap"`) that is a bubblewrap sandbox whose `/` is the mount
    root, so a path means the same file for the file tools and the shell; the
    system's directories are read-only, /tmp is private, the network is off
    (`network=True` turns it on), the environment is an allowlist plus `env`,
    and `limits` bound wall time, CPU time, memory, processes and output. Every
    process a command started is gone when `execute` returns; a thread's
    commands see that thread's files only.
    `isolation="none"` runs commands on the host instead (opt-in, by name).
    Without bubblewrap, `execute` returns an error that says what to install.
    stderr lines are marked `[stderr] `; output over `offload_threshold_tokens`
    is saved to `large_tool_results/` in the mount and replaced by a preview.
    """

    #: run views kept (a view holds no daemon, only the sandbox's probe result)
    VIEWS_KEPT = 1024

    def __init__(
        self,
        files: Mount | Runs,
        *,
        default_timeout: float | None = None,
        max_output_bytes: int | None = None,
        offload_threshold_tokens: int | float = DEFAULT_THRESHOLD_TOKENS,
        env: Mapping[str, str] | None = None,
        isolation: str = "bwrap",
        network: bool = False,
        limits: ExecLimits | None = None,
        env_allowlist: Iterable[str] = DEFAULT_ENV_ALLOWLIST,
        bwrap: str = "bwrap",
        tmp: str = "run",
    ) -> None:
        if not isinstance(files, Mount | Runs):
            raise TypeError(f"files must be a mount_tool Mount or Runs, not {type(files)!r}")
        limits = limits or ExecLimits(output_bytes=DEFAULT_MAX_OUTPUT_BYTES)
        if default_timeout is not None:
            if default_timeout <= 0:
                raise ValueError(f"timeout must be positive, got {default_timeout}")
            limits = dataclasses.replace(limits, timeout=default_timeout)
        if max_output_bytes is not None:
            if max_output_bytes <= 0:
                raise ValueError(f"max_output_bytes must be positive, got {max_output_bytes}")
            limits = dataclasses.replace(limits, output_bytes=max_output_bytes)
        self.files = files
        self.offload_threshold_tokens = offload_threshold_tokens
        self._sandbox_options = {
            "isolation": isolation,
            "network": network,
            "limits": limits,
            "env": dict(env or {}),
            "env_allowlist": tuple(env_allowlist),
            "bwrap": bwrap,
            "tmp": tmp,
        }
        # What every run's sandbox shares (limits, isolation, the prompt note).
        self._template = Sandbox(files.root, **self._sandbox_options)
        self._views: dict[str, _RunView] = {}
        self._views_lock = threading.Lock()
        self._id = f"vfsd-{uuid.uuid4().hex[:8]}"
        # The shell runs as root without capabilities: mode bits bind it, so the
        # file tools honour them too and both see the same files the same way.
        self._dac = isolation == "bwrap" and os.geteuid() == 0
        if isinstance(files, Mount):
            # Only what needs no probe: the probe claims the mount's sandbox
            # names, which waits for the first command.
            reason = self._view(files).sandbox.missing_binary()
            if reason:
                logger.warning("%s", reason)

    @property
    def mount(self) -> Mount:
        """The Mount of the one-mount form (AttributeError with a Runs)."""
        if not isinstance(self.files, Mount):
            raise AttributeError("this VfsdBackend serves a Runs: runs.get(thread_id)")
        return self.files

    @property
    def root(self) -> Path:
        """The mount root of the one-mount form (AttributeError with a Runs)."""
        return self._view(self.mount).root

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox of the one-mount form; with a Runs, the settings every
        thread's sandbox shares (its root is ROOT, never used to run)."""
        if isinstance(self.files, Mount):
            return self._view(self.files).sandbox
        return self._template

    def _view(self, m: Mount) -> _RunView:
        key = str(m.run_dir)
        with self._views_lock:
            view = self._views.get(key)
            if view is not None and view.mount is m:
                return view
        root = Path(os.path.realpath(m.root))
        view = _RunView(
            m, root, Sandbox(root, **self._sandbox_options),
            MountFiles(m.root_fd, lambda p: m.relative(p.lstrip("/") or "."), m.client))
        with self._views_lock:
            if len(self._views) >= self.VIEWS_KEPT:
                self._views.pop(next(iter(self._views)))
            self._views[key] = view
        return view

    @contextlib.contextmanager
    def _use(self) -> Iterator[_RunView]:
        """The running call's run: its mount held for the call."""
        with lease(self.files) as m:
            yield self._view(m)

    @property
    def id(self) -> str:
        """Identifier of this backend instance (`vfsd-<hex>`)."""
        return self._id

    @property
    def isolation(self) -> str:
        """`bwrap`, `none`, or `unavailable` (bwrap asked for but not usable here)."""
        sandbox = self.sandbox if isinstance(self.files, Mount) else self._template
        if isinstance(self.files, Mount) and sandbox.unavailable_reason():
            return "unavailable"
        return sandbox.isolation

    @property
    def default_timeout(self) -> float:
        """Wall-time limit of a command when `execute` gets no timeout (seconds)."""
        return self._template.limits.timeout

    @property
    def max_output_bytes(self) -> int:
        """Output kept per command; the rest is counted and dropped."""
        return self._template.limits.output_bytes

    def sandbox_info(self) -> dict[str, Any]:
        """Which isolation and limits are in force for `execute`, and what enforces each
        (with a Runs: for the running thread's run dir)."""
        if isinstance(self.files, Mount):
            return self.sandbox.info()
        with self._use() as v:
            return v.sandbox.info()

    def prompt_note(self, routed: Iterable[str] = ()) -> str:
        """The path convention and limits, as a system prompt section for the model
        (`routed`: path prefixes a CompositeBackend sends to other backends)."""
        return self._template.prompt_note(routed)

    # -- paths --------------------------------------------------------------

    def _confine(self, v: _RunView, path: str | None) -> str:
        """The normalized virtual path of `path`; ValueError if the file tools may not use it.

        Accepts absolute virtual paths ("/a/b", "/" when None or empty); with
        isolation="none", whose commands print host paths, also real absolute
        paths under the mount root. Refuses relative paths, `..` escapes, NUL
        bytes, symlinks leading out, and the sandbox's mount points (/tmp, /usr,
        ...), which inside `execute` are not the run's files. Below a record
        directory (`/conversation_history/`) every name means itself, so a
        record named from input stays there (`mount_tool.deepagents.records`).
        """
        raw = "/" if path in (None, "") else str(path)
        root = str(v.root)
        if v.sandbox.isolation == "none" and (raw == root or raw.startswith(root + "/")):
            raw = raw[len(root) :] or "/"
        if not raw.startswith("/"):
            raise ValueError(f"paths must be absolute (start with '/'), got {raw!r}")
        raw = record_path(raw)
        relative = raw.lstrip("/") or "."
        # Raises ValueError for `..` escapes, NUL bytes and symlinks leading out.
        v.mount.resolve_path(relative)
        normalized = os.path.normpath("/" + relative)
        normalized = "/" if normalized in ("/.", "//") else normalized
        reason = reserved_reason(normalized, v.sandbox.tmp)
        if reason:
            raise ValueError(reason)
        return normalized

    @staticmethod
    def _exists(v: _RunView, virtual: str) -> bool:
        try:
            return os.path.lexists(v.mount.resolve_path(virtual.lstrip("/") or "."))
        except (OSError, ValueError):
            return False

    @staticmethod
    def _write(v: _RunView, virtual: str, data: str | bytes) -> None:
        """Write a file for the file tools: the mount answers it all (no request
        to the daemon: VfsdMiddleware takes the refs of what a tool call
        changed after it). A file written in the sandbox's /tmp is scratch
        too: marked done, as execute marks what commands leave there."""
        scratch = (v.sandbox.tmp == "run" and v.sandbox.isolation == "bwrap"
                   and virtual.startswith(f"/{TMP_DIR}/"))
        ref = _write(v.mount, virtual, data, ref=scratch)
        if ref is not None:
            with contextlib.suppress(ControlError):
                v.mount.set_status(ref, "done")

    def _check_access(self, v: _RunView, virtual: str, *, write: bool = False) -> None:
        """PermissionError when the sandboxed shell could not read (write) this file."""
        if not self._dac:
            return
        try:
            st = os.stat(v.mount.resolve_path(virtual.lstrip("/") or "."))
        except FileNotFoundError:
            return
        if not _mode_allows(st, 2 if write else 4):
            raise PermissionError(errno.EACCES, "Permission denied", virtual)

    # -- BackendProtocol ------------------------------------------------------
    #
    # Every file tool resolves its path beneath the mount root in the same step
    # that uses it (mount_tool.deepagents.files); what fails is the result's error.

    def ls(self, path: str) -> LsResult:
        """List the direct children of a directory in the mount.

        Directory paths carry no trailing `/` (`is_dir` says what they are), as
        deepagents' sandbox backends list them.
        """
        try:
            with self._use() as v:
                virtual = self._confine(v, path)
                result = v.files.ls(virtual)
                if result.error and result.error.endswith("path_not_found"):
                    result = LsResult(error=_told(result.error, v.mount, virtual))
        except Exception as exc:  # noqa: BLE001 - the protocol reports, never raises
            return LsResult(error=f"Cannot list '{path}': {_reason(exc)}")
        for entry in result.entries or ():
            if entry.get("is_dir") and entry["path"] != "/":
                entry["path"] = entry["path"].rstrip("/")
        return result

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Read a window of lines (text) or the whole file (binary, base64).

        As in deepagents' sandbox backends, the lines of a window are joined
        without a final newline, and binary files over 500 KiB are refused.
        """
        try:
            with self._use() as v:
                virtual = self._confine(v, file_path)
                self._check_access(v, virtual)
                result = v.files.read(virtual, offset, limit)
                if result.error and result.error.endswith("not found"):
                    result = ReadResult(error=_told(result.error, v.mount, virtual))
        except Exception as exc:  # noqa: BLE001 - the protocol reports, never raises
            return ReadResult(error=f"Error reading file '{file_path}': {_reason(exc)}")
        data = result.file_data
        if data and data.get("encoding") == "base64":
            if len(data["content"]) * 3 // 4 > MAX_BINARY_BYTES:
                return ReadResult(
                    error=f"File '{file_path}': Binary file exceeds maximum preview size "
                    f"of {MAX_BINARY_BYTES} bytes"
                )
        elif data and data["content"].endswith("\n"):
            data["content"] = data["content"][:-1]
        return result

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
            with self._use() as v:
                virtual = self._confine(v, path)
                result = v.files.grep(pattern, virtual, glob, max_count)
                if not result.matches and not result.error and not self._exists(v, virtual):
                    told = why_missing(v.mount, virtual)
                    if told:
                        result = GrepResult(error=f"Path '{virtual}' not found: {told}",
                                            matches=[])
                return result
        except Exception as exc:  # noqa: BLE001 - the protocol reports, never raises
            return GrepResult(error=f"Error searching path '{path}': {_reason(exc)}", matches=[])

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Files matching `pattern` under `path`, with deepagents' glob rules."""
        try:
            with self._use() as v:
                virtual = self._confine(v, path)
                result = v.files.glob(pattern, virtual)
                if result.matches == [] and not result.error:
                    told = glob_note(v.mount, virtual, pattern)
                    if told:
                        result = GlobResult(error=told, matches=[])
                return result
        except Exception as exc:  # noqa: BLE001 - the protocol reports, never raises
            return GlobResult(error=f"Error: '{path}': {_reason(exc)}")

    def write(self, file_path: str, content: str) -> WriteResult:
        """Create or overwrite a file (parent directories are created)."""
        try:
            with self._use() as v:
                virtual = self._confine(v, file_path)
                if virtual == "/":
                    raise IsADirectoryError("/ is the mount root")
                self._check_access(v, virtual, write=True)
                self._write(v, virtual, content)
        except Exception as exc:  # noqa: BLE001 - the protocol reports, never raises
            return WriteResult(error=f"Error writing file '{file_path}': {_reason(exc)}")
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
            with self._use() as v:
                virtual = self._confine(v, file_path)
                self._check_access(v, virtual, write=True)
                result = v.files.edit(virtual, old_string, new_string, replace_all)
                if result.error and result.error.endswith("not found"):
                    result = EditResult(error=_told(result.error, v.mount, virtual))
                elif result.error and result.error.endswith(NO_SPACE):
                    why = why_no_room(v.mount)  # the kernel's ENOSPC says no more
                    result = EditResult(error=f"{result.error}: {why}" if why else result.error)
                return result
        except Exception as exc:  # noqa: BLE001 - the protocol reports, never raises
            return EditResult(error=f"Error editing file '{file_path}': {_reason(exc)}")

    def delete(self, file_path: str) -> DeleteResult:
        """Delete a file, or a directory and everything under it (a symlink is
        removed itself, never followed)."""
        try:
            with self._use() as v:
                return v.files.delete(self._confine(v, file_path))
        except Exception as exc:  # noqa: BLE001 - the protocol reports, never raises
            return DeleteResult(error=f"Error deleting '{file_path}': {_reason(exc)}")

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each (path, bytes) pair; one response per input, in order."""
        responses = []
        try:
            with self._use() as v:
                for path, data in files:
                    try:
                        virtual = self._confine(v, path)
                        if virtual == "/":
                            raise IsADirectoryError(path)
                        self._check_access(v, virtual, write=True)
                        self._write(v, virtual, data)
                        responses.append(FileUploadResponse(path=path))
                    except Exception as exc:  # noqa: BLE001 - reported per file, as the protocol asks
                        responses.append(FileUploadResponse(path=path, error=_error_code(exc)))
        except Exception as exc:  # noqa: BLE001 - no run to write to: every file fails
            return [FileUploadResponse(path=path, error=_error_code(exc)) for path, _ in files]
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each path's bytes; one response per input, in order."""
        responses = []
        try:
            with self._use() as v:
                for path in paths:
                    try:
                        virtual = self._confine(v, path)
                        self._check_access(v, virtual)
                        content = v.files.download(virtual)
                        responses.append(FileDownloadResponse(path=path, content=content))
                    except Exception as exc:  # noqa: BLE001 - reported per file, as the protocol asks
                        responses.append(FileDownloadResponse(path=path, error=_error_code(exc)))
        except Exception as exc:  # noqa: BLE001 - no run to read from: every file fails
            return [FileDownloadResponse(path=path, error=_error_code(exc)) for path in paths]
        return responses

    # -- SandboxBackendProtocol ---------------------------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run a shell command in the sandbox; stdout and stderr merged, stderr lines marked.

        `timeout` in seconds (None: the default; 0: no wall-time limit). A
        timed-out command is killed, with everything it started, and exit code
        124 returned with the output so far. The command sees the running
        thread's files only.
        """
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be non-negative, got {timeout}")
        try:
            with self._use() as v:
                return self._execute(v, command, timeout)
        except (MountToolError, ValueError, RuntimeError) as exc:
            return ExecuteResponse(output=f"Error: {exc}", exit_code=126)

    def _execute(self, v: _RunView, command: str, timeout: int | None) -> ExecuteResponse:
        registered: list[str] = []

        def confined(where: dict[str, Any]) -> None:
            # Before the command runs: its processes' requests are the call's.
            call = toolcalls.current()
            if call is None:
                return
            try:
                reply = v.mount.client.call("call_begin", call=call, **where)
            except (ControlError, OSError, ValueError) as exc:  # it runs unattributed
                logger.warning("execute: the daemon did not take the tool call: %s", exc)
                return
            registered.append(reply["key"])

        scratch = v.sandbox.isolation == "bwrap" and v.sandbox.tmp == "run"
        started = v.mount.step_hint() if scratch else 0
        try:
            result = v.sandbox.run(command, timeout, on_confined=confined)
        except SandboxUnavailable as exc:
            return ExecuteResponse(output=f"Error: {exc}", exit_code=126)
        finally:
            for key in registered:
                with contextlib.suppress(ControlError, OSError, ValueError):
                    v.mount.client.call("call_end", key=key)
        if scratch:
            _retire_scratch(v.mount, started)
        output = _describe_run(result, v.sandbox.limits, timeout)
        try:
            output = offload_tool_output(
                v.mount,
                output,
                f"execute-{uuid.uuid4().hex[:12]}",
                threshold_tokens=self.offload_threshold_tokens,
                # The paths its hints give are the ones the next command sees.
                root_shown="/" if v.sandbox.isolation == "bwrap" else None,
            )
        except (OSError, ValueError, MountToolError) as exc:
            # The command ran: its output must reach the agent, cut if need be.
            output = cut_unsaved(output, exc, threshold_tokens=self.offload_threshold_tokens)
        return ExecuteResponse(output=output, exit_code=result.exit_code, truncated=result.truncated)


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


def _write(m: Mount, virtual: str, data: str | bytes, *, ref: bool = True) -> FileRef | None:
    """`Mount.write` for the file tools: an ENOSPC says what held the room,
    and leaves no half-written record behind (the next summarization would
    append to it)."""
    try:
        return m.write(virtual.lstrip("/"), data, ref=ref)
    except OSError as exc:
        told = explained(exc, m)
        if told is exc:
            raise
        if is_record(virtual):
            with contextlib.suppress(OSError, ValueError):
                m.remove(virtual.lstrip("/"))
        raise told from exc


def _retire_scratch(m: Mount, since_step: int) -> None:
    """Mark what is new in the run's /tmp done, so the daemon evicts it like any
    finished file (`done_retention_steps` after it was last written)."""
    try:
        changed = m.changes(since_step)["changed"]
        for ref in changed:
            if ref["path"].startswith(f"{TMP_DIR}/") and ref.get("status") != "done":
                with contextlib.suppress(ControlError):  # gone since: nothing to mark
                    m.set_status(ref, "done")
    except (ControlError, OSError, ValueError) as exc:  # the command ran: say, never fail
        logger.warning("execute: could not mark the files left in /tmp done: %s", exc)


def _describe_run(result: RunResult, limits: ExecLimits, timeout: float | None) -> str:
    """The text the model sees: output, then what cut or stopped it, then the exit code."""
    lines = []
    if result.truncated:
        lines.append(
            f"... Output truncated: {limits.output_bytes:,} of {result.produced:,} bytes kept."
        )
    if result.stopped == "timeout":
        limit = limits.timeout if timeout is None else timeout
        lines.append(
            f"Error: Command timed out after {limit:g} seconds (custom timeout). "
            "The command may be stuck or require more time."
            if timeout is not None
            else f"Error: Command timed out after {limit:g} seconds. For long-running "
            "commands, re-run using the timeout parameter."
        )
    elif result.stopped == "cpu":
        lines.append(
            f"Error: Command used more than {limits.cpu_seconds:g} seconds of CPU time "
            "(all its processes together) and was stopped."
        )
    lines.extend(f"Note: {note}." for note in result.notes)
    output = result.output
    if lines:
        if output and not output.endswith("\n"):
            output += "\n"
        output += "\n".join(lines)
    if result.exit_code != 0 and result.stopped is None:
        output = f"{output.rstrip()}\n\nExit code: {result.exit_code}"
    return output


def _mode_allows(st: os.stat_result, bit: int) -> bool:
    """Whether the mode bits grant `bit` (4 read, 2 write) to a process without capabilities."""
    if st.st_uid == os.geteuid():
        return bool(st.st_mode & (bit << 6))
    if st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def _error_code(exc: Exception) -> str:
    """The protocol's standard error code for a per-file failure."""
    if isinstance(exc, FileNotFoundError):
        return FILE_NOT_FOUND
    if isinstance(exc, IsADirectoryError):
        return IS_DIRECTORY
    if isinstance(exc, PermissionError):
        return PERMISSION_DENIED
    if isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENAMETOOLONG,
                                                   errno.EINVAL):
        return INVALID_PATH
    if isinstance(exc, (ValueError, NotADirectoryError, FileExistsError)):
        return INVALID_PATH
    return f"{type(exc).__name__}: {exc}"


def _told(error: str, mount: Mount, virtual: str) -> str:
    """A file tool's "not found" error, with what eviction did when it removed the path."""
    told = why_missing(mount, virtual)
    return f"{error}: {told}" if told else error


def _reason(exc: BaseException) -> str:
    """An exception as the text of a tool's error result."""
    if isinstance(exc, RecursionError):
        return "the path is too deep"
    if isinstance(exc, OSError) and exc.errno == errno.EXDEV:
        return "the path leads outside the mount"
    return str(exc) or type(exc).__name__


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


# -- wiring -------------------------------------------------------------------------


def prompt_note_for(backend: Any) -> str:
    """The path-convention note for `backend`: a VfsdBackend, or a deepagents
    `CompositeBackend` whose default is one (its routed prefixes, "/memories/",
    are named as paths the shell does not see)."""
    from deepagents.backends.composite import CompositeBackend

    if isinstance(backend, VfsdBackend):
        return backend.prompt_note()
    if isinstance(backend, CompositeBackend) and isinstance(backend.default, VfsdBackend):
        return backend.default.prompt_note(routed=backend.routes)
    raise TypeError(
        "backend must be a VfsdBackend or a CompositeBackend whose default is a VfsdBackend, "
        f"not {type(backend).__name__}"
    )


def _vfsd_backend_of(backend: Any) -> VfsdBackend:
    prompt_note_for(backend)  # the same TypeError for anything else
    return backend if isinstance(backend, VfsdBackend) else backend.default


def create_vfsd_deep_agent(
    files: Mount | Runs,
    model: Any,
    *,
    middleware: Iterable[Any] = (),
    compact_threshold_chars: int = DEFAULT_COMPACT_THRESHOLD_CHARS,
    backend_options: Mapping[str, Any] | None = None,
    backend: Any = None,
    subagents: Iterable[Any] | None = None,
    offload_tool_outputs: bool = True,
    **kwargs: Any,
) -> Any:
    """`create_deep_agent` with a `VfsdBackend` and a `VfsdMiddleware` on `files`
    (a `Runs`: every thread its own run dir; or one `Mount`).

    Subagents run the same middleware: the general-purpose subagent (which
    deepagents would otherwise build with its default middleware only) and
    every declarative `SubAgent` spec in `subagents` that does not list a
    `VfsdMiddleware` itself. Compiled and async subagents are built elsewhere
    and are passed on unchanged. The system prompts get the backend's path
    convention (`VfsdBackend.prompt_note`). A `checkpointer` is wrapped in a
    `VfsdCheckpointer` on `files` (unless it is one already), so a replayed,
    forked or resumed thread finds its files as they were.

    `backend`, instead of `backend_options`: a ready VfsdBackend on `files`, or
    a deepagents `CompositeBackend` whose default is one (`routes={"/memories/":
    StoreBackend(...)}`); the note then names the routed prefixes as paths the
    shell does not see.

    With `offload_tool_outputs` (the default) an `OffloadMiddleware` right
    after the `VfsdMiddleware` gives every tool's large result (custom tools,
    `task`, MCP tools) vfsd's preview (JSON shape, log error lines, a file
    named by its kind) at the backend's `offload_threshold_tokens`, before
    deepagents' own offloading (the first characters, in a file without an
    extension) would see it; the file tools and `execute` are left as they are
    (`NOT_OFFLOADED_TOOLS`). Not added when `middleware` holds an
    `OffloadMiddleware` already. Other keyword arguments go to
    `create_deep_agent` unchanged.
    """
    from deepagents import create_deep_agent
    from deepagents.middleware.subagents import GENERAL_PURPOSE_SUBAGENT

    saver = kwargs.get("checkpointer")
    if isinstance(saver, BaseCheckpointSaver) and not isinstance(saver, VfsdCheckpointer):
        kwargs["checkpointer"] = VfsdCheckpointer(saver, files)
    if backend is None:
        backend = VfsdBackend(files, **dict(backend_options or {}))
    elif backend_options:
        raise ValueError("pass either backend or backend_options, not both")
    vfsd_backend = _vfsd_backend_of(backend)
    if vfsd_backend.files is not files:
        raise ValueError("the backend's VfsdBackend must serve the same Mount or Runs as files")
    note = prompt_note_for(backend)
    middleware = list(middleware)
    offload = offload_tool_outputs and not any(
        isinstance(m, OffloadMiddleware) for m in middleware
    )

    def vfsd_middleware() -> list[AgentMiddleware]:
        stack: list[AgentMiddleware] = [
            VfsdMiddleware(files, compact_threshold_chars=compact_threshold_chars, prompt_note=note)
        ]
        if offload:
            # Inside VfsdMiddleware, so the saved file is in the call's `files` update.
            stack.append(OffloadMiddleware(
                files, vfsd_backend.offload_threshold_tokens, exclude_tools=NOT_OFFLOADED_TOOLS,
                root_shown="/" if vfsd_backend.sandbox.isolation == "bwrap" else None,
            ))
        return stack

    specs = [_with_vfsd_middleware(spec, vfsd_middleware) for spec in subagents or ()]
    if not any(spec.get("name") == GENERAL_PURPOSE_SUBAGENT["name"] for spec in specs):
        specs.insert(0, {**GENERAL_PURPOSE_SUBAGENT, "middleware": vfsd_middleware()})
    return create_deep_agent(
        model,
        backend=backend,
        middleware=[*vfsd_middleware(), *middleware],
        subagents=specs,
        **kwargs,
    )


def _with_vfsd_middleware(spec: Any, make: Callable[[], list[AgentMiddleware]]) -> Any:
    """A declarative subagent spec with a VfsdMiddleware (and the offloading) first in
    its middleware."""
    if not isinstance(spec, Mapping) or "runnable" in spec or "graph_id" in spec:
        return spec  # compiled or async: its middleware is not ours to set
    own = list(spec.get("middleware") or [])
    if any(isinstance(m, VfsdMiddleware) for m in own):
        return spec
    added = make()
    if any(isinstance(m, OffloadMiddleware) for m in own):
        added = [m for m in added if not isinstance(m, OffloadMiddleware)]
    return {**spec, "middleware": [*added, *own]}


__all__ = [
    "VfsdAgentState",
    "VfsdBackend",
    "VfsdMiddleware",
    "create_vfsd_deep_agent",
    "prompt_note_for",
    "virtual_path",
]
