"""Errors raised by the storage layer.

Each carries the POSIX errno that best describes it, so callers (the FUSE layer,
the control server) can answer without knowing storage internals.
"""

import errno


class StoreError(Exception):
    """Base class; `errno` says what a POSIX caller should see."""

    errno = errno.EIO


class NotFound(StoreError):
    errno = errno.ENOENT


class Exists(StoreError):
    errno = errno.EEXIST


class NotEmpty(StoreError):
    errno = errno.ENOTEMPTY


class NotADirectory(StoreError):
    errno = errno.ENOTDIR


class IsADirectory(StoreError):
    errno = errno.EISDIR


class NameTooLong(StoreError):
    errno = errno.ENAMETOOLONG


class NoSpace(StoreError):
    errno = errno.ENOSPC


class InvalidArgument(StoreError):
    errno = errno.EINVAL


class CorruptChunk(StoreError):
    """A chunk file is missing or its bytes do not match its name."""

    errno = errno.EIO


class StoreLocked(Exception):
    """Another daemon holds the volume."""


class StoreVersionError(Exception):
    """The store was written by an incompatible schema version or is damaged."""
