"""Long changes made in steps: a generator of short transactions, run on the loop.

A change that would be one long write transaction (a snapshot or a restore of
many objects, an eviction pass over thousands of files, a volume's drop) is
written as a generator that commits a short transaction per step and yields
between them. `drive` runs one on the trio loop, letting every other request
through between its steps; code that may block (a daemon's start, a unit
test) just runs it to the end with `next`.
"""

from __future__ import annotations

import trio


async def drive(steps):
    """Run a change made in steps (a generator of short transactions, see
    `Snapshots.create_in_steps`) on the loop, yielding between transactions
    so other requests are answered; its result, with how many steps it took."""
    n = 0
    try:
        while True:
            next(steps)
            n += 1
            await trio.sleep(0)
    except StopIteration as done:
        result = done.value
    if isinstance(result, dict):
        result["steps"] = n
    return result
