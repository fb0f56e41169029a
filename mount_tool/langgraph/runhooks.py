"""Run ends: LangChain callbacks that tell VfsdCheckpointer when a graph run is over.

With replicas (a `Runs` with a remote), a run holds its thread from its start
to its end, and the next run may be on another replica: the thread must be
given back as soon as the run is over, whatever way it ends. A checkpointer
sees a run start (`get_tuple` with LangGraph's runtime) but never its end.
LangChain's callbacks do, on every path: LangGraph calls `on_chain_end` for
the graph's own run once its loop is done (every checkpoint stored, an
interrupt waiting included) and `on_chain_error` for any exception, a
cancelled async run (shielded) and a sync stream closed early included.

`run_hooks()` gives the two handlers a graph needs in its config
(`graph.with_config(callbacks=run_hooks())`; `create_vfsd_deep_agent` adds
them):

- `RunStartHook`, inline: the graph run's `on_chain_start` comes right before
  the checkpointer's run-start `get_tuple`, in the same context (a sync run's
  thread, or the async task iterating the stream), so it leaves the run's id
  in a ContextVar there, which the checkpointer claims (`claim_start`) and
  uses as the token naming the run. It also ends sync runs: their end is
  reported inline on the thread that ran them.
- `AsyncRunEndHook`: the end of an async run, awaited by LangGraph before the
  run returns (the work in a worker thread: the event loop never waits for
  the bucket). It is skipped while no async run is held, so sync runs do not
  pay for an event loop per callback.

The handlers keep no state: what a run's end must do is registered here by
the checkpointer (`register`) under the run's id, so handlers copied with a
config, or built by another import, end the same runs. A run registered but
never reported (a graph without these hooks cannot register one: the
checkpointer refuses to start it) is ended by the shard when this process
exits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler

logger = logging.getLogger(__name__)


@dataclass
class _Start:
    """A graph run's `on_chain_start`, until a run start claims it."""

    run_id: UUID
    claimed: bool = False


@dataclass
class _Open:
    """A run that holds its thread: how to give it back, once."""

    mode: str  # "sync" or "async": which handler reports its end
    end: Callable[[BaseException | None], None]


#: the latest chain start in this context (a graph run's start, just before its get_tuple)
_START: ContextVar[_Start | None] = ContextVar("vfsd_chain_start", default=None)
_open: dict[UUID, _Open] = {}
_async_open = 0
_lock = threading.Lock()


def claim_start() -> UUID | None:
    """The id of the graph run starting in this context, once (None: no hook
    reported one, or another run start claimed it). Call it in the context of
    the run's `get_tuple`, not in a worker thread's copy."""
    start = _START.get()
    if start is None or start.claimed:
        return None
    start.claimed = True
    return start.run_id


def register(run_id: UUID, mode: str, end: Callable[[BaseException | None], None]) -> None:
    """Call `end(error)` when the run `run_id` ends (error: None, or why it
    failed); `mode` "sync" or "async" as the run. `end` may block (an async
    run's is called in a worker thread)."""
    global _async_open
    with _lock:
        if run_id in _open:
            raise RuntimeError(f"graph run {run_id} is held already")
        _open[run_id] = _Open(mode, end)
        if mode == "async":
            _async_open += 1


def forget(run_id: UUID, mode: str | None = None) -> _Open | None:
    """The run's registration, removed (None: not registered, or ended, or,
    given `mode`, registered by a run of the other kind, left as it is)."""
    global _async_open
    with _lock:
        entry = _open.get(run_id)
        if entry is None or (mode is not None and entry.mode != mode):
            return None
        del _open[run_id]
        if entry.mode == "async":
            _async_open -= 1
    return entry


def holding() -> int:
    """How many runs are registered and not ended yet."""
    with _lock:
        return len(_open)


def _finish(entry: _Open, run_id: UUID, error: BaseException | None) -> None:
    """End a run; an error of the end is raised for a run that succeeded (its
    caller learns that its files were not handed over) and logged for one
    that failed (its own error is the one to see)."""
    try:
        entry.end(error)
    except Exception as exc:
        if error is None:
            raise
        logger.error("vfsd: ending graph run %s (which failed: %r) failed too: %s",
                     run_id, error, exc)


class _ChainsOnly:
    """A handler that hears graph (chain) runs and nothing else."""

    ignore_llm = True
    ignore_chat_model = True
    ignore_retriever = True
    ignore_agent = True
    ignore_retry = True
    ignore_custom_event = True


class RunStartHook(_ChainsOnly, BaseCallbackHandler):
    """See the module docstring: marks a graph run's start for the
    checkpointer, and ends sync runs."""

    run_inline = True  # in the caller's context: what it sets, the get_tuple sees
    raise_error = True  # a run whose files could not be handed over fails

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       **kwargs: Any) -> None:
        _START.set(_Start(run_id))

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id, error)

    @staticmethod
    def _ended(run_id: UUID, error: BaseException | None) -> None:
        entry = forget(run_id, "sync")
        if entry is not None:
            _finish(entry, run_id, error)

    def __deepcopy__(self, memo: dict) -> RunStartHook:
        return self  # no state: a copied config ends the same runs


class AsyncRunEndHook(_ChainsOnly, AsyncCallbackHandler):
    """See the module docstring: ends async runs, in a worker thread."""

    run_inline = True  # awaited in order; the work itself is in a worker thread
    raise_error = True

    @property
    def ignore_chain(self) -> bool:  # type: ignore[override]
        # Skipped while no async run is held: a sync run's callback manager
        # would run each of these coroutines in an event loop of its own.
        return not _async_open

    async def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        await self._ended(run_id, None)

    async def on_chain_error(self, error: BaseException, *, run_id: UUID,
                             **kwargs: Any) -> None:
        await self._ended(run_id, error)

    @staticmethod
    async def _ended(run_id: UUID, error: BaseException | None) -> None:
        entry = forget(run_id, "async")
        if entry is not None:
            await asyncio.to_thread(_finish, entry, run_id, error)

    def __deepcopy__(self, memo: dict) -> AsyncRunEndHook:
        return self


def run_hooks() -> list[BaseCallbackHandler]:
    """The callbacks a graph needs for VfsdCheckpointer on a Runs with a remote:
    `graph = builder.compile(checkpointer=saver).with_config(callbacks=run_hooks())`
    (`create_vfsd_deep_agent` adds them itself)."""
    return [RunStartHook(), AsyncRunEndHook()]
