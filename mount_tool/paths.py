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
from pathlib import Path, PurePosixPath


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def confine(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Return the absolute, symlink-resolved form of `path` inside `root`.

    A relative `path` is taken relative to `root`. Raises ValueError when the
    path leaves the root lexically (`..`), is absolute but elsewhere, or
    resolves through a symlink to somewhere outside.
    """
    real_root = os.path.realpath(root)
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
    resolved = os.path.realpath(candidate)
    if not _within(resolved, real_root):
        raise ValueError(f"{raw!r} resolves to {resolved}, outside the mount {real_root}")
    return Path(resolved)


def mount_relative(root: str | os.PathLike[str], absolute: str | os.PathLike[str]) -> str:
    """The control-protocol form of an absolute path inside `root` ("out/a.txt")."""
    rel = os.path.relpath(os.fspath(absolute), os.path.realpath(root))
    return "/" if rel == "." else PurePosixPath(rel).as_posix()
