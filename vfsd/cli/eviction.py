"""`vfsd step`, `vfsd evict`, `vfsd evicted`: the agent clock and what left."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .common import call, cli, human, json_option, printable


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("step", type=click.IntRange(min=0))
@json_option
def step(run_dir: Path, step: int, as_json: bool) -> None:
    """Advance the agent step to STEP and apply eviction."""
    report = call(run_dir, "set_step", step=step)
    _print_report(report, as_json)


def _print_report(report: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    verb = "would evict" if report["dry_run"] else "evicted"
    click.echo(f"step {report['step']}: {verb} {report['files']} file(s), "
               f"{human(report['bytes'])}")
    for r in report["evicted"]:
        click.echo(f"  {r['reason']:<9} {printable(r['path'])}  ({human(r['size'])}, "
                   f"written at step {r['step']})")
    deferred = report.get("deferred") or []
    if deferred:
        click.echo(f"deferred {len(deferred)} open file(s): they stay while open and are "
                   "looked at again when closed")
    for d in deferred:
        click.echo(f"  {d['reason']:<9} {printable(d['path'])}  (open, {d['handles']} handle(s); "
                   f"{human(d['size'])}, written at step {d['step']})")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Report what would go, remove nothing.")
@json_option
def evict(run_dir: Path, dry_run: bool, as_json: bool) -> None:
    """Apply the eviction policy now."""
    _print_report(call(run_dir, "evict", dry_run=dry_run), as_json)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1),
              help="Show at most this many records.")
@json_option
def evicted(run_dir: Path, limit: int, as_json: bool) -> None:
    """The eviction log, oldest first."""
    records = call(run_dir, "evicted", limit=limit)["records"]
    if as_json:
        click.echo(json.dumps(records, indent=2))
        return
    for r in records:
        click.echo(f"step {r['evicted_step']:>5}  {r['reason']:<9} {printable(r['path'])}  "
                   f"ino={r['ino']} size={r['size']} hash={r['hash']}")
