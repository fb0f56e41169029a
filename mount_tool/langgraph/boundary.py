"""Step boundaries: the moment LangGraph captures a graph's state, when vfsd captures its files.

LangGraph builds each checkpoint synchronously between supersteps
(`create_checkpoint`), and calls `checkpoint()` on every channel that has a
version exactly then, and only when a checkpoint is really made (with
`durability="exit"`, only at the end). It hands the checkpoint to the saver
in a background task, so with a saver whose `put` takes time the next
superstep already runs (and writes files) while the `put` of the previous
checkpoint waits for the database.

So the files are captured where the state is: `BoundaryChannel`, a private
channel in the state of every graph `VfsdMiddleware` builds
(`vfsd_boundary`), and `FilesChannel`'s channel
(`mount_tool.langgraph.FilesAggregate`), call `at_boundary()` from
`checkpoint()`. The channel knows its run: `VfsdCheckpointer.get_tuple`
starts a `RunState` at the root run's start and sets `RUN_SCOPE` in that
context, where LangGraph builds the run's channels right after (a
subgraph's `get_tuple` marks its own context as a subgraph's, whose channels
then belong to no run: its boundaries are the root's business). A sync run
takes the snapshot right there; an async run never blocks its event loop:
the snapshot is taken in a worker thread (one after the other per thread, so
boundaries never reorder), and the capture is

- set in `RUN_SCOPE` of the current context, which the checkpoint's `put`
  task copies right after: it finds the capture of its own checkpoint,
  however late it runs;
- the run's latest capture, which every task of the next superstep waits for
  before touching files: every mount_tool file operation
  (`wait_for_capture`, a use hook on the Mount or Runs), and VfsdMiddleware's
  tool and model calls (`await_capture`), so any tool of a Deep Agents graph,
  `execute` and user tools included. Tasks find their run by their thread
  (`running`), not by context: a server iterates a run's stream from
  several tasks, each with a context of its own.

This works the same whoever compiles the graph and whatever wraps the
checkpointer (LangGraph's server calls no other method of the wrapper there).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from langgraph.channels.base import BaseChannel
from langgraph.errors import EmptyChannelError

from ..runs import ThreadIdError, current_config, thread_of
from .threadfiles import FilesVersion

try:  # LangGraph's "no value" marker; private, so fall back to an object of our own
    from langgraph._internal._typing import MISSING
except ImportError:  # pragma: no cover - other langgraph versions
    MISSING = object()

#: what BoundaryChannel stores in a checkpoint (it has no value of its own)
BOUNDARY_MARK = "vfsd"
#: worker threads taking async runs' step-boundary snapshots
CAPTURE_WORKERS = 8
#: the latest root runs kept by thread besides those still running (a run holds
#: no daemon, only its captures)
RUNS_KEPT = 4096


# -- what a run keeps in its context -------------------------------------------------------


class Capture:
    """The files at one step boundary, or at a run's start: a snapshot taken, or
    being taken (a Future, in a worker thread). `claimed_by`: the checkpoint
    that a boundary's capture went to (one only)."""

    __slots__ = ("claimed_by", "taken")

    def __init__(self, taken: FilesVersion | Future) -> None:
        self.taken = taken
        self.claimed_by: str | None = None

    def version(self) -> FilesVersion:
        """The snapshot (waits for it: a worker thread, or a sync run's thread)."""
        return self.taken.result() if isinstance(self.taken, Future) else self.taken

    def pending(self) -> Future | None:
        """The Future while the snapshot is still being taken, else None."""
        if isinstance(self.taken, Future) and not self.taken.done():
            return self.taken
        return None


@dataclass(eq=False)
class RunState:
    """One root graph run, shared by every context of the run.

    `start`: the files at the run's start; `capture`: the latest step
    boundary's; `hooked`: the graph has a channel that calls `at_boundary`
    (it built one at the run's start), so the wrapper's `get_next_version`
    stays quiet; `building`: the run has started and LangGraph builds its
    channels (until its first step boundary or checkpoint); `token`: with
    replicas, the name the run holds its thread under (its LangChain run id).
    """

    owner: Any  # the VfsdCheckpointer
    runtime: Any
    thread: str
    start: Capture | None = None
    capture: Capture | None = None
    hooked: bool = False
    building: bool = True
    token: str | None = None  # with replicas: the run's name while it holds its thread


@dataclass(frozen=True)
class RunScope:
    """What a context of a root run holds: its run and the last boundary's
    capture. Immutable: each boundary sets a new one, so a `put` running late
    in the background still sees the capture of its own checkpoint."""

    run: RunState
    capture: Capture | None = None
    subgraph: bool = False


#: the scope of the root graph run the current context belongs to
RUN_SCOPE: ContextVar[RunScope | None] = ContextVar("vfsd_run_scope", default=None)

# The latest runs by thread: the RUNS_KEPT most recent, and any other still
# alive (a running graph's channels hold their run).
_running: OrderedDict[str, RunState] = OrderedDict()
_running_alive: weakref.WeakValueDictionary[str, RunState] = weakref.WeakValueDictionary()
_running_lock = threading.Lock()


def run_started(run: RunState) -> None:
    """`run` is the thread's running root run (the previous one ended: LangGraph
    runs one run of a thread at a time)."""
    with _running_lock:
        _running[run.thread] = run
        _running.move_to_end(run.thread)
        _running_alive[run.thread] = run
        while len(_running) > RUNS_KEPT:
            _running.popitem(last=False)


def running(thread: str) -> RunState | None:
    """The thread's latest root run (maybe over)."""
    with _running_lock:
        return _running.get(thread) or _running_alive.get(thread)


def run_of_context() -> RunState | None:
    """The root run whose start set the current context (None in a subgraph's)."""
    scope = RUN_SCOPE.get()
    return scope.run if scope is not None and not scope.subgraph else None


def at_boundary(run: RunState | None) -> None:
    """LangGraph is capturing the state of `run` (a channel's run): capture its files too."""
    if run is None:
        return
    run.hooked = True
    run.owner._capture(run)


def wait_for_capture(thread: str | None = None) -> None:
    """In a graph task, before touching the files of `thread` (None: the task's):
    wait until the files of the checkpoint the step starts from are captured.
    (Blocks: call it from a worker thread, or from a sync run.)"""
    capture = _capture_for(thread)
    if capture is not None:
        capture.version()


async def await_capture(thread: str | None = None) -> None:
    """`wait_for_capture` without blocking the event loop."""
    capture = _capture_for(thread)
    future = capture.pending() if capture is not None else None
    if future is not None:
        await asyncio.wrap_future(future)


def _capture_for(thread: str | None) -> Capture | None:
    """The latest capture of the thread's run, inside a graph task (None elsewhere)."""
    try:
        config = current_config()
    except RuntimeError:
        return None  # not in a graph task
    if thread is None:
        try:
            thread = thread_of(config)
        except ThreadIdError:
            return None
    run = running(thread)
    return run.capture if run is not None else None


# -- the snapshots of async runs: in worker threads, in order per thread ---------------------


class SerialCaptures:
    """Runs jobs in a shared pool of worker threads, one at a time and in order per key."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._queues: dict[str, deque[tuple[Callable[[], Any], Future]]] = {}

    def submit(self, key: str, job: Callable[[], Any]) -> Future:
        future: Future = Future()
        with self._lock:
            queue = self._queues.get(key)
            start = queue is None
            if start:
                queue = self._queues[key] = deque()
            queue.append((job, future))
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="vfsd-capture")
            pool = self._pool
        if start:
            pool.submit(self._drain, key)
        return future

    def _drain(self, key: str) -> None:
        while True:
            with self._lock:
                queue = self._queues[key]
                if not queue:
                    del self._queues[key]
                    return
                job, future = queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(exc)


CAPTURES = SerialCaptures(CAPTURE_WORKERS)


# -- the channels ------------------------------------------------------------------------------


class BoundaryChannel(BaseChannel[None, Any, str]):
    """A private state channel whose `checkpoint()` is the step boundary.

    It has no value: it is written by nobody, triggers no node and is in
    neither the graph's input nor its output. To be checkpointed it needs a
    version, which LangGraph gives a channel whose `update` reports a change:
    it reports one once, at the first superstep of a thread, and from then
    on it is versioned, empty and silent. Until then (a new thread's input
    checkpoint, the first superstep's tasks) it reads as None.
    """

    __slots__ = ("run", "versioned")

    def __init__(self, typ: Any = None, key: str = "") -> None:
        super().__init__(typ, key)
        self.versioned = False
        self.run: RunState | None = None

    @property
    def ValueType(self) -> Any:  # noqa: N802 - LangGraph's name
        return type(None)

    @property
    def UpdateType(self) -> Any:  # noqa: N802 - LangGraph's name
        return type(None)

    def copy(self) -> BoundaryChannel:
        # Not through checkpoint() (the base class's way): LangGraph copies
        # channels to read state in the middle of a step.
        other = BoundaryChannel(self.typ, self.key)
        other.versioned, other.run = self.versioned, self.run
        return other

    def from_checkpoint(self, checkpoint: Any) -> BoundaryChannel:
        other = BoundaryChannel(self.typ, self.key)
        other.versioned = checkpoint is not MISSING
        other.run = adopt()
        return other

    def get(self) -> None:
        if self.versioned:
            raise EmptyChannelError()
        return None

    def is_available(self) -> bool:
        return not self.versioned

    def update(self, values: Sequence[Any]) -> bool:
        if self.versioned:
            return False
        self.versioned = True
        return True

    def checkpoint(self) -> str:
        at_boundary(self.run)
        return BOUNDARY_MARK


def adopt() -> RunState | None:
    """For a channel built at a root run's start: its run (which then needs no
    `get_next_version` fallback). None elsewhere: a subgraph, outside runs,
    another graph built later in a context a finished run left behind."""
    run = run_of_context()
    if run is None or not run.building:
        return None
    run.hooked = True
    return run
