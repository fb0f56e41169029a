"""Opening paths under a directory in one race-free step.

Checking a path (realpath, then "is it inside?") and then using it leaves a
window: a directory swapped for a symlink to elsewhere in between sends the
use outside. Here the kernel does the check during the use itself:
`openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` resolves the path from a
directory fd and fails (EXDEV) as soon as any step, `..` or a symlink, would
leave that directory; symlinks that stay inside are followed. Everything that
follows works on the file descriptors it returns, or on names relative to a
directory fd (`*at` calls), so no path is ever resolved twice.

Kernels without openat2 (before 5.6) get a walk of O_NOFOLLOW opens from the
same directory fd, one component at a time: just as safe, but it refuses
every symlink instead of following the ones that stay inside.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
#: resolution that never leaves the directory and never uses /proc magic links
CONFINED = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_RETRIES = 8  # openat2 says EAGAIN when a rename raced with its `..` check

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_have_openat2: bool | None = None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def relative_parts(path: str | bytes) -> list[bytes]:
    """The components of `path` taken relative to the directory (leading `/`
    and empty or `.` components dropped; `..` kept for the kernel to judge)."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise ValueError(f"path contains a NUL byte: {path!r}")
    return [p for p in raw.split(b"/") if p not in (b"", b".")]


def _openat2(dir_fd: int, path: bytes, flags: int, mode: int, resolve: int) -> int:
    # openat2 refuses a mode unless the call may create a file.
    creates = bool(flags & os.O_CREAT) or flags & os.O_TMPFILE == os.O_TMPFILE
    how = _OpenHow(flags | os.O_CLOEXEC, mode if creates else 0, resolve)
    for _ in range(_RETRIES):
        fd = _libc.syscall(_SYS_OPENAT2, dir_fd, path, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):
            raise OSError(err, os.strerror(err), os.fsdecode(path))
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), os.fsdecode(path))


def _openat2_available() -> bool:
    global _have_openat2
    if _have_openat2 is None:
        try:
            os.close(_openat2(-100, b"/", os.O_PATH, 0, 0))  # AT_FDCWD
            _have_openat2 = True
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter
                raise
            _have_openat2 = False
    return _have_openat2


def open_beneath(dir_fd: int, path: str | bytes, flags: int, mode: int = 0o644, *,
                 follow_symlinks: bool = True) -> int:
    """An fd for `path` resolved strictly inside `dir_fd` (OSError otherwise).

    EXDEV: the path leads outside (through `..` or a symlink). ELOOP: a
    symlink where none may be. The empty path opens `dir_fd`'s directory.
    """
    parts = relative_parts(path)
    rel = b"/".join(parts) or b"."
    resolve = CONFINED if follow_symlinks else CONFINED | RESOLVE_NO_SYMLINKS
    if _openat2_available():
        return _openat2(dir_fd, rel, flags, mode, resolve)
    return _walk_open(dir_fd, parts, flags, mode)


def _walk_open(dir_fd: int, parts: list[bytes], flags: int, mode: int) -> int:
    """openat2's fallback: O_NOFOLLOW opens, one component at a time."""
    stack = [os.dup(dir_fd)]
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            if name == b"..":
                if len(stack) == 1:
                    raise OSError(errno.EXDEV, "path leads outside the directory")
                os.close(stack.pop())
                if last:
                    return os.dup(stack[-1]) if flags & os.O_PATH else \
                        os.open(".", flags | os.O_CLOEXEC, dir_fd=stack[-1])
                continue
            if last:
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=stack[-1])
                if flags & os.O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
                    os.close(fd)  # O_PATH | O_NOFOLLOW opens the link itself
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fsdecode(name))
                return fd
            stack.append(os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW |
                                 os.O_CLOEXEC, dir_fd=stack[-1]))
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=stack[-1])
    finally:
        for fd in stack:
            os.close(fd)


def makedirs_beneath(dir_fd: int, path: str | bytes, mode: int = 0o777) -> int:
    """An O_PATH fd of directory `path` under `dir_fd`, creating what is missing.

    Iterative (no recursion, whatever the depth); each directory is made with
    mkdirat() in a directory already confirmed inside, and every step is
    resolved beneath `dir_fd`, so a swap at any moment cannot lead outside.
    """
    parts = relative_parts(path)
    flags = os.O_PATH | os.O_DIRECTORY
    try:
        return open_beneath(dir_fd, b"/".join(parts), flags)
    except FileNotFoundError:
        pass
    current = os.dup(dir_fd)
    try:
        for i, name in enumerate(parts):
            try:
                nxt = open_beneath(current, name, flags, follow_symlinks=False)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    try:
                        os.mkdir(name, mode, dir_fd=current)
                    except FileExistsError:
                        pass  # made meanwhile by someone else: fine
                    nxt = open_beneath(current, name, flags, follow_symlinks=False)
                elif exc.errno in (errno.ELOOP, errno.EXDEV):
                    # `..` or a symlink: resolve this prefix from the top instead,
                    # where it may legitimately go anywhere inside.
                    nxt = open_beneath(dir_fd, b"/".join(parts[:i + 1]), flags)
                else:
                    raise
            os.close(current)
            current = nxt
        return current
    except BaseException:
        os.close(current)
        raise

