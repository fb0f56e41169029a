"""`vfsd ref`: the reference graph state keeps for a file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from vfsd.rundir import RunDir

from .common import call, cli, fail


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("path")
def ref(run_dir: Path, path: str) -> None:
    """Print the reference (JSON) of PATH, relative to the mount root or absolute inside it."""
    run = RunDir(run_dir)
    p = Path(path)
    if p.is_absolute():
        try:
            path = str(Path(os.path.abspath(p)).relative_to(run.mountpoint))
        except ValueError:
            fail(f"{path} is not inside {run.mountpoint}", 2)
    click.echo(json.dumps(call(run_dir, "ref", path=path)))
