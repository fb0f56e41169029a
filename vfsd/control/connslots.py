"""Who may hold one of the control socket's connection slots.

A slot is taken at connect and given back at close. Idle connections (a
client that keeps its connection open between requests, or one that never
sends anything) must never lock the others out, so when the slots run out a
newcomer does not get "busy": an idle connection is closed to make room,
taken from the uid that holds the most slots (per-uid fairness: no uid may
hold more than `per_uid` slots, and a uid at that limit makes room from its
own connections). Which one goes:

1. a connection that never completed a request, the oldest first: a flood
   of silent connections then only displaces itself, and a client that has
   just connected and is about to send keeps its slot;
2. then one stalled in the middle of a request;
3. then, among connections that did make requests, the most recently
   opened: a long-lived client (an agent's Mount, a monitoring loop) keeps
   its connection through a burst of short-lived ones. A closed idle client loses nothing: it had no
request in flight, and a client that reconnects on a closed connection (as
mount_tool's does) does not notice. Only when every connection is in the
middle of a request is a newcomer refused with `busy`.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter

import trio

IDLE, READING, WORKING = "idle", "reading", "working"


class Slot:
    """One admitted connection: its peer's uid, state and cancel scope."""

    _ids = itertools.count(1)

    def __init__(self, uid: int) -> None:
        self.id = next(self._ids)
        self.uid = uid
        self.state = IDLE
        self.opened = self.since = time.monotonic()  # since: when the state began
        self.scope = trio.CancelScope()
        self.evicted = False
        self.requests = 0  # complete requests received

    def set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.since = time.monotonic()


def _closing_order(slot: Slot) -> tuple:
    if slot.requests == 0:
        return (0, slot.opened)
    if slot.state == READING:
        return (1, slot.since)
    return (2, -slot.opened)


class SlotTable:
    """The control server's connection slots."""

    def __init__(self, limit: int, per_uid: int) -> None:
        self.limit = limit
        self.per_uid = per_uid
        self.slots: dict[int, Slot] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.slots)

    def admit(self, uid: int) -> Slot | None:
        """A slot for a new connection from `uid`, closing an idle one if needed;
        None if every slot is in the middle of a request."""
        held = Counter(s.uid for s in self.slots.values())
        if held[uid] >= self.per_uid:
            pool = [s for s in self.slots.values() if s.uid == uid]
        elif len(self.slots) >= self.limit:
            # The uid that holds the most slots gives one back.
            most = max(held.values())
            pool = [s for s in self.slots.values() if held[s.uid] == most]
        else:
            pool = None
        if pool is not None:
            victim = self._first_to_close(pool)
            if victim is None:
                return None
            self.evict(victim)
        slot = Slot(uid)
        self.slots[slot.id] = slot
        return slot

    @staticmethod
    def _first_to_close(pool: list[Slot]) -> Slot | None:
        # A connection that is working on a request is never closed.
        candidates = [s for s in pool if s.state != WORKING]
        if not candidates:
            return None
        return min(candidates, key=_closing_order)

    def evict(self, slot: Slot) -> None:
        """Close `slot`'s connection (its task sees the cancellation) and free it now."""
        slot.evicted = True
        slot.scope.cancel()
        self.slots.pop(slot.id, None)
        self.evictions += 1

    def release(self, slot: Slot) -> None:
        self.slots.pop(slot.id, None)
