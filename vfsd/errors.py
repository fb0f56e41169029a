"""Errors raised by the storage layer, and the daemon's startup refusal.

Each storage error carries the POSIX errno that best describes it, so callers
(the FUSE layer, the control server) can answer without knowing storage
internals. The exceptions below `StoreError`'s family are not errno-shaped:
they stop a daemon before it mounts, with a message for the user.
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


class QuotaExceeded(NoSpace):
    """The volume's quota (or max_files) refused the room, not the disk."""


class InvalidArgument(StoreError):
    errno = errno.EINVAL


class Corrupt(StoreError):
    """Stored bytes or records are damaged: never served, always EIO."""

    errno = errno.EIO


class CorruptChunk(Corrupt):
    """Content (a chunk file or an inline blob) is missing or does not match its name."""


class Unavailable(StoreError):
    """Content that lives in the object store could not be fetched in time (EIO)."""

    errno = errno.EIO


class TooBig(StoreError):
    """A size or offset past what the store accepts."""

    errno = errno.EFBIG


class NoAttr(StoreError):
    """No such extended attribute."""

    errno = errno.ENODATA


class AttrTooBig(StoreError):
    """An extended attribute (or a file's attributes together) past the limits."""

    errno = errno.E2BIG


class ReadOnly(StoreError):
    errno = errno.EROFS


class StoreLocked(Exception):
    """Another daemon holds the volume."""


class StoreVersionError(Exception):
    """The store was written by an incompatible schema version or is damaged."""


class NoSuchVolume(StoreVersionError):
    """The store exists but has no volume of that name (and was not asked to make one)."""


class StartupError(Exception):
    """The daemon cannot start; the message is for the user."""
