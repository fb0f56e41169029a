"""deepagents' file tools on a vfsd mount, with every path resolved race-free.

The results follow deepagents' own local-filesystem backend (its error texts,
line windows, glob and grep rules), but nothing here resolves a path twice:
each operation opens what it needs beneath the mount root in one step
(`beneath.open_beneath`), then works on file descriptors and on names
relative to directory descriptors. A directory swapped for a symlink to the
outside at any moment therefore makes the operation fail (or skip the entry),
never read or write outside the mount. Walks (glob, grep) go down by
directory descriptors and never enter symlinks; a symlink to a file is used
only if it resolves inside the mount.

Paths given to these methods are virtual paths already normalized by the
backend ("/a/b"); what fails comes back as the result's error, never raised.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from deepagents.backends.protocol import (
    DEFAULT_GREP_TIMEOUT,
    DeleteResult,
    EditResult,
    FileData,
    FileInfo,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
)
from deepagents.backends.utils import (
    MAX_VIDEO_INPUT_BYTES,
    InvalidGlobPatternError,
    _get_backend_read_file_type,
    check_empty_content,
    compile_grep_include_glob,
    perform_string_replacement,
    slice_read_response,
)

from ..beneath import open_beneath, relative_parts
from ..daemon import toolcalls

GLOB_TIMEOUT_SECONDS = 5
MAX_GREP_FILE_BYTES = 10 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY  # a FIFO must not block the open
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY


def _child(virtual: str, name: str) -> str:
    return ("" if virtual == "/" else virtual) + "/" + name


def _info(path: str, st: os.stat_result, is_dir: bool) -> FileInfo:
    return {
        "path": path + "/" if is_dir else path,
        "is_dir": is_dir,
        "size": 0 if is_dir else int(st.st_size),
        "modified_at": datetime.fromtimestamp(st.st_mtime).isoformat(),  # noqa: DTZ006 - local times
    }


def _text(raw: bytes) -> str:
    """UTF-8 text with universal newlines, as a text-mode read gives it."""
    return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _pwrite_all(fd: int, data: bytes) -> None:
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], written)


def _rewrite(fd: int, data: bytes, original: bytes) -> None:
    """Replace the file's content with `data` in place; on failure (ENOSPC, the
    quota) put `original` back. Writing before truncating never leaves the
    file cut short part-way; fsync makes the writeback cache report now."""
    try:
        _pwrite_all(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, len(original))  # first: gives back the room it took
            _pwrite_all(fd, original)
            os.fsync(fd)
        raise


class MountFiles:
    """ls, read, edit, delete, glob, grep and download on one mount root.

    `open_root` is a context manager giving an O_PATH fd of the mount root;
    `resolve` maps a path to its symlink-free form inside the mount (ValueError
    if it leads outside), as `Mount.relative` does; `client` is the mount's
    control client, through which an edit's tool call is named (`toolcalls.tag`).
    """

    def __init__(self, open_root: Callable, resolve: Callable[[str], str],
                 client=None) -> None:
        self.open_root = open_root
        self.resolve = resolve
        self.client = client

    def _open(self, virtual: str, flags: int) -> int:
        with self.open_root() as root:
            try:
                return open_beneath(root, virtual, flags)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                # RESOLVE_BENEATH refuses absolute symlinks even when they point
                # inside: resolve those here, and open again, still beneath.
                return open_beneath(root, self.resolve(virtual), flags)

    @contextmanager
    def _opened(self, virtual: str, flags: int) -> Iterator[int]:
        fd = self._open(virtual, flags)
        try:
            yield fd
        finally:
            os.close(fd)

    # -- reading --------------------------------------------------------------

    def read(self, virtual: str, offset: int, limit: int) -> ReadResult:
        try:
            with self._opened(virtual, _READ_FLAGS) as fd:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return ReadResult(error=f"File '{virtual}' not found")
                file_type = _get_backend_read_file_type(virtual)
                if file_type == "video" and st.st_size > MAX_VIDEO_INPUT_BYTES:
                    return ReadResult(
                        error=f"Video file exceeds maximum input size of {MAX_VIDEO_INPUT_BYTES} bytes"
                    )
                raw = _read_all(fd)
        except FileNotFoundError:
            return ReadResult(error=f"File '{virtual}' not found")
        except OSError as exc:
            return ReadResult(error=f"Error reading file '{virtual}': {_why(exc)}")
        if file_type != "text":
            encoded = base64.standard_b64encode(raw).decode("ascii")
            return ReadResult(file_data=FileData(content=encoded, encoding="base64"))
        try:
            content = _text(raw)
        except UnicodeDecodeError as exc:
            return ReadResult(error=f"Error reading file '{virtual}': {exc}")
        empty = check_empty_content(content)
        if empty:
            return ReadResult(file_data=FileData(content=empty, encoding="utf-8"))
        return slice_read_response(FileData(content=content, encoding="utf-8"), offset, limit)

    def download(self, virtual: str) -> bytes:
        """The bytes of a regular file; OSError (IsADirectoryError, ...) otherwise."""
        with self._opened(virtual, _READ_FLAGS) as fd:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", virtual)
            if not stat.S_ISREG(mode):
                raise OSError(errno.EINVAL, "not a regular file", virtual)
            return _read_all(fd)

    def ls(self, virtual: str) -> LsResult:
        try:
            with self._opened(virtual, _READ_FLAGS) as fd:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    return LsResult(error=f"Path '{virtual}': not_a_directory", entries=None)
                entries, errors = self._list(fd, virtual)
        except FileNotFoundError:
            return LsResult(error=f"Path '{virtual}': path_not_found", entries=None)
        except OSError as exc:
            return LsResult(error=f"Cannot list '{virtual}': {_why(exc)}", entries=None)
        entries.sort(key=lambda e: e.get("path", ""))
        return LsResult(error="\n".join(sorted(errors)) if errors else None, entries=entries)

    def _list(self, dir_fd: int, virtual: str) -> tuple[list[FileInfo], list[str]]:
        entries: list[FileInfo] = []
        errors: list[str] = []
        with os.scandir(dir_fd) as it:
            for entry in it:
                path = _child(virtual, entry.name)
                try:
                    st = self._stat_inside(dir_fd, entry, path)
                except OSError as exc:
                    errors.append(f"child error: cannot stat '{path}': {_why(exc)}")
                    continue
                if st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    entries.append(_info(path, st, stat.S_ISDIR(st.st_mode)))
        return entries, errors

    def _stat_inside(self, dir_fd: int, entry: os.DirEntry, virtual: str) -> os.stat_result | None:
        """The entry's stat, through a symlink only if it resolves inside the
        mount (None if it leads out or nowhere)."""
        if not entry.is_symlink():
            return os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False)
        try:
            with self._opened(virtual, os.O_PATH) as fd:
                return os.fstat(fd)
        except ValueError:
            return None  # leads outside the mount
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.ELOOP, errno.ENOENT, errno.ENOTDIR):
                return None
            raise

    # -- changing ---------------------------------------------------------------

    def edit(self, virtual: str, old: str, new: str, replace_all: bool) -> EditResult:
        try:
            with self._opened(virtual, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY) as fd:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return EditResult(error=f"Error: File '{virtual}' not found")
                raw = _read_all(fd)
                content = raw.decode("utf-8")
                count = content.count(old) if old else 0
                if not count:
                    # As the text read gives it, the edit speaks in "\n" line ends;
                    # `old` as sent is tried first, so a file keeps its bytes
                    # outside the edit (Deep Agents appends to its records so).
                    content = _text(raw)
                    old = old.replace("\r\n", "\n").replace("\r", "\n")
                    new = new.replace("\r\n", "\n").replace("\r", "\n")
                    count = content.count(old) if old else 0
                if count > 1 and not replace_all:
                    return EditResult(
                        error=f"Error: String '{old}' appears multiple times ({count} in the "
                        "file). Use replace_all=True to replace all occurrences, or provide "
                        "a more specific string with surrounding context.")
                result = perform_string_replacement(content, old, new, replace_all)
                if isinstance(result, str):
                    return EditResult(error=result)
                text, occurrences = result
                toolcalls.tag(fd, self.client)
                _rewrite(fd, text.encode("utf-8"), raw)
        except (FileNotFoundError, IsADirectoryError):
            return EditResult(error=f"Error: File '{virtual}' not found")
        except (OSError, UnicodeDecodeError, UnicodeEncodeError) as exc:
            return EditResult(error=f"Error editing file '{virtual}': {_why(exc)}")
        return EditResult(path=virtual, occurrences=int(occurrences))

    def delete(self, virtual: str) -> DeleteResult:
        parts = relative_parts(virtual)
        if not parts:
            return DeleteResult(error="Error: refusing to delete the mount root")
        parent, name = b"/".join(parts[:-1]), parts[-1]
        try:
            dir_fd = self._open(os.fsdecode(b"/" + parent), os.O_PATH | os.O_DIRECTORY)
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    # fd-based and symlink-safe: it never follows a link it meets.
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)  # a symlink goes, never its target
            finally:
                os.close(dir_fd)
        except FileNotFoundError:
            return DeleteResult(error=f"Error: '{virtual}' not found")
        except OSError as exc:
            return DeleteResult(error=f"Error deleting '{virtual}': {_why(exc)}")
        return DeleteResult(path=virtual)

    # -- searching ----------------------------------------------------------------

    def _walk(self, top_fd: int, deadline: float) -> Iterator[tuple[str, int, os.DirEntry]]:
        """(path relative to the top, directory fd, entry) for everything under
        `top_fd`, going down by directory fds and never into symlinks. Stops
        quietly at `deadline` (the caller checks the clock too)."""
        stack = [("", os.dup(top_fd))]
        try:
            while stack:
                rel, fd = stack.pop()
                try:
                    with os.scandir(fd) as it:
                        entries = sorted(it, key=lambda e: e.name)
                    for entry in entries:
                        if time.monotonic() > deadline:
                            return
                        child = f"{rel}/{entry.name}" if rel else entry.name
                        yield child, fd, entry
                        if entry.is_dir(follow_symlinks=False):
                            try:
                                sub = os.open(entry.name, _DIR_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC,
                                              dir_fd=fd)
                            except OSError:
                                continue  # gone or replaced meanwhile: skip it
                            stack.append((child, sub))
                finally:
                    os.close(fd)
        finally:
            for _, fd in stack:
                os.close(fd)

    def _regular_stat(self, base: str, rel: str, dir_fd: int,
                      entry: os.DirEntry) -> os.stat_result | None:
        """The stat of a regular file, or of a symlink's target when that is a
        regular file inside the mount; None for anything else."""
        try:
            st = self._stat_inside(dir_fd, entry, _child(base, rel))
        except OSError:
            return None
        return st if st is not None and stat.S_ISREG(st.st_mode) else None

    def glob(self, pattern: str, virtual: str) -> GlobResult:
        try:
            matches = compile_grep_include_glob(pattern)
        except InvalidGlobPatternError as exc:
            return GlobResult(error=str(exc), matches=None)
        deadline = time.monotonic() + GLOB_TIMEOUT_SECONDS
        results: list[FileInfo] = []
        try:
            with self._opened(virtual, _DIR_FLAGS) as top:
                for rel, dir_fd, entry in self._walk(top, deadline):
                    if not matches(rel):
                        continue
                    st = self._regular_stat(virtual, rel, dir_fd, entry)
                    if st is not None:
                        results.append(_info(_child(virtual, rel), st, False))
        except (FileNotFoundError, NotADirectoryError):
            return GlobResult(matches=[])
        except OSError as exc:
            return GlobResult(error=f"Error globbing path '{virtual}': {_why(exc)}", matches=[])
        truncated = time.monotonic() > deadline
        results.sort(key=lambda x: x.get("path", ""))
        return GlobResult(matches=results, truncated=truncated,
                          truncation_reason="budget" if truncated else None)

    def grep(self, pattern: str, virtual: str, include: str | None,
             max_count: int | None) -> GrepResult:
        try:
            wanted = compile_grep_include_glob(include) if include else None
        except InvalidGlobPatternError as exc:
            return GrepResult(error=str(exc), matches=[])
        deadline = time.monotonic() + DEFAULT_GREP_TIMEOUT
        search = _Search(pattern, max_count)
        try:
            with self._opened(virtual, _READ_FLAGS) as top:
                if stat.S_ISREG(os.fstat(top).st_mode):
                    search.file(top, virtual, deadline)
                elif stat.S_ISDIR(os.fstat(top).st_mode):
                    for rel, dir_fd, entry in self._walk(top, deadline):
                        if search.done or (wanted is not None and not wanted(rel)):
                            continue
                        st = self._regular_stat(virtual, rel, dir_fd, entry)
                        if st is None or st.st_size > MAX_GREP_FILE_BYTES:
                            continue
                        self._grep_entry(search, virtual, rel, dir_fd, entry, deadline)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return GrepResult(matches=[])
        except OSError as exc:
            return GrepResult(error=f"Error searching path '{virtual}': {_why(exc)}", matches=[])
        truncated = search.truncated or time.monotonic() > deadline
        return GrepResult(error=search.error(), matches=search.matches, truncated=truncated)

    def _grep_entry(self, search: _Search, base: str, rel: str, dir_fd: int,
                    entry: os.DirEntry, deadline: float) -> None:
        path = _child(base, rel)
        try:
            if entry.is_symlink():
                fd = self._open(path, _READ_FLAGS)
            else:
                fd = os.open(entry.name, _READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except (OSError, ValueError) as exc:
            search.failed(path, exc)
            return
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                search.file(fd, path, deadline)
        finally:
            os.close(fd)


class _Search:
    """A literal search over files, with deepagents' match cap and error rules."""

    def __init__(self, pattern: str, max_count: int | None) -> None:
        self.pattern = pattern
        self.max_count = max_count
        self.matches: list[GrepMatch] = []
        self.truncated = False
        self.file_errors: list[str] = []

    @property
    def done(self) -> bool:
        return self.truncated

    def failed(self, path: str, exc: BaseException) -> None:
        self.file_errors.append(f"- {path}: {type(exc).__name__}: {_why(exc)}")

    def file(self, fd: int, path: str, deadline: float) -> None:
        scanned = 0
        found = 0
        try:
            with os.fdopen(os.dup(fd), "r", encoding="utf-8", errors="strict") as handle:
                for number, line in enumerate(handle, 1):
                    scanned = number
                    if number % 2048 == 0 and time.monotonic() > deadline:
                        self.truncated = True
                        return
                    if self.pattern not in line:
                        continue
                    if self.max_count is not None and len(self.matches) >= self.max_count:
                        self.truncated = True
                        return
                    self.matches.append({"path": path, "line": number, "text": line.rstrip("\n")})
                    found += 1
        except UnicodeDecodeError as exc:
            # Binary files are skipped, as ripgrep does; one that fails partway is reported.
            if scanned or found:
                self.file_errors.append(f"- {path}: {type(exc).__name__}: {exc.reason}")
        except OSError as exc:
            self.failed(path, exc)

    def error(self) -> str | None:
        if not self.file_errors:
            return None
        return "One or more files could not be fully searched:\n" + "\n".join(self.file_errors)


def _why(exc: BaseException) -> str:
    """An error's reason without the real path (which would leak the mount's location)."""
    if isinstance(exc, OSError):
        if exc.errno == errno.EXDEV:
            return "the path leads outside the mount"
        if exc.errno == errno.ELOOP:
            return "too many levels of symbolic links, or a /proc magic link"
        return exc.strerror or type(exc).__name__
    return str(exc)
