"""Exceptions raised by mount_tool.

Everything mount_tool raises on purpose derives from `MountToolError`, so a caller
can catch the whole family; the reference errors also derive from the closest
builtin (`FileNotFoundError`) where code written for plain files expects one.
"""

from __future__ import annotations

import errno
from typing import Any


class MountToolError(Exception):
    """Base class of the errors mount_tool raises."""


class MountError(MountToolError):
    """The daemon could not be started, attached to, or unmounted."""


class ControlError(MountToolError):
    """The daemon answered a control request with an error reply.

    `code` is one of the protocol's codes (`not_found`, `evicted`, `forbidden`,
    `bad_request`, ...; see docs/control.md) or `connection` when the socket
    itself failed.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RefError(MountToolError):
    """A FileRef no longer leads to the content it was taken for.

    `note` adds to the message what else was tried (e.g. that no retained
    snapshot holds that version either).
    """

    def __init__(self, message: str, ref: dict[str, Any], note: str = "") -> None:
        super().__init__(f"{message}; {note}" if note else message)
        self.ref = ref


class Evicted(RefError, FileNotFoundError):
    """The referenced file was evicted; `record` is the daemon's eviction record."""

    def __init__(self, ref: dict[str, Any], record: dict[str, Any], note: str = "") -> None:
        where = record.get("path", ref.get("path"))
        super().__init__(
            f"{where} was evicted at step {record.get('evicted_step')} ({record.get('reason')})",
            ref,
            note,
        )
        self.record = record


class EvictedPath(MountToolError, FileNotFoundError):
    """A path that is missing because eviction removed it.

    Raised by `Mount.read_bytes` (and anything reading by path through the
    Mount) instead of a bare FileNotFoundError: the message says when and
    why the file went, and whether a retained snapshot still holds it
    (`snapshot`, else None), so `Mount.unevict` can bring it back. `record`
    is the daemon's eviction record.
    """

    def __init__(self, path: str, record: dict[str, Any], message: str) -> None:
        super().__init__(errno.ENOENT, message)
        self.path = path
        self.record = record
        self.snapshot = record.get("snapshot")
        self.filename = path

    def __str__(self) -> str:
        return str(self.args[1])


class StaleRef(RefError):
    """The file still exists but its content changed since the ref was taken.

    `current` is the file's current FileRef when known (None otherwise).
    """

    def __init__(
        self, ref: dict[str, Any], current: dict[str, Any] | None = None, note: str = ""
    ) -> None:
        super().__init__(
            f"{ref.get('path')} changed since the reference was taken "
            f"(ref hash {ref.get('hash')}, now {current.get('hash') if current else 'unknown'})",
            ref,
            note,
        )
        self.current = current


class Missing(RefError, FileNotFoundError):
    """The referenced file was removed (unlinked, not evicted)."""

    def __init__(self, ref: dict[str, Any], note: str = "") -> None:
        super().__init__(f"{ref.get('path')} (ino {ref.get('ino')}) no longer exists", ref, note)


class SnapshotUnavailable(MountToolError):
    """A checkpoint's files cannot be brought back: its snapshot is gone.

    Raised by `VfsdCheckpointer` when a graph run starts from a checkpoint
    whose snapshot retention (or a user) deleted, or whose files live in
    another run dir. `checkpoint_id`, `snapshot` and `reason` (the daemon's
    message) say which and why; `lost` lists the refs of the checkpoint's
    `files` state that no live file and no retained snapshot holds, and
    `available` those that could still be read (by `Mount.read`).
    """

    def __init__(
        self,
        message: str,
        *,
        checkpoint_id: str,
        snapshot: str,
        reason: str,
        lost: list[dict[str, Any]] | None = None,
        available: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.snapshot = snapshot
        self.reason = reason
        self.lost = lost or []
        self.available = available or []


class SnapshotNotPublished(MountToolError):
    """A checkpoint's snapshot did not reach the object store in time.

    Raised by `VfsdCheckpointer` (remote tier) when its durability rule needs
    a snapshot published before a checkpoint may be stored (`publish="wait"`:
    this checkpoint's; `publish="behind"`: the oldest beyond `max_lag`) and
    `sync_timeout` ran out. The checkpoint was not stored; publishing goes on
    in the daemon's background. `snapshot` and `reason` (the daemon's
    message: chunks left, last error, lease state) say which and why.
    """

    def __init__(self, message: str, *, snapshot: str, reason: str) -> None:
        super().__init__(message)
        self.snapshot = snapshot
        self.reason = reason


class ThreadBusy(MountToolError):
    """Another run holds the thread (on this replica or another one sharing its
    bucket): a run's start waited the configured bound for it to end or lapse.
    `holder` is the daemon's word on who holds it and when it may lapse.
    Nothing was changed; try again later (or give runs longer to wait:
    `remote_lease_wait`)."""

    def __init__(self, message: str, *, thread_id: str, holder: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.holder = holder


class ThreadBindingError(MountToolError):
    """A graph thread other than the one the run dir serves tried to use it."""


class Damaged(RefError, OSError):
    """The referenced file is there but the store cannot serve its content:
    the daemon found it damaged on disk and answered EIO (it never serves
    bytes that fail their hash), or the daemon answered a request about it
    with the `damaged` code (its record is damaged; `note` says which).
    `vfsd fsck --verify` lists damaged files.

    Also an OSError with errno EIO, as a read of the file itself gives.
    """

    def __init__(self, ref: dict[str, Any], note: str = "") -> None:
        super().__init__(
            f"{ref.get('path')} (ino {ref.get('ino')}) cannot be read: its stored content is "
            "damaged (EIO); `vfsd fsck --verify RUN_DIR` lists the damaged files",
            ref,
            note,
        )
        self.errno = errno.EIO
        self.strerror = "stored content is damaged"

    def __str__(self) -> str:
        return str(self.args[0])  # the message, not OSError's "[Errno 5] ..."
