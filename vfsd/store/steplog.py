"""The step log: a bounded history of what each agent step did to the files.

Layout (a named database of the store's LMDB environment):

`steplog`   vol u32 + seq u64 -> JSON record of one stretch of a step {seq,
            step, first_ns, last_ns, files, logical_bytes, stored_bytes,
            created, created_paths, changed, changed_paths, deleted,
            deleted_paths, evicted, evicted_paths, calls: {call key hex:
            {created, changed, deleted}}, snapshots: [id], restores: [{id,
            from_step}]}. `seq` counts up in the order things happened, so a
            step met again after a restore gets a record of its own. `changed`
            counts regular files whose last content change is in the step
            (created ones included), as the `bystep` index says when the
            record is written; `*_paths` hold up to STEP_PATHS examples. At
            most STEPLOG_MAX records per volume; the oldest go first. A record
            is rewritten while its stretch goes on (the daemon's journal) and
            never once the step has moved on.
"""

from __future__ import annotations

import json
import struct

STEPLOG_MAX = 2000
#: example paths kept per kind in a record
STEP_PATHS = 20

_U32 = struct.Struct(">I")
_VOL_SEQ = _VOL_STEP = struct.Struct(">IQ")


class StepLogMixin:
    """The step-log half of `Store`."""

    def put_step_record(self, record: dict) -> None:
        """Write (or rewrite) record `record["seq"]`, trimming the oldest."""
        key = _VOL_SEQ.pack(self.vol, record["seq"])
        db = self.db["steplog"]
        with self.txn(write=True) as txn:
            new = txn.get(key, db=db) is None
            txn.put(key, json.dumps(record, sort_keys=True).encode(), db=db)
            if new:
                self._bump(txn, b"steplog_n", 1)
                if self._counter(txn, b"steplog_n") > STEPLOG_MAX:
                    cur = txn.cursor(db=db)
                    if cur.set_range(self._vb) and cur.key()[:4] == self._vb:
                        cur.delete()
                        self._bump(txn, b"steplog_n", -1)

    def last_step_record(self) -> dict | None:
        """The newest record of the volume (the stretch a new daemon may carry on)."""
        if self.db.get("steplog") is None:
            return None
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["steplog"])
            if self.vol < 0xFFFFFFFF and cur.set_range(_U32.pack(self.vol + 1)):
                found = cur.prev()
            else:
                found = cur.last()
            if not found or cur.key()[:4] != self._vb:
                return None
            return json.loads(bytes(cur.value()))

    def step_records(self) -> list[dict]:
        """Every kept record of the volume, oldest first."""
        out: list[dict] = []
        if self.db.get("steplog") is None:
            return out
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["steplog"])
            if cur.set_range(self._vb):
                for key, val in cur:
                    if key[:4] != self._vb:
                        break
                    out.append(json.loads(bytes(val)))
        return out

    def changed_at(self, step: int, limit: int) -> tuple[int, list[int]]:
        """(how many regular files were last changed at `step`, the first `limit` of them)."""
        prefix = _VOL_STEP.pack(self.vol, step)
        n = 0
        inos: list[int] = []
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["bystep"])
            if cur.set_range(prefix):
                for key in cur.iternext(keys=True, values=False):
                    if key[:12] != prefix:
                        break
                    n += 1
                    if len(inos) < limit:
                        inos.append(struct.unpack(">Q", key[12:20])[0])
        return n, inos
