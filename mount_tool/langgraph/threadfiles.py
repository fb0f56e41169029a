"""One thread's files as its checkpoints see them: what VfsdCheckpointer keeps per run dir.

`FilesVersion` is what a checkpoint records (`metadata["vfsd"]`); `RunDirRecord`
what the wrapper keeps in the run dir; `ThreadFiles` the decisions for one run
dir (align the files at a run start, bind a checkpoint to its snapshot,
publish, pin at interrupts, release), made with the thread's mount held. The
wrapper (`mount_tool.langgraph.checkpointer`) routes each call to the ThreadFiles of
its thread; the snapshots of step boundaries are taken by `mount_tool.langgraph.boundary`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import Checkpoint, CheckpointTuple

from ..errors import (
    ControlError,
    MountError,
    MountToolError,
    SnapshotNotPublished,
    SnapshotUnavailable,
    ThreadBindingError,
)
from ..mount import Mount
from ..refs import as_ref, is_ref

if TYPE_CHECKING:
    from .boundary import Capture
    from .checkpointer import VfsdCheckpointer

logger = logging.getLogger(__name__)

RECORD_NAME = "langgraph.json"
POSITION_NAME = "langgraph.position"
# Checkpoint -> snapshot answers kept in memory (the metadata has them all).
SNAPSHOT_CACHE_SIZE = 4096
# Refs listed by name in a SnapshotUnavailable message (all are in `.lost`).
LISTED_FILES = 20
_SNAPSHOT_ID = re.compile(r"s(0|[1-9][0-9]{0,18})")
#: the snapshot id a checkpoint records when its thread had no files at all
#: (written outside a run before the thread's run dir existed): no daemon needed
NO_FILES = "s0"
_RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
# Characters of an unbound checkpoint's reason kept in its metadata.
REASON_CHARS = 2000


class BadFilesMetadata(MountToolError, ValueError):
    """A checkpoint's `metadata["vfsd"]` that does not describe a snapshot."""


# -- what a checkpoint records -----------------------------------------------------


@dataclass(frozen=True)
class FilesVersion:
    """The snapshot that holds a checkpoint's files (`metadata["vfsd"]`).

    Or, with `unbound` (and no snapshot: `snapshot` is ""), why the wrapper
    could not tell which files the checkpoint had: a run from it refuses
    (SnapshotUnavailable) instead of guessing."""

    run: str
    snapshot: str
    step: int = 0
    remote: str | None = None
    unbound: str | None = None

    @classmethod
    def unbound_because(cls, reason: str, run: str = "") -> FilesVersion:
        return cls(run, "", 0, None, reason[:REASON_CHARS])

    @classmethod
    def of(cls, metadata: Mapping[str, Any] | None, *, strict: bool = False) -> FilesVersion | None:
        """The version a checkpoint's metadata records; None when it records none.

        Metadata is input (a checkpoint store may hold anything): a `vfsd`
        entry that does not name a snapshot of a run raises BadFilesMetadata
        with `strict`, and counts as none without."""
        raw = (metadata or {}).get("vfsd") if isinstance(metadata, Mapping) else None
        if raw is None:
            return None
        try:
            return cls._parse(raw)
        except BadFilesMetadata:
            if strict:
                raise
            return None

    @classmethod
    def _parse(cls, raw: Any) -> FilesVersion:
        if not isinstance(raw, Mapping):
            raise BadFilesMetadata(f"metadata['vfsd'] is {type(raw).__name__}, not an object")
        snapshot, run, step = raw.get("snapshot"), raw.get("run") or "", raw.get("step") or 0
        remote, unbound = raw.get("remote"), raw.get("unbound")
        if unbound is not None:
            if not isinstance(unbound, str) or not unbound or snapshot is not None:
                raise BadFilesMetadata(f"metadata['vfsd'] says its files are unbound, but not "
                                       f"why (or names a snapshot too): {unbound!r:.80}")
            if not isinstance(run, str) or (run and not _RUN_ID.fullmatch(run)):
                raise BadFilesMetadata(f"metadata['vfsd'] names no run id: {run!r:.80}")
            return cls.unbound_because(unbound, run)
        if not isinstance(snapshot, str) or not _SNAPSHOT_ID.fullmatch(snapshot):
            raise BadFilesMetadata(f"metadata['vfsd'] names no snapshot id like 's12': "
                                   f"{snapshot!r:.80}")
        if not isinstance(run, str) or (run and not _RUN_ID.fullmatch(run)):
            raise BadFilesMetadata(f"metadata['vfsd'] names no run id: {run!r:.80}")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 63:
            raise BadFilesMetadata(f"metadata['vfsd'] has no step number: {step!r:.80}")
        if remote is not None and (not isinstance(remote, str) or
                                   not remote.startswith("s3://") or len(remote) > 2048):
            raise BadFilesMetadata(f"metadata['vfsd'] names no bucket: {remote!r:.80}")
        return cls(run, snapshot, step, remote)

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> FilesVersion:
        """From a daemon snapshot record (a reused one also says the live step)."""
        return cls(str(rec.get("run") or ""), str(rec["id"]), int(rec.get("live_step", rec["step"])))

    def as_metadata(self) -> dict[str, Any]:
        if self.unbound is not None:
            return {"run": self.run, "snapshot": None, "unbound": self.unbound}
        return {"run": self.run, "snapshot": self.snapshot, "step": self.step}

    @property
    def seq(self) -> int:
        return snapshot_seq(self.snapshot)


def snapshot_seq(snapshot_id: str | None) -> int:
    """12 for "s12"; 0 for None or anything else."""
    if isinstance(snapshot_id, str) and snapshot_id[1:].isdigit():
        return int(snapshot_id[1:])
    return 0


# -- the run dir's record ---------------------------------------------------------------


@dataclass
class RunDirRecord:
    """What the wrapper keeps in the run dir's state directory (`RUN_DIR/.vfsd`).

    `langgraph.json` (rewritten whole, rarely):
    - thread: the graph thread this run dir serves (None until first used)
    - pins: {checkpoint id: {"snapshot", "was_pinned"}}: snapshots pinned
      because their checkpoint waits at an interrupt

    `langgraph.position` (rewritten at every checkpoint, in place: one small
    `pwrite` padded with spaces, which JSON ignores, instead of a rename that
    costs ~0.4 ms; opened for each write, since a descriptor kept per thread
    ran a server of a thousand threads into the usual limit of 1,024 open
    files): position = {"checkpoint", "snapshot", "run"}, the checkpoint
    the live files follow (the last one written by a run, or restored). A
    position that does not read back is taken as unknown, which only makes
    the next run start restore when in doubt.
    """

    state_dir: Path
    thread: str | None = None
    position: dict[str, str] | None = None
    pins: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.state_dir / RECORD_NAME

    @property
    def position_path(self) -> Path:
        return self.state_dir / POSITION_NAME

    def load(self) -> None:
        """Read both files again (another process may have used the run dir)."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            raw = {}
        except (OSError, ValueError) as exc:
            raise MountToolError(
                f"{self.path} is unreadable ({exc}); it records which graph thread this run "
                "dir serves: fix or remove it"
            ) from exc
        if not isinstance(raw, dict):
            raise MountToolError(f"{self.path} does not hold a JSON object; fix or remove it")
        thread, pins = raw.get("thread"), raw.get("pins")
        self.thread = thread if isinstance(thread, str) else None
        self.pins = pins if isinstance(pins, dict) else {}
        try:
            position = json.loads(self.position_path.read_bytes() or b"null")
        except (OSError, ValueError):
            position = None
        self.position = position if isinstance(position, dict) else None

    def save(self) -> None:
        """Write the thread and the pins (temporary file, then rename)."""
        doc = {"version": 1, "thread": self.thread, "pins": self.pins}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)

    def save_position(self) -> None:
        data = json.dumps(self.position).encode()
        fd = os.open(self.position_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            # Padded over what a longer position left, so no stale tail stays.
            os.pwrite(fd, data.ljust(max(os.fstat(fd).st_size, 256)), 0)
        finally:
            os.close(fd)

    def clear(self) -> None:
        self.thread, self.position, self.pins = None, None, {}
        for path in (self.path, self.position_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def copy_record(source_state: Path, target_state: Path, target: str) -> None:
    """A copied thread's record (`Runs.copy`'s `before_done`): bound to the
    target thread, with the source's interrupt pins (the copied snapshots
    keep their pins, and the copied checkpoints are what releases them)."""
    try:
        doc = json.loads((source_state / RECORD_NAME).read_text())
    except (OSError, ValueError):
        doc = {}
    pins = doc.get("pins") if isinstance(doc, dict) else None
    out = {"version": 1, "thread": target, "pins": pins if isinstance(pins, dict) else {}}
    target_state.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = target_state / f".{RECORD_NAME}.tmp"
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, target_state / RECORD_NAME)


def _remove_tree(dir_fd: int, name: str) -> None:
    """Remove `name` in directory `dir_fd` and everything under it, never following a symlink."""
    import stat as stat_mod

    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat_mod.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            _remove_tree(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


#: the label `keep_run_end` gives a snapshot: the checkpoint the files follow
_RUN_END = re.compile(r" after ckpt ([^ ]{1,128}) \(run end\)$")
#: seconds between the tries of a run end whose publication timed out
END_RETRY_SECONDS = 5.0


def position_of_run_end(latest: str | None, listed: list[Mapping[str, Any]]) -> dict[str, str] | None:
    """The position a replica takes after a hold: the checkpoint whose run
    left the latest snapshot (`keep_run_end`'s label), else None."""
    if not latest:
        return None
    label = next((str(s.get("label") or "") for s in listed if s.get("id") == latest), "")
    found = _RUN_END.search(label)
    if found is None:
        return None
    run = next((str(s.get("run") or "") for s in listed if s.get("id") == latest), "")
    return {"checkpoint": found.group(1), "snapshot": latest, "run": run}


def _retry_end(m: Mount, token: str, timeout: float) -> None:
    """Keep ending a run whose publication timed out, in the background, until
    the daemon gives the thread back (or says the run is over anyway)."""
    def again() -> None:
        while True:
            time.sleep(END_RETRY_SECONDS)
            try:
                m.end_run(token, timeout=timeout)  # type: ignore[attr-defined]
            except ControlError as exc:
                if exc.code == "timeout":
                    continue
                logger.warning("vfsd: ending run %s of %s: %s", token, m, exc)
            except MountToolError as exc:
                logger.warning("vfsd: ending run %s of %s: %s", token, m, exc)
            else:
                logger.info("vfsd: run %s of %s ended: its snapshots are published", token, m)
            return

    threading.Thread(target=again, name="vfsd-end-retry", daemon=True).start()


def copied_with(state: Mapping[str, Any], version: FilesVersion) -> bool:
    """Whether the run dir is a copy of `version`'s run that holds its snapshot
    (a copied thread: the copy has the source's history up to the copy)."""
    for origin in state.get("copied_from") or ():
        if isinstance(origin, Mapping) and origin.get("run") == version.run and \
                version.seq <= int(origin.get("upto") or 0):
            return True
    return False


# -- one thread's side of the wrapper ---------------------------------------------------------


class ThreadFiles:
    """What the wrapper knows about one run dir and the thread it serves.

    `lock` serializes a decision and the daemon calls it makes (worker threads
    only, never the event loop); `cache_lock` guards the small in-memory maps
    and is never held across I/O, so the loop may take it. `mount` is the live
    Mount for the length of each lease (a Runs may remount an idle run dir
    between two leases: the Mount object then changes).
    """

    def __init__(self, owner: VfsdCheckpointer, state_dir: Path) -> None:
        self.key = str(state_dir)
        self.owner = owner
        self.record = RunDirRecord(state_dir)
        self.record.load()
        self.lock = threading.RLock()
        self.cache_lock = threading.Lock()
        self.mount: Mount | None = None
        self.users = 0
        self.versions: OrderedDict[str, FilesVersion] = OrderedDict()
        # Checkpoints waiting at an interrupt whose `put` has not run yet.
        self.pin_on_put: set[str] = set()
        self.mode: str | None = None  # `publish` resolved against the mount
        self.remote_url: str | None = None
        # Snapshots named by stored checkpoints and not known to be published.
        self.unpublished: deque[str] = deque()
        # With replicas: where the live tree stands, as the run's hold left it (one read).
        self.fresh_state: dict[str, Any] | None = None

    @property
    def m(self) -> Mount:
        assert self.mount is not None, "used outside a lease"
        return self.mount

    @property
    def busy(self) -> bool:
        """Whether forgetting this state would lose something (see `_forget_idle`)."""
        return bool(self.users or self.pin_on_put or self.unpublished)

    # -- run start: align the files --------------------------------------------------------

    def begin_run(self, thread: str, tup: CheckpointTuple | None, label: str) -> FilesVersion:
        """Bring the files to the checkpoint a run starts from, and capture them:
        the files of the checkpoints LangGraph writes before the run's first task."""
        with self.lock:
            self.record.load()  # another process may have used the run dir
            self.bind(thread)
            version = FilesVersion.of(tup.metadata, strict=True) if tup is not None else None
            if tup is not None and version is not None:
                self.align(tup, version)
            # (else a new thread, or a checkpoint written without the wrapper)
            return self.take(label)

    def align(self, tup: CheckpointTuple, version: FilesVersion) -> None:
        checkpoint_id = tup.checkpoint["id"]
        if version.unbound is not None:
            position = self.record.position or {}
            if position.get("checkpoint") == checkpoint_id:
                return  # the live files go on from it: nothing to bring back
            self.unbound_run(tup, version)
            return
        if version.snapshot == NO_FILES:
            self.clear_files(checkpoint_id)
            self.set_position(checkpoint_id, version)
            return
        state, self.fresh_state = self.fresh_state or self.m.snapshot_state(), None
        where = self.where(checkpoint_id, version, state)
        if where in ("exact", "after"):
            self.set_position(checkpoint_id, version)
            return
        if where == "foreign":
            why = self.resume_elsewhere(tup, version, state)
            if why is None:
                self.set_position(checkpoint_id, version)
                return
            self.unavailable(
                tup,
                version,
                f"its files are in run {version.run}, and this mount holds run {state.get('run')} "
                f"({why}; or fork that run dir from the checkpoint's snapshot to run it here)",
            )
            return
        try:
            res = self.m.restore(version.snapshot)
        except ControlError as exc:
            if exc.code not in ("not_found", "bad_request"):
                raise
            self.unavailable(tup, version, exc.message)
            return
        if version.step > int(res.get("step", 0)):
            # The snapshot was reused by a later step: go to the step the
            # checkpoint was written at (nothing is due for eviction there).
            self.m.set_step(version.step)
        logger.info(
            "vfsd: restored %s for checkpoint %s (%s change(s))",
            version.snapshot,
            checkpoint_id,
            res.get("changed"),
        )
        self.set_position(checkpoint_id, version)

    def clear_files(self, checkpoint_id: str) -> None:
        """Bring the live tree to no files (a checkpoint from before the thread
        had any); what was there stays in a snapshot taken first."""
        if not self.live_names():
            return
        kept = self.take(f"{self.owner._label(self.record.thread or '', checkpoint_id, None)}"
                         " (before clearing)")
        with self.m.root_fd() as root:
            for name in self.live_names():
                _remove_tree(root, name)
        logger.info("vfsd: cleared the files for checkpoint %s (they are in %s)",
                    checkpoint_id, kept.snapshot)

    def live_names(self) -> list[str]:
        return [n for n in os.listdir(self.m.root) if n != ".vfsd"]

    def where(self, checkpoint_id: str, version: FilesVersion, state: Mapping[str, Any]) -> str:
        """How the live tree stands to a checkpoint's files:
        "exact" (it is that snapshot), "after" (it follows that checkpoint, maybe
        changed since), "elsewhere", or "foreign" (another run's files); for a
        checkpoint whose files are unbound, "after" or "unbound"."""
        base = state.get("base")
        position = self.record.position
        if version.unbound is not None:
            return "after" if (position or {}).get("checkpoint") == checkpoint_id else "unbound"
        if version.run and state.get("run") and version.run != state.get("run"):
            if copied_with(state, version):
                pass  # this run dir is a copy of that run, history included
            else:
                origin = state.get("forked_from") or {}
                fresh_fork = position is None and base is None
                if fresh_fork and origin.get("run") == version.run and \
                        origin.get("snapshot") == version.snapshot:
                    return "after"  # forked from exactly these files, not used since
                return "foreign"
        if base == version.snapshot and not state.get("changed"):
            return "exact"
        if position is None:
            return "after" if base == version.snapshot else "elsewhere"
        if (
            position.get("checkpoint") == checkpoint_id
            and base is not None
            and snapshot_seq(base) >= version.seq
        ):
            return "after"
        return "elsewhere"

    def unbound_run(self, tup: CheckpointTuple, version: FilesVersion) -> None:
        """A run from a checkpoint whose files were never bound: refuse (or,
        with on_missing="keep", run on the live files and say so)."""
        checkpoint_id = tup.checkpoint["id"]
        reason = f"its files were not bound to a snapshot when it was written: {version.unbound}"
        message = (f"checkpoint {checkpoint_id} cannot bring its files back: {reason}. "
                   "(vfsd counts such checkpoints: `vfsd status` on a run dir, "
                   "`vfsd threads ROOT THREAD_ID` for a Runs' thread.)")
        if self.owner.on_missing == "raise":
            raise SnapshotUnavailable(
                message + " Nothing was changed: the mount still shows its live files. Pass "
                "on_missing='keep' to run on them anyway.",
                checkpoint_id=checkpoint_id, snapshot="", reason=reason)
        logger.warning("vfsd: %s Running on the live files (on_missing='keep').", message)
        self.set_position(checkpoint_id, version)

    def unavailable(self, tup: CheckpointTuple, version: FilesVersion, reason: str) -> None:
        checkpoint_id = tup.checkpoint["id"]
        lost, available = self.files_report(tup)
        message = (
            f"checkpoint {checkpoint_id} keeps its files in snapshot {version.snapshot}, "
            f"which cannot be restored: {reason}."
        )
        if lost:
            names = ", ".join(ref["path"] for ref in lost[:LISTED_FILES])
            more = f" and {len(lost) - LISTED_FILES} more" if len(lost) > LISTED_FILES else ""
            message += (
                f" {len(lost)} file(s) of its state cannot come back (no live file and no "
                f"retained snapshot holds their version): {names}{more}."
            )
        if available:
            message += f" {len(available)} other file(s) can still be read with Mount.read."
        if self.owner.on_missing == "raise":
            raise SnapshotUnavailable(
                message
                + " Nothing was changed: the mount still shows its live files. Pass "
                "on_missing='keep' to run on them anyway.",
                checkpoint_id=checkpoint_id,
                snapshot=version.snapshot,
                reason=reason,
                lost=lost,
                available=available,
            )
        logger.warning("vfsd: %s Running on the live files (on_missing='keep').", message)
        self.set_position(checkpoint_id, version)

    def files_report(self, tup: CheckpointTuple) -> tuple[list[dict], list[dict]]:
        """(lost, available) refs of the checkpoint's `files` state."""
        lost: list[dict] = []
        available: list[dict] = []
        for ref in self.owner._files_of(tup).values():
            if not is_ref(ref):
                continue
            ref = dict(as_ref(ref))
            try:
                res = self.m.resolve(ref)
                if res.get("state") == "live" and res.get("matches", True):
                    available.append({**ref, "from": "live"})
                    continue
                found = self.m.locate(ref)
            except ControlError:
                found, res = {}, {}
            if found.get("found"):
                available.append({**ref, "from": found["id"]})
            else:
                lost.append({**ref, "state": res.get("state", "unknown")})
        return lost, available

    # -- snapshots ----------------------------------------------------------------------

    def take(self, label: str) -> FilesVersion:
        return FilesVersion.from_record(self.m.snapshot(label=label[:200], reuse=True))

    def files_version(self, plan: PutPlan, checkpoint: Checkpoint,
                      metadata: Mapping[str, Any]) -> FilesVersion:
        with self.lock:
            if not plan.from_run:
                self.record.load()
            self.bind(plan.thread)
            if plan.from_run:
                plan.moves_position = True
                if plan.capture is None:
                    return self.unbound(checkpoint["id"], plan.unbound or "no capture")
                return plan.capture.version()
            return self.version_for_update(plan, checkpoint, metadata)

    def unbound(self, checkpoint_id: str, reason: str) -> FilesVersion:
        """A checkpoint whose files could not be bound: recorded, counted (the
        daemon's `unbound_checkpoints`, in `vfsd status`) and logged."""
        try:
            count = self.m.note_unbound(checkpoint_id)
        except ControlError as exc:
            count = f"? ({exc})"
        logger.warning(
            "vfsd: checkpoint %s of thread %.80r has no snapshot of its files (%s); a run "
            "from it will raise SnapshotUnavailable. Unbound checkpoints in this run dir: %s. "
            "Give the graph a vfsd boundary channel: VfsdMiddleware in a Deep Agents graph, "
            "a `files: FilesChannel` key in a StateGraph's state.",
            checkpoint_id, self.record.thread, reason, count)
        return FilesVersion.unbound_because(reason)

    def version_for_update(self, plan: PutPlan, checkpoint: Checkpoint,
                           metadata: Mapping[str, Any]) -> FilesVersion:
        """`update_state`: never snapshot files that belong to another checkpoint."""
        parent = plan.parent
        label = self.owner._label(plan.thread, checkpoint["id"], metadata)
        if parent is None:
            # The thread's first checkpoint, or a parent written without the
            # wrapper: the files are whatever the mount shows.
            plan.moves_position = True
            return self.take(label)
        if parent.unbound is not None:
            if (self.record.position or {}).get("checkpoint") == plan.parent_id:
                plan.moves_position = True  # the live files go on from the parent
                return self.take(label)
            return self.unbound(checkpoint["id"], f"it forks checkpoint {plan.parent_id}, "
                                f"whose files were not bound ({parent.unbound})")
        where = self.where(plan.parent_id or "", parent, self.m.snapshot_state())
        if where == "after":
            # The mount follows the parent and changed since: edits made
            # through the shell between steps belong to this checkpoint.
            plan.moves_position = True
            return self.take(label)
        plan.moves_position = where == "exact"
        return parent  # exact, or the mount is elsewhere: the parent's files, as they were

    # -- the remote tier: publication before (or shortly after) storing ------------------

    def publish_mode(self) -> str:
        """`publish` resolved once against the mount: "wait", "behind" or "off"."""
        if self.mode is None:
            remote = self.m.remote()
            self.remote_url = remote.get("url") if remote else None
            mode = self.owner.publish
            if mode == "auto":
                mode = "wait" if remote else "off"
            elif mode in ("wait", "behind") and not remote:
                raise MountToolError(f"publish={mode!r} needs a mount with a remote tier "
                                     "(vfsd mount --remote s3://BUCKET/PREFIX)")
            self.mode = mode
        return self.mode

    def remote_of(self, version: FilesVersion | None) -> str | None:
        """The bucket a checkpoint naming `version` records (None: none)."""
        if version is None or version.unbound is not None:
            return None
        if self.publish_mode() != "off" and self.remote_url:
            return self.remote_url
        return None

    def before_store(self, version: FilesVersion) -> None:
        """Apply the durability rule before a checkpoint naming `version` is stored."""
        if version.unbound is not None:
            return
        mode = self.publish_mode()
        if mode == "wait":
            self.sync(version.snapshot)
        elif mode == "behind":
            with self.cache_lock:
                if version.snapshot not in self.unpublished:
                    self.unpublished.append(version.snapshot)
                over = len(self.unpublished) > self.owner.max_lag
            if over:
                self.bound_lag()

    def bound_lag(self) -> None:
        """Wait for the oldest unpublished snapshots until at most `max_lag` remain."""
        status = self.m.publish_status()
        known = {s["id"]: s["published"] for s in status.get("snapshots", [])}
        with self.cache_lock:
            for snap in list(self.unpublished):
                if known.get(snap):
                    self.unpublished.remove(snap)
        while True:
            with self.cache_lock:
                if len(self.unpublished) <= self.owner.max_lag:
                    return
                oldest = self.unpublished[0]
            self.sync(oldest, tolerate_gone=True)
            with self.cache_lock:
                if self.unpublished and self.unpublished[0] == oldest:
                    self.unpublished.popleft()

    def sync(self, snapshot: str, *, tolerate_gone: bool = False,
             timeout: float | None = None, stored: bool = False) -> None:
        """Wait until `snapshot` is published. `stored`: its checkpoint is stored
        already (flush), which the error then says instead of "not stored"."""
        try:
            self.m.sync(snapshot, timeout=self.owner.sync_timeout if timeout is None else timeout)
        except ControlError as exc:
            if tolerate_gone and exc.code == "not_publishable" and "deleted" in exc.message:
                logger.warning("vfsd: %s; the checkpoints naming it cannot be resumed on "
                               "another worker", exc.message)
                return
            if exc.code not in ("timeout", "not_publishable"):
                raise
            consequence = ("its checkpoint is stored but cannot be resumed on another "
                           "worker yet" if stored else "so the checkpoint was not stored")
            raise SnapshotNotPublished(
                f"snapshot {snapshot} is not published, {consequence}: {exc.message}",
                snapshot=snapshot, reason=exc.message) from None

    def flush(self, deadline: float, timeout: float) -> None:
        while True:
            with self.cache_lock:
                if not self.unpublished:
                    return
                oldest = self.unpublished[0]
            left = deadline - time.monotonic()
            if left <= 0:
                reason = f"flush's {timeout:g} s ran out before it was published"
                raise SnapshotNotPublished(
                    f"snapshot {oldest} is not published, its checkpoint is stored but "
                    f"cannot be resumed on another worker yet: {reason}", snapshot=oldest,
                    reason=reason)
            self.sync(oldest, tolerate_gone=True, timeout=left, stored=True)
            with self.cache_lock:
                if self.unpublished and self.unpublished[0] == oldest:
                    self.unpublished.popleft()

    def resume_elsewhere(self, tup: CheckpointTuple, version: FilesVersion,
                         state: Mapping[str, Any]) -> str | None:
        """Bring a checkpoint's files from the bucket into a run dir that holds
        nothing yet. None when done; else why it could not be."""
        remote = version.remote
        if not remote:
            try:
                remote = (self.m.remote() or {}).get("url")
            except ControlError:
                remote = None
        if not remote or not version.run:
            return "it was not published to an object store"
        if self.owner.replicated:
            return (f"the thread's files are in run {state.get('run')} of {remote}, not in run "
                    f"{version.run}: the thread was deleted and started again since, or the "
                    "checkpoint names another thread's files")
        expected = self.owner._expected_run(self.record.thread)
        if expected is not None and version.run != expected:
            return (f"run {version.run} is not this thread's (its run is {expected}): a "
                    "checkpoint of this thread never names another thread's files")
        if state.get("last") or state.get("base"):
            return (f"it is published in {remote}, and this run dir already holds other "
                    f"files: resume it in an empty run dir (vfsd mount RUN_DIR --remote "
                    f"{remote} --from {version.run}@{version.snapshot})")
        try:
            self.m.resume_from(version.run, version.snapshot, remote=remote)
        except (MountError, ControlError) as exc:
            return f"resuming it from {remote} failed: {exc}"
        self.mode = None  # the mount has a remote now
        logger.info("vfsd: resumed %s@%s from %s for checkpoint %s", version.run,
                    version.snapshot, remote, tup.checkpoint["id"])
        return None

    # -- replicas: a run holds its thread (a Runs with a remote) -------------------------

    def hold(self, token: str) -> dict[str, Any]:
        """Hold the thread for one run, or for one write outside runs
        (`ThreadMount.begin_run`: its files caught up with the bucket, the
        live files its latest snapshot), then trust nothing this replica
        believed of it that runs elsewhere may have changed. Not under
        `lock`: a run of the thread ending here needs it while this waits."""
        res = self.m.begin_run(token)  # type: ignore[attr-defined]
        with self.lock:
            self.caught_up(res)
        return res

    def caught_up(self, res: Mapping[str, Any]) -> None:
        """After a hold: the record reloaded; a thread whose run changed (deleted
        and used again, a copy's first run here) keeps none of its old pins;
        the checkpoint the live files follow is the one the bucket's latest
        snapshot says (a run's end keeps what it left after its last
        checkpoint, `keep_run_end`), else none (the local position may be from
        before runs elsewhere)."""
        self.record.load()
        if res.get("rebuilt") or res.get("record") == "revived":
            if self.record.pins:
                self.record.pins = {}
                self.record.save()
            with self.cache_lock:
                self.versions.clear()
                self.pin_on_put.clear()
        doc = self.m.client.call("snapshots")
        listed = doc.pop("snapshots", None) or []
        doc.setdefault("forked_from", None)
        doc.setdefault("copied_from", [])
        self.fresh_state = doc
        self.record.position = position_of_run_end(res.get("latest"), listed)
        self.record.save_position()

    def end_run(self, token: str) -> None:
        """A graph run is over: what it left after its last checkpoint kept,
        then the thread given back (`let_go`)."""
        with self.lock:
            self.keep_run_end()
        self.let_go(token, strict=True)

    def keep_run_end(self) -> None:
        """Snapshot the files a run leaves after the checkpoint it ended on (the
        finished tasks of a step that failed or waits at an interrupt, whose
        writes LangGraph keeps and will not redo), labelled with that
        checkpoint: a run from it, on any replica, goes on with them, as it
        would on the replica that ran it (see `caught_up`). Nothing when
        nothing changed since the last snapshot."""
        checkpoint = (self.record.position or {}).get("checkpoint")
        if not checkpoint:
            return
        thread = self.record.thread or ""
        shown = "".join(c if c.isprintable() else "?" for c in thread[:40])
        label = f"{shown} after ckpt {checkpoint} (run end)"
        try:
            rec = self.m.snapshot(label=label[:200], reuse=True)
        except ControlError as exc:  # the lease was lost: the end says so
            logger.warning("vfsd: thread %.80r: the files its run left after checkpoint %s "
                           "could not be kept: %s", thread, checkpoint, exc)
            return
        if not rec.get("reused"):
            logger.info("vfsd: thread %.80r: the files its run left after checkpoint %s are "
                        "kept in %s", thread, checkpoint, rec.get("id"))

    def let_go(self, token: str, *, strict: bool = False) -> None:
        """Give the thread back (`ThreadMount.end_run`: every snapshot published
        first). A publication that does not come within `sync_timeout`
        raises SnapshotNotPublished (`strict`; else it is logged) and the
        thread stays held while the daemon goes on publishing: this is tried
        again in the background until it is given back. A run whose lease was
        lost raises it too (its unpublished snapshots are not the thread's)."""
        try:
            res = self.m.end_run(token, timeout=self.owner.sync_timeout)  # type: ignore[attr-defined]
        except ControlError as exc:
            if exc.code not in ("timeout", "not_publishable"):
                if strict:
                    raise
                logger.warning("vfsd: thread %.80r could not be given back: %s",
                               self.record.thread, exc)
                return
            if exc.code == "timeout":
                _retry_end(self.m, token, self.owner.sync_timeout)
            error = SnapshotNotPublished(
                f"thread {self.record.thread!r:.200} was not handed over: {exc.message}",
                snapshot="", reason=exc.message)
            if strict:
                raise error from None
            logger.warning("vfsd: %s", error)
            return
        if res.get("ended"):
            with self.cache_lock:
                self.unpublished.clear()  # all published: nothing for flush() to wait for

    # -- after storing: position and interrupt pins ---------------------------------------

    def after_put(self, plan: PutPlan, checkpoint_id: str, version: FilesVersion) -> None:
        with self.lock:
            if plan.moves_position:
                self.set_position(checkpoint_id, version)
            passed = self.record.pins.get(plan.parent_id) if plan.parent_id else None
            with self.cache_lock:
                interrupted = checkpoint_id in self.pin_on_put
        if passed is not None:
            # Unpinned before the record forgets it: an interrupt in between
            # leaves a record to release again (harmless), never a lost pin.
            if not passed.get("was_pinned") and not self.pinned_by_record(
                passed["snapshot"], besides=plan.parent_id
            ):
                self.unpin(passed["snapshot"])
            with self.lock:
                if self.record.pins.pop(plan.parent_id, None) is not None:
                    self.record.save()
        if interrupted:  # its interrupt's writes came first
            self.pin_interrupt(checkpoint_id, version)

    def pin_when_known(self, checkpoint_id: str | None) -> bool:
        """Pin now if this wrapper's `put` has decided the checkpoint's files
        (True); else mark it so that `put` pins it (False: the saver may hold it
        already, written by another process). LangGraph sends a step's writes
        without waiting for the `put` of their checkpoint, which itself waits
        for the previous put."""
        if not checkpoint_id:
            return True
        with self.cache_lock:
            known = self.versions.get(checkpoint_id)
            if known is None:
                self.pin_on_put.add(checkpoint_id)
                return False
        self.pin_interrupt(checkpoint_id, known)
        return True

    def pin_interrupt(self, checkpoint_id: str | None, version: FilesVersion | None) -> None:
        if version is None or not checkpoint_id or version.unbound is not None:
            return
        with self.lock:
            with self.cache_lock:
                self.pin_on_put.discard(checkpoint_id)
            if checkpoint_id in self.record.pins:
                return
            try:
                listed = {s["id"]: s for s in self.m.snapshots()}
                if version.snapshot not in listed:
                    logger.warning(
                        "vfsd: checkpoint %s waits at an interrupt but its snapshot %s is gone",
                        checkpoint_id,
                        version.snapshot,
                    )
                    return
                # A pin one of our own records holds is ours to release, not the user's.
                was_pinned = bool(listed[version.snapshot].get("pinned")) and not \
                    self.pinned_by_record(version.snapshot)
            except ControlError as exc:
                logger.warning("vfsd: could not pin %s: %s", version.snapshot, exc)
                return
            # Recorded before pinning: an interrupt (KeyboardInterrupt, a
            # cancelled task's thread cut short) between the two then leaves a
            # record whose release unpins, never a pin nothing releases.
            self.record.pins[checkpoint_id] = {
                "snapshot": version.snapshot,
                "was_pinned": was_pinned,
            }
            self.record.save()
            if was_pinned:
                return
            try:
                self.m.pin_snapshot(version.snapshot, True)
            except ControlError as exc:
                logger.warning("vfsd: could not pin %s: %s", version.snapshot, exc)
                del self.record.pins[checkpoint_id]
                self.record.save()

    def pinned_by_record(self, snapshot_id: str, besides: str | None = None) -> bool:
        """Whether a recorded interrupt pin (other than checkpoint `besides`'s)
        pinned `snapshot_id`: two checkpoints may name one snapshot."""
        with self.lock:
            return any(
                pin["snapshot"] == snapshot_id and not pin.get("was_pinned")
                for checkpoint_id, pin in self.record.pins.items()
                if checkpoint_id != besides
            )

    def unpin(self, snapshot_id: str) -> None:
        try:
            self.m.pin_snapshot(snapshot_id, False)
        except ControlError as exc:
            if exc.code != "not_found":
                logger.warning("vfsd: could not unpin %s: %s", snapshot_id, exc)

    def release(self, thread_id: str) -> None:
        """Forget the binding to `thread_id` (its checkpoints are gone)."""
        with self.lock:
            self.record.load()
            if self.record.thread != thread_id:
                return
            # Unpinned first, then forgotten: an interrupt in between leaves
            # the record, and the next release unpins again.
            for pin in list(self.record.pins.values()):
                if not pin.get("was_pinned"):
                    self.unpin(pin["snapshot"])
            self.record.clear()
            with self.cache_lock:
                self.versions.clear()
                self.pin_on_put.clear()

    def release_unnamed(self, named: set[str]) -> list[str]:
        """Delete the snapshots no stored checkpoint names (`named`): the
        checkpoints that kept them were pruned or deleted. Pinned ones stay
        (a user's pin, or an interrupt's), and the newest (the next step may
        reuse it). The ids deleted."""
        with self.lock:
            snaps = self.m.snapshots()
            newest = snaps[-1]["id"] if snaps else None
            gone = []
            for snap in snaps:
                if snap["id"] in named or snap.get("pinned") or snap["id"] == newest:
                    continue
                try:
                    self.m.delete_snapshot(snap["id"])
                except ControlError as exc:
                    if exc.code != "not_found":
                        raise
                gone.append(snap["id"])
            if gone:
                logger.info("vfsd: released %d snapshot(s) of thread %.80r that no checkpoint "
                            "names any more", len(gone), self.record.thread)
            return gone

    # -- bookkeeping ---------------------------------------------------------------------

    def bind(self, thread: str) -> None:
        bound = self.record.thread
        if bound is None:
            self.record.thread = thread
            self.record.save()
        elif bound != thread:
            raise ThreadBindingError(
                f"run dir {self.m.run_dir} serves graph thread {bound!r:.200}; thread "
                f"{thread!r:.200} cannot use it (its files would overwrite that thread's). "
                "Serve every thread from its own run dir with mount_tool.runs(ROOT) "
                "(VfsdCheckpointer(saver, runs)), or start the new thread from a snapshot of "
                "this one: new = mount.fork(snapshot_id, new_run_dir) (snapshot ids of "
                "checkpoints: VfsdCheckpointer.snapshot_of(config))."
            )

    def set_position(self, checkpoint_id: str, version: FilesVersion) -> None:
        position = {"checkpoint": checkpoint_id, "snapshot": version.snapshot, "run": version.run}
        if self.record.position != position:
            self.record.position = position
            self.record.save_position()

    def remember(self, checkpoint_id: str, version: FilesVersion) -> None:
        """(cache_lock held)"""
        self.versions[checkpoint_id] = version
        self.versions.move_to_end(checkpoint_id)
        while len(self.versions) > SNAPSHOT_CACHE_SIZE:
            self.versions.popitem(last=False)

    def known(self, checkpoint_id: str | None) -> FilesVersion | None:
        if not checkpoint_id:
            return None
        with self.cache_lock:
            return self.versions.get(checkpoint_id)


@dataclass
class PutPlan:
    """What one `put` does about files, decided in the put's own context."""

    thread: str
    parent_id: str | None
    from_run: bool
    capture: Capture | None = None
    unbound: str | None = None  # why a run's checkpoint has no capture
    needs_parent: bool = False
    parent: FilesVersion | None = None
    moves_position: bool = False

    def __post_init__(self) -> None:
        self.needs_parent = not self.from_run and bool(self.parent_id)


