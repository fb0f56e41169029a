"""The status document shown by `vfsd status` and the `stats` control request."""

from __future__ import annotations

import os
import time

from . import __version__


def store_status(store) -> dict:
    """What the store alone can tell (works with the daemon stopped)."""
    c = store.counters()
    logical = c["logical_bytes"]
    inline = c["inline_bytes"]
    stored = c["blob_bytes"] + c["chunk_bytes"]
    doc = {
        "version": __version__,
        "store": str(store.dir),
        "volume": store.volume,
        "run": store.run_id,
        "chunk_size": store.chunk_size,
        "step": c["step"],
        "files": c["files"],
        "logical_bytes": logical,
        "inline_bytes": inline,
        "chunked_bytes": logical - inline,
        "chunk_count": c["chunk_count"],
        "chunk_bytes": c["chunk_bytes"],
        "blob_count": c["blob_count"],
        "blob_bytes": c["blob_bytes"],
        "xattr_bytes": c["xattr_bytes"],
        # Content the whole store holds (deduplicated; older versions that
        # snapshots keep included), for every volume of it together.
        "stored_bytes": stored,
        "store_volumes": volume_count(store),
        # stored / logical: below 1, what dedup saved; None when the store
        # holds other volumes too (its stored bytes are theirs together).
        "stored_ratio": None,
        "snapshots": _snapshot_summary(store),
        # Graph checkpoints whose files their checkpointer could not bind to a
        # snapshot (mount_tool's VfsdCheckpointer counts them; a run from one refuses).
        "unbound_checkpoints": c["unbound_checkpoints"],
        "remote": _remote_summary(store),
    }
    if doc["store_volumes"] <= 1:
        doc["stored_ratio"] = stored_ratio(stored, logical)
    return doc


def stored_ratio(stored: int, logical: int) -> float | None:
    """Stored bytes per logical byte (0.25: dedup saved 75%; above 1: snapshots
    keep more older content than dedup saves); None with no logical bytes."""
    return round(stored / logical, 3) if logical else None


def volume_count(store) -> int:
    """How many volumes the store holds (its run dirs, forks, a shard's threads)."""
    with store.txn() as txn:
        return txn.stat(store.db["volume"])["entries"]


def recorded_thread(view) -> str | None:
    """The graph thread id a volume records (a shard's `thread` meta), if any."""
    raw = view.meta_bytes(b"thread")
    return raw.decode("utf-8", "surrogatepass") if raw is not None else None


def volume_summary(view) -> dict:
    """One volume of a store in a few numbers (a shard's `volumes` request,
    and `vfsd threads` / `vfsd status` on a store no daemon serves)."""
    from vfsd.snapshots.snapshots import Snapshots

    c = view.counters()
    count, newest = Snapshots(view).count_and_newest()
    return {"volume": view.volume, "thread": recorded_thread(view), "step": c["step"],
            "files": c["files"], "bytes": c["logical_bytes"], "snapshots": count,
            "last_snapshot": newest["id"] if newest else None,
            "last_snapshot_ns": newest.get("created_ns") if newest else None,
            "incomplete": bool(view.meta_u64(b"incomplete")),
            "unbound_checkpoints": c["unbound_checkpoints"]}


def store_summary(store) -> dict:
    """What a store holds for all its volumes together: content objects and
    their bytes, the LMDB file's size on disk."""
    c = store.counters()
    try:
        lmdb_bytes = (store.dir / "lmdb" / "data.mdb").stat().st_size
    except OSError:
        lmdb_bytes = None
    return {"store": str(store.dir), "volumes": volume_count(store),
            "chunk_count": c["chunk_count"], "chunk_bytes": c["chunk_bytes"],
            "blob_count": c["blob_count"], "blob_bytes": c["blob_bytes"],
            "stored_bytes": c["blob_bytes"] + c["chunk_bytes"], "lmdb_bytes": lmdb_bytes}


def _snapshot_summary(store) -> dict:
    """How many snapshots are kept, the last, and whether the live files moved on."""
    from vfsd.snapshots.snapshots import Snapshots

    snaps = Snapshots(store)
    listed = snaps.list()
    return {"count": len(listed), "pinned": sum(1 for s in listed if s["pinned"]),
            **snaps.state()}


def _remote_summary(store) -> dict | None:
    """The remote tier as the store records it (the running daemon says more)."""
    from vfsd.store import remotestate

    if store.db.get("upload") is None:
        return None
    url = remotestate.remote_url(store)
    if url is None:
        return None
    counts = remotestate.counts(store)
    published = remotestate.published(store)
    return {"url": url, "run": store.run_id, "state": "not running", "read_only": False,
            "reason": None,
            "backlog": {"chunks": counts["upload_chunks"], "bytes": counts["upload_bytes"],
                        "unpublished_chunks": counts["unpublished_chunks"],
                        "unpublished_bytes": counts["unpublished_bytes"]},
            "publisher": {"published": f"s{max(published)}" if published else None},
            "oldest_unpublished_change_age_s": None, "last_error": None}


def live_status(daemon) -> dict:
    """Store status plus the running daemon's counters."""
    doc = store_status(daemon.store)
    ops = daemon.ops
    ev = daemon.evictor
    doc.update({
        "running": True,
        "pid": os.getpid(),
        "mountpoint": str(daemon.run.mountpoint),
        "uptime_s": round(time.monotonic() - daemon.started, 1),
        # What the quota counts: content (buffered writes included) and xattrs,
        # of files unlinked while open too (until freed: `quota_unlinked_bytes`).
        "quota_used_bytes": ev.usage(),
        "quota_unlinked_bytes": ev.unlinked_usage(),
        "quota_bytes": daemon.config.quota_bytes,
        "open_files": len(ops.files.files),
        # A first snapshot being built in steps: objects recorded so far, and
        # about how many there are (a progress bar for `vfsd snapshot`).
        "snapshot_in_progress": getattr(getattr(daemon, "snapservice", None),
                                        "first_progress", None),
        # Due files left alone because they are open: they go at their close
        # if still due (the first 100 paths).
        "eviction_deferred": ev.deferred_paths(100),
        # The policy as the evictor applies it: rules by path first (the first
        # match wins: the user's, then the built-in ones, `builtin: true`, with
        # why), the global limits last.
        "eviction_policy": {"age_from": daemon.config.age_from,
                            "max_age_steps": daemon.config.max_age_steps,
                            "done_retention_steps": daemon.config.done_retention_steps,
                            "builtin_rules": daemon.config.builtin_eviction_rules,
                            "rules": [{"index": r.index, **r.as_dict()}
                                      for r in ev.policy.rules.rules]},
        # The last write the quota or max_files refused (ENOSPC) and what held
        # the room (records a built-in rule keeps, pinned or open files); None
        # once a later write that needed room got it.
        "quota_refusal": ev.refusal,
        "dirty_bytes": ops.files.dirty_bytes,
        "dirty_limit": ops.files.dirty_limit,
        "hot_files": len(daemon.store.hot_inodes()),
        "chunk_cache_bytes": daemon.store.chunks.cache_bytes,
        "chunk_cache_limit": daemon.store.chunks.cache_limit,
        # True while the store refuses writes for lack of disk space (`--check`).
        "disk_full": ops.disk.full(),
        "counters": {**ops.counters.as_dict(), "evicted": ev.evicted_total,
                     # Every ENOSPC refusal: the quota, max_files, the disk.
                     "enospc": ev.enospc_total + ops.disk.refusals,
                     "enospc_disk": ops.disk.refusals,
                     "eviction_deferred": ev.deferred_total,
                     "chunk_cache_hits": daemon.store.chunks.cache_hits,
                     "chunk_cache_misses": daemon.store.chunks.cache_misses,
                     # LMDB's last transaction id: write transactions so far.
                     "lmdb_write_txns": daemon.store.env.info()["last_txnid"]},
        "requests": dict(ops.counters.requests),  # FUSE requests by handler
        "config": daemon.config.as_dict(),
    })
    if daemon.remote is not None:
        doc["remote"] = daemon.remote.status()
    return doc


def perf_status(daemon) -> dict:
    """Cumulative figures of a running daemon, cheap to gather once a second:
    requests and their latencies by FUSE operation (timed while someone
    watches), bytes, cache and tier hits, the upload backlog."""
    ops = daemon.ops
    store = daemon.store
    doc = {
        "time": time.time(),
        "uptime_s": round(time.monotonic() - daemon.started, 3),
        "step": store.get_step(),
        "requests": dict(ops.counters.requests),
        "latency": ops.tracer.latency.as_dict(),
        "timed": ops.tracer.on,
        "counters": ops.counters.as_dict(),
        "chunk_cache": {"hits": store.chunks.cache_hits, "misses": store.chunks.cache_misses,
                        "bytes": store.chunks.cache_bytes},
        "open_files": len(ops.files.files),
        "dirty_bytes": ops.files.dirty_bytes,
        "access_log_readers": len(ops.tracer.log.readers),
        "provenance": ops.provenance.status(),
        "snapshot_latency": daemon.snapservice.latency.as_dict(),
        "eviction_latency": daemon.evictor.latency.as_dict(),
        "remote": None,
    }
    remote = daemon.remote
    if remote is not None:
        fetch = remote.fetcher.stats if remote.fetcher is not None else {}
        up = remote.uploader.status() if remote.uploader is not None else {}
        doc["remote"] = {
            "state": remote.state,
            "fetch_local": fetch.get("local", 0),
            "fetch_downloads": fetch.get("downloads", 0),
            "fetch_bytes": fetch.get("downloaded_bytes", 0),
            "upload_backlog": up.get("backlog", 0),
            "upload_backlog_bytes": up.get("backlog_bytes", 0),
            "uploaded": up.get("uploaded", 0),
            "sent_bytes": up.get("sent_bytes", 0),
            "requests": remote.objstore.latency_dict(),
        }
    return doc
