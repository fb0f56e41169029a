"""What the local store remembers about the remote tier: its LMDB tables and keys.

Owned here (the store opens the tables; `store` points here):

`upload`     digest (16) -> state u8 + size u32 + since_ns u64. Chunk files
             that are not yet safe in the bucket. State 0 (PENDING): to be
             uploaded; state 1 (UPLOADED): in the bucket, but no published
             manifest names it yet. A chunk file becomes PENDING in the same
             transaction that creates its content record (`content.ContentStore
             .put`), in every store, remote or not, so a store that later goes
             remote knows exactly what the bucket lacks. The entry goes when
             the chunk's last reference goes (`decref`) or when a published
             manifest names it (`covered`). Invariant: a chunk file with an
             entry is never deleted from the local cache (`chunkcache`), so
             the only copy of unpublished data never leaves the disk; a
             referenced chunk without an entry is in the bucket (or the store
             never went remote), and may be absent locally ("remote-only").
`published`  vol u32 + seq u64 -> JSON {"seq", "parent", "full", "generation",
             "entries", "bytes", "published_ns", "imported"}: snapshots of the
             volume that the run's head lists (written after the head CAS
             succeeded; an imported snapshot is recorded as published).

Keys in `meta` (store-wide): `remote_url` (utf-8; the store's one bucket
prefix: every volume of a remote store is remote-backed), `upload_n`,
`upload_bytes` (u64, PENDING entries), `unpub_n`, `unpub_bytes` (u64,
UPLOADED entries). Per volume (`v<vol u32>:` prefix): `remote_owner` (ascii,
the lease owner token of this volume's daemons, so a restarted daemon takes
its own lease back), `remote_generation` (u64, the lease generation this
volume last wrote the head with), `remote_origin` (JSON {"run", "seq",
"remote"}: where an imported volume came from).
"""

from __future__ import annotations

import json
import struct
import time

PENDING = 0
UPLOADED = 1
_ENTRY = struct.Struct(">BIQ")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_VS = struct.Struct(">IQ")

_COUNTERS = {PENDING: (b"upload_n", b"upload_bytes"), UPLOADED: (b"unpub_n", b"unpub_bytes")}


def _unpack(raw) -> tuple[int, int, int]:
    return _ENTRY.unpack(raw)


def _count(bump, txn, state: int, size: int, sign: int) -> None:
    n_key, bytes_key = _COUNTERS[state]
    bump(txn, n_key, sign, volume=False)
    bump(txn, bytes_key, sign * size, volume=False)


# ------------------------------------------------------------- upload table


def add_pending(txn, db: dict, bump, digest: bytes, size: int) -> None:
    """A new chunk file that the bucket may lack (in the creating transaction)."""
    table = db.get("upload")
    if table is None:  # a read-only handle on a store without the table
        return
    old = txn.get(digest, db=table)
    if old is not None:
        state, osize, _ = _unpack(old)
        _count(bump, txn, state, osize, -1)
    txn.put(digest, _ENTRY.pack(PENDING, size, time.time_ns()), db=table)
    _count(bump, txn, PENDING, size, +1)


def drop(txn, db: dict, bump, digest: bytes) -> None:
    """Forget a chunk (its last reference went, or a published manifest names it)."""
    table = db.get("upload")
    if table is None:
        return
    old = txn.get(digest, db=table)
    if old is None:
        return
    state, size, _ = _unpack(old)
    txn.delete(digest, db=table)
    _count(bump, txn, state, size, -1)


def mark_uploaded(txn, db: dict, bump, digests) -> int:
    """PENDING -> UPLOADED for these digests; how many changed."""
    table = db["upload"]
    n = 0
    for digest in digests:
        old = txn.get(digest, db=table)
        if old is None:
            continue
        state, size, since = _unpack(old)
        if state != PENDING:
            continue
        txn.put(digest, _ENTRY.pack(UPLOADED, size, since), db=table)
        _count(bump, txn, PENDING, size, -1)
        _count(bump, txn, UPLOADED, size, +1)
        n += 1
    return n


def covered(txn, db: dict, bump, digests) -> None:
    """These chunks are named by a published manifest: nothing left to protect."""
    for digest in digests:
        drop(txn, db, bump, digest)


def load_pending(txn, db: dict, after: bytes | None, limit: int) -> list[tuple[bytes, int, int]]:
    """Up to `limit` PENDING (digest, size, since_ns) with digest > `after`, in order."""
    out = []
    cur = txn.cursor(db=db["upload"])
    found = cur.set_range(after + b"\0") if after is not None else cur.first()
    if not found:
        return out
    for k, v in cur:
        state, size, since = _unpack(v)
        if state == PENDING:
            out.append((bytes(k), size, since))
            if len(out) >= limit:
                break
    return out


def entry(txn, db: dict, digest: bytes) -> tuple[int, int, int] | None:
    """(state, size, since_ns) of a chunk's entry, or None."""
    table = db.get("upload")
    raw = txn.get(digest, db=table) if table is not None else None
    return _unpack(raw) if raw is not None else None


def oldest_pending_ns(txn, db: dict, limit: int = 100_000) -> int | None:
    """Since when the oldest entry waits (scans at most `limit` entries)."""
    table = db.get("upload")
    if table is None:
        return None
    oldest = None
    for n, (_, v) in enumerate(txn.cursor(db=table)):
        since = _unpack(v)[2]
        oldest = since if oldest is None else min(oldest, since)
        if n >= limit:
            break
    return oldest


# --------------------------------------------------------- published table


def record_published(txn, store, seq: int, info: dict) -> None:
    txn.put(store._vb + _U64.pack(seq), json.dumps(info).encode(), db=store.db["published"])


def published(store) -> dict[int, dict]:
    """seq -> record of every published snapshot of the volume."""
    out = {}
    with store.txn() as txn:
        table = store.db.get("published")
        if table is None:
            return out
        cur = txn.cursor(db=table)
        if cur.set_range(store._vb):
            for k, v in cur:
                if k[:4] != store._vb:
                    break
                out[_VS.unpack(k)[1]] = json.loads(bytes(v))
    return out


def forget_published(txn, store, seqs) -> None:
    for seq in seqs:
        txn.delete(store._vb + _U64.pack(seq), db=store.db["published"])


# ------------------------------------------------------------------ meta keys


def remote_url(store) -> str | None:
    with store.txn() as txn:
        raw = txn.get(b"remote_url", db=store.db["meta"])
    return bytes(raw).decode() if raw is not None else None


def set_remote_url(txn, store, url: str) -> None:
    txn.put(b"remote_url", url.encode(), db=store.db["meta"])


def volume_meta(store, key: bytes) -> bytes | None:
    with store.txn() as txn:
        raw = txn.get(store._vp + key, db=store.db["meta"])
    return bytes(raw) if raw is not None else None


def set_volume_meta(txn, store, key: bytes, value: bytes) -> None:
    txn.put(store._vp + key, value, db=store.db["meta"])


def generation(store) -> int:
    raw = volume_meta(store, b"remote_generation")
    return _U64.unpack(raw)[0] if raw is not None else 0


def set_generation(txn, store, gen: int) -> None:
    set_volume_meta(txn, store, b"remote_generation", _U64.pack(gen))


def counts(store) -> dict[str, int]:
    """Backlog figures: PENDING (to upload) and UPLOADED (awaiting a manifest)."""
    m = store.db["meta"]
    with store.txn() as txn:
        def get(key: bytes) -> int:
            raw = txn.get(key, db=m)
            return _U64.unpack(raw)[0] if raw is not None else 0

        return {"upload_chunks": get(b"upload_n"), "upload_bytes": get(b"upload_bytes"),
                "unpublished_chunks": get(b"unpub_n"), "unpublished_bytes": get(b"unpub_bytes")}
