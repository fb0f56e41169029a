"""VfsdBackend: deepagents' `SandboxBackendProtocol` on a vfsd mount.

`ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`, `upload_files`,
`download_files` (and their async twins) work on the mounted directory of
the running thread (or of one Mount), plus `execute`, a shell command run in
a sandbox whose `/` is the mount root (`mount_tool.sandbox`). Paths are the
agent's paths ("/notes/plan.md" is `RUN_DIR/fs/notes/plan.md`, for the file
tools and the shell alike) and are confined to the mount before anything is
touched (`files` does the file tools' work beneath the mount root).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

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

from ..daemon import toolcalls
from ..errors import ControlError, MountToolError
from ..mount import Mount
from ..refs import FileRef
from ..reserved import TMP_DIR, reserved_reason
from ..runs import Runs, lease
from ..sandbox import (
    DEFAULT_ENV_ALLOWLIST,
    ExecLimits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
)
from .evictnotes import glob_note, why_missing
from .files import MountFiles
from .nospace import explained, why_no_room
from .offload import DEFAULT_THRESHOLD_TOKENS, cut_unsaved, offload_tool_output
from .records import is_record, record_path

logger = logging.getLogger(__name__)

DEFAULT_EXECUTE_TIMEOUT = 120
DEFAULT_MAX_OUTPUT_BYTES = 4 << 20
#: how an OSError's text ends for ENOSPC (MountFiles' errors carry no errno)
NO_SPACE = os.strerror(errno.ENOSPC)


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
