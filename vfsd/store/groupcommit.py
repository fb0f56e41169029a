"""Group commit: one LMDB write transaction shared by the FUSE requests of a
few milliseconds.

Unpacking, copying or syncing a tree costs five or more small write
transactions per file (create, a chown, a chmod, the content, the times).
With group commit on (the daemon turns it on; library users never see it),
the write transactions of FUSE requests (`in_request`, set by the FUSE layer
around each handler) become children of one open top-level transaction:
LMDB's nested transactions, so a request that fails still undoes exactly its
own changes. The top-level one commits

- `window` seconds after it opened (the daemon's timer: `on_open` arms it),
- after `max_children` requests, and
- before anything else touches the store: a write transaction outside a
  request (control requests, snapshots, eviction, the settler), any
  transaction on another thread (a sync, a scrape, the publisher: they wait
  for `request_flush`, which has the loop thread commit), `Store.sync()` and
  `Store.close()`.

So every reader sees what it saw before (the loop thread reads inside the
open transaction; others only after it committed), and durability is what it
was: `sync()` commits the group first, so an `fsync()` or `syncfs()` is
durable when it returns. What a daemon crash (`kill -9`) can take is the
last `window` of requests that no fsync covered, where before it took
nothing that had committed (`tests/test_crash.py` kills daemons inside the
window).

A commit of the group that fails (a disk that filled up in the window, an I/O
error) cannot be reported to the requests it held, which were answered
already: `on_failure` is told (the daemon stops serving, as a crash would),
and group commit stays off. To make that practically unreachable, no group
opens while the store's disk has less than `min_free` bytes free; requests
then commit one by one and a full disk fails the request that hit it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar

#: True while a FUSE request's handler runs in this task (set by the FUSE layer)
in_request: ContextVar[bool] = ContextVar("vfsd_in_request", default=False)


class GroupCommit:
    """The state of group commit for one LMDB environment (shared by a
    Store and its volume views)."""

    def __init__(self) -> None:
        self.enabled = False
        self.txn = None  # the open top-level write transaction, or None
        self.thread: int | None = None  # the only thread that may use it
        self.children = 0
        self.child_active = False
        #: commits of the group so far (a figure for `vfsd status`)
        self.commits = 0
        self.window = 0.005
        self.max_children = 1000
        self.min_free = 256 << 20
        self.on_open: Callable[[], None] | None = None
        self.request_flush: Callable[[], None] | None = None
        self.on_failure: Callable[[Exception], None] | None = None
        self._free_checked = 0.0
        self._free_ok = False

    def enable(self, window: float, on_open: Callable[[], None],
               request_flush: Callable[[], None],
               on_failure: Callable[[Exception], None]) -> None:
        """Turn group commit on; call on the thread that will own the groups."""
        self.window = window
        self.on_open, self.request_flush, self.on_failure = on_open, request_flush, on_failure
        self.thread = threading.get_ident()
        self.enabled = True

    def owner(self) -> bool:
        return threading.get_ident() == self.thread

    def open_for_reads(self):
        """The open group's transaction if this thread may read inside it (the
        owner, with no request's child transaction active), else None: the
        loop's reads (a getattr, a lookup) then cost no transaction of their own."""
        txn = self.txn
        if txn is None or self.child_active or threading.get_ident() != self.thread:
            return None
        return txn

    def room_for_a_group(self, store_dir) -> bool:
        """Enough free disk that a group's commit will not fail for space
        (checked at most every 0.1 s)."""
        now = time.monotonic()
        if now - self._free_checked > 0.1:
            st = os.statvfs(store_dir)
            self._free_ok = st.f_bavail * st.f_frsize >= self.min_free
            self._free_checked = now
        return self._free_ok
