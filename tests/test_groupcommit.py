"""Group commit seen from another thread, on a real LMDB store, no FUSE.

The groupcommit contract: a thread other than the group's owner reads only
after the open group committed. The owner's commit lets go of the GIL while
LMDB writes and syncs; a worker thread that looks at the group during that
time must not take "no group open" to mean "committed" (it did: `vfsd ref`
hashed a file just written from before its content, as "changed between the
write and taking its reference", about 1 in 300 writes under CPU load).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from vfsd import errors
from vfsd.store.groupcommit import in_request
from vfsd.store.store import Store

REG = stat.S_IFREG | 0o644
ROUNDS = 10
FILES_PER_GROUP = 200  # enough pages that the synced commit takes a while


def test_a_worker_that_sees_no_group_sees_its_commit(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", sync=True)
    asked: list[int] = []
    # The owner is this thread; the worker below never needs to ask for a flush.
    store.group.enable(60.0, on_open=lambda: None, request_flush=lambda: asked.append(1),
                       on_failure=lambda exc: None)
    go, spinning, done = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []
    errors_in_worker: list[BaseException] = []

    def worker() -> None:
        try:
            for r in range(ROUNDS):
                go.wait()
                go.clear()
                spinning.set()
                while store.group.txn is not None:
                    pass  # spin: take the GIL the moment the commit lets go of it
                try:
                    store.lookup(store.root_ino, b"last%d" % r)
                    seen.append(True)
                except errors.NotFound:
                    seen.append(False)
                done.set()
        except BaseException as exc:  # reported below
            errors_in_worker.append(exc)
            done.set()

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    token = in_request.set(True)  # the creates below are FUSE requests of one group
    try:
        for r in range(ROUNDS):
            for i in range(FILES_PER_GROUP):
                store.create(store.root_ino, b"r%d-%d" % (r, i), REG, os.getuid(), os.getgid())
            store.create(store.root_ino, b"last%d" % r, REG, os.getuid(), os.getgid())
            assert store.group.txn is not None
            done.clear()
            spinning.clear()
            go.set()
            assert spinning.wait(30)
            store.flush_group()
            assert done.wait(30)
    finally:
        in_request.reset(token)
        t.join(30)
        store.close()
    assert not errors_in_worker
    assert seen == [True] * ROUNDS
    assert store.group.commits == ROUNDS
