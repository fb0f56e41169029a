"""The running step's record for the timeline (`vfsd.store.steplog`).

Cheap on the request path: a create or a delete adds one to a counter (and
keeps its name while fewer than STEP_PATHS are kept); content changes cost
nothing here, because the `bystep` index already knows which files were
last changed in the step. The record is written (one transaction) when the
step advances, when a snapshot is taken or restored, when the `timeline`
control request asks, every FLUSH_INTERVAL seconds while something changed,
and at unmount. A daemon that starts in the middle of a step carries on
with that step's record; a step met again after a restore gets a new one.
"""

from __future__ import annotations

import time

import structlog

from vfsd.store.steplog import STEP_PATHS

log = structlog.get_logger("vfsd.journal")

#: seconds between writes of the running step's record while files change
FLUSH_INTERVAL = 10.0
#: files of one step whose authors are counted (beyond, counted but unattributed):
#: the record is made on the loop, an inode read each (20,000 held every
#: thread of a shard ~110 ms at each snapshot of a step that changed them all)
ATTRIBUTED_MAX = 2_000
#: tool calls named per step record
CALLS_MAX = 64


class _Kind:
    """Created or deleted files of the stretch: a count, some names, counts per call."""

    __slots__ = ("n", "names", "paths", "by")

    def __init__(self, prev: dict, key: str) -> None:
        self.n = prev.get(key, 0)
        self.names: list[tuple[int, bytes]] = []
        self.paths: list[str] = list(prev.get(f"{key}_paths", []))
        self.by: dict[int, int] = {int(k, 16): v.get(key, 0)
                                   for k, v in prev.get("calls", {}).items() if v.get(key)}

    def add(self, parent: int, name: bytes, call: int, n: int = 1) -> None:
        self.n += n
        if len(self.names) + len(self.paths) < STEP_PATHS:
            self.names.append((parent, name))
        self.count(call, n)

    def count(self, call: int, n: int) -> None:
        if call in self.by or len(self.by) < CALLS_MAX:
            self.by[call] = self.by.get(call, 0) + n
            if self.by[call] <= 0:
                del self.by[call]

    def resolve(self, store) -> list[str]:
        for parent, name in self.names:
            base = "" if parent == store.root_ino else store.path_of(parent)
            text = name.decode(errors="surrogateescape")
            if base is None:  # the directory is gone already
                self.paths.append(f"?/{text}")
            else:
                self.paths.append(f"{base}/{text}" if base else text)
        self.names.clear()
        return self.paths[:STEP_PATHS]


class StepJournal:
    """What happened in the current stretch of the current step."""

    def __init__(self, store) -> None:
        self.store = store
        last = store.last_step_record()
        self.seq = last["seq"] if last else 0
        if last is not None and last.get("step") == store.get_step():
            self._begin(last["step"], last)  # carry on
        else:
            self._begin(store.get_step())
        self._txn_seen = -1

    def _begin(self, step: int, prev: dict | None = None) -> None:
        if prev is None:
            self.seq += 1
            prev = {}
        self.step = step
        self.first_ns = prev.get("first_ns") or time.time_ns()
        self.created = _Kind(prev, "created")
        self.deleted = _Kind(prev, "deleted")
        self.evicted = prev.get("evicted", 0)
        self.evicted_paths: list[str] = list(prev.get("evicted_paths", []))
        self.snapshots: list[str] = list(prev.get("snapshots", []))
        self.restores: list[dict] = list(prev.get("restores", []))

    # ------------------------------------------------------------ events

    def file_created(self, parent: int, name: bytes, call: int) -> None:
        """A regular file was created (by tool call `call`, a key)."""
        self.created.add(parent, name, call)

    def maker_named(self, old: int, new: int) -> None:
        """A file created this step turned out to be tool call `new`'s (its tag
        came after the create, which counted it as `old`'s)."""
        self.created.count(old, -1)
        self.created.count(new, 1)

    def file_deleted(self, parent: int, name: bytes, call: int) -> None:
        """A regular file lost its last name (unlink, or renamed over)."""
        self.deleted.add(parent, name, call)

    def files_evicted(self, records: list[dict]) -> None:
        """Eviction removed these files (eviction records: path, reason)."""
        self.evicted += len(records)
        for r in records:
            if len(self.evicted_paths) >= STEP_PATHS:
                break
            self.evicted_paths.append(f"{r.get('path')} ({r.get('reason')})")

    def snapshot_taken(self, ident: str) -> None:
        self.snapshots.append(ident)
        self.flush()

    def restored(self, ident: str, from_step: int, to_step: int) -> None:
        """A restore moved the tree (and the step) to snapshot `ident`'s (the
        stretch it ended was written before the restore)."""
        self._begin(to_step)
        self.restores.append({"id": ident, "from_step": from_step})
        self.flush()

    def advance(self, step: int) -> None:
        """The step moves on: the record of the one that ends is written."""
        if step == self.step:
            return
        self.flush()
        self._begin(step)

    # ------------------------------------------------------------ writing

    def record(self) -> dict:
        """The current stretch's record as it stands."""
        st = self.store
        changed, inos = st.changed_at(self.step, ATTRIBUTED_MAX)
        changed_by: dict[int, int] = {}
        changed_paths = []
        for ino in inos:
            try:
                inode = st.get_inode(ino)
            except Exception:  # noqa: BLE001 - freed meanwhile: not worth a line
                continue
            changed_by[inode.changed_by] = changed_by.get(inode.changed_by, 0) + 1
            if len(changed_paths) < STEP_PATHS:
                path = st.path_of(ino)
                if path is not None:
                    changed_paths.append(path)
        made, gone = self.created.by, self.deleted.by
        keys = sorted(made.keys() | changed_by.keys() | gone.keys(),
                      key=lambda k: -(made.get(k, 0) + changed_by.get(k, 0) + gone.get(k, 0)))
        calls = {f"{k:016x}": {"created": made.get(k, 0), "changed": changed_by.get(k, 0),
                               "deleted": gone.get(k, 0)} for k in keys[:CALLS_MAX]}
        c = st.counters()
        return {
            "seq": self.seq, "step": self.step, "first_ns": self.first_ns,
            "last_ns": time.time_ns(), "files": c["files"],
            "logical_bytes": c["logical_bytes"],
            "stored_bytes": c["blob_bytes"] + c["chunk_bytes"],
            "created": self.created.n, "created_paths": self.created.resolve(st),
            "changed": changed, "changed_paths": changed_paths,
            "deleted": self.deleted.n, "deleted_paths": self.deleted.resolve(st),
            "evicted": self.evicted, "evicted_paths": self.evicted_paths,
            "calls": calls, "snapshots": self.snapshots, "restores": self.restores,
        }

    def flush(self) -> None:
        """Write the current stretch's record (a store that refuses is logged)."""
        try:
            self.store.put_step_record(self.record())
        except Exception as exc:  # noqa: BLE001 - the timeline never fails a request
            log.warning("step_record_failed", step=self.step, error=str(exc))
        self._txn_seen = self.store.commits

    def flush_if_changed(self) -> None:
        """`flush`, if a write transaction of this volume committed since the
        last one (its own: the other volumes of a shared environment, and this
        record itself, do not count)."""
        if self.store.commits != self._txn_seen:
            self.flush()
