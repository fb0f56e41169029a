"""Path confinement: every path mount_tool touches must stay inside the mount.

`confine` decides before anything is created or written: it refuses NUL bytes,
relative paths whose `..` components climb above the root at any point, absolute
paths elsewhere, and paths whose symlinks (resolved with realpath, which only
reads link targets) lead outside. This check is for clear errors; what makes a
use safe is that it resolves the path again, beneath the mount root, in the same
system call that opens it (`beneath.open_beneath`): a symlink swapped in after
the check cannot lead that use outside.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def confine(root: str | os.PathLike[str], path: str | os.PathLike[str], *,
            canonical: bool = False) -> Path:
    """Return the absolute, symlink-resolved form of `path` inside `root`.

    A relative `path` is taken relative to `root`. Raises ValueError when the
    path leaves the root lexically (`..`), is absolute but elsewhere, or
    resolves through a symlink to somewhere outside. `canonical`: `root` is
    known to be its own realpath (not resolved again).
    """
    real_root = os.fspath(root) if canonical else os.path.realpath(root)
    raw = os.fsdecode(os.fspath(path))
    if "\0" in raw:
        raise ValueError(f"path contains a NUL byte: {raw!r}")
    if raw == "":
        raise ValueError("empty path")
    if os.path.isabs(raw):
        lexical = os.path.normpath(raw)
        if not (_within(lexical, real_root) or _within(lexical, os.path.abspath(root))):
            raise ValueError(f"{raw!r} is outside the mount {real_root}")
        candidate = lexical
    else:
        depth = 0
        for part in PurePosixPath(raw).parts:
            if part == "..":
                depth -= 1
                if depth < 0:
                    raise ValueError(f"{raw!r} escapes the mount with '..'")
            elif part != ".":
                depth += 1
        candidate = os.path.join(real_root, raw)
    resolved = _realpath_below(real_root, candidate) if canonical else os.path.realpath(candidate)
    if not _within(resolved, real_root):
        raise ValueError(f"{raw!r} resolves to {resolved}, outside the mount {real_root}")
    return Path(resolved)


def _realpath_below(root: str, candidate: str) -> str:
    """`os.path.realpath(candidate)` for a normalized `candidate` under the
    canonical `root`: only the components below the root are looked at (the
    root's own are known to hold no symlink); from the first symlink on, the
    rest is resolved by realpath itself."""
    if not _within(candidate, root):
        return os.path.realpath(candidate)
    path = root
    parts = [p for p in candidate[len(root):].split("/") if p not in ("", ".")]
    for i, part in enumerate(parts):
        if part == "..":
            # Lexical: nothing on the way is a symlink (and confine's checks
            # keep a relative path from climbing above the root).
            path = os.path.dirname(path) if path != root else root
            continue
        nxt = os.path.join(path, part)
        try:
            st = os.lstat(nxt)
        except OSError:
            rest = parts[i + 1:]
            if ".." in rest:  # a `..` after a missing name may reach a symlink again
                return os.path.realpath(os.path.join(nxt, *rest))
            # Missing (or unreadable): realpath keeps the rest as it is written.
            return os.path.join(nxt, *rest)
        if stat.S_ISLNK(st.st_mode):
            return os.path.realpath(os.path.join(nxt, *parts[i + 1:]))
        path = nxt
    return path


def mount_relative(root: str | os.PathLike[str], absolute: str | os.PathLike[str], *,
                   canonical: bool = False) -> str:
    """The control-protocol form of an absolute path inside `root` ("out/a.txt")."""
    rel = os.path.relpath(os.fspath(absolute),
                          os.fspath(root) if canonical else os.path.realpath(root))
    return "/" if rel == "." else PurePosixPath(rel).as_posix()
