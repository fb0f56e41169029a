"""`vfsd sync`: wait until a snapshot is published to the run's bucket."""

from __future__ import annotations

from pathlib import Path

import click

from .common import call, cli, emit, json_option


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--snapshot", "snapshot_id", help="Wait for this snapshot instead of the latest.")
@click.option("--take", is_flag=True, help="Take a snapshot first, then wait for it.")
@click.option("--timeout", default=60.0, show_default=True,
              help="Seconds to wait before giving up (the publication goes on).")
@json_option
def sync(run_dir: Path, snapshot_id: str | None, take: bool, timeout: float,
         as_json: bool) -> None:
    """Wait until the latest snapshot of RUN_DIR is published to its bucket; print the `--from` that resumes it."""
    if take:
        snapshot_id = call(run_dir, "snapshot")["id"]
    args = {"timeout": timeout}
    if snapshot_id:
        args["snapshot"] = snapshot_id
    res = call(run_dir, "sync", client_timeout=timeout + 30, **args)
    if res.get("published") is not None:
        res["resume"] = f"--remote {res['remote']} --from {res['run']}@{res['published']}"
    emit(res, as_json, _text)


def _text(res: dict) -> str:
    if res.get("published") is None:
        return f"vfsd: {res.get('message', 'nothing to publish')}"
    return (f"vfsd: {res['published']} of run {res['run']} is published in {res['remote']}\n"
            f"resume it elsewhere with: vfsd mount NEW_RUN_DIR {res['resume']}")
