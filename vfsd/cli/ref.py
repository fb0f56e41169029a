"""`vfsd ref`: the reference graph state keeps for a file."""

from __future__ import annotations

import os
from pathlib import Path

import click

from vfsd.rundir import RunDir

from .common import call, cli, emit, fail, json_option


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("path")
@json_option
def ref(run_dir: Path, path: str, as_json: bool) -> None:
    """Print the reference graph state keeps for PATH (a JSON document, compact; indented with --json).

    PATH is relative to the mount root, or absolute inside the mount.
    """
    run = RunDir(run_dir)
    p = Path(path)
    if p.is_absolute():
        try:
            path = str(Path(os.path.abspath(p)).relative_to(run.mountpoint))
        except ValueError:
            fail(f"{path} is not inside {run.mountpoint}", 2)
    emit(call(run_dir, "ref", path=path), as_json)
