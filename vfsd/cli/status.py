"""`vfsd status`: what a run dir holds and how its daemon is doing."""

from __future__ import annotations

from pathlib import Path

import click

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir

from .common import (
    EXIT_DEAD,
    EXIT_DEGRADED,
    EXIT_FAILED,
    cli,
    control_failure,
    daemon_state,
    emit,
    fail,
    human,
    json_option,
    rows,
    warn,
)
from .shardstatus import ratio_text

#: counters that count bytes (shown in binary units; the others are plain counts)
BYTE_COUNTERS = ("bytes_read", "bytes_written")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--check", is_flag=True,
              help="For monitoring: exit 0 only if the daemon runs and is healthy (writable, "
                   "room on the store's disk, its remote tier publishing), else 1 (not "
                   "running), 4 (dead) or 5 (degraded), with the reason on stderr. For a Runs "
                   "root: 0 when a shard runs and none is dead (4) or degraded, nor its "
                   "records wrong (5); 1 when no shard runs.")
@json_option
def status(run_dir: Path, check: bool, as_json: bool) -> None:
    """Files, bytes per tier, chunks, stored vs logical bytes, snapshots, remote tier and live counters; of a shard or a Runs root too.

    Works on an unmounted run dir too (from the store). A dead daemon (killed,
    its mount left stale) is said so, with how to clean up, and exits 4. A
    shard's run dir (`vfsd mount --shard`) shows its daemon, store and every
    volume; a Runs root (mount_tool.runs) each of its shards, its threads
    and the problems found in its records.
    """
    from .runsroot import is_runs_root, shard_of_root

    if is_runs_root(Path(run_dir)):
        _root_status(Path(run_dir), check, as_json)
        return
    run = RunDir(run_dir)
    try:
        with ControlClient(run.sock, timeout=30) as c:
            doc = c.call("stats")
    except ControlError as exc:
        if exc.code == "bad_request" and _serves_shard(run):
            _shard_status(run.path, check, as_json)
            return
        fail(control_failure(run, exc))
    except DaemonUnreachable:
        doc = None if shard_of_root(run.path) else _offline(run)
        if doc is None:  # a shard's run dir: its store has volumes, but no `default`
            _shard_status(run.path, check, as_json)
            return
    doc["daemon"] = daemon_state(run, doc)
    emit(doc, as_json, _text)
    _conclude(doc["daemon"], *_health(doc), check)


def _conclude(daemon: dict, problem: str | None, code: int, check: bool) -> None:
    """A dead daemon exits 4 (with its advice) whatever; --check exits with
    the health's code."""
    if daemon.get("state") == "dead":
        warn(daemon["advice"])
        raise SystemExit(EXIT_DEAD)
    if check and problem:
        warn(problem)
        raise SystemExit(code)


def _serves_shard(run: RunDir) -> bool:
    """Whether the daemon answering on RUN_DIR's socket is a shard's."""
    try:
        with ControlClient(run.sock, timeout=30) as c:
            return bool(c.call("shard").get("shard"))
    except (ControlError, DaemonUnreachable):
        return False


def _shard_status(run_path: Path, check: bool, as_json: bool) -> None:
    from .shardstatus import shard_doc, shard_health, shard_text

    doc = shard_doc(run_path)
    emit(doc, as_json, shard_text)
    _conclude(doc["daemon"], *shard_health(doc), check)


def _root_status(root: Path, check: bool, as_json: bool) -> None:
    from .shardstatus import root_doc, root_health, root_text

    doc = root_doc(root)
    emit(doc, as_json, root_text)
    problem, code = root_health(doc)
    if code == EXIT_DEAD:
        warn(problem)
        raise SystemExit(EXIT_DEAD)
    if check and problem:
        warn(problem)
        raise SystemExit(code)


def _offline(run: RunDir) -> dict | None:
    """The status the store alone can give (no daemon answers); None when
    the store holds no volume `default` of a run dir but others: a shard's."""
    from vfsd.errors import NoSuchVolume, StoreError, StoreVersionError
    from vfsd.status import store_status
    from vfsd.store import compact
    from vfsd.store.store import Store

    try:
        store_dir, volume = run.store_location()
    except (ValueError, OSError) as exc:
        fail(f"cannot read {run.store_file}: {exc}")
    if not compact.exists(store_dir):
        if run.path.parent.name == "threads" and (run.path / "thread.json").exists():
            root = run.path.parent.parent
            fail(f"{run.path} is a thread's directory of the Runs root {root}, not a run "
                 f"dir: `vfsd threads {root}` lists the threads and where their files are, "
                 f"`vfsd status {root}` describes the root")
        fail(f"no vfsd store for {run.path} (is it a run dir? `vfsd mount {run.path}` "
             "makes one)")
    try:
        st = Store(store_dir, volume, readonly=True, create=False)
    except NoSuchVolume as exc:
        if volume == "default" and not run.store_file.exists():
            return None  # a store of its own without the run dir's volume: a shard's
        fail(f"cannot read the store of {run.path}: {exc}")
    except (StoreError, StoreVersionError) as exc:
        fail(f"cannot read the store of {run.path}: {exc}")
    try:
        return {**store_status(st), "running": False}
    finally:
        st.close()


def _health(doc: dict) -> tuple[str | None, int]:
    """What keeps the run dir from being healthy, and the --check exit code."""
    daemon = doc["daemon"]
    if daemon["state"] == "dead":
        return daemon["advice"], EXIT_DEAD
    if daemon["state"] != "running":
        return daemon.get("advice") or "not mounted", EXIT_FAILED
    if doc.get("disk_full"):
        return ("the store's disk is full: writes are refused for lack of space "
                f"({doc.get('store')}); free some there", EXIT_DEGRADED)
    remote = doc.get("remote")
    if remote:
        if remote.get("read_only"):
            return f"read-only: {remote.get('reason')}", EXIT_DEGRADED
        if remote.get("state") != "held":
            return f"remote tier {remote.get('state')}: {remote.get('reason')}", EXIT_DEGRADED
    return None, 0


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def _daemon_line(daemon: dict, doc: dict) -> str:
    state = daemon["state"]
    if state == "running":
        return f"running (pid {daemon['pid']}, up {doc.get('uptime_s', 0):.0f} s)"
    if state == "dead":
        return "DEAD (" + ("stale mount; " if daemon.get("mount") == "stale" else "") + \
            "see below)"
    return state.replace("unmounted", "not running (unmounted)")


def _snapshots_line(snaps: dict | None) -> str:
    if not snaps:
        return "none"
    if not snaps["count"]:
        return "none yet"
    base = snaps.get("base")
    live = (f"; live files {'changed' if snaps['changed'] else 'unchanged'} since {base}"
            if base else "")
    pinned = f", {snaps['pinned']} pinned" if snaps.get("pinned") else ""
    return f"{snaps['count']} (last {snaps['last']}{pinned}){live}"


def _text(doc: dict) -> str:
    pairs: list[tuple[str, object]] = [
        ("daemon", _daemon_line(doc["daemon"], doc)),
        ("store", doc["store"]),
        ("step", _count(doc["step"])),
        ("files", _count(doc["files"])),
        ("logical size", human(doc["logical_bytes"])),
        ("  inline (LMDB)", human(doc["inline_bytes"])),
        ("  chunked", human(doc["chunked_bytes"])),
        ("chunks", f"{_count(doc['chunk_count'])} ({human(doc['chunk_bytes'])})"),
        ("stored size", human(doc["stored_bytes"])
         + (f" (the whole store: {doc['store_volumes']:,} volumes)"
            if doc.get("store_volumes", 1) > 1 else "")),
        ("stored / logical", ratio_text(doc.get("stored_ratio"), doc.get("store_volumes", 1))),
        ("xattrs", human(doc["xattr_bytes"])),
        ("snapshots", _snapshots_line(doc.get("snapshots"))),
    ]
    if doc.get("unbound_checkpoints"):
        pairs.append(("unbound checkpoints", f"{_count(doc['unbound_checkpoints'])} (graph "
                      "checkpoints without a snapshot of their files: see the log)"))
    remote = doc.get("remote")
    if remote:
        backlog = remote.get("backlog", {})
        age = remote.get("oldest_unpublished_change_age_s")
        pairs += [
            ("remote", remote.get("url")),
            ("  run", remote.get("run")),
            ("  lease", remote.get("state") + (f" ({remote['reason']})"
                                               if remote.get("reason") else "")),
            ("  upload backlog", f"{_count(backlog.get('chunks', 0))} chunk(s), "
                                 f"{human(backlog.get('bytes', 0))}"),
            ("  uploaded, unpublished",
             f"{_count(backlog.get('unpublished_chunks', 0))} chunk(s), "
             f"{human(backlog.get('unpublished_bytes', 0))}"),
            ("  published", (remote.get("publisher") or {}).get("published") or "none"),
            ("  oldest unpublished change", "none" if age is None else f"{age:.1f} s ago"),
            ("  last error", remote.get("last_error") or "none"),
        ]
        cache = remote.get("cache") or {}
        if cache:
            limit = cache.get("limit")
            pairs.append(("  local chunk cache", f"{human(cache.get('bytes', 0))}"
                          + (f" of {human(limit)}" if limit else " (no bound)")))
    policy = doc.get("eviction_policy")
    if policy:
        pairs.append(("eviction", f"max age {policy['max_age_steps']} steps, done retention "
                                  f"{policy['done_retention_steps']}, age from "
                                  f"{'last use' if policy['age_from'] == 'use' else 'last write'}"))
        for rule in policy["rules"]:
            sets = ", ".join(f"{k} {str(v).lower()}" for k, v in rule.items()
                             if k not in ("index", "path", "builtin", "why"))
            builtin = " (built-in)" if rule.get("builtin") else ""
            pairs.append((f"  rule {rule['index']}{builtin}", f"{rule['path']}: {sets}"))
        if policy.get("builtin_rules") is False:
            pairs.append(("  built-in rules", "off (builtin_eviction_rules = false)"))
    if doc.get("disk_full"):
        pairs.append(("store disk", "FULL: writes are refused for lack of space"))
    if "quota_used_bytes" in doc:
        limit = f" of {human(doc['quota_bytes'])}" if doc.get("quota_bytes") else ""
        pairs.append(("quota used", f"{human(doc['quota_used_bytes'])}{limit}"))
        if doc.get("quota_unlinked_bytes"):
            pairs.append(("  unlinked, still open", human(doc["quota_unlinked_bytes"])))
    refusal = doc.get("quota_refusal")
    if refusal:
        pairs.append(("last refusal", f"at step {refusal['step']}: {refusal['message']}"))
    for key, value in doc.get("counters", {}).items():
        shown = human(value) if key in BYTE_COUNTERS else _count(value)
        pairs.append((key.replace("_", " "), shown))
    return rows(pairs)
