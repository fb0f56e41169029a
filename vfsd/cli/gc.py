"""`vfsd gc`: unreferenced chunks out of a local store or a bucket."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from vfsd.config import ConfigError, load_config
from vfsd.rundir import RunDir, pid_alive

from .common import call, cli, emit, fail, human, json_option, phase_progress, rows


@cli.command()
@click.argument("target", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--remote", "remote_url", metavar="s3://BUCKET/PREFIX",
              help="Sweep this bucket prefix (chunks no manifest of any run names).")
@click.option("--bucket", is_flag=True,
              help="Ask RUN_DIR's daemon to sweep its bucket instead of its local store.")
@click.option("--grace", type=float, help="Keep chunks younger than this many seconds "
                                          "[remote_gc_grace, 3600].")
@click.option("--dry-run", is_flag=True, help="Report what would go; delete nothing.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file with the remote_* options (endpoint, credentials...).")
@click.option("--compact", "do_compact", is_flag=True,
              help="Also shrink the LMDB file to what it holds (no daemon may use the store).")
@json_option
def gc(target: Path | None, remote_url: str | None, bucket: bool, grace: float | None,
       dry_run: bool, config_path: Path | None, do_compact: bool, as_json: bool) -> None:
    """Remove unreferenced chunks from a store (TARGET: a run dir or a store directory) or a bucket.

    `vfsd gc RUN_DIR` (or `vfsd gc STORE`, a --store directory shared by
    several run dirs) cleans the local store; `vfsd gc --remote s3://B/P` (or
    `vfsd gc RUN_DIR --bucket`) marks the chunks every run's manifests name
    and deletes the others older than the grace period.
    """
    if remote_url is not None:
        _gc_bucket(remote_url, grace, dry_run, config_path, as_json)
        return
    if target is None:
        fail("give RUN_DIR or STORE (a local store) or --remote s3://BUCKET/PREFIX", 2)
    from vfsd.store import compact

    if compact.exists(target) and not RunDir(target).state.exists():
        if bucket:
            fail(f"{target} is a store directory; --bucket needs a mounted RUN_DIR", 2)
        # A shared store: the daemons of its run dirs each hold one volume, and
        # chunk files are shared store-wide, so the sweep runs here, under the
        # same locks as with a run dir (a compaction needs every volume free).
        emit(_gc_offline(Path(target), None, do_compact, as_json), as_json, _gc_text)
        return
    run = RunDir(target)
    if bucket:
        args = {"remote": True, "dry_run": dry_run}
        if grace is not None:
            args["grace"] = grace
        emit(call(target, "gc", client_timeout=3600, **args), as_json, _sweep_text)
        return
    if pid_alive(run.read_pid()):
        if do_compact:
            fail(f"{run.path} is mounted: unmount it to compact its store")
        result = call(target, "gc")
    else:
        store_dir, volume = run.store_location()
        result = _gc_offline(store_dir, volume, do_compact, as_json)
    emit(result, as_json, _gc_text)


def _gc_text(doc: dict) -> str:
    pairs = [("chunk files removed", doc.get("chunks_removed", 0)),
             ("tombstones removed", doc.get("tombstones_removed", 0)),
             ("temporaries removed", doc.get("temps_removed", 0))]
    if "before_bytes" in doc:
        pairs.append(("LMDB file", f"{human(doc['before_bytes'])} -> "
                                   f"{human(doc['after_bytes'])}"))
    return rows(pairs)


def _sweep_text(doc: dict) -> str:
    verb = "would delete" if doc.get("dry_run") else "deleted"
    count = len(doc.get("would_delete", [])) if doc.get("dry_run") else doc.get("deleted", 0)
    pairs = [("bucket", doc.get("url")),
             ("runs", doc.get("runs", 0)),
             ("manifests read", doc.get("manifests", 0)),
             ("chunks", f"{doc.get('chunks', 0)} ({human(doc.get('chunk_bytes', 0))})"),
             ("chunks named", doc.get("marked", 0)),
             (f"deleted threads' runs ({verb})", f"{len(doc.get('runs_deleted', []))} "
                                       f"({doc.get('run_objects_deleted', 0)} objects)"
                                       + (f"; {len(doc['runs_refused'])} refused (see --json)"
                                          if doc.get("runs_refused") else "")),
             ("kept, younger than grace", f"{doc.get('young', 0)} "
                                          f"(grace {doc.get('grace', 0):g} s)"),
             (verb, f"{count} chunk(s)" + ("" if doc.get("dry_run")
                                           else f", {human(doc.get('deleted_bytes', 0))}")),
             ("took", f"{doc.get('duration_s', 0):.1f} s")]
    return rows(pairs)


def _gc_offline(store_dir: Path, volume: str | None, do_compact: bool,
                as_json: bool = False) -> dict:
    """gc (and compaction) of a store no daemon of this run dir uses, in this process.
    `volume` None: a store directory named on the command line (no volume opened)."""
    from vfsd.errors import StoreLocked, StoreVersionError
    from vfsd.fsck import lock_all
    from vfsd.store import compact
    from vfsd.store.lmdbcheck import check_readable
    from vfsd.store.store import Store

    if not compact.exists(store_dir):
        fail(f"no vfsd store at {store_dir}")
    locks: list[int] = []
    try:
        try:
            hold = compact.hold(store_dir)
        except StoreLocked as exc:
            fail(str(exc))
        try:
            # Never write to (or copy) a store whose pages do not all read.
            damage = (check_readable(store_dir)
                      if (store_dir / "lmdb" / "data.mdb").exists() else None)
            if damage is not None:
                fail(f"{damage}; run `vfsd fsck {store_dir}` for a report")
            try:
                st = Store(store_dir, volume, create=False)
            except StoreVersionError as exc:
                fail(str(exc))
            try:
                locks = lock_all(st) if do_compact else []
                result = st.gc_chunks(min_temp_age_s=0)
            except StoreLocked as exc:
                fail(f"{exc}; unmount it to compact the store")
            finally:
                st.close()
        finally:
            os.close(hold)
        if do_compact:
            try:
                with phase_progress(enabled=not as_json, unit="B") as tell:
                    result.update(compact.compact(store_dir, on_progress=tell))
            except StoreLocked as exc:
                fail(str(exc))
    finally:
        for fd in locks:
            os.close(fd)
    return result


def remote_store(url_text: str, config_path: Path | None):
    """An ObjectStore for a command-line tool (settings from --config and AWS_*)."""
    from vfsd.logs import setup_logging
    from vfsd.remote.objstore import (
        BadRemoteURL,
        ObjectStore,
        RemoteError,
        RemoteSettings,
        RemoteURL,
    )

    setup_logging("warning", sys.stderr)  # stdout is the command's answer
    try:
        config = load_config(config_path, {})
        url = RemoteURL.parse(url_text)
        return ObjectStore(url, RemoteSettings.from_config(config)), config
    except (ConfigError, BadRemoteURL) as exc:
        fail(str(exc), 2)
    except RemoteError as exc:
        fail(str(exc))


def _gc_bucket(url_text: str, grace: float | None, dry_run: bool,
               config_path: Path | None, as_json: bool) -> None:
    from vfsd.remote.bucketgc import GcError, sweep
    from vfsd.remote.objstore import RemoteError

    store, config = remote_store(url_text, config_path)
    try:
        with phase_progress(enabled=not as_json) as tell:
            report = sweep(store, grace=grace if grace is not None else config.remote_gc_grace,
                           dry_run=dry_run, on_progress=tell)
    except (GcError, RemoteError) as exc:
        fail(str(exc))
    finally:
        store.close()
    emit(report.as_dict(), as_json, _sweep_text)
