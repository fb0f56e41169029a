"""`vfsd gc`: unreferenced chunks out of a local store or a bucket."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from vfsd.config import ConfigError, load_config
from vfsd.rundir import RunDir, pid_alive

from .common import call, cli, fail


@cli.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
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
def gc(run_dir: Path | None, remote_url: str | None, bucket: bool, grace: float | None,
       dry_run: bool, config_path: Path | None, do_compact: bool) -> None:
    """Remove unreferenced chunks: from RUN_DIR's store, or from a bucket.

    `vfsd gc RUN_DIR` cleans the local store; `vfsd gc --remote s3://B/P`
    (or `vfsd gc RUN_DIR --bucket`) marks the chunks every run's manifests
    name and deletes the others older than the grace period.
    """
    if remote_url is not None:
        _gc_bucket(remote_url, grace, dry_run, config_path)
        return
    if run_dir is None:
        fail("give RUN_DIR (local store) or --remote s3://BUCKET/PREFIX", 2)
    run = RunDir(run_dir)
    if bucket:
        args = {"remote": True, "dry_run": dry_run}
        if grace is not None:
            args["grace"] = grace
        click.echo(json.dumps(call(run_dir, "gc", client_timeout=3600, **args)))
        return
    if pid_alive(run.read_pid()):
        if do_compact:
            fail(f"{run.path} is mounted: unmount it to compact its store")
        result = call(run_dir, "gc")
    else:
        result = _gc_offline(run, do_compact)
    click.echo(json.dumps(result))


def _gc_offline(run: RunDir, do_compact: bool) -> dict:
    """gc (and compaction) of an unmounted run dir's store, in this process."""
    from vfsd.errors import StoreLocked, StoreVersionError
    from vfsd.fsck import lock_all
    from vfsd.store import compact
    from vfsd.store.lmdbcheck import check_readable
    from vfsd.store.store import Store

    store_dir, volume = run.store_location()
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
                result.update(compact.compact(store_dir))
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
               config_path: Path | None) -> None:
    from vfsd.remote.bucketgc import GcError, sweep
    from vfsd.remote.objstore import RemoteError

    store, config = remote_store(url_text, config_path)
    try:
        report = sweep(store, grace=grace if grace is not None else config.remote_gc_grace,
                       dry_run=dry_run)
    except (GcError, RemoteError) as exc:
        fail(str(exc))
    finally:
        store.close()
    click.echo(json.dumps(report.as_dict()))
