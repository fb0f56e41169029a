"""Where a file's content is: inline in LMDB, chunk files here, or only in the bucket.

A query over the `block`, `content` and `upload` tables (their layout is in
the package docstring and `remotestate`), for `vfsd info` and `vfsd warmup`.
"""

from __future__ import annotations

from . import remotestate
from .content import LOC_FILE, LOC_HOT, LOC_LMDB, ref_digest, ref_loc, unpack_record


def placement(store, ino: int) -> dict:
    """Counts and bytes of a regular file's blocks by where they are.

    `inline`: objects in LMDB; `hot`: bytes in the inode's hot file (being
    rewritten in place); `local`: chunk files in this store's `chunks/`;
    `remote_only`: chunks this store does not hold, safe in the bucket
    (fetched when read); `pending_upload`: chunk files not in the bucket
    yet (a remote store keeps them until they are). `missing` lists the
    (digest, size) of the remote-only chunks and `present` those of the
    local ones, for a warm-up.
    """
    out = {key: 0 for key in ("blocks", "inline", "inline_bytes", "hot", "local",
                              "local_bytes", "remote_only", "remote_only_bytes",
                              "pending_upload")}
    missing: list[tuple[bytes, int]] = []
    present: list[tuple[bytes, int]] = []
    with store.txn() as txn:
        refs = store._block_map(txn, ino)
        for ref in refs.values():
            out["blocks"] += 1
            loc = ref_loc(ref)
            if loc == LOC_HOT:
                out["hot"] += 1
                continue
            digest = ref_digest(ref)
            raw = txn.get(digest, db=store.db["content"])
            size = unpack_record(raw)[1] if raw is not None else 0
            if loc == LOC_LMDB:
                out["inline"] += 1
                out["inline_bytes"] += size
                continue
            if loc != LOC_FILE:
                continue
            entry = remotestate.entry(txn, store.db, digest)
            if entry is not None and entry[0] == remotestate.PENDING:
                out["pending_upload"] += 1
            if store.chunks.exists(digest):
                out["local"] += 1
                out["local_bytes"] += size
                present.append((digest, size))
            else:
                out["remote_only"] += 1
                out["remote_only_bytes"] += size
                missing.append((digest, size))
    out["missing"] = missing
    out["present"] = present
    return out
