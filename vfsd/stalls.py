"""Find what holds the daemon's loop: log every task step longer than a bound.

Every FUSE and control request of a daemon (of every volume of a shard) runs
on one trio loop, so a step of one task that runs long (a big transaction, a
walk that never yields) makes every other request wait. With the environment
variable `VFSD_STALL_LOG_MS=N`, a daemon logs each task step that ran longer
than N ms (`long_loop_step`: the task, how long, and where it was when the
watchdog looked, sampled from another thread), for an operator or a bench to
see what to cut into shorter steps. Off by default: the instrument costs two
clock reads per task step.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import structlog
import trio

log = structlog.get_logger("vfsd.stalls")

ENV = "VFSD_STALL_LOG_MS"


class StallWatch(trio.abc.Instrument):
    """A trio instrument and a watchdog thread (see the module docstring)."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self.loop_thread = threading.get_ident()
        self._step: tuple[object, float] | None = None
        self._sample: list[str] | None = None
        self._done = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="vfsd-stallwatch",
                                          daemon=True)
        self._watchdog.start()

    def before_task_step(self, task) -> None:
        self._sample = None
        self._step = (task, time.perf_counter())

    def after_task_step(self, task) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        took = time.perf_counter() - step[1]
        if took > self.bound_s:
            log.warning("long_loop_step", task=task.name, ms=round(took * 1000, 1),
                        where=self._sample)

    def _watch(self) -> None:
        while not self._done.wait(self.bound_s / 2):
            step = self._step
            if step is None or self._sample is not None:
                continue
            if time.perf_counter() - step[1] > self.bound_s:
                frame = sys._current_frames().get(self.loop_thread)
                if frame is not None:
                    self._sample = [line.strip() for line in
                                    traceback.format_stack(frame, limit=12)]

    def close(self) -> None:
        self._done.set()


def watch_from_env() -> StallWatch | None:
    """Add a StallWatch to the running trio loop if `VFSD_STALL_LOG_MS` asks for one."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    try:
        bound = float(raw) / 1000
    except ValueError:
        log.warning("bad_stall_log_ms", value=raw[:40])
        return None
    if bound <= 0:
        return None
    watch = StallWatch(bound)
    trio.lowlevel.add_instrument(watch)
    return watch
