"""VfsdCheckpointer: LangGraph checkpoints that bring their files back.

    saver = VfsdCheckpointer(InMemorySaver(), mount)     # or PostgresSaver, any saver
    graph = builder.compile(checkpointer=saver)

Each checkpoint of the root graph records the snapshot of the mount that holds
its files, as `metadata["vfsd"] = {"run", "snapshot", "step"}`. When a graph run
starts from a checkpoint whose files are not what the mount shows (a replay from
an earlier `checkpoint_id`, a fork made by `update_state` on a past config, the
other branch of a fork), the mount is restored to that snapshot before the first
node runs, so the shell sees those files. Reading state (`get_state`,
`get_state_history`) never touches the files.

When is a snapshot taken. LangGraph saves a checkpoint in the background while
the next superstep already runs, so a snapshot taken inside `put` could catch
the next step's writes. The wrapper therefore takes it in `get_next_version`,
which the loop calls on its own thread once a superstep's tasks have all
finished and before it hands the checkpoint to `put`; the loop's background
executor copies the context at that moment, so each `put` finds the snapshot of
its own step in a ContextVar. A `put` that finds none (the first checkpoint of
a replay) takes one itself: no task runs at that point. Snapshots are asked
with `reuse`, so a step that changed no file costs a round trip and no new
snapshot.

What a run start decides. The wrapper remembers in the run dir
(`RUN_DIR/.vfsd/langgraph.json` and `langgraph.position`) which thread the run
dir serves and the checkpoint the live files follow (the last one written or
restored). A run from that checkpoint keeps the live files
as they are, including what changed after it (the finished tasks of an
interrupted step, whose writes LangGraph keeps and will not redo; edits made
through the shell between runs). A run from any other checkpoint restores its
snapshot, unless the mount already shows exactly it.

Forks and human edits (`update_state`, a put that no graph run makes): the new
checkpoint records its parent's snapshot when the mount shows exactly that, or
is elsewhere (a fork from the past); when the mount follows the parent but
changed since (edits through the shell), it takes a new snapshot.

Remote tier (a mount with `--remote`): checkpoints travel, so a thread may
resume on any worker. The metadata also records the bucket
(`metadata["vfsd"]["remote"]`). Durability is a choice, `publish=`:
- "wait" (the default with a remote): `put` stores a checkpoint only once its
  snapshot is published (`Mount.sync`), so every stored checkpoint can be
  resumed elsewhere; a step costs the publication (a manifest and the head,
  once its chunks are up, which the daemon uploads while the step runs).
- "behind": checkpoints are stored at once and published in the background;
  at most `max_lag` stored checkpoints may name a snapshot not published yet
  (a `put` beyond that waits for the oldest). A worker lost with its disk
  loses at most those.
In both, a publication that does not come within `sync_timeout` raises
`SnapshotNotPublished` and the checkpoint is not stored. `flush()` waits for
everything stored so far.
A run starting from a checkpoint whose snapshot is not in this mount, on a
run dir that holds nothing yet (a fresh worker), resumes it from the bucket:
the run dir is remounted with `--from RUN@SNAPSHOT` and its files are
fetched on first read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from .errors import (
    ControlError,
    MountError,
    MountToolError,
    SnapshotNotPublished,
    SnapshotUnavailable,
    ThreadBindingError,
)
from .mount import Mount
from .refs import as_ref, is_ref

try:  # LangGraph's names for these keys; private, so fall back to their values
    from langgraph._internal._constants import CONFIG_KEY_RUNTIME, INTERRUPT
except ImportError:  # pragma: no cover - other langgraph versions
    CONFIG_KEY_RUNTIME = "__pregel_runtime"
    INTERRUPT = "__interrupt__"

logger = logging.getLogger(__name__)

PUBLISH_MODES = ("auto", "wait", "behind", "off")
RECORD_NAME = "langgraph.json"
POSITION_NAME = "langgraph.position"
ON_MISSING = ("raise", "keep")
# Checkpoint -> snapshot answers kept in memory (the metadata has them all).
SNAPSHOT_CACHE_SIZE = 4096
# Refs listed by name in a SnapshotUnavailable message (all are in `.lost`).
LISTED_FILES = 20


# -- what a checkpoint records -----------------------------------------------------


@dataclass(frozen=True)
class FilesVersion:
    """The snapshot that holds a checkpoint's files (`metadata["vfsd"]`)."""

    run: str
    snapshot: str
    step: int = 0

    @classmethod
    def of(cls, metadata: Mapping[str, Any] | None) -> FilesVersion | None:
        raw = (metadata or {}).get("vfsd")
        if not isinstance(raw, Mapping) or not isinstance(raw.get("snapshot"), str):
            return None
        return cls(str(raw.get("run") or ""), raw["snapshot"], int(raw.get("step") or 0))

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> FilesVersion:
        """From a daemon snapshot record (a reused one also says the live step)."""
        return cls(str(rec.get("run") or ""), str(rec["id"]), int(rec.get("live_step", rec["step"])))

    def as_metadata(self) -> dict[str, Any]:
        return {"run": self.run, "snapshot": self.snapshot, "step": self.step}

    @property
    def seq(self) -> int:
        return snapshot_seq(self.snapshot)


def snapshot_seq(snapshot_id: str | None) -> int:
    """12 for "s12"; 0 for None or anything else."""
    if isinstance(snapshot_id, str) and snapshot_id[1:].isdigit():
        return int(snapshot_id[1:])
    return 0


# -- per-run scope: which run this context belongs to, and its step's snapshot ------


@dataclass
class _Pending:
    """A snapshot taken at a step boundary, waiting for that step's `put`."""

    version: FilesVersion
    claimed: bool = False


@dataclass(frozen=True)
class _RunScope:
    """Set in the context of a root graph run by its first `get_tuple`.

    Immutable: each step sets a new one, so a `put` running late in the
    background still sees the snapshot of its own step.
    """

    runtime: Any
    thread: str
    pending: _Pending | None = None


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
    costs ~0.4 ms): position = {"checkpoint", "snapshot", "run"}, the checkpoint
    the live files follow (the last one written by a run, or restored). A
    position that does not read back is taken as unknown, which only makes
    the next run start restore when in doubt.
    """

    state_dir: Path
    thread: str | None = None
    position: dict[str, str] | None = None
    pins: dict[str, dict[str, Any]] = field(default_factory=dict)
    _position_fd: int | None = field(default=None, repr=False)
    _position_len: int = field(default=0, repr=False)

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
        if self._position_fd is None:
            self._position_fd = os.open(self.position_path, os.O_RDWR | os.O_CREAT, 0o600)
            self._position_len = os.fstat(self._position_fd).st_size
        padded = data.ljust(max(self._position_len, 256))
        os.pwrite(self._position_fd, padded, 0)
        self._position_len = len(padded)

    def clear(self) -> None:
        self.thread, self.position, self.pins = None, None, {}
        if self._position_fd is not None:
            os.close(self._position_fd)
            self._position_fd, self._position_len = None, 0
        for path in (self.path, self.position_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def __del__(self) -> None:
        if self._position_fd is not None:
            try:
                os.close(self._position_fd)
            except OSError:
                pass


# -- the wrapper ----------------------------------------------------------------------------


class VfsdCheckpointer(BaseCheckpointSaver):
    """Wraps any LangGraph checkpointer so checkpoints also pin the mount's files.

    `saver` does the storing (InMemorySaver, PostgresSaver, AsyncPostgresSaver,
    ...); every method not described here is the saver's own. `mount` is the
    vfsd mount whose files follow the graph.

    - `put`/`aput` add `metadata["vfsd"] = {"run", "snapshot", "step"}`.
    - `get_tuple`/`aget_tuple` at the start of a root graph run bring the
      mount to that checkpoint's snapshot first (see the module docstring).
    - A checkpoint whose snapshot is gone (retention) raises
      `SnapshotUnavailable` at the start of a run from it, naming the files
      that cannot come back; `on_missing="keep"` logs that and runs on the
      live files instead.
    - One run dir serves one thread: the first thread that runs or writes a
      checkpoint is bound to it (persisted in the run dir); any other thread
      gets `ThreadBindingError`. Give each thread its own run dir, or start a
      thread from another's snapshot with `Mount.fork`.
    - A checkpoint that waits at an interrupt (`interrupt()` in a node) gets
      its snapshot pinned until the thread moves past it.

    Subgraph checkpoints (a non-empty `checkpoint_ns`) carry no snapshot of
    their own: the files follow the root graph's checkpoints.
    """

    def __init__(
        self,
        saver: BaseCheckpointSaver,
        mount: Mount,
        *,
        on_missing: str = "raise",
        files_key: str = "files",
        publish: str = "auto",
        max_lag: int = 4,
        sync_timeout: float = 60.0,
    ) -> None:
        if isinstance(saver, VfsdCheckpointer):
            raise ValueError("saver is already a VfsdCheckpointer")
        if not isinstance(saver, BaseCheckpointSaver):
            raise TypeError(f"saver must be a LangGraph BaseCheckpointSaver, not {type(saver)!r}")
        if on_missing not in ON_MISSING:
            raise ValueError(f"on_missing must be one of {ON_MISSING}, not {on_missing!r}")
        self.saver = saver
        self.mount = mount
        self.on_missing = on_missing
        self.files_key = files_key
        if publish not in PUBLISH_MODES:
            raise ValueError(f"publish must be one of {PUBLISH_MODES}, not {publish!r}")
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise ValueError(f"max_lag must be an integer >= 0, not {max_lag!r}")
        if not isinstance(sync_timeout, int | float) or sync_timeout <= 0:
            raise ValueError(f"sync_timeout must be a positive number, not {sync_timeout!r}")
        self.publish = publish
        self.max_lag = max_lag
        self.sync_timeout = float(sync_timeout)
        self._mode: str | None = None  # `publish` resolved against the mount
        self._remote_url: str | None = None
        # Snapshots named by stored checkpoints and not known to be published.
        self._unpublished: deque[str] = deque()
        self._record = RunDirRecord(mount.state_dir)
        self._record.load()
        self._lock = threading.RLock()
        self._scope: ContextVar[_RunScope | None] = ContextVar(
            f"vfsd_run_scope_{id(self):x}", default=None
        )
        self._versions: OrderedDict[str, FilesVersion] = OrderedDict()
        # Checkpoints waiting at an interrupt whose `put` has not run yet.
        self._pin_on_put: set[str] = set()
        self._inner_task_path = _accepts_task_path(saver.put_writes)
        self._inner_atask_path = _accepts_task_path(saver.aput_writes)

    # -- plain delegation ---------------------------------------------------------

    @property
    def serde(self) -> Any:  # type: ignore[override]
        return self.saver.serde

    @serde.setter
    def serde(self, value: Any) -> None:
        self.saver.serde = value

    @property
    def config_specs(self) -> list:
        return self.saver.config_specs

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks (setup(), conn, ...).
        if name.startswith("__") or name == "saver":
            raise AttributeError(name)
        return getattr(self.saver, name)

    def __repr__(self) -> str:
        return f"VfsdCheckpointer({self.saver!r}, {self.mount!r})"

    def with_allowlist(self, extra_allowlist: Any) -> VfsdCheckpointer:
        """A clone around the saver's own clone, sharing this wrapper's state."""
        inner = self.saver.with_allowlist(extra_allowlist)
        if inner is self.saver:
            return self
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.saver = inner
        return clone

    def get(self, config: RunnableConfig) -> Checkpoint | None:
        return self.saver.get(config)

    async def aget(self, config: RunnableConfig) -> Checkpoint | None:
        return await self.saver.aget(config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return self.saver.list(config, filter=filter, before=before, limit=limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for item in self.saver.alist(config, filter=filter, before=before, limit=limit):
            yield item

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        return self.saver.delete_for_runs(run_ids)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        return await self.saver.adelete_for_runs(run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        return self.saver.copy_thread(source_thread_id, target_thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        return await self.saver.acopy_thread(source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        return self.saver.prune(thread_ids, strategy=strategy)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        return await self.saver.aprune(thread_ids, strategy=strategy)

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]) -> Any:
        return self.saver.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Any:
        return await self.saver.aget_delta_channel_history(config=config, channels=channels)

    # -- what a checkpoint holds ---------------------------------------------------

    def snapshot_of(self, config: RunnableConfig) -> str | None:
        """The snapshot id recorded for the checkpoint `config` addresses (None:
        no such checkpoint, or one written without this wrapper). Fork a new
        run dir from it with `mount.fork(id, new_run_dir)`."""
        tup = self.saver.get_tuple(config)
        version = FilesVersion.of(tup.metadata) if tup else None
        return version.snapshot if version else None

    # -- reading: a run start aligns the files ------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The saver's tuple; at the start of a root graph run, the mount is
        first brought to that checkpoint's files."""
        start = self._run_start(config)
        tup = self.saver.get_tuple(config)
        if start is not None:
            self._begin_run(start, tup)
            self._scope.set(start)
        return tup

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        start = self._run_start(config)
        tup = await self.saver.aget_tuple(config)
        if start is not None:
            await asyncio.to_thread(self._begin_run, start, tup)
            self._scope.set(start)
        return tup

    def _run_start(self, config: RunnableConfig) -> _RunScope | None:
        """The scope of a root run starting here, or None (not a run start).

        LangGraph puts its Runtime in the config of every checkpointer call a
        run makes, and in none that `get_state`/`update_state` make. A run's
        first root `get_tuple` is its start; later ones in the same run (the
        check for a newer checkpoint when replaying) are reads.
        """
        conf = config.get("configurable") or {}
        runtime = conf.get(CONFIG_KEY_RUNTIME)
        if runtime is None or conf.get("checkpoint_ns"):
            # Outside a run, or a subgraph (its files follow the root graph).
            self._scope.set(None)
            return None
        scope = self._scope.get()
        if scope is not None and scope.runtime is runtime:
            return None
        return _RunScope(runtime, str(conf.get("thread_id")))

    def _begin_run(self, start: _RunScope, tup: CheckpointTuple | None) -> None:
        with self._lock:
            self._reload()
            self._bind(start.thread)
            version = FilesVersion.of(tup.metadata) if tup is not None else None
            if tup is None or version is None:
                return  # a new thread, or a checkpoint written without the wrapper
            self._align(tup, version)

    def _align(self, tup: CheckpointTuple, version: FilesVersion) -> None:
        checkpoint_id = tup.checkpoint["id"]
        state = self.mount.snapshot_state()
        where = self._where(checkpoint_id, version, state)
        if where in ("exact", "after"):
            self._set_position(checkpoint_id, version)
            return
        if where == "foreign":
            why = self._resume_elsewhere(tup, version, state)
            if why is None:
                self._set_position(checkpoint_id, version)
                return
            self._unavailable(
                tup,
                version,
                f"its files are in run {version.run}, and this mount holds run {state.get('run')} "
                f"({why}; or fork that run dir from the checkpoint's snapshot to run it here)",
            )
            return
        try:
            res = self.mount.restore(version.snapshot)
        except ControlError as exc:
            if exc.code != "not_found":
                raise
            self._unavailable(tup, version, exc.message)
            return
        if version.step > int(res.get("step", 0)):
            # The snapshot was reused by a later step: go to the step the
            # checkpoint was written at (nothing is due for eviction there).
            self.mount.set_step(version.step)
        logger.info(
            "vfsd: restored %s for checkpoint %s (%s change(s))",
            version.snapshot,
            checkpoint_id,
            res.get("changed"),
        )
        self._set_position(checkpoint_id, version)

    def _where(self, checkpoint_id: str, version: FilesVersion, state: Mapping[str, Any]) -> str:
        """How the live tree stands to a checkpoint's files:
        "exact" (it is that snapshot), "after" (it follows that checkpoint, maybe
        changed since), "elsewhere", or "foreign" (another run's files)."""
        base = state.get("base")
        position = self._record.position
        if version.run and state.get("run") and version.run != state.get("run"):
            origin = state.get("forked_from") or {}
            fresh_fork = position is None and base is None
            if fresh_fork and origin.get("run") == version.run and origin.get("snapshot") == version.snapshot:
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

    def _unavailable(self, tup: CheckpointTuple, version: FilesVersion, reason: str) -> None:
        checkpoint_id = tup.checkpoint["id"]
        lost, available = self._files_report(tup)
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
        if self.on_missing == "raise":
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
        self._set_position(checkpoint_id, version)

    def _files_report(self, tup: CheckpointTuple) -> tuple[list[dict], list[dict]]:
        """(lost, available) refs of the checkpoint's `files` state."""
        lost: list[dict] = []
        available: list[dict] = []
        for ref in self._files_of(tup).values():
            if not is_ref(ref):
                continue
            ref = dict(as_ref(ref))
            try:
                res = self.mount.resolve(ref)
                if res.get("state") == "live" and res.get("matches", True):
                    available.append({**ref, "from": "live"})
                    continue
                found = self.mount.locate(ref)
            except ControlError:
                found, res = {}, {}
            if found.get("found"):
                available.append({**ref, "from": found["id"]})
            else:
                lost.append({**ref, "state": res.get("state", "unknown")})
        return lost, available

    def _files_of(self, tup: CheckpointTuple) -> Mapping[str, Any]:
        """The checkpoint's `files` channel: stored whole, or rebuilt from a
        DeltaChannel's history. {} when there is none or it cannot be read."""
        values = tup.checkpoint.get("channel_values") or {}
        value = values.get(self.files_key)
        value = getattr(value, "value", value)  # a DeltaChannel snapshot blob
        if isinstance(value, Mapping):
            return value
        if self.files_key not in (tup.checkpoint.get("channel_versions") or {}):
            return {}
        try:
            history = self.saver.get_delta_channel_history(
                config=tup.config, channels=[self.files_key]
            )[self.files_key]
        except Exception as exc:  # a saver without delta history: report what we can
            logger.debug("vfsd: no files history for %s: %s", tup.checkpoint["id"], exc)
            return {}
        seed = history.get("seed")
        files: dict[str, Any] = dict(getattr(seed, "value", seed) or {})
        for write in history.get("writes", []):
            update = write[2] if len(write) > 2 else None
            if isinstance(update, Mapping):
                for key, ref in update.items():
                    if ref is None:
                        files.pop(key, None)
                    else:
                        files[key] = ref
        return files

    # -- step boundaries: snapshot while no task runs ---------------------------------------

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The saver's next version. In a root graph run, also snapshot the mount:
        LangGraph calls this on the loop's thread between supersteps, before
        it hands the step's checkpoint to `put` (see the module docstring)."""
        version = self.saver.get_next_version(current, channel)
        scope = self._scope.get()
        if scope is not None:
            taken = self._take(f"langgraph thread {scope.thread}")
            self._scope.set(replace(scope, pending=_Pending(taken)))
        return version

    def _take(self, label: str) -> FilesVersion:
        return FilesVersion.from_record(self.mount.snapshot(label=label[:200], reuse=True))

    def _claim(self, runtime: Any) -> FilesVersion | None:
        """The snapshot of this put's step, if the step boundary took one."""
        scope = self._scope.get()
        if scope is None or scope.runtime is not runtime or scope.pending is None:
            return None
        with self._lock:
            if scope.pending.claimed:
                return None
            scope.pending.claimed = True
            return scope.pending.version

    # -- writing ----------------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Record the snapshot holding this checkpoint's files, then store it."""
        plan = self._plan_put(config, checkpoint)
        if plan is not None and plan.needs_parent:
            plan.parent = self._version_of(config)
        version = self._files_version(plan, checkpoint) if plan else None
        if version is not None:
            self._before_store(version)
            with self._lock:  # before storing: its interrupt's writes may come first
                self._remember(checkpoint["id"], version)
        stored = self.saver.put(config, checkpoint, self._metadata(metadata, version),
                                new_versions)
        if plan is not None and version is not None:
            self._after_put(plan, checkpoint["id"], version)
        return stored

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        plan = self._plan_put(config, checkpoint)
        if plan is not None and plan.needs_parent:
            plan.parent = await self._aversion_of(config)
        version = (
            await asyncio.to_thread(self._files_version, plan, checkpoint) if plan else None
        )
        if version is not None:
            await asyncio.to_thread(self._before_store, version)
            with self._lock:  # before storing: its interrupt's writes may come first
                self._remember(checkpoint["id"], version)
        stored = await self.saver.aput(
            config, checkpoint, self._metadata(metadata, version), new_versions
        )
        if plan is not None and version is not None:
            await asyncio.to_thread(self._after_put, plan, checkpoint["id"], version)
        return stored

    def _plan_put(self, config: RunnableConfig, checkpoint: Checkpoint) -> _PutPlan | None:
        conf = config.get("configurable") or {}
        if conf.get("checkpoint_ns"):
            return None  # a subgraph's checkpoint: the root's carries the files
        runtime = conf.get(CONFIG_KEY_RUNTIME)
        plan = _PutPlan(
            thread=str(conf.get("thread_id")),
            parent_id=conf.get("checkpoint_id"),
            from_run=runtime is not None,
        )
        if runtime is not None:
            plan.claimed = self._claim(runtime)  # in this put's own context
        return plan

    def _files_version(self, plan: _PutPlan, checkpoint: Checkpoint) -> FilesVersion:
        with self._lock:
            if not plan.from_run:
                self._reload()
            self._bind(plan.thread)
            if plan.from_run:
                plan.moves_position = True
                return plan.claimed or self._take(checkpoint["id"])
            return self._version_for_update(plan, checkpoint)

    def _version_for_update(self, plan: _PutPlan, checkpoint: Checkpoint) -> FilesVersion:
        """`update_state`: never snapshot files that belong to another checkpoint."""
        parent = plan.parent
        if parent is None:
            # The thread's first checkpoint, or a parent written without the
            # wrapper: the files are whatever the mount shows.
            plan.moves_position = True
            return self._take(checkpoint["id"])
        where = self._where(plan.parent_id or "", parent, self.mount.snapshot_state())
        if where == "after":
            # The mount follows the parent and changed since: edits made
            # through the shell between steps belong to this checkpoint.
            plan.moves_position = True
            return self._take(checkpoint["id"])
        plan.moves_position = where == "exact"
        return parent  # exact, or the mount is elsewhere: the parent's files, as they were

    # -- the remote tier: publication before (or shortly after) storing ------------------

    def _publish_mode(self) -> str:
        """`publish` resolved once against the mount: "wait", "behind" or "off"."""
        if self._mode is None:
            remote = self.mount.remote()
            self._remote_url = remote.get("url") if remote else None
            mode = self.publish
            if mode == "auto":
                mode = "wait" if remote else "off"
            elif mode in ("wait", "behind") and not remote:
                raise MountToolError(f"publish={mode!r} needs a mount with a remote tier "
                                     "(vfsd mount --remote s3://BUCKET/PREFIX)")
            self._mode = mode
        return self._mode

    def _metadata(self, metadata: CheckpointMetadata, version: FilesVersion | None) -> Any:
        meta = _with_version(metadata, version)
        if version is not None and self._publish_mode() != "off" and self._remote_url:
            meta["vfsd"] = {**meta["vfsd"], "remote": self._remote_url}
        return meta

    def _before_store(self, version: FilesVersion) -> None:
        """Apply the durability rule before a checkpoint naming `version` is stored."""
        mode = self._publish_mode()
        if mode == "wait":
            self._sync(version.snapshot)
        elif mode == "behind":
            with self._lock:
                if version.snapshot not in self._unpublished:
                    self._unpublished.append(version.snapshot)
                over = len(self._unpublished) > self.max_lag
            if over:
                self._bound_lag()

    def _bound_lag(self) -> None:
        """Wait for the oldest unpublished snapshots until at most `max_lag` remain."""
        status = self.mount.publish_status()
        known = {s["id"]: s["published"] for s in status.get("snapshots", [])}
        with self._lock:
            for snap in list(self._unpublished):
                if known.get(snap):
                    self._unpublished.remove(snap)
        while True:
            with self._lock:
                if len(self._unpublished) <= self.max_lag:
                    return
                oldest = self._unpublished[0]
            self._sync(oldest, tolerate_gone=True)
            with self._lock:
                if self._unpublished and self._unpublished[0] == oldest:
                    self._unpublished.popleft()

    def _sync(self, snapshot: str, *, tolerate_gone: bool = False,
              timeout: float | None = None, stored: bool = False) -> None:
        """Wait until `snapshot` is published. `stored`: its checkpoint is stored
        already (flush), which the error then says instead of "not stored"."""
        try:
            self.mount.sync(snapshot, timeout=self.sync_timeout if timeout is None else timeout)
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

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every snapshot a stored checkpoint names is published
        (`publish="behind"`); SnapshotNotPublished if they are not all in
        within `timeout` seconds in total (default `sync_timeout`; this call's
        only, later puts keep `sync_timeout`)."""
        if self._publish_mode() == "off":
            return
        timeout = self.sync_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number, not {timeout!r}")
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._unpublished:
                    return
                oldest = self._unpublished[0]
            left = deadline - time.monotonic()
            if left <= 0:
                reason = f"flush's {timeout:g} s ran out before it was published"
                raise SnapshotNotPublished(
                    f"snapshot {oldest} is not published, its checkpoint is stored but "
                    f"cannot be resumed on another worker yet: {reason}", snapshot=oldest,
                    reason=reason)
            self._sync(oldest, tolerate_gone=True, timeout=left, stored=True)
            with self._lock:
                if self._unpublished and self._unpublished[0] == oldest:
                    self._unpublished.popleft()

    async def aflush(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.flush, timeout)

    def _resume_elsewhere(self, tup: CheckpointTuple, version: FilesVersion,
                          state: Mapping[str, Any]) -> str | None:
        """Bring a checkpoint's files from the bucket into a run dir that holds
        nothing yet. None when done; else why it could not be."""
        remote = ((tup.metadata or {}).get("vfsd") or {}).get("remote")
        if not remote:
            try:
                remote = (self.mount.remote() or {}).get("url")
            except ControlError:
                remote = None
        if not remote or not version.run:
            return "it was not published to an object store"
        if state.get("last") or state.get("base"):
            return (f"it is published in {remote}, and this run dir already holds other "
                    f"files: resume it in an empty run dir (vfsd mount RUN_DIR --remote "
                    f"{remote} --from {version.run}@{version.snapshot})")
        try:
            self.mount.resume_from(version.run, version.snapshot, remote=remote)
        except (MountError, ControlError) as exc:
            return f"resuming it from {remote} failed: {exc}"
        self._mode = None  # the mount has a remote now
        logger.info("vfsd: resumed %s@%s from %s for checkpoint %s", version.run,
                    version.snapshot, remote, tup.checkpoint["id"])
        return None

    def _after_put(self, plan: _PutPlan, checkpoint_id: str, version: FilesVersion) -> None:
        with self._lock:
            if plan.moves_position:
                self._set_position(checkpoint_id, version)
            passed = self._record.pins.get(plan.parent_id) if plan.parent_id else None
            interrupted = checkpoint_id in self._pin_on_put
        if passed is not None:
            # Unpinned before the record forgets it: an interrupt in between
            # leaves a record to release again (harmless), never a lost pin.
            if not passed.get("was_pinned") and not self._pinned_by_record(
                passed["snapshot"], besides=plan.parent_id
            ):
                self._unpin(passed["snapshot"])
            with self._lock:
                if self._record.pins.pop(plan.parent_id, None) is not None:
                    self._record.save()
        if interrupted:  # its interrupt's writes came first
            self._pin_interrupt({"configurable": {"checkpoint_id": checkpoint_id}}, version)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The saver's `put_writes`; an interrupt pins its checkpoint's snapshot."""
        if self._inner_task_path:
            self.saver.put_writes(config, writes, task_id, task_path)
        else:
            self.saver.put_writes(config, writes, task_id)
        if _has_interrupt(config, writes) and not self._pin_when_known(config):
            self._pin_interrupt(config, self._version_of(config))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if self._inner_atask_path:
            await self.saver.aput_writes(config, writes, task_id, task_path)
        else:
            await self.saver.aput_writes(config, writes, task_id)
        if _has_interrupt(config, writes) and not await asyncio.to_thread(
            self._pin_when_known, config
        ):
            version = await self._aversion_of(config)
            await asyncio.to_thread(self._pin_interrupt, config, version)

    def _pin_when_known(self, config: RunnableConfig) -> bool:
        """Pin now if this wrapper's `put` has decided the checkpoint's files
        (True); else mark it so that `put` pins it (False: the saver may hold it
        already, written by another process). LangGraph sends a step's writes
        without waiting for the `put` of their checkpoint, which itself waits
        for the previous put."""
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if not checkpoint_id:
            return True
        with self._lock:
            known = self._versions.get(checkpoint_id)
            if known is None:
                self._pin_on_put.add(checkpoint_id)
                return False
        self._pin_interrupt(config, known)
        return True

    def _pin_interrupt(self, config: RunnableConfig, version: FilesVersion | None) -> None:
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if version is None or not checkpoint_id:
            return
        with self._lock:
            self._pin_on_put.discard(checkpoint_id)
            if checkpoint_id in self._record.pins:
                return
            try:
                listed = {s["id"]: s for s in self.mount.snapshots()}
                if version.snapshot not in listed:
                    logger.warning(
                        "vfsd: checkpoint %s waits at an interrupt but its snapshot %s is gone",
                        checkpoint_id,
                        version.snapshot,
                    )
                    return
                # A pin one of our own records holds is ours to release, not the user's.
                was_pinned = bool(listed[version.snapshot].get("pinned")) and not \
                    self._pinned_by_record(version.snapshot)
            except ControlError as exc:
                logger.warning("vfsd: could not pin %s: %s", version.snapshot, exc)
                return
            # Recorded before pinning: an interrupt (KeyboardInterrupt, a
            # cancelled task's thread cut short) between the two then leaves a
            # record whose release unpins, never a pin nothing releases.
            self._record.pins[checkpoint_id] = {
                "snapshot": version.snapshot,
                "was_pinned": was_pinned,
            }
            self._record.save()
            if was_pinned:
                return
            try:
                self.mount.pin_snapshot(version.snapshot, True)
            except ControlError as exc:
                logger.warning("vfsd: could not pin %s: %s", version.snapshot, exc)
                del self._record.pins[checkpoint_id]
                self._record.save()

    def _pinned_by_record(self, snapshot_id: str, besides: str | None = None) -> bool:
        """Whether a recorded interrupt pin (other than checkpoint `besides`'s)
        pinned `snapshot_id`: two checkpoints may name one snapshot."""
        with self._lock:
            return any(
                pin["snapshot"] == snapshot_id and not pin.get("was_pinned")
                for checkpoint_id, pin in self._record.pins.items()
                if checkpoint_id != besides
            )

    def _unpin(self, snapshot_id: str) -> None:
        try:
            self.mount.pin_snapshot(snapshot_id, False)
        except ControlError as exc:
            if exc.code != "not_found":
                logger.warning("vfsd: could not unpin %s: %s", snapshot_id, exc)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints; if it is the thread this run dir
        serves, the run dir is free for another (its files stay)."""
        self.saver.delete_thread(thread_id)
        self._release(str(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        await self.saver.adelete_thread(thread_id)
        await asyncio.to_thread(self._release, str(thread_id))

    def _release(self, thread_id: str) -> None:
        with self._lock:
            self._reload()
            if self._record.thread != thread_id:
                return
            # Unpinned first, then forgotten: an interrupt in between leaves
            # the record, and the next release unpins again.
            for pin in list(self._record.pins.values()):
                if not pin.get("was_pinned"):
                    self._unpin(pin["snapshot"])
            self._record.clear()
            self._versions.clear()
            self._pin_on_put.clear()

    # -- bookkeeping -------------------------------------------------------------------------------

    def _reload(self) -> None:
        """Read the run dir's record again (another process may have used it).

        In place: clones made by `with_allowlist` share the record object.
        """
        self._record.load()

    def _bind(self, thread: str) -> None:
        bound = self._record.thread
        if bound is None:
            self._record.thread = thread
            self._record.save()
        elif bound != thread:
            raise ThreadBindingError(
                f"run dir {self.mount.run_dir} serves graph thread {bound!r}; thread {thread!r} "
                "cannot use it (its files would overwrite that thread's). Give each thread its "
                "own run dir (mount_tool.mount(another_run_dir) and a VfsdCheckpointer on it), "
                "or start the new thread from a snapshot of this one: "
                "new = mount.fork(snapshot_id, new_run_dir) (snapshot ids of checkpoints: "
                "VfsdCheckpointer.snapshot_of(config))."
            )

    def _set_position(self, checkpoint_id: str, version: FilesVersion) -> None:
        position = {"checkpoint": checkpoint_id, "snapshot": version.snapshot, "run": version.run}
        if self._record.position != position:
            self._record.position = position
            self._record.save_position()

    def _remember(self, checkpoint_id: str, version: FilesVersion) -> None:
        self._versions[checkpoint_id] = version
        self._versions.move_to_end(checkpoint_id)
        while len(self._versions) > SNAPSHOT_CACHE_SIZE:
            self._versions.popitem(last=False)

    def _version_of(self, config: RunnableConfig) -> FilesVersion | None:
        """The files version of the checkpoint `config` addresses (None: none)."""
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if not checkpoint_id:
            return None
        with self._lock:
            known = self._versions.get(checkpoint_id)
        if known is not None:
            return known
        tup = self.saver.get_tuple(_plain(config))
        return FilesVersion.of(tup.metadata) if tup else None

    async def _aversion_of(self, config: RunnableConfig) -> FilesVersion | None:
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if not checkpoint_id:
            return None
        with self._lock:
            known = self._versions.get(checkpoint_id)
        if known is not None:
            return known
        tup = await self.saver.aget_tuple(_plain(config))
        return FilesVersion.of(tup.metadata) if tup else None


@dataclass
class _PutPlan:
    """What one `put` does about files, decided in the put's own context."""

    thread: str
    parent_id: str | None
    from_run: bool
    claimed: FilesVersion | None = None
    needs_parent: bool = False
    parent: FilesVersion | None = None
    moves_position: bool = False

    def __post_init__(self) -> None:
        self.needs_parent = not self.from_run and bool(self.parent_id)


def _with_version(metadata: CheckpointMetadata, version: FilesVersion | None) -> Any:
    # A copy: the loop may reuse its metadata dict for a later checkpoint.
    if version is None:
        return metadata
    return {**metadata, "vfsd": version.as_metadata()}


def _has_interrupt(config: RunnableConfig, writes: Sequence[tuple[str, Any]]) -> bool:
    if (config.get("configurable") or {}).get("checkpoint_ns"):
        return False
    return any(w[0] == INTERRUPT for w in writes)


def _plain(config: RunnableConfig) -> RunnableConfig:
    """`config` with only the keys that address a checkpoint."""
    conf = config.get("configurable") or {}
    keep = ("thread_id", "checkpoint_ns", "checkpoint_id")
    return {"configurable": {k: conf[k] for k in keep if k in conf}}


def _accepts_task_path(method: Any) -> bool:
    import inspect

    try:
        return "task_path" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


_warned_unwrapped: set[int] = set()


def warn_if_unwrapped(mount: Mount) -> None:
    """Log once per checkpointer when the running graph keeps checkpoints
    without a VfsdCheckpointer on `mount`: its rewinds would not bring the files
    back. Call from inside a node; does nothing elsewhere."""
    try:
        from langgraph.config import get_config

        conf = get_config().get("configurable") or {}
    except RuntimeError:
        return
    saver = conf.get("__pregel_checkpointer")
    if not isinstance(saver, BaseCheckpointSaver) or id(saver) in _warned_unwrapped:
        return
    if isinstance(saver, VfsdCheckpointer) and saver.mount.run_dir == mount.run_dir:
        return
    _warned_unwrapped.add(id(saver))
    logger.warning(
        "vfsd: the graph keeps checkpoints with %s, which does not snapshot %s: a replay, "
        "fork or resume will not bring the files back; wrap it: VfsdCheckpointer(saver, mount)",
        type(saver).__name__,
        mount.run_dir,
    )
