"""Long changes made in steps: a generator of short transactions, run on the loop.

A change that would be one long write transaction (a snapshot or a restore of
many objects, an eviction pass over thousands of files, a volume's drop) is
written as a generator that commits a short transaction per step and yields
between them. `drive` runs one on the trio loop, and between two steps lets
everything else that is ready run first: a request of another volume needs
several turns of the loop (the kernel's wake-up, the handler, the next
request of the same system call), and a long change that came straight back
after each step would make each of those turns wait for one of its steps.
It waits at most as long as its last step took, so it keeps at least half
of a busy loop. Code that may block (a daemon's start, a unit test) runs a
generator to its end with `next`.
"""

from __future__ import annotations

import time

import trio

try:
    # What trio.testing exports, without the import of trio.testing (which
    # loads pytest when it is installed: megabytes in every daemon).
    from trio._core import wait_all_tasks_blocked
except ImportError:  # pragma: no cover - another trio: yield once instead
    async def wait_all_tasks_blocked() -> None:
        await trio.sleep(0)


async def make_way(took: float) -> None:
    """After a step that took `took` seconds: let everything ready run first,
    waiting at most as long (see the module docstring)."""
    with trio.move_on_after(max(took, 0.001)):
        await wait_all_tasks_blocked()


async def drive(steps):
    """Run a change made in steps (see the module docstring); its result,
    with how many steps it took (`steps`, when the result is a dict)."""
    n = 0
    try:
        while True:
            t0 = time.perf_counter()
            next(steps)
            n += 1
            await make_way(time.perf_counter() - t0)
    except StopIteration as done:
        result = done.value
    if isinstance(result, dict):
        result["steps"] = n
    return result
