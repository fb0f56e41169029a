"""What `vfsd info` says about one file: provenance, tier, where its chunks
are, the snapshots holding it, and its eviction rule.

The same document comes from a running daemon (the `info` control request)
and from an unmounted run dir's store (read-only); `describe_call` turns the
inode's call keys into descriptions (see `vfsd.store.calls`).
"""

from __future__ import annotations

from collections.abc import Callable

from vfsd.snapshots.snapshots import snapshot_id
from vfsd.store.inode import STATUS_NAMES, Inode
from vfsd.store.placement import placement

from .eviction import explain
from .evictscope import Scope

#: snapshots looked at for versions of the file (the newest first)
SNAPSHOTS_SCANNED = 1000


def file_info(store, snaps, inode: Inode, path: str, *, config, step: int,
              describe_call: Callable[[int], dict | None], content_hash: str | None,
              open_handles: int | None = None, remote: bool = False) -> dict:
    """The `vfsd info` document of a regular file; `remote`: the store has a bucket."""
    where = placement(store, inode.ino)
    chunks = where["local"] + where["remote_only"]
    if not remote:
        where["pending_upload"] = 0  # every store counts them; only a remote one uploads
    where["in_bucket"] = chunks - where["pending_upload"] if remote else 0
    live_blocks = store.block_map(inode.ino)
    held = []
    for rec in list(reversed(snaps.list()))[:SNAPSHOTS_SCANNED]:
        entry = snaps.inode_at(rec["seq"], inode.ino)
        if entry is None:
            continue
        same = entry.inode.size == inode.size and entry.blocks == live_blocks
        held.append({"id": snapshot_id(rec["seq"]), "step": rec["step"],
                     "label": rec.get("label", ""), "same_content": same,
                     "changed_by": describe_call(entry.inode.changed_by)})
    held.reverse()
    tier = "inline" if where["blocks"] == where["inline"] else (
        "remote" if where["remote_only"] and not where["local"] and not where["inline"]
        else "chunked")
    return {
        "path": path, "ino": inode.ino, "gen": inode.gen, "size": inode.size,
        "hash": content_hash, "step": inode.step, "status": STATUS_NAMES[inode.status],
        "pinned": inode.pinned, "mtime_ns": inode.mtime_ns,
        "made_by": describe_call(inode.made_by),
        "changed_by": describe_call(inode.changed_by),
        "tier": tier,
        "content": {k: v for k, v in where.items() if k not in ("missing", "present")},
        "snapshots": held,
        "used_step": inode.use_step,
        "eviction": explain(inode, step, config, path=path, scope=Scope(store)),
        "open_handles": open_handles,
    }
