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

When is a snapshot taken. A checkpoint's snapshot holds its files at the
moment LangGraph captured its state (`mount_tool.langgraph.boundary`): LangGraph saves a
checkpoint in the background while the next superstep already runs, so a
snapshot taken inside `put` could catch the next step's writes. The graph's
boundary channel (in VfsdMiddleware's state, and FilesChannel) is called as
LangGraph builds the checkpoint; the snapshot is taken then (an async run: in
a worker thread, and the next step's file operations and tool calls wait for
it), and the `put`, whose background task copies the context right after,
finds it in a ContextVar. The checkpoints LangGraph writes before a run's
first task (its input, a fork of a past checkpoint) get the files captured at
the run's start. For a graph without a boundary channel, `get_next_version`
(which LangGraph calls at the step boundary when it compiled the graph with
this wrapper; LangGraph's server does not) takes the snapshot instead. A
checkpoint of a run for which nothing captured the files is written with
`metadata["vfsd"]["unbound"]` (why) and no snapshot: a run from it raises
SnapshotUnavailable, it is counted (`vfsd status`) and logged, and nothing
guesses its files. Snapshots are asked with `reuse`, so a step that changed no
file costs a round trip and no new snapshot.

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
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from ..errors import MountToolError
from ..mount import Mount
from ..runs import Runs, add_use_hook, lease, thread_key, thread_of
from . import runhooks
from .boundary import (
    CAPTURES,
    RUN_SCOPE,
    Capture,
    RunScope,
    RunState,
    run_of_context,
    run_started,
    running,
    wait_for_capture,
)
from .threadfiles import (
    NO_FILES,
    BadFilesMetadata,
    FilesVersion,
    PutPlan,
    ThreadFiles,
    copy_record,
    snapshot_seq,
)

try:  # LangGraph's names for these keys; private, so fall back to their values
    from langgraph._internal._constants import CONFIG_KEY_RUNTIME, INTERRUPT
except ImportError:  # pragma: no cover - other langgraph versions
    CONFIG_KEY_RUNTIME = "__pregel_runtime"
    INTERRUPT = "__interrupt__"

logger = logging.getLogger(__name__)

NO_FILES_VERSION = FilesVersion("", NO_FILES, 0)
PUBLISH_MODES = ("auto", "wait", "behind", "off")
ON_MISSING = ("raise", "keep")
# Idle threads whose state stays in memory (all of it is in the run dirs and the saver).
THREADS_KEPT = 1024
# Why a checkpoint of a run has no snapshot when nothing captured its step boundary.
NOT_CAPTURED = (
    "LangGraph wrote it without vfsd capturing the files at its step boundary: the graph "
    "has no vfsd boundary channel (VfsdMiddleware in a Deep Agents graph, a `files: "
    "FilesChannel` key in a StateGraph), and the wrapper's get_next_version was not called "
    "either (LangGraph's server wraps the checkpointer in an adapter of its own)")

# Why a run on a Runs with a remote cannot start without the run hooks.
NO_RUN_HOOKS = (
    "with a remote, VfsdCheckpointer holds a thread from a run's start to its end (the next "
    "run may be on another replica), and learns of the end from LangChain callbacks this "
    "graph run does not have: compile the graph with them, graph = builder.compile("
    "checkpointer=saver).with_config(callbacks=mount_tool.langgraph.run_hooks()) "
    "(create_vfsd_deep_agent adds them). Nothing was changed")

__all__ = ["BadFilesMetadata", "FilesVersion", "VfsdCheckpointer", "snapshot_seq"]


# -- the wrapper ----------------------------------------------------------------------------


class VfsdCheckpointer(BaseCheckpointSaver):
    """Wraps any LangGraph checkpointer so checkpoints also pin their files.

    `saver` does the storing (InMemorySaver, PostgresSaver, AsyncPostgresSaver,
    ...); every method not described here is the saver's own. `files` is
    where the files live: a `Runs` (`mount_tool.runs(ROOT)`: every thread its
    own run dir, the way LangGraph serves many threads with one graph and
    one checkpointer), or one `Mount` (one thread).

    - `put`/`aput` add `metadata["vfsd"] = {"run", "snapshot", "step"}`: the
      files at the step boundary where LangGraph captured the checkpoint's
      state (see the module docstring), or `{"snapshot": None, "unbound":
      why}` when nothing captured them (a run from such a checkpoint raises
      SnapshotUnavailable; `vfsd status` counts them).
    - `get_tuple`/`aget_tuple` at the start of a root graph run bring the
      thread's files to that checkpoint's snapshot first (see the module
      docstring).
    - A checkpoint whose snapshot is gone raises `SnapshotUnavailable` at the
      start of a run from it, naming the files that cannot come back;
      `on_missing="keep"` logs that and runs on the live files instead.
    - `delete_thread` removes the thread's files, snapshots and run dir
      (Runs); `copy_thread` gives the target thread the source's
      checkpoints, files and snapshots (a fork: no content copied), on any
      saver. `prune` and `delete_for_runs` exist when the saver has them, and
      then release the snapshots of the checkpoints they drop.
    - With one Mount, the first thread that runs or writes a checkpoint is
      bound to it (persisted in the run dir); any other thread gets
      `ThreadBindingError`.
    - A checkpoint that waits at an interrupt (`interrupt()` in a node) gets
      its snapshot pinned until the thread moves past it.

    Subgraph checkpoints (a non-empty `checkpoint_ns`) carry no snapshot of
    their own: the files follow the root graph's checkpoints.
    """

    def __new__(cls, saver: Any = None, *args: Any, **kwargs: Any) -> VfsdCheckpointer:
        # The methods LangGraph treats as optional capabilities (the server and
        # the conformance suite look for them on the class) exist only when
        # the wrapped saver has them.
        return super().__new__(_class_for(cls, saver))

    def __init__(
        self,
        saver: BaseCheckpointSaver,
        files: Mount | Runs,
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
        if not isinstance(files, Mount | Runs):
            raise TypeError(f"files must be a mount_tool Mount or Runs, not {type(files)!r}")
        if on_missing not in ON_MISSING:
            raise ValueError(f"on_missing must be one of {ON_MISSING}, not {on_missing!r}")
        if publish not in PUBLISH_MODES:
            raise ValueError(f"publish must be one of {PUBLISH_MODES}, not {publish!r}")
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise ValueError(f"max_lag must be an integer >= 0, not {max_lag!r}")
        if not isinstance(sync_timeout, int | float) or sync_timeout <= 0:
            raise ValueError(f"sync_timeout must be a positive number, not {sync_timeout!r}")
        self.saver = saver
        self.files = files
        self.runs = files if isinstance(files, Runs) else None
        self.on_missing = on_missing
        self.files_key = files_key
        self.publish = publish
        self.max_lag = max_lag
        self.sync_timeout = float(sync_timeout)
        self._threads: OrderedDict[str, ThreadFiles] = OrderedDict()
        self._threads_lock = threading.Lock()
        self._inner_task_path = _accepts_task_path(saver.put_writes)
        self._inner_atask_path = _accepts_task_path(saver.aput_writes)
        add_use_hook(files, self._step_gate)
        if self.runs is None:
            with self._thread_files(None):  # reads the binding now, as it always did
                pass

    @property
    def mount(self) -> Mount:
        """The Mount of the one-mount form (AttributeError with a Runs)."""
        if self.runs is not None:
            raise AttributeError("this VfsdCheckpointer serves a Runs: runs.get(thread_id)")
        return self.files  # type: ignore[return-value]

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
        if name.startswith("__") or name in ("saver", "files", "runs"):
            raise AttributeError(name)
        return getattr(self.saver, name)

    def __repr__(self) -> str:
        return f"VfsdCheckpointer({self.saver!r}, {self.files!r})"

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

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]) -> Any:
        return self.saver.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Any:
        return await self.saver.aget_delta_channel_history(config=config, channels=channels)

    # -- threads -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _thread_files(self, thread: str | None) -> Iterator[ThreadFiles]:
        """The thread's state with its mount held (worker threads: may mount)."""
        with lease(self.files, thread, hooks=False) as m, self._state(m) as tf:
            yield tf

    @contextlib.contextmanager
    def _state(self, m: Mount) -> Iterator[ThreadFiles]:
        """The state of the run dir `m` mounts, while `m` is held."""
        key = str(m.state_dir)
        with self._threads_lock:
            tf = self._threads.get(key)
            if tf is not None:
                self._threads.move_to_end(key)
                tf.users += 1
        if tf is None:
            fresh = ThreadFiles(self, m.state_dir)  # reads the record: not under the lock
            with self._threads_lock:
                tf = self._threads.setdefault(key, fresh)
                tf.users += 1
                self._forget_idle()
        tf.mount = m
        try:
            yield tf
        finally:
            with self._threads_lock:
                tf.users -= 1

    def _forget_idle(self) -> None:
        """Drop the state of idle threads beyond THREADS_KEPT (it is all in the
        run dirs and the saver); _threads_lock held."""
        excess = len(self._threads) - THREADS_KEPT
        for key in list(self._threads):
            if excess <= 0:
                break
            tf = self._threads[key]
            if not tf.busy:
                del self._threads[key]
                excess -= 1

    def _state_key(self, thread: str) -> str:
        """The key of a thread's state (its run dir's state directory; no I/O)."""
        if self.runs is not None:
            return str(self.runs.run_dir(thread) / ".vfsd")
        return str(self.mount.state_dir)

    def _known(self, thread: str, checkpoint_id: str | None) -> FilesVersion | None:
        """A checkpoint's files version if this process decided it (no I/O)."""
        with self._threads_lock:
            tf = self._threads.get(self._state_key(thread))
        return tf.known(checkpoint_id) if tf is not None else None

    def _expected_run(self, thread: str | None) -> str | None:
        """The run id a thread's files must be in, when the Runs fixes it."""
        if self.runs is None or thread is None:
            return None
        return self.runs.expected_run(thread)

    def _label(self, thread: str, checkpoint_id: str, metadata: Mapping[str, Any] | None) -> str:
        """A snapshot label that reads like the history: thread, checkpoint, step."""
        shown = "".join(c if c.isprintable() else "?" for c in thread[:40])
        step = (metadata or {}).get("step")
        label = f"{shown} ckpt {checkpoint_id}"
        if isinstance(step, int):
            label += f", step {step}"
        return label[:200]

    def _step_gate(self, thread: str | None, m: Mount) -> None:
        """Before a file operation inside a graph run: wait until the files of the
        checkpoint the step starts from are captured (see `mount_tool.langgraph.boundary`)."""
        if thread is not None:
            wait_for_capture(thread)

    # -- what a checkpoint holds ---------------------------------------------------

    def snapshot_of(self, config: RunnableConfig) -> str | None:
        """The snapshot id recorded for the checkpoint `config` addresses (None:
        no such checkpoint, or one written without this wrapper). Fork a new
        run dir from it with `mount.fork(id, new_run_dir)`."""
        tup = self.saver.get_tuple(config)
        version = FilesVersion.of(tup.metadata, strict=True) if tup else None
        return version.snapshot if version and version.unbound is None else None

    def restorable(self, config: RunnableConfig) -> bool:
        """Whether a run from the checkpoint `config` addresses gets its files
        back (its snapshot is retained, or it needs none)."""
        tup = self.saver.get_tuple(config)
        if tup is None:
            return False
        version = FilesVersion.of(tup.metadata, strict=True)
        if version is None or version.snapshot == NO_FILES:
            return True
        thread = thread_of(tup.config)
        with self._thread_files(thread) as tf:
            state = tf.m.snapshot_state()
            where = tf.where(tup.checkpoint["id"], version, state)
            if where in ("exact", "after"):
                return True
            if where in ("foreign", "unbound"):
                return False
            return version.snapshot in {s["id"] for s in tf.m.snapshots()}

    # -- reading: a run start aligns the files ------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The saver's tuple; at the start of a root graph run, the thread's
        files are first brought to that checkpoint's files (with a remote, the
        thread is held for the run first, then its checkpoint read)."""
        start = self._run_start(config)
        if start is not None and self.replicated:
            self._claim_run(start, "sync")
            self._hold_run(start)
        tup = self.saver.get_tuple(config)
        if start is not None:
            self._begin_run(start, tup)
            RUN_SCOPE.set(RunScope(start))
        return tup

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        start = self._run_start(config)
        if start is not None and self.replicated:
            self._claim_run(start, "async")  # in this context, where the hook left it
            await asyncio.to_thread(self._hold_run, start)
        tup = await self.saver.aget_tuple(config)
        if start is not None:
            await asyncio.to_thread(self._begin_run, start, tup)
            RUN_SCOPE.set(RunScope(start))
        return tup

    # -- replicas: a run holds its thread from its start to its end ------------------------

    @property
    def replicated(self) -> bool:
        """Whether the files are a Runs with a remote (replicas sharing a bucket)."""
        return self.runs is not None and self.runs.remote is not None

    def _claim_run(self, start: RunState, mode: str) -> None:
        """Name the starting run by its LangChain run id (`runhooks`) and have
        its end give the thread back; MountToolError for a graph run without
        the hooks (in the run's own context: the hook left the id there)."""
        run_id = runhooks.claim_start()
        if run_id is None:
            raise MountToolError(NO_RUN_HOOKS)
        start.token = str(run_id)
        # Registered before the lease is asked for: whatever happens from here
        # on, the run's end gives back what it may hold.
        runhooks.register(run_id, mode, lambda error: self._end_run(start, error))

    def _hold_run(self, start: RunState) -> None:
        """Hold the thread for the run (worker thread): caught up with the
        bucket, waiting for another run of it to end (ThreadBusy after the
        Runs' `lease_wait`)."""
        assert start.token is not None
        with self._thread_files(start.thread) as tf:
            tf.hold(start.token)

    def _end_run(self, start: RunState, error: BaseException | None) -> None:
        """The run is over (its hooks say so; worker thread or the sync run's):
        the files it left after its last checkpoint kept in a snapshot, every
        snapshot published, then the thread free for its next run anywhere."""
        capture = start.capture
        pending = capture.pending() if capture is not None else None
        if pending is not None:  # a boundary's snapshot still being taken
            with contextlib.suppress(Exception):
                pending.result(timeout=self.sync_timeout)
        assert start.token is not None
        with self._thread_files(start.thread) as tf:
            tf.end_run(start.token)

    @contextlib.contextmanager
    def _outside_run(self, tf: ThreadFiles, plan: PutPlan) -> Iterator[None]:
        """With a remote, a checkpoint written outside a graph run (update_state)
        holds its thread for its own work, as a run would."""
        if not self.replicated or plan.from_run:
            yield
            return
        token = f"update-{uuid.uuid4()}"
        tf.hold(token)
        try:
            yield
        except BaseException:
            tf.let_go(token)
            raise
        tf.let_go(token, strict=True)

    def _holding(self, thread: str, purpose: str) -> contextlib.AbstractContextManager:
        """The thread held for work outside graph runs (a prune, a copy's
        checkpoints) with a remote; nothing to hold without one."""
        if not self.replicated:
            return contextlib.nullcontext()
        assert self.runs is not None
        return self.runs.hold(thread, token=f"{purpose}-{uuid.uuid4()}")

    def _run_start(self, config: RunnableConfig) -> RunState | None:
        """The run starting here, or None (not a run start).

        LangGraph puts its Runtime in the config of every checkpointer call a
        run makes, and in none that `get_state`/`update_state` make. A run's
        first root `get_tuple` is its start; later ones in the same run (the
        check for a newer checkpoint when replaying) are reads. A subgraph's
        (a `checkpoint_ns`) marks its context as a subgraph's: its step
        boundaries are not the root's, whose capture its tasks still wait for.
        """
        conf = config.get("configurable") or {}
        runtime = conf.get(CONFIG_KEY_RUNTIME)
        scope = RUN_SCOPE.get()
        if runtime is None:
            # Outside a run (get_state, update_state): forget the last run, but
            # not while a starting run builds its channels (reading the history
            # of delta channels makes such calls).
            if scope is not None and not scope.run.building:
                RUN_SCOPE.set(None)
            return None
        if conf.get("checkpoint_ns"):
            if scope is not None and not scope.subgraph:
                RUN_SCOPE.set(replace(scope, subgraph=True))
            return None
        thread = thread_of(config)
        current = running(thread)
        if current is not None and current.runtime is runtime:
            return None
        return RunState(self, runtime, thread)

    def _begin_run(self, start: RunState, tup: CheckpointTuple | None) -> None:
        """Align the files with the checkpoint the run starts from, and capture
        them (worker thread; no task of the run runs yet)."""
        label = self._label(start.thread, tup.checkpoint["id"] if tup else "(new)",
                            tup.metadata if tup else None) + " (run start)"
        with self._thread_files(start.thread) as tf:
            start.start = Capture(tf.begin_run(start.thread, tup, label))
        run_started(start)

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

    def _capture(self, run: RunState) -> None:
        """Capture the files at a step boundary of `run` (its boundary channel,
        or `get_next_version`, on the loop's thread)."""
        run.building = False
        label = self._label(run.thread, "(next)", None)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a sync run: take it now, no task runs
            taken: FilesVersion | Future = self._take_for(run.thread, label)
        else:
            # On the event loop (an async run): never block it. The snapshot is
            # taken in a worker thread; the next step's tasks and the put wait for it.
            taken = CAPTURES.submit(run.thread, lambda: self._take_for(run.thread, label))
        run.capture = capture = Capture(taken)
        RUN_SCOPE.set(RunScope(run, capture))  # for the put LangGraph submits right after

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The saver's next version. In a root graph run whose graph has no
        boundary channel, also capture the files: LangGraph calls this on the
        loop's thread between supersteps, before it hands the step's checkpoint
        to `put`, when it compiled the graph with this wrapper (see the module
        docstring)."""
        version = self.saver.get_next_version(current, channel)
        run = run_of_context()
        if run is None or run.owner is not self or run.hooked:
            return version
        # Called once per channel that changed: the later calls reuse the
        # snapshot the first one took (one round trip each, no new snapshot).
        self._capture(run)
        return version

    def _take_for(self, thread: str, label: str) -> FilesVersion:
        with self._thread_files(thread) as tf:
            return tf.take(label)

    def _claim(self, thread: str, runtime: Any, checkpoint: Checkpoint,
               metadata: CheckpointMetadata) -> tuple[Capture | None, str | None]:
        """The capture of this put's checkpoint (in the put's own context), or
        why there is none."""
        run = running(thread)
        if run is None or run.runtime is not runtime:
            return None, NOT_CAPTURED
        run.building = False
        if _before_any_task(metadata):
            # Its input, a fork at the start, an exit run's stand-in parent: the
            # files the run started from.
            return run.start, None if run.start is not None else NOT_CAPTURED
        scope = RUN_SCOPE.get()
        capture = scope.capture if scope is not None and scope.run is run else None
        if capture is None:
            return None, NOT_CAPTURED
        with self._threads_lock:
            if capture.claimed_by is not None:
                return None, (f"the files captured at its step boundary went to checkpoint "
                              f"{capture.claimed_by}: LangGraph wrote two checkpoints without "
                              "a boundary between them")
            capture.claimed_by = checkpoint["id"]
        return capture, None

    # -- writing ----------------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Record the snapshot holding this checkpoint's files, then store it."""
        plan = self._plan_put(config, checkpoint, metadata)
        if plan is None:
            return self.saver.put(config, checkpoint, metadata, new_versions)
        if self._has_no_files(plan):
            return self.saver.put(config, checkpoint, _with_version(metadata, NO_FILES_VERSION),
                                  new_versions)
        if plan.needs_parent:
            plan.parent = self._version_of(config)
        with contextlib.ExitStack() as stack:
            tf, version, meta = self._open_put(stack, plan, checkpoint, metadata)
            stored = self.saver.put(config, checkpoint, meta, new_versions)
            tf.after_put(plan, checkpoint["id"], version)
        return stored

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        plan = self._plan_put(config, checkpoint, metadata)
        if plan is None:
            return await self.saver.aput(config, checkpoint, metadata, new_versions)
        if await asyncio.to_thread(self._has_no_files, plan):
            return await self.saver.aput(
                config, checkpoint, _with_version(metadata, NO_FILES_VERSION), new_versions)
        if plan.needs_parent:
            plan.parent = self._known(plan.thread, plan.parent_id) or \
                await self._aversion_of(config)
        async with _let_go_in_worker() as stack:
            # One worker hop for the holds and the files version (it was three).
            tf, version, meta = await _enter_in_worker(
                self._open_put, stack, plan, checkpoint, metadata)
            stored = await self.saver.aput(config, checkpoint, meta, new_versions)
            await asyncio.to_thread(tf.after_put, plan, checkpoint["id"], version)
        return stored

    def _open_put(self, stack: contextlib.ExitStack, plan: PutPlan, checkpoint: Checkpoint,
                  metadata: CheckpointMetadata) -> tuple[ThreadFiles, FilesVersion, Any]:
        """Hold the thread's files (and its run, outside one) on `stack`; the
        files version of the checkpoint and its metadata (`_prepare_put`)."""
        tf = stack.enter_context(self._thread_files(plan.thread))
        stack.enter_context(self._outside_run(tf, plan))
        return (tf, *self._prepare_put(tf, plan, checkpoint, metadata))

    def _has_no_files(self, plan: PutPlan) -> bool:
        """A checkpoint written outside a run for a thread that has no run dir
        yet: its files are none, and no daemon is needed to say so."""
        return self.runs is not None and not self.replicated and not plan.from_run and \
            not self.runs.exists(plan.thread)

    def _prepare_put(self, tf: ThreadFiles, plan: PutPlan, checkpoint: Checkpoint,
                     metadata: CheckpointMetadata) -> tuple[FilesVersion, Any]:
        """The files version of a checkpoint about to be stored and its metadata,
        after the durability rule (worker thread)."""
        version = tf.files_version(plan, checkpoint, metadata)
        tf.before_store(version)
        with tf.cache_lock:  # before storing: its interrupt's writes may come first
            tf.remember(checkpoint["id"], version)
        return version, _with_version(metadata, version, tf.remote_of(version))

    def _plan_put(self, config: RunnableConfig, checkpoint: Checkpoint,
                  metadata: CheckpointMetadata) -> PutPlan | None:
        conf = config.get("configurable") or {}
        if conf.get("checkpoint_ns"):
            return None  # a subgraph's checkpoint: the root's carries the files
        runtime = conf.get(CONFIG_KEY_RUNTIME)
        plan = PutPlan(
            thread=thread_of(config),
            parent_id=conf.get("checkpoint_id"),
            from_run=runtime is not None,
        )
        if runtime is not None:  # in this put's own context
            plan.capture, plan.unbound = self._claim(plan.thread, runtime, checkpoint, metadata)
        return plan

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every snapshot a stored checkpoint names is published
        (`publish="behind"`); SnapshotNotPublished if they are not all in
        within `timeout` seconds in total (default `sync_timeout`; this call's
        only, later puts keep `sync_timeout`)."""
        timeout = self.sync_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number, not {timeout!r}")
        deadline = time.monotonic() + timeout
        with self._threads_lock:
            waiting = [tf.record.thread for tf in self._threads.values() if tf.unpublished]
        for thread in waiting:
            if thread is None:
                continue
            with self._thread_files(thread) as tf:
                if tf.publish_mode() != "off":
                    tf.flush(deadline, timeout)

    async def aflush(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.flush, timeout)

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
        if _has_interrupt(config, writes):
            checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
            with self._thread_files(thread_of(config)) as tf:
                if not tf.pin_when_known(checkpoint_id):
                    tf.pin_interrupt(checkpoint_id, self._version_of(config))

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
        if not _has_interrupt(config, writes):
            return
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        thread = thread_of(config)
        async with _let_go_in_worker() as stack:
            tf = await _enter_in_worker(stack.enter_context, self._thread_files(thread))
            if not await asyncio.to_thread(tf.pin_when_known, checkpoint_id):
                version = await self._aversion_of(config)
                await asyncio.to_thread(tf.pin_interrupt, checkpoint_id, version)

    # -- thread lifecycle ------------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, then its files: with a Runs, its
        run dir, files and snapshots go; with one Mount, the run dir is free
        for another thread (its files stay)."""
        self.saver.delete_thread(thread_id)
        self._delete_files(thread_key(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        await self.saver.adelete_thread(thread_id)
        await asyncio.to_thread(self._delete_files, thread_key(thread_id))

    def _delete_files(self, thread: str) -> None:
        if self.runs is None:
            with self._thread_files(thread) as tf:
                tf.release(thread)
            return
        with self._threads_lock:
            key = str(self.runs.run_dir(thread) / ".vfsd")
            self._threads.pop(key, None)
        self.runs.delete(thread)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Give `target_thread_id` the source's checkpoints (through the saver's
        own list/put/put_writes, so on any saver), files and snapshots (with a
        Runs: a copy of the source's run dir that shares its content)."""
        source, target = thread_key(source_thread_id), thread_key(target_thread_id)
        if source == target:
            raise ValueError("copy_thread: the source and the target are the same thread")
        tuples = sorted(self.saver.list({"configurable": {"thread_id": source_thread_id}}),
                        key=lambda t: t.checkpoint["id"])
        copied = self._copy_files(source, target, bool(tuples))
        with self._holding(target, "copy") if copied is not None else contextlib.nullcontext():
            for tup in tuples:
                stored = self.saver.put(*_copy_args(tup, target_thread_id, copied))
                for task_id, writes in _writes_by_task(tup):
                    self.saver.put_writes(stored, writes, task_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source, target = thread_key(source_thread_id), thread_key(target_thread_id)
        if source == target:
            raise ValueError("copy_thread: the source and the target are the same thread")
        tuples = [t async for t in self.saver.alist(
            {"configurable": {"thread_id": source_thread_id}})]
        tuples.sort(key=lambda t: t.checkpoint["id"])
        copied = await asyncio.to_thread(self._copy_files, source, target, bool(tuples))
        async with _let_go_in_worker() as stack:
            if copied is not None:
                await _enter_in_worker(stack.enter_context, self._holding(target, "copy"))
            for tup in tuples:
                stored = await self.saver.aput(*_copy_args(tup, target_thread_id, copied))
                for task_id, writes in _writes_by_task(tup):
                    await self.saver.aput_writes(stored, writes, task_id)

    def _copy_files(self, source: str, target: str,
                    has_checkpoints: bool) -> dict[str, Any] | None:
        """Copy the source's files to the target; with a remote, the daemon's
        `remote_copy` answer (the copy's run and which snapshots it holds),
        else None."""
        if self.runs is None:
            raise MountToolError(
                "copy_thread needs a VfsdCheckpointer on a Runs (mount_tool.runs(ROOT)): one "
                "Mount serves one thread, and a copy needs a run dir of its own")
        if not self.replicated and not self.runs.exists(source):
            if has_checkpoints:
                logger.info("vfsd: thread %r has checkpoints but no files to copy", source[:200])
            return None
        # The copy gets this wrapper's record too, before it is marked complete.
        m = self.runs.copy(source, target, before_done=lambda source_state, target_state:
                           copy_record(source_state, target_state, target))
        if m is None and has_checkpoints:
            logger.info("vfsd: thread %r has checkpoints but no files to copy", source[:200])
        return m.copy_info if m is not None else None

    def _release_snapshots(self, threads: Iterable[str]) -> None:
        """Delete the snapshots of `threads` that no stored checkpoint names any
        more (after prune and delete_for_runs)."""
        for thread in threads:
            if self.runs is not None and not self.replicated and not self.runs.exists(thread):
                continue
            # With a remote, inside a hold of the thread: the head then lists what
            # is kept, and every replica drops the rest at its next run.
            with self._holding(thread, "prune"):
                named = {v.snapshot for v in (
                    FilesVersion.of(t.metadata) for t in self.saver.list(
                        {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}))
                    if v is not None and v.unbound is None}
                with self._thread_files(thread) as tf:
                    tf.release_unnamed(named)

    async def _arelease_snapshots(self, threads: Iterable[str]) -> None:
        for thread in threads:
            if self.runs is not None and not self.replicated and \
                    not await asyncio.to_thread(self.runs.exists, thread):
                continue
            async with _let_go_in_worker() as stack:
                await _enter_in_worker(stack.enter_context, self._holding(thread, "prune"))
                named = set()
                async for t in self.saver.alist(
                        {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}):
                    v = FilesVersion.of(t.metadata)
                    if v is not None and v.unbound is None:
                        named.add(v.snapshot)

                def release(thread: str = thread, named: set[str] = named) -> None:
                    with self._thread_files(thread) as tf:
                        tf.release_unnamed(named)

                await asyncio.to_thread(release)

    def _threads_of_runs(self, run_ids: Sequence[str]) -> set[str]:
        threads: set[str] = set()
        for run_id in run_ids:
            for tup in self.saver.list(None, filter={"run_id": run_id}):
                threads.add(thread_of(tup.config))
        return threads

    async def _athreads_of_runs(self, run_ids: Sequence[str]) -> set[str]:
        threads: set[str] = set()
        for run_id in run_ids:
            async for tup in self.saver.alist(None, filter={"run_id": run_id}):
                threads.add(thread_of(tup.config))
        return threads

    # -- bookkeeping -------------------------------------------------------------------------------

    def _version_of(self, config: RunnableConfig) -> FilesVersion | None:
        """The files version of the checkpoint `config` addresses (None: none)."""
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if not checkpoint_id:
            return None
        known = self._known(thread_of(config), checkpoint_id)
        if known is not None:
            return known
        tup = self.saver.get_tuple(_plain(config))
        return FilesVersion.of(tup.metadata, strict=True) if tup else None

    async def _aversion_of(self, config: RunnableConfig) -> FilesVersion | None:
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if not checkpoint_id:
            return None
        known = self._known(thread_of(config), checkpoint_id)
        if known is not None:
            return known
        tup = await self.saver.aget_tuple(_plain(config))
        return FilesVersion.of(tup.metadata, strict=True) if tup else None


async def _enter_in_worker(func, *args):
    """`func(*args)` in a worker thread, for one that puts holds on a
    `_let_go_in_worker` stack. Cancelled, it still waits for the worker to
    finish before the cancellation goes on: the stack is then closed after
    the holds are on it, never while the worker is still taking them."""
    work = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        raise


@contextlib.asynccontextmanager
async def _let_go_in_worker() -> AsyncIterator[contextlib.ExitStack]:
    """An ExitStack for the holds an async method takes (a thread's files, a
    run of it), let go in a worker thread, when the block fails or is
    cancelled too: letting go may wait for a daemon, or give a run back to
    the bucket, which must not hold up the event loop."""
    stack = contextlib.ExitStack()
    try:
        yield stack
    except BaseException:
        await asyncio.shield(asyncio.to_thread(stack.close))
        raise
    await asyncio.to_thread(stack.close)


# The optional capabilities, each present only when the saver has its own.


def _prune(self: VfsdCheckpointer, thread_ids: Sequence[str], *,
           strategy: str = "keep_latest") -> None:
    """The saver's `prune`; then the snapshots of the dropped checkpoints go."""
    self.saver.prune(thread_ids, strategy=strategy)
    self._release_snapshots(thread_key(t) for t in thread_ids)


async def _aprune(self: VfsdCheckpointer, thread_ids: Sequence[str], *,
                  strategy: str = "keep_latest") -> None:
    await self.saver.aprune(thread_ids, strategy=strategy)
    await self._arelease_snapshots([thread_key(t) for t in thread_ids])


def _delete_for_runs(self: VfsdCheckpointer, run_ids: Sequence[str]) -> None:
    """The saver's `delete_for_runs`; then the snapshots of the dropped checkpoints go."""
    threads = self._threads_of_runs(run_ids)
    self.saver.delete_for_runs(run_ids)
    self._release_snapshots(threads)


async def _adelete_for_runs(self: VfsdCheckpointer, run_ids: Sequence[str]) -> None:
    threads = await self._athreads_of_runs(run_ids)
    await self.saver.adelete_for_runs(run_ids)
    await self._arelease_snapshots(threads)


_OPTIONAL_METHODS = {
    "prune": _prune,
    "aprune": _aprune,
    "delete_for_runs": _delete_for_runs,
    "adelete_for_runs": _adelete_for_runs,
}
_CLASSES: dict[tuple[type, frozenset[str]], type] = {}


def _class_for(cls: type, saver: Any) -> type:
    """`cls`, or a subclass of it with the optional methods `saver`'s class overrides."""
    if not isinstance(saver, BaseCheckpointSaver):
        return cls
    have = frozenset(name for name in _OPTIONAL_METHODS
                     if getattr(type(saver), name, None) is not getattr(BaseCheckpointSaver, name))
    if not have:
        return cls
    key = (cls, have)
    if key not in _CLASSES:
        methods = {name: _OPTIONAL_METHODS[name] for name in have}
        _CLASSES[key] = type(cls.__name__, (cls,), {**methods, "__module__": cls.__module__,
                                                    "__qualname__": cls.__qualname__})
    return _CLASSES[key]


def _copy_args(tup: CheckpointTuple, target_thread_id: str,
               copied: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
    """The arguments of the `put` that copies `tup` to the target thread.
    `copied` (a copy in the bucket: {"run", "copied_from": {"run", "upto"}}):
    a checkpoint naming a snapshot the copy holds names the copy's run."""
    conf = tup.config.get("configurable") or {}
    config: dict[str, Any] = {"configurable": {
        "thread_id": target_thread_id, "checkpoint_ns": conf.get("checkpoint_ns", "")}}
    parent = (tup.parent_config or {}).get("configurable") or {}
    if parent.get("checkpoint_id"):
        config["configurable"]["checkpoint_id"] = parent["checkpoint_id"]
    metadata = dict(tup.metadata or {})
    if "thread_id" in metadata:
        metadata["thread_id"] = target_thread_id
    if copied is not None:
        metadata = _in_copied_run(metadata, copied)
    checkpoint = tup.checkpoint
    return config, checkpoint, metadata, dict(checkpoint.get("channel_versions") or {})


def _in_copied_run(metadata: dict[str, Any], copied: Mapping[str, Any]) -> dict[str, Any]:
    """A copied checkpoint's metadata naming the copy's run when the copy holds
    its snapshot (the same id, published before the copy); else as it was (a
    snapshot the copy lacks: a run from it says so)."""
    version = FilesVersion.of(metadata)
    origin = copied.get("copied_from") or {}
    if version is None or version.unbound is not None or version.snapshot == NO_FILES:
        return metadata
    if version.run != origin.get("run") or version.snapshot not in (copied.get("snapshots") or ()):
        return metadata
    return {**metadata, "vfsd": {**metadata["vfsd"], "run": str(copied["run"])}}


def _writes_by_task(tup: CheckpointTuple) -> list[tuple[str, list[tuple[str, Any]]]]:
    by_task: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in tup.pending_writes or ():
        by_task.setdefault(task_id, []).append((channel, value))
    return list(by_task.items())


def _with_version(metadata: CheckpointMetadata, version: FilesVersion | None,
                  remote: str | None = None) -> Any:
    # A copy: the loop may reuse its metadata dict for a later checkpoint.
    if version is None:
        return metadata
    recorded = version.as_metadata()
    if remote:
        recorded["remote"] = remote
    return {**metadata, "vfsd": recorded}


def _before_any_task(metadata: Mapping[str, Any]) -> bool:
    """Whether LangGraph writes this checkpoint of a run before the run's first
    task: its input, a fork of the checkpoint a replay starts from, or (with
    durability="exit") the empty stand-in parent of a new thread (step -2)."""
    return metadata.get("source") in ("input", "fork") or metadata.get("step") == -2


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


def warn_if_unwrapped(files: Mount | Runs) -> None:
    """Log once per checkpointer when the running graph keeps checkpoints
    without a VfsdCheckpointer on `files`: its rewinds would not bring the files
    back. Call from inside a node; does nothing elsewhere."""
    try:
        from langgraph.config import get_config

        conf = get_config().get("configurable") or {}
    except RuntimeError:
        return
    saver = conf.get("__pregel_checkpointer")
    if not isinstance(saver, BaseCheckpointSaver) or id(saver) in _warned_unwrapped:
        return
    inner = getattr(saver, "_inner", saver)  # the LangGraph server's adapter wraps ours
    if isinstance(inner, VfsdCheckpointer) and _same_files(inner.files, files):
        return
    _warned_unwrapped.add(id(saver))
    logger.warning(
        "vfsd: the graph keeps checkpoints with %s, which does not snapshot %s: a replay, "
        "fork or resume will not bring the files back; wrap it: VfsdCheckpointer(saver, %s)",
        type(inner).__name__,
        files.root if isinstance(files, Runs) else files.run_dir,
        "runs" if isinstance(files, Runs) else "mount",
    )


def _same_files(a: Mount | Runs, b: Mount | Runs) -> bool:
    if a is b:
        return True
    if isinstance(a, Mount) and isinstance(b, Mount):
        return a.run_dir == b.run_dir
    if isinstance(a, Runs) and isinstance(b, Runs):
        return a.root == b.root
    return False
