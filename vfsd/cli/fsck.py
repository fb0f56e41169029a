"""`vfsd fsck`: check (and repair) a store with no daemon on it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from vfsd.rundir import RunDir

from .common import cli, fail, json_option, printable
from .gc import remote_store
from .runsroot import shard_of_root, shard_store


@cli.command()
@click.argument("target", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--repair", is_flag=True, help="Fix what can be fixed.")
@click.option("--verify", is_flag=True, help="Also read and hash every chunk.")
@click.option("--quarantine", is_flag=True,
              help="With --repair: move files whose content is damaged into lost+found/ at "
                   "the root, their damaged blocks dropped (read as zeros).")
@click.option("--remote", "check_remote", is_flag=True,
              help="Look up chunks missing locally in the store's bucket (with --verify: "
                   "download and hash them).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file with the remote_* options, for --remote.")
@json_option
def fsck(target: Path, repair: bool, verify: bool, quarantine: bool, check_remote: bool,
         config_path: Path | None, as_json: bool) -> None:
    """Check a store (RUN_DIR, a shard's run dir or a --store directory) with no daemon on it.

    In a store with a remote, chunks absent locally but uploaded are
    "remote-only", not damage; --remote checks that the bucket has them.
    """
    from vfsd.errors import StoreLocked
    from vfsd.store import compact

    if quarantine and not repair:
        fail("--quarantine works with --repair", 2)
    if compact.exists(target):
        store_dir = target
    elif shard_of_root(target) is not None:  # ROOT/shards/legacy: its store is ROOT/store
        store_dir = shard_store(target)
    else:
        store_dir, _ = RunDir(target).store_location()
    try:
        # Finishes a compaction cut short (as every writer does first) and
        # keeps a new one off until fsck is done.
        hold = compact.hold(store_dir) if compact.exists(store_dir) else None
    except StoreLocked as exc:
        fail(str(exc))
    try:
        _fsck(store_dir, repair, verify, as_json, check_remote, config_path, quarantine)
    finally:
        if hold is not None:
            os.close(hold)


def _fsck(store_dir: Path, repair: bool, verify: bool, as_json: bool,
          check_remote: bool = False, config_path: Path | None = None,
          quarantine: bool = False) -> None:
    from vfsd.errors import StoreLocked, StoreVersionError
    from vfsd.fsck import fsck as run_fsck
    from vfsd.fsck import lock_all, readable
    from vfsd.store.store import Store

    # Damaged pages can crash whoever reads them (SIGBUS): a child process
    # reads them all first, and damage found there is the whole report.
    if (store_dir / "lmdb" / "data.mdb").exists():
        damage = readable(store_dir)
        if damage is not None:
            _print_fsck(damage, damage, as_json)
            sys.exit(1)
    try:
        # The whole store, every volume of it (a run dir's, a shard's, a shared one).
        st = Store.base(store_dir, create=False)
    except StoreVersionError as exc:
        fail(str(exc))
    try:
        locks = lock_all(st)
    except StoreLocked as exc:
        st.close()
        fail(f"{exc}; unmount it first")
    remote = None
    if check_remote:
        from vfsd.store import remotestate

        url = remotestate.remote_url(st) if st.db.get("upload") is not None else None
        if url is None:
            st.close()
            for fd in locks:
                os.close(fd)
            fail(f"{store_dir} has no remote (it was never mounted with --remote)", 2)
        remote, _ = remote_store(url, config_path)
    try:
        report = run_fsck(st, repair=repair, verify=verify,
                          progress=sys.stderr.isatty() and not as_json, remote=remote)
        if quarantine and report.damaged_blocks:
            from vfsd.fsck import quarantine as move_to_lost_found

            report.repaired += move_to_lost_found(st, report.damaged_blocks)
        after = run_fsck(st, verify=verify, remote=remote) \
            if repair and not report.clean else report
    finally:
        st.close()
        for fd in locks:
            os.close(fd)
        if remote is not None:
            remote.close()
    _print_fsck(report, after, as_json, verified=verify)
    sys.exit(0 if after.clean else 1)


def _print_fsck(report, after, as_json: bool, verified: bool = True) -> None:
    """An fsck report (and whether a repair left the store clean), as text or JSON."""
    doc = report.as_dict()
    doc["clean_after_repair"] = after.clean
    doc["content_verified"] = verified
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for p in report.problems:
        click.echo(printable(f"problem: {p}"))
    for n in report.notes:
        click.echo(printable(f"note: {n}"))
    for r in report.repaired:
        click.echo(printable(f"repaired: {r}"))
    for f in report.damaged_files:
        click.echo(printable(f"damaged (content lost, reads fail with EIO): {f}"))
    state = "clean" if report.clean else ("repaired" if after.clean else "NOT clean")
    remote_only = report.stats.get("remote_only", 0)
    counts = (f" ({report.stats['inodes']} inodes, {report.stats.get('chunk_files', 0)} "
              "chunk files" + (f", {remote_only} remote-only chunks" if remote_only else "")
              + ")" if "inodes" in report.stats else "")
    click.echo(f"fsck: {state}{counts}")
    if not verified:
        click.echo("fsck: content not verified (chunks were not read back and hashed); "
                   "`vfsd fsck --verify` does")
