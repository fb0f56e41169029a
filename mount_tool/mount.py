"""Mount: a vfsd mount of one run directory, as an agent program sees it.

mount_tool never imports vfsd. It starts the daemon through its command line
(`python -m vfsd.cli mount RUN_DIR ...`), then talks to it only through the
mounted directory (POSIX calls) and the control socket.

The one-thread form, below the Runs (whose threads are Mounts too) and the
integrations: it imports the daemon's client and the shared modules only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from .beneath import makedirs_beneath, open_beneath, relative_parts
from .daemon import toolcalls
from .daemon.client import ControlClient
from .daemon.mountinfo import is_mounted, mount_point_listed
from .daemon.spawn import mount_flags, vfsd_command
from .errors import (
    ControlError,
    Damaged,
    Evicted,
    EvictedPath,
    Missing,
    MountError,
    MountToolError,
    StaleRef,
)
from .paths import confine, mount_relative
from .refs import DEFAULT_CHUNK_SIZE, FileRef, as_ref, content_hash
from .reserved import SANDBOX_DIRS, reserved_reason

STATUSES = ("active", "done")
# `vfsd mount` returns once mounted; the socket may need a moment more to answer.
PING_WAIT_SECONDS = 10.0
#: FUSE's root inode number: what the mount root's fd must show
FUSE_ROOT_INO = 1
# What _read_same_inode returns when the inode is there but cannot match the ref.
_CHANGED = object()
# Retained snapshots, read-only, inside the mount.
SNAPSHOTS_DIR = ".vfsd/snapshots"
NOT_IN_SNAPSHOTS = "no retained snapshot holds that version"
#: seconds `sync` waits for the daemon's answer beyond the publication timeout
SYNC_GRACE_SECONDS = 10.0


def _sandbox_reason(rel: str, exc: OSError) -> str | None:
    """The file tools' reason when a write under a sandbox mount point (a
    read-only virtual directory once a sandbox claimed it) failed because of it."""
    if exc.errno not in (errno.EROFS, errno.EEXIST, errno.EPERM):
        return None
    top = rel.split("/", 1)[0]
    return reserved_reason("/" + rel) if top in SANDBOX_DIRS else None


def _not_regular(rel: str) -> OSError:
    return OSError(errno.EINVAL, f"{rel} is not a regular file (a FIFO, socket or device); "
                   "nothing was written")


def _confined(opener: Callable[[], int], path: str, *, symlinks_refused: bool = False) -> int:
    """`opener()`, with the kernel's "that leads outside" (EXDEV, from
    RESOLVE_BENEATH) turned into the ValueError every path API raises; with
    `symlinks_refused`, ELOOP too (a symlink where the checked path had none)."""
    try:
        return opener()
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise ValueError(f"{path!r} leads outside the mount") from None
        if exc.errno == errno.ELOOP and symlinks_refused:
            raise ValueError(f"{path!r} was replaced by a symlink while in use") from None
        raise


class Mount:
    """A live vfsd mount of `run_dir`, its files reachable under `root` (RUN_DIR/fs).

    Create with `mount_tool.mount(run_dir, **options)` (starts a daemon unless
    one already serves the run dir) or `Mount.attach(run_dir)`. As a context
    manager it unmounts on exit only if it started the daemon.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, started: bool = False) -> None:
        self.run_dir = Path(os.path.realpath(run_dir))
        self.root = self.run_dir / "fs"
        self.state_dir = self.run_dir / ".vfsd"
        self.client = ControlClient(self.state_dir / "vfsd.sock")
        self.started = started
        self._closed = False
        self._chunk_size: int | None = None
        self._step: int | None = None  # the step this Mount last saw (a hint)

    # -- lifecycle ----------------------------------------------------------

    @classmethod
    def start(cls, run_dir: str | os.PathLike[str], **options: Any) -> Mount:
        """Start vfsd on `run_dir` (or attach to the daemon already serving it)."""
        run_dir = Path(os.path.realpath(run_dir))
        if is_mounted(run_dir / "fs"):
            return cls.attach(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        proc = vfsd_command("mount", str(run_dir), *mount_flags(options))
        if proc.returncode != 0:
            raise MountError(
                f"vfsd mount {run_dir} exited {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()}"
            )
        m = cls(run_dir, started=True)
        if not m._wait_for_ping():
            m.unmount()
            raise MountError(f"vfsd mounted {m.root} but its control socket does not answer")
        return m

    @classmethod
    def attach(cls, run_dir: str | os.PathLike[str]) -> Mount:
        """Use the vfsd already serving `run_dir`; never unmounts it on close."""
        m = cls(run_dir, started=False)
        if not m.is_mounted():
            raise MountError(f"{m.root} is not mounted")
        if not m.client.ping():
            raise MountError(
                f"{m.root} is mounted but no daemon answers on {m.client.socket_path}; "
                f"a crashed daemon leaves a dead mount: `fusermount3 -u -z {m.root}`"
            )
        return m

    def is_mounted(self) -> bool:
        """Whether the mount is still there (`root` is canonical: no realpath,
        whose lstat of the mount root would wait on a busy daemon)."""
        return mount_point_listed(os.fsencode(self.root))

    def _wait_for_ping(self) -> bool:
        deadline = time.monotonic() + PING_WAIT_SECONDS
        while True:
            if self.client.ping():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def unmount(self) -> None:
        """Unmount the run dir (whoever started the daemon) and close the client."""
        self.client.close()
        proc = vfsd_command("umount", str(self.run_dir))
        if proc.returncode != 0 and self.is_mounted():
            raise MountError(
                f"vfsd umount {self.run_dir} exited {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()}"
            )
        self._closed = True

    def detach(self) -> None:
        """Close the control connection and leave the daemon running."""
        self.client.close()
        self._closed = True

    def close(self) -> None:
        """Unmount if this Mount started the daemon, else just detach."""
        if self._closed:
            return
        if self.started:
            self.unmount()
        else:
            self.detach()

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Mount({str(self.run_dir)!r}, started={self.started})"

    @property
    def chunk_size(self) -> int:
        """The store's chunk size (file hashes depend on it; asked once)."""
        if self._chunk_size is None:
            self._chunk_size = int(self.stats().get("chunk_size") or DEFAULT_CHUNK_SIZE)
        return self._chunk_size

    def hash_of(self, data: bytes) -> str:
        """The hash the daemon would give a file holding `data`."""
        return content_hash(data, self.chunk_size)

    # -- paths ----------------------------------------------------------------

    def resolve_path(self, path: str | os.PathLike[str]) -> Path:
        """Absolute path of `path` inside the mount; ValueError if it leads outside.

        Relative paths are taken from the mount root. Nothing is created or
        written before the check.
        """
        # The root is canonical: made from a realpath (Mount) or from a Runs'
        # canonical root (ThreadMount).
        return confine(self.root, path, canonical=True)

    def relative(self, path: str | os.PathLike[str]) -> str:
        """The mount-relative form of `path` ("out/a.txt"), after confinement."""
        return mount_relative(self.root, self.resolve_path(path), canonical=True)

    def path_of(self, ref: Mapping[str, Any]) -> Path:
        """Absolute path where `ref` was taken (it may have moved or gone since)."""
        return self.resolve_path(ref["path"])

    # -- files ----------------------------------------------------------------

    def write(self, path: str | os.PathLike[str], data: bytes | str, *,
              ref: bool = True) -> FileRef | None:
        """Write `data` to `path` (creating parent dirs) and return its FileRef
        (with `ref=False`, None: no request to the daemon at all, the mount
        answers everything).

        The path is resolved and used in one step beneath the mount root
        (see `open_file`): a directory swapped for a symlink to the outside
        meanwhile makes the write fail with ValueError, never land outside.
        A FIFO, socket or device at `path` is refused at once (OSError EINVAL,
        "not a regular file"): nothing is truncated, written or waited for.
        Under a mount point of the execute sandbox (`etc/...`, `usr/...`, once
        a sandbox has claimed them) it is ValueError with the reason, as the
        Deep Agents file tools give it.
        """
        rel = self.relative(path)
        if isinstance(data, str):
            data = data.encode()
        parts = relative_parts(rel)
        if not parts:
            raise IsADirectoryError(str(self.root))
        try:
            fd = self._create(rel, parts)
        except OSError as exc:
            reason = _sandbox_reason(rel, exc)
            if reason is None:
                raise
            raise ValueError(reason) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _not_regular(rel)
            # Truncate only once it is known to be a regular file (a new one
            # is empty: no request for it).
            if st.st_size:
                os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            toolcalls.tag(fd, self.client)  # the running tool call, if any, is the author
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if not ref:
            return None
        taken = self._ref_written(rel, self.volume_ino(st.st_ino))
        if taken["hash"] != self.hash_of(data):
            raise MountToolError(
                f"{taken['path']} changed between the write and taking its reference "
                "(another writer?)"
            )
        return taken

    def _create(self, rel: str, parts: list[bytes]) -> int:
        """An fd open for writing on `rel`, made with its parents, beneath the root."""
        # O_NONBLOCK: a FIFO must not block the open (ENXIO without a reader).
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
        with self.root_fd() as root:
            try:
                # One step when the parents exist; O_NOFOLLOW: never the last
                # component's symlink (inside ones on the way are followed).
                return _confined(lambda: open_beneath(root, b"/".join(parts),
                                                      flags | os.O_NOFOLLOW, 0o644),
                                 rel, symlinks_refused=True)
            except FileNotFoundError:
                pass  # a parent is missing: made below
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                raise _not_regular(rel) from None
            dir_fd = _confined(lambda: makedirs_beneath(root, b"/".join(parts[:-1])), rel)
            try:
                return _confined(lambda: open_beneath(
                    dir_fd, parts[-1], flags, 0o644, follow_symlinks=False), rel,
                    symlinks_refused=True)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                raise _not_regular(rel) from None
            finally:
                os.close(dir_fd)

    def _ref_written(self, rel: str, ino: int) -> FileRef:
        """The ref of the file just written through inode `ino`: by its path,
        or by its inode if the path no longer leads to it (moved meanwhile)."""
        try:
            ref = as_ref(self.client.call("ref", path=rel))
        except ControlError as exc:
            if exc.code not in ("not_found", "not_a_file"):
                raise
            ref = None
        if ref is None or ref["ino"] != ino:
            ref = as_ref(self.client.call("ref", ino=ino))
        return ref

    def open_file(self, path: str | os.PathLike[str], flags: int = os.O_RDONLY,
                  mode: int = 0o644) -> int:
        """A file descriptor for `path`, resolved beneath the mount root in one step.

        Symlinks are followed only while they stay inside the mount; the
        kernel checks every step during the open itself (openat2 with
        RESOLVE_BENEATH), so no swap between a check and the use can lead
        outside. ValueError if the path leads outside; OSError as open() gives.
        """
        rel = self.relative(path)
        with self.root_fd() as root:
            return _confined(lambda: open_beneath(root, rel, flags, mode), rel)

    def read_bytes(self, path: str | os.PathLike[str]) -> bytes:
        """The content of the regular file at `path` (confined as `open_file`).

        A path eviction removed raises EvictedPath (a FileNotFoundError) that
        says when and why, and which retained snapshot still holds it."""
        try:
            fd = self.open_file(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except FileNotFoundError:
            raise self.missing_error(path) from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise IsADirectoryError(f"{path} is not a regular file")
            return f.read()

    def remove(self, path: str | os.PathLike[str], *, directory: bool = False) -> None:
        """Unlink the file (or, with `directory`, the empty directory) at `path`.

        The parent is resolved beneath the mount root; the last name is never
        followed, so a symlink is removed itself, never its target.
        """
        # Only the parent is confined (realpath); resolving the whole path
        # would remove a symlink's target instead of the link.
        head, name = os.path.split(os.fsdecode(os.fspath(path)).rstrip("/"))
        if name in ("", ".", ".."):
            raise ValueError(f"{path!r}: the mount root, '.' and '..' cannot be removed")
        parent = relative_parts(self.relative(head or "."))
        with self.root_fd() as root:
            dir_fd = _confined(lambda: open_beneath(
                root, b"/".join(parent), os.O_PATH | os.O_DIRECTORY), str(path))
        try:
            if directory:
                os.rmdir(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    @contextlib.contextmanager
    def root_fd(self) -> Iterator[int]:
        """`with m.root_fd() as fd:` an O_PATH fd of the mount root, for
        `*at()` calls and `beneath.open_beneath`. Hold it for one operation
        only: an open fd keeps the mount busy at unmount."""
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_ino != FUSE_ROOT_INO:
                raise OSError(errno.ENOTCONN, f"{self.root} is not a mounted vfsd root")
            yield fd
        finally:
            os.close(fd)

    def volume_ino(self, st_ino: int) -> int:
        """The inode number FileRefs carry for a file whose `stat` shows
        `st_ino` (the same here; a thread of a Runs translates)."""
        return st_ino

    def ref(self, path: str | os.PathLike[str]) -> FileRef:
        """The current FileRef of the file at `path` (e.g. one a shell tool wrote)."""
        return self._ref_of(self.resolve_path(path))

    def _ref_of(self, absolute: Path) -> FileRef:
        return as_ref(self.client.call("ref", path=mount_relative(self.root, absolute,
                                                                  canonical=True)))

    def read(self, ref: Mapping[str, Any]) -> bytes:
        """The content `ref` points at, checked against its hash.

        The live file is read when it still holds that version. When it does
        not (changed, evicted, removed), a retained snapshot that holds that
        exact version (same inode, generation and hash) is read instead,
        through `.vfsd/snapshots/<id>/<path>`. Only when no retained snapshot
        has it: Evicted (with `.record`) when the file was evicted, StaleRef
        when its content changed since the ref was taken, Missing when it was
        removed; the message says no snapshot has it. Damaged when the store
        cannot serve the content (EIO: it is damaged on disk).

        The daemon is asked first: the kernel may still cache the name of a file
        the daemon has just evicted, so reading by path alone could return
        evicted content. What is read is then hashed (xxh3-128) and compared.
        """
        ref = as_ref(ref)
        try:
            res = self.resolve(ref)
        except ControlError as exc:
            if exc.code == "damaged":
                raise Damaged(ref, exc.message) from None
            raise
        state, current = res.get("state"), res.get("ref")
        if state == "live" and res.get("matches", True) and current:
            try:
                data = self._read_same_inode(current["path"], ref)
            except OSError as exc:
                if exc.errno == errno.EIO:
                    raise Damaged(ref) from None
                raise
            if isinstance(data, bytes) and self.hash_of(data) == ref["hash"]:
                return data
            # Changed, moved or removed between the daemon's answer and the read.
            res = self.resolve(ref)
            state, current = res.get("state"), res.get("ref")
            if state == "live":
                state = "changed"
        kept = self._read_from_snapshot(ref)
        if kept is not None:
            return kept
        if state == "evicted":
            raise Evicted(ref, res.get("evicted") or {}, NOT_IN_SNAPSHOTS)
        if state == "missing":
            raise Missing(ref, NOT_IN_SNAPSHOTS)
        raise StaleRef(ref, as_ref(current) if current else None, NOT_IN_SNAPSHOTS)

    def _read_from_snapshot(self, ref: FileRef) -> bytes | None:
        """The ref's version from a retained snapshot that holds it, or None."""
        for _attempt in (1, 2):  # the snapshot found may be deleted before the read
            found = self.locate(ref)
            if not found.get("found"):
                return None
            try:
                rel = str(PurePosixPath(SNAPSHOTS_DIR, str(found["id"]), str(found["path"])))
                with self.root_fd() as root:
                    # The daemon's path has no symlinks: never follow one.
                    fd = open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY,
                                      follow_symlinks=False)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                try:
                    data = f.read()
                except OSError as exc:
                    if exc.errno == errno.EIO:
                        raise Damaged(ref) from None
                    raise
            if self.hash_of(data) == ref["hash"]:
                return data
        return None

    def resolve(self, ref: Mapping[str, Any]) -> dict[str, Any]:
        """Where `ref` stands now, by asking the daemon (no content read):
        {"state": "live"|"changed"|"evicted"|"missing", "ref", "matches", "evicted"}."""
        return self.client.call("resolve", ref=dict(as_ref(ref)))

    def read_text(self, ref: Mapping[str, Any], encoding: str = "utf-8") -> str:
        """`read(ref)` decoded as text."""
        return self.read(ref).decode(encoding)

    def _read_same_inode(self, path: str, ref: FileRef) -> bytes | object | None:
        """Content at `path` if it is still the ref's inode.

        None when the inode is not there; _CHANGED when it is but its size
        already shows the content changed (no need to read it).
        """
        try:
            rel = self.relative(path)
            with self.root_fd() as root:
                # The daemon's path has no symlinks: any there now was swapped in.
                fd = open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY,
                                  follow_symlinks=False)
        except (ValueError, OSError):
            # Gone, replaced by a directory, or a stale kernel entry (ESTALE):
            # the daemon's `resolve` tells which.
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or self.volume_ino(st.st_ino) != ref["ino"]:
                return None
            if st.st_size != ref["size"]:
                return _CHANGED
            return f.read()

    # -- steps, status, eviction ---------------------------------------------

    def get_step(self) -> int:
        """The daemon's current step."""
        self._step = int(self.client.call("get_step")["step"])
        return self._step

    def step_hint(self) -> int:
        """The step this Mount last saw (asked only if it saw none): for what
        a stale value cannot harm, such as the step a tool call starts at."""
        return self._step if self._step is not None else self.get_step()

    def set_step(self, step: int) -> dict[str, Any]:
        """Advance the daemon's step (>= current) and return its eviction report."""
        report = self.client.call("set_step", step=int(step))
        self._step = int(report.get("step", step))
        return report

    def advance_step(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """One model turn's start in one round trip (a `batch`): the files
        changed since the current step (as `changes`), then the step advanced
        by one, with its eviction report (as `set_step`). The step is the one
        this Mount last saw, checked by the daemon (`expect`): if it moved
        meanwhile (a restore elsewhere), it is asked again and nothing was
        changed."""
        for _attempt in (1, 2):
            step = self.step_hint()
            res = self.client.call("batch", stop_on_error=True, requests=[
                {"op": "changes", "since": step},
                {"op": "set_step", "step": step + 1, "expect": step}])
            answers = res["results"]
            for answer in answers:
                if not answer["ok"] and answer["error"]["code"] != "step_moved":
                    raise ControlError(answer["error"]["code"], answer["error"]["message"])
            if len(answers) == 2 and answers[1]["ok"]:
                report = answers[1]["result"]
                self._step = int(report.get("step", step + 1))
                return self._rest_of_changes(answers[0]["result"], step), report
            self._step = None  # it moved: ask, and try again
        step = self.get_step()
        changes = self.changes(step)
        return changes, self.set_step(step + 1)

    def evict(self, dry_run: bool = False) -> dict[str, Any]:
        """Run eviction now (or report what it would remove) and return the report."""
        return self.client.call("evict", dry_run=bool(dry_run))

    def set_status(
        self, target: str | os.PathLike[str] | Mapping[str, Any], status: str
    ) -> FileRef:
        """Mark a file (path or FileRef) `active` or `done`; returns its new FileRef."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        return as_ref(self.client.call("set_status", status=status, **self._target(target)))

    def pin(self, target: str | os.PathLike[str] | Mapping[str, Any]) -> FileRef:
        """Keep a file (path or FileRef) from eviction; returns its FileRef."""
        return as_ref(self.client.call("pin", **self._target(target)))

    def unpin(self, target: str | os.PathLike[str] | Mapping[str, Any]) -> FileRef:
        """Make a pinned file evictable again; returns its FileRef."""
        return as_ref(self.client.call("unpin", **self._target(target)))

    def _target(self, target: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(target, Mapping):
            return {"ino": int(target["ino"])}
        return {"path": self.relative(target)}

    def changes(self, since_step: int) -> dict[str, Any]:
        """Files changed and removed since `since_step`: {"step", "changed", "removed"}."""
        res = self.client.call("changes", since=int(since_step))
        if isinstance(res.get("step"), int):
            self._step = res["step"]
        return self._rest_of_changes(res, since_step)

    def _rest_of_changes(self, first: dict[str, Any], since_step: int) -> dict[str, Any]:
        """A `changes` answer with its further pages asked for."""
        res = first
        changed = [as_ref(r) for r in res.get("changed", [])]
        # The daemon answers a page at a time, so no reply holds its loop long.
        while res.get("next"):
            res = self.client.call("changes", since=int(since_step), after=res["next"])
            changed += [as_ref(r) for r in res.get("changed", [])]
        return {"step": first.get("step"), "changed": changed,
                "removed": first.get("removed", [])}

    def eviction(self, path: str | os.PathLike[str], limit: int = 20) -> dict[str, Any]:
        """Why `path` is missing, as the daemon knows it: {"path", "evicted":
        its eviction record with "snapshot" (a retained snapshot holding it,
        or None) and "message", or None; "below": such records of evicted
        files below it (newest first, at most `limit`), "below_total",
        "message": what to tell a user or a model, or None when eviction did
        not remove it}."""
        rel = os.fsdecode(os.fspath(path)).strip("/") or "."
        return self.client.call("eviction", path=rel, limit=int(limit))

    def missing_error(self, path: str | os.PathLike[str]) -> FileNotFoundError:
        """The error for a path that is not there: EvictedPath when eviction
        removed it (or files below it), else a plain FileNotFoundError."""
        shown = os.fsdecode(os.fspath(path))
        try:
            why = self.eviction(path, limit=1)
        except (ControlError, ValueError):
            why = {}
        if why.get("evicted"):
            return EvictedPath(shown, why["evicted"], f"{shown} was {why['message']}")
        if why.get("message"):
            return EvictedPath(shown, {}, f"{shown} is not there: {why['message']}")
        return FileNotFoundError(errno.ENOENT, "No such file or directory", shown)

    def evicted(self, limit: int = 100) -> list[dict[str, Any]]:
        """The most recent eviction records, newest last."""
        return list(self.client.call("evicted", limit=int(limit)).get("records", []))

    def stats(self) -> dict[str, Any]:
        """The daemon's status document (as `vfsd status --json`)."""
        return self.client.call("stats")

    # -- snapshots ------------------------------------------------------------

    def snapshot(self, pin: bool = False, label: str = "", *, reuse: bool = False) -> dict[str, Any]:
        """Snapshot the whole tree now; returns its record ({"id": "s12", "seq",
        "step", "pinned", "label", "entries", ...}).

        Whatever programs wrote is in the snapshot (the daemon writes the
        kernel's dirty pages back first). `pin` keeps it whatever the retention
        policy says. `reuse=True` returns the snapshot the live tree comes from
        (with `"reused": True`) instead of taking a new one when nothing
        changed since it.
        """
        if not isinstance(label, str):
            raise TypeError("label must be a string")
        return self.client.call("snapshot", pin=bool(pin), label=label, reuse=bool(reuse))

    def note_unbound(self, checkpoint_id: str = "") -> int:
        """Count a graph checkpoint of this run dir whose files could not be bound
        to a snapshot (`unbound_checkpoints` in `vfsd status`); the count so far."""
        return int(self.client.call("note_unbound", checkpoint=str(checkpoint_id)[:200])["count"])

    def snapshots(self) -> list[dict[str, Any]]:
        """The retained snapshots, oldest first."""
        return list(self.client.call("snapshots").get("snapshots", []))

    def snapshot_state(self) -> dict[str, Any]:
        """Where the live tree stands: {"base": the snapshot it comes from (the
        last taken or restored; None before the first), "changed": whether it
        changed since, "last": the newest snapshot, "run": this run's id,
        "forked_from": {"run", "snapshot"} for a forked run dir, else None,
        "copied_from": [{"run", "upto"}] for a copied one (its snapshots up to
        `upto` are that run's, under the same ids), else []}."""
        doc = self.client.call("snapshots")
        doc.pop("snapshots", None)
        doc.setdefault("forked_from", None)
        doc.setdefault("copied_from", [])
        return doc

    def restore(self, snapshot_id: str, *, force: bool = False,
                paths: Iterable[str | os.PathLike[str]] | None = None) -> dict[str, Any]:
        """Make the live tree exactly snapshot `snapshot_id` (files made since
        disappear, changed files revert, evicted ones return) and set the step
        back to the snapshot's: {"id", "step", "changed", ...}.

        With `paths` (mount-relative files or directories), only those come
        back, with what lies below them, and nothing else changes (nor the
        step): {"restored": [paths of files placed], "unchanged", "from",
        "step", ...}. A live directory in the way is merged into; a live
        file that differs from the snapshot's refuses the whole request
        (ControlError "exists", nothing changed) unless `force`. Restored
        files count as written now: their age starts again.

        Raises ControlError("not_found") with the daemon's reason when the
        snapshot was deleted (retention or by request), and
        ControlError("files_open"), naming the processes, when the restore
        would change a file a process holds open for writing (unless `force`).
        """
        if paths is not None:
            return self.client.call("restore", snapshot=_snapshot_arg(snapshot_id),
                                    paths=self._rel_paths(paths), force=bool(force))
        self._step = None  # back to the snapshot's (asked again if the answer lacks it)
        res = self.client.call("restore", snapshot=_snapshot_arg(snapshot_id),
                               force=bool(force))
        if isinstance(res.get("step"), int):
            self._step = res["step"]
        return res

    def unevict(self, paths: Iterable[str | os.PathLike[str]] | str, *,
                force: bool = False) -> dict[str, Any]:
        """Bring back evicted files: each path is an evicted file, or a
        directory below which files were evicted (all of them come back).
        Each comes from a retained snapshot holding the version eviction
        removed, at the path it was evicted from, with its inode number (a
        FileRef taken before resolves again); nothing else changes. Returns
        {"restored": [paths], "lost": [evicted files no snapshot holds], "from":
        [snapshot ids], "step", ...}. ControlError: "not_found" when eviction
        never removed the path or no retained snapshot holds it, "exists" when
        a file lives there (unless `force`), "forbidden" for a path leaving
        the mount."""
        if isinstance(paths, str | os.PathLike):
            paths = [paths]
        return self.client.call("unevict", paths=self._rel_paths(paths), force=bool(force))

    def _rel_paths(self, paths: Iterable[str | os.PathLike[str]]) -> list[str]:
        """Mount-relative paths as the daemon takes them (absolute paths inside
        the mount root are accepted; the daemon refuses `..`)."""
        out = []
        root = str(self.root)
        for p in paths:
            text = os.fsdecode(os.fspath(p))
            if text == root or text.startswith(root + "/"):
                text = text[len(root):]
            out.append(text.lstrip("/"))
        return out

    def delete_snapshot(self, snapshot_id: str) -> dict[str, Any]:
        """Delete a snapshot; content that only it kept is freed."""
        return self.client.call("snapshot_delete", snapshot=_snapshot_arg(snapshot_id))

    def pin_snapshot(self, snapshot_id: str, pin: bool = True) -> dict[str, Any]:
        """Pin a snapshot (retention keeps it) or, with pin=False, unpin it."""
        return self.client.call("snapshot_pin", snapshot=_snapshot_arg(snapshot_id), pin=bool(pin))

    def diff(self, a: str, b: str | None = None) -> list[dict[str, Any]]:
        """What changed from snapshot `a` to snapshot `b` (None: the live tree):
        [{"path", "change": added|removed|modified|renamed|attributes, "ino",
        "type", "size", "old_path"?}], sorted by path."""
        res = self.client.call("diff", a=_snapshot_arg(a), b="live" if b is None else _snapshot_arg(b))
        return list(res.get("changes", []))

    def locate(self, ref: Mapping[str, Any]) -> dict[str, Any]:
        """A retained snapshot holding exactly the ref's version (inode,
        generation and hash): {"found": True, "id", "path"} (newest first), or
        {"found": False}."""
        return self.client.call("locate", ref=dict(as_ref(ref)))

    def fork(
        self, snapshot_id: str, new_run_dir: str | os.PathLike[str], **options: Any
    ) -> Mount:
        """Start `new_run_dir` from snapshot `snapshot_id` and mount it.

        The new run dir shares this run's store (no content is copied) and
        diverges independently from then on. `options` are mount options for
        the new daemon, as for `mount_tool.mount`. The returned Mount started
        its daemon: closing it unmounts the fork.
        """
        target = Path(os.path.abspath(new_run_dir))
        self.client.call("fork", snapshot=_snapshot_arg(snapshot_id), run_dir=str(target))
        try:
            return Mount.start(target, **options)
        except MountError as exc:
            raise MountError(
                f"{target} was forked from {snapshot_id} but could not be mounted: {exc}"
            ) from exc

    # -- remote tier ----------------------------------------------------------

    def sync(self, snapshot_id: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until a snapshot (default: the latest) is published to the run's
        bucket: {"published": "s12", "run", "remote", "snapshot": {...}}.

        Raises ControlError with code "timeout" (not published in time: the
        message says what is left, the publication goes on), "not_publishable"
        (deleted first, or another worker holds the run) or "no_remote".
        """
        args: dict[str, Any] = {"timeout": float(timeout)}
        if snapshot_id is not None:
            args["snapshot"] = str(snapshot_id)
        # A connection of its own: the wait may outlast the shared client's
        # timeout. A daemon that does not answer by the grace after it fails
        # with ControlError("connection", "... did not answer 'sync' ...").
        with ControlClient(self.client.socket_path,
                           timeout=float(timeout) + SYNC_GRACE_SECONDS) as c:
            return c.call("sync", **args)

    def remote(self) -> dict[str, Any] | None:
        """The remote tier's status (`stats()["remote"]`: url, run, state, backlog...),
        or None for a mount without one."""
        return self.stats().get("remote")

    def resume_from(self, run: str, snapshot_id: str, *, remote: str | None = None) -> None:
        """Make this mount show a snapshot another worker published: remount the
        run dir with `--from RUN@SNAPSHOT` (files are then fetched on first read).

        Only for a run dir that holds nothing yet (no snapshot taken, no file):
        anything else raises MountError, changing nothing. `remote` is the
        bucket (`s3://BUCKET/PREFIX`), by default this mount's. The daemon is
        restarted with the options it runs with now; this Mount then owns it
        (closing it unmounts). A run another worker still holds mounts
        read-only: MountError says so.
        """
        doc = self.stats()
        state = self.client.call("snapshots")
        if doc.get("files") or state.get("last") or state.get("base"):
            raise MountError(f"{self.run_dir} already holds files or snapshots; resume "
                             f"{run}@{snapshot_id} in an empty run dir")
        config = dict(doc.get("config") or {})
        url = remote or (doc.get("remote") or {}).get("url") or config.get("remote_url")
        if not url:
            raise MountError(f"{self.run_dir} has no remote tier and no remote was given")
        config.update(remote_url=url)
        flags = mount_flags({k: v for k, v in config.items() if v is not None})
        self.unmount()
        proc = vfsd_command("mount", str(self.run_dir), *flags, "--from", f"{run}@{snapshot_id}")
        if proc.returncode != 0:
            raise MountError(f"vfsd mount {self.run_dir} --from {run}@{snapshot_id} exited "
                             f"{proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
        self._closed = False
        self.started = True
        if not self._wait_for_ping():
            raise MountError(f"vfsd mounted {self.root} but its control socket does not answer")
        remote_state = self.remote() or {}
        if remote_state.get("read_only"):
            raise MountError(f"{self.run_dir} resumed {run}@{snapshot_id} read-only: "
                             f"{remote_state.get('reason')}")

    def publish_status(self) -> dict[str, Any]:
        """Which retained snapshots are published: {"run", "remote", "state",
        "latest", "published", "snapshots": [{"id", "step", "published", "full"}],
        "backlog", "last_error"}. ControlError "no_remote" without a remote."""
        return self.client.call("publish_status")


def _snapshot_arg(snapshot_id: str) -> str:
    if not isinstance(snapshot_id, str):
        raise TypeError(f"a snapshot id is a string like 's12', not {type(snapshot_id).__name__}")
    return snapshot_id


def mount(run_dir: str | os.PathLike[str], **options: Any) -> Mount:
    """Mount `run_dir` with vfsd and return the Mount (a context manager).

    Keyword options become `vfsd mount` flags (done_retention_steps=3 ->
    `--done-retention-steps 3`). If the run dir is already served by a daemon
    that answers, attach to it instead (options are then ignored).
    """
    return Mount.start(run_dir, **options)
