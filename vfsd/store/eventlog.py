"""The bounded logs of a volume: what eviction removed, and what left the tree.

Layout (named databases of the store's LMDB environment):

`evicted`   vol u32 + seq u64 -> JSON eviction record {path, ino, gen, hash,
            size, step, evicted_step, reason, status}, plus {restored_step,
            restored_from} once a path restore brought that file back. At most EVICT_LOG_MAX
            records per volume; the oldest go first. `seq` comes from the
            volume's `evict_seq` counter and is never reused.
`evictino`  vol u32 + ino u64 -> seq u64: the record of an evicted inode, to
            answer `resolve` of a reference with "evicted at step N (reason)".
`removed`   vol u32 + step u64 + ino u64 -> JSON {ino, gen, path, step, reason}:
            regular files that lost their last name (unlink, rename over,
            eviction), for `changes`. At most REMOVED_LOG_MAX per volume.

Every method takes the caller's transaction: a log record commits with the
change it describes.
"""

from __future__ import annotations

import json
import struct

EVICT_LOG_MAX = 10_000
REMOVED_LOG_MAX = 10_000

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_VOL_SEQ = struct.Struct(">IQ")
_VOL_STEP_INO = struct.Struct(">IQQ")


class EventLog:
    """The eviction and removal logs of the store's volume."""

    def __init__(self, store) -> None:
        self.store = store
        self.db = store.db

    @property
    def vol(self) -> int:
        return self.store.vol

    # ------------------------------------------------------------ removals

    def log_removed(self, txn, ino: int, gen: int, path: str, step: int, reason: str) -> None:
        rec = {"ino": ino, "gen": gen, "path": path, "step": step, "reason": reason}
        txn.put(_VOL_STEP_INO.pack(self.vol, step, ino), json.dumps(rec).encode(),
                db=self.db["removed"])
        self._trim(txn, "removed", REMOVED_LOG_MAX, b"removed_n")

    def _trim(self, txn, db_name: str, limit: int, counter: bytes) -> None:
        store = self.store
        store._bump(txn, counter, 1)
        if store._counter(txn, counter) <= limit:
            return
        cur = txn.cursor(db=self.db[db_name])
        prefix = _U32.pack(self.vol)
        if cur.set_range(prefix) and cur.key()[:4] == prefix:
            cur.delete()
            store._bump(txn, counter, -1)

    def removed_since(self, txn, step: int, limit: int) -> list[dict]:
        out = []
        cur = txn.cursor(db=self.db["removed"])
        if cur.set_range(_VOL_STEP_INO.pack(self.vol, step, 0)):
            for key, val in cur:
                if _U32.unpack(key[:4])[0] != self.vol or len(out) >= limit:
                    break
                out.append(json.loads(bytes(val)))
        return out

    # ----------------------------------------------------------- evictions

    def log_eviction(self, txn, ino: int, record: dict) -> None:
        store = self.store
        seq = store._counter(txn, b"evict_seq")
        store._bump(txn, b"evict_seq", 1)
        txn.put(_VOL_SEQ.pack(self.vol, seq), json.dumps(record).encode(), db=self.db["evicted"])
        txn.put(_VOL_SEQ.pack(self.vol, ino), _U64.pack(seq), db=self.db["evictino"])
        store._bump(txn, b"evicted_n", 1)
        if store._counter(txn, b"evicted_n") > EVICT_LOG_MAX:
            cur = txn.cursor(db=self.db["evicted"])
            prefix = _U32.pack(self.vol)
            if cur.set_range(prefix) and cur.key()[:4] == prefix:
                old_seq = _VOL_SEQ.unpack(bytes(cur.key()))[1]
                old = json.loads(bytes(cur.value()))
                cur.delete()
                # The inode may have been evicted again since (after a restore):
                # its index entry then points at the newer record.
                key = _VOL_SEQ.pack(self.vol, old["ino"])
                raw = txn.get(key, db=self.db["evictino"])
                if raw is not None and _U64.unpack(raw)[0] == old_seq:
                    txn.delete(key, db=self.db["evictino"])
                store._bump(txn, b"evicted_n", -1)

    def newest(self, txn, limit: int) -> list[dict]:
        """The newest `limit` eviction records, oldest first."""
        out: list[dict] = []
        cur = txn.cursor(db=self.db["evicted"])
        if cur.set_range(_VOL_SEQ.pack(self.vol + 1, 0)):
            ok = cur.prev()
        else:
            ok = cur.last()
        while ok and len(out) < limit:
            if _U32.unpack(cur.key()[:4])[0] != self.vol:
                break
            out.append(json.loads(bytes(cur.value())))
            ok = cur.prev()
        out.reverse()
        return out

    def page(self, txn, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` (seq, JSON record) with seq > `after_seq`, oldest first."""
        out = []
        cur = txn.cursor(db=self.db["evicted"])
        if cur.set_range(_VOL_SEQ.pack(self.vol, after_seq + 1)):
            for key, val in cur:
                vol, seq = _VOL_SEQ.unpack(key)
                if vol != self.vol or len(out) >= limit:
                    break
                out.append((seq, bytes(val)))
        return out

    def mark_restored(self, txn, ino: int, gen: int, step: int, snapshot: str) -> bool:
        """The eviction record of `ino` (generation `gen`) gains `restored_step`
        and `restored_from`: the file is back (it stays in the log)."""
        raw = txn.get(_VOL_SEQ.pack(self.vol, ino), db=self.db["evictino"])
        if raw is None:
            return False
        key = _VOL_SEQ.pack(self.vol, _U64.unpack(raw)[0])
        val = txn.get(key, db=self.db["evicted"])
        if val is None:
            return False
        rec = json.loads(bytes(val))
        if rec.get("gen") != gen or rec.get("restored_step") is not None:
            return False
        rec["restored_step"] = step
        rec["restored_from"] = snapshot
        txn.put(key, json.dumps(rec).encode(), db=self.db["evicted"])
        return True

    def record_of(self, txn, ino: int) -> dict | None:
        raw = txn.get(_VOL_SEQ.pack(self.vol, ino), db=self.db["evictino"])
        if raw is None:
            return None
        val = txn.get(_VOL_SEQ.pack(self.vol, _U64.unpack(raw)[0]), db=self.db["evicted"])
        return json.loads(bytes(val)) if val is not None else None
