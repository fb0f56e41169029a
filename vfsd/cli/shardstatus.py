"""`vfsd status` of a shard's run dir and of a Runs root (a run dir's is in `status`).

A shard serves many volumes, so its status is the shard's (daemon, store,
volumes served and held) with a line per volume; a Runs root's is each of
its shards' and what its thread records and volumes say together
(`runsroot`). Both work mounted or not. `--check` for a shard is a run
dir's: 0 only when its daemon runs and is healthy; for a root: 0 when at
least one shard runs, none is dead or degraded and nothing is wrong with
the records (see `root_health`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from vfsd.rundir import RunDir

from .common import (
    EXIT_DEAD,
    EXIT_DEGRADED,
    EXIT_FAILED,
    escaped,
    human,
    rows,
    shown_id,
    table,
)
from .runsroot import (
    RECORD,
    THREADS_DIR,
    ShardView,
    read_root,
    read_shard,
    shard_of_root,
    shard_store,
)
from .threads import when

#: volumes listed one per line in a shard's text status (--json has all)
VOLUMES_SHOWN = 50


def shard_doc(run_path: Path) -> dict:
    """The status document of a shard's run dir."""
    from vfsd.status import stored_ratio

    run = RunDir(run_path)
    found = shard_of_root(run.path)
    name = found[1] if found else run.path.name
    view = read_shard(name, run.path, shard_store(run.path))
    if found is not None:  # a Runs' shard: each volume is a thread with a record
        for volume in view.volumes:
            if not (found[0] / THREADS_DIR / volume / RECORD).exists():
                view.problems.append(f"volume {volume} belongs to no thread record under "
                                     f"{found[0] / THREADS_DIR}")
    volumes = sorted(view.volumes.values(), key=lambda v: v["volume"])
    for v in volumes:
        if v.get("incomplete"):
            view.problems.append(f"volume {v['volume']} is a copy still being made (or one "
                                 "that died)")
    logical = sum(v["bytes"] for v in volumes)
    store = view.store or {}
    return {"kind": "shard", "shard": str(run.path), "name": name,
            "root": str(found[0]) if found else None, "store": str(view.store_dir),
            "mountpoint": str(run.mountpoint), "daemon": view.daemon, "uptime_s": view.uptime_s,
            "running": view.running, "pid": view.daemon.get("pid"),
            "volume_count": len(volumes), "served": sum(1 for v in volumes if v["served"]),
            "logical_bytes": logical, "stored_bytes": store.get("stored_bytes"),
            "stored_ratio": stored_ratio(store["stored_bytes"], logical) if store else None,
            "store_summary": view.store, "volumes": volumes, "problems": view.problems}


def shard_health(doc: dict) -> tuple[str | None, int]:
    """What keeps a shard from being healthy, and the --check exit code."""
    daemon = doc["daemon"]
    if daemon["state"] == "dead":
        return daemon["advice"], EXIT_DEAD
    if daemon["state"] != "running":
        return daemon.get("advice") or f"shard {doc['shard']} is not mounted", EXIT_FAILED
    if (doc.get("store_summary") or {}).get("disk_full"):
        return (f"the store's disk is full: writes are refused for lack of space "
                f"({doc['store']}); free some there", EXIT_DEGRADED)
    return None, 0


def _daemon_text(daemon: dict, uptime: float | None) -> str:
    state = daemon.get("state")
    if state == "running":
        return f"running (pid {daemon.get('pid')}, up {uptime or 0:.0f} s)"
    if state == "dead":
        return "DEAD (" + ("stale mount; " if daemon.get("mount") == "stale" else "") + \
            "see below)"
    if state == "unmounted":
        return "not running (unmounted)"
    return str(state)


def _store_text(store: dict | None) -> str:
    if not store:
        return "none yet (never mounted)"
    lmdb = store.get("lmdb_bytes")
    return (f"{human(store['stored_bytes'])} of content ({store['chunk_count']:,} chunk(s), "
            f"{store['blob_count']:,} inline object(s))"
            + (f", LMDB file {human(lmdb)}" if lmdb is not None else "")
            + (", DISK FULL" if store.get("disk_full") else ""))


def ratio_text(ratio: float | None, shared_by: int = 1) -> str:
    """stored / logical as people read it: what dedup saved, or what the
    history costs on top of the live files."""
    if ratio is None:
        if shared_by > 1:
            return (f"- (the store holds {shared_by:,} volumes: its stored size is theirs "
                    "together)")
        return "- (no files)"
    if ratio <= 1:
        return f"{ratio:.2f} (saved {(1 - ratio) * 100:.0f}%)"
    return (f"{ratio:.2f} (older versions that snapshots keep take {(ratio - 1) * 100:.0f}% "
            "more than dedup saves)")


def shard_text(doc: dict) -> list[str]:
    where = f"{doc['name']} of {escaped(doc['root'], 'surrogateescape')}" if doc["root"] \
        else escaped(doc["shard"], "surrogateescape")
    lines = [rows([
        ("shard", where),
        ("daemon", _daemon_text(doc["daemon"], doc["uptime_s"])),
        ("store", escaped(doc["store"], "surrogateescape")),
        ("store size", _store_text(doc["store_summary"])),
        ("volumes", f"{doc['volume_count']:,} ({doc['served']:,} served)"),
        ("logical size", human(doc["logical_bytes"])),
        ("stored / logical", ratio_text(doc["stored_ratio"])),
    ])]
    if doc["volumes"]:
        body = [(v["volume"], shown_id(v["thread"]) if v["thread"] is not None else "-",
                 f"{v['files']:,}", human(v["bytes"]), f"{v['step']:,}", f"{v['snapshots']:,}",
                 when(v["last_snapshot_ns"]), "yes" if v["served"] else "no")
                for v in doc["volumes"][:VOLUMES_SHOWN]]
        body = [(a, b if len(b) <= 40 else b[:37] + "...", *rest) for a, b, *rest in body]
        lines.append("")
        lines += table(("VOLUME", "THREAD", "FILES", "BYTES", "STEP", "SNAPSHOTS",
                        "LAST SNAPSHOT", "SERVED"), body, right=frozenset({2, 3, 4, 5}))
        if len(doc["volumes"]) > VOLUMES_SHOWN:
            lines.append(f"... and {len(doc['volumes']) - VOLUMES_SHOWN:,} more (--json lists "
                         "them all" + (", `vfsd threads ROOT` with their threads" if doc["root"]
                                       else "") + ")")
    lines += [f"problem: {p}" for p in doc["problems"]]
    return lines


# -- a Runs root ----------------------------------------------------------------------------


def root_doc(root: Path) -> dict:
    """The status document of a Runs root."""
    view = read_root(root)
    states = Counter(t.state for t in view.threads)
    shards = [_root_shard(s) for s in view.shards.values()]
    return {"kind": "runs_root", "root": str(view.root), "shards": shards,
            "threads": len(view.threads), "threads_by_state": dict(sorted(states.items())),
            "threads_served": sum(1 for t in view.threads if t.as_dict(view.shards)["served"]),
            "running_shards": sum(1 for s in view.shards.values() if s.running),
            "problems": view.problems}


def _root_shard(s: ShardView) -> dict:
    doc = s.as_dict()
    doc["logical_bytes"] = sum(v["bytes"] for v in s.volumes.values())
    return doc


def root_health(doc: dict) -> tuple[str | None, int]:
    """What keeps a Runs root from being healthy, and the --check exit code:
    4 a shard's daemon is dead, 5 a shard's disk is full or the records have
    problems, 1 no shard runs (a Runs mounts its shards at their threads'
    first use: a root nothing serves has none running), else 0."""
    for s in doc["shards"]:
        if s["daemon"].get("state") == "dead":
            return f"shard {s['name']}: {s['daemon']['advice']}", EXIT_DEAD
    for s in doc["shards"]:
        if (s.get("store_summary") or {}).get("disk_full"):
            return (f"shard {s['name']}: the store's disk is full: writes are refused for lack "
                    f"of space ({s['store']})", EXIT_DEGRADED)
    if doc["problems"]:
        return f"{len(doc['problems'])} problem(s): {doc['problems'][0]}", EXIT_DEGRADED
    if not doc["running_shards"]:
        return f"no shard of {doc['root']} is mounted (nothing serves it)", EXIT_FAILED
    return None, 0


def root_text(doc: dict) -> list[str]:
    states = ", ".join(f"{n:,} {s}" for s, n in doc["threads_by_state"].items())
    pairs: list[tuple[str, object]] = [
        ("root", escaped(doc["root"], "surrogateescape") + " (a Runs root; `vfsd threads "
                                                          "ROOT` lists its threads)"),
        ("threads", f"{doc['threads']:,}" + (f" ({states})" if states else "")
         + f", {doc['threads_served']:,} served"),
        ("shards", f"{len(doc['shards'])} ({doc['running_shards']} running)"),
    ]
    for s in doc["shards"]:
        pairs.append((f"  shard {s['name']}",
                      f"{_daemon_text(s['daemon'], s['uptime_s'])}; {s['volumes']:,} "
                      f"volume(s), {s['served']:,} served, {human(s['logical_bytes'])} of files"))
        pairs.append(("    store", f"{escaped(s['store'], 'surrogateescape')}: "
                                   f"{_store_text(s['store_summary'])}"))
    return [rows(pairs)] + [f"problem: {p}" for p in doc["problems"]]
