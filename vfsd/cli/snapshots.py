"""`vfsd snapshot`, `snapshots`, `snapshot-delete`, `snapshot-pin`, `restore`, `fork`, `diff`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from vfsd.config import load_config
from vfsd.rundir import RunDir

from .common import call, cli
from .mount import spawn_daemon


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--pin", is_flag=True, help="Keep it whatever the retention policy says.")
@click.option("--label", default="", help="A note stored with the snapshot.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with at least `id`).")
def snapshot(run_dir: Path, pin: bool, label: str, as_json: bool) -> None:
    """Snapshot the files of RUN_DIR now; prints the snapshot's id."""
    rec = call(run_dir, "snapshot", pin=pin, label=label)
    click.echo(json.dumps(rec, indent=2) if as_json else rec["id"])


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def snapshots(run_dir: Path, as_json: bool) -> None:
    """List the retained snapshots of RUN_DIR, oldest first."""
    doc = call(run_dir, "snapshots")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for s in doc["snapshots"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["created_ns"] / 1e9))
        flags = " pinned" if s["pinned"] else ""
        label = f"  {s['label']}" if s["label"] else ""
        click.echo(f"{s['id']:>8}  step {s['step']:<6} {when}{flags}{label}")
    state = "unchanged since" if not doc["changed"] else "changed since"
    if doc["base"]:
        click.echo(f"live files: {state} {doc['base']}")


@cli.command("snapshot-delete")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
def snapshot_delete(run_dir: Path, snapshot_id: str) -> None:
    """Delete a snapshot (content only it kept is freed)."""
    rec = call(run_dir, "snapshot_delete", snapshot=snapshot_id)
    click.echo(f"vfsd: deleted {rec['id']}")


@cli.command("snapshot-pin")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.option("--unpin", is_flag=True, help="Let retention delete it again.")
def snapshot_pin(run_dir: Path, snapshot_id: str, unpin: bool) -> None:
    """Pin a snapshot (retention never deletes it) or unpin it."""
    rec = call(run_dir, "snapshot_pin", snapshot=snapshot_id, pin=not unpin)
    click.echo(f"vfsd: {rec['id']} {'pinned' if rec['pinned'] else 'unpinned'}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.option("--json", "as_json", is_flag=True)
def restore(run_dir: Path, snapshot_id: str, as_json: bool) -> None:
    """Make the files of RUN_DIR exactly what SNAPSHOT_ID holds.

    Files made since disappear, changed files revert, evicted ones return;
    the step goes back to the snapshot's.
    """
    res = call(run_dir, "restore", snapshot=snapshot_id)
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        click.echo(f"vfsd: restored {res['id']} ({res['changed']} change(s) undone, "
                   f"step {res['step']})")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.argument("new_run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--no-mount", is_flag=True, help="Only create it; mount it later with `vfsd mount`.")
@click.option("--json", "as_json", is_flag=True)
def fork(run_dir: Path, snapshot_id: str, new_run_dir: Path, no_mount: bool,
         as_json: bool) -> None:
    """Start NEW_RUN_DIR from SNAPSHOT_ID of RUN_DIR (sharing its store; no content copied)."""
    new = RunDir(new_run_dir)
    res = call(run_dir, "fork", snapshot=snapshot_id, run_dir=str(new.path))
    if not no_mount:
        config = load_config(None, {})
        spawn_daemon(new, config, Path(res["store"]), res["volume"])
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        click.echo(f"vfsd: {new.path} starts from {snapshot_id} of {RunDir(run_dir).path} "
                   f"({res['files']} files)" + ("" if no_mount else f"; mounted {new.mountpoint}"))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("a")
@click.argument("b", required=False, default="live")
@click.option("--json", "as_json", is_flag=True)
def diff(run_dir: Path, a: str, b: str, as_json: bool) -> None:
    """What changed from snapshot A to snapshot B (default: the live files)."""
    res = call(run_dir, "diff", a=a, b=b)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    marks = {"added": "A", "removed": "D", "modified": "M", "renamed": "R", "attributes": "T"}
    for c in res["changes"]:
        where = f"{c['old_path']} -> {c['path']}" if c.get("old_path") else c["path"]
        click.echo(f"{marks.get(c['change'], '?')}  {where}")
