"""`vfsd unevict`, and the path form of `vfsd restore`: some files back, nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import click

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir

from .common import EXIT_USAGE, cli, emit, fail, json_option, printable, unreachable

#: refusals that are the input's fault: exit 2 (the rest, 1)
BAD_INPUT = frozenset({"forbidden", "bad_request"})


def mount_relative(run: RunDir, path: str) -> str:
    """PATH relative to the mount root (an absolute path must lie inside the mount)."""
    if os.path.isabs(path):
        try:
            return str(Path(os.path.abspath(path)).relative_to(run.mountpoint))
        except ValueError:
            fail(f"{path} is not inside {run.mountpoint}", EXIT_USAGE)
    return path


def bring_back(run_path: Path, op: str, paths: tuple[str, ...], **args) -> dict:
    """One `unevict` or path `restore` request; a refusal ends the command
    with its reason (exit 2 for a path that is no path here, 1 otherwise)."""
    run = RunDir(run_path)
    rel = [mount_relative(run, p) for p in paths]
    try:
        with ControlClient(run.sock, timeout=120.0) as c:
            return c.call(op, paths=rel, **args)
    except DaemonUnreachable as exc:
        fail(unreachable(run, exc))
    except ControlError as exc:
        fail(exc.message, EXIT_USAGE if exc.code in BAD_INPUT else 1)


def report_text(res: dict) -> str:
    lines = [f"vfsd: brought back {len(res['restored'])} file(s) from "
             f"{', '.join(res['from']) or 'no snapshot'} (their age starts at step "
             f"{res['step']})"]
    lines += [f"  {printable(p)}" for p in res["restored"]]
    if res.get("unchanged"):
        lines.append(f"{len(res['unchanged'])} file(s) already as the snapshot has them")
    if res.get("lost"):
        lines.append(f"{len(res['lost'])} evicted file(s) no retained snapshot holds "
                     "(their content is gone):")
        lines += [f"  {printable(p)}" for p in res["lost"]]
    return "\n".join(lines)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("paths", nargs=-1, required=True)
@click.option("--force", is_flag=True,
              help="Replace a file that lives at an evicted path now.")
@json_option
def unevict(run_dir: Path, paths: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Bring evicted files back from the retained snapshots that hold them.

    Each PATH is an evicted file, or a directory: every file evicted below it
    comes back. Nothing else in the tree changes; the files come back with
    their inode numbers (references to them resolve again) and count as
    written now. Exit 1 when eviction never removed PATH, no retained
    snapshot holds it, or a file lives there (unless --force); 2 for a path
    outside the mount.
    """
    res = bring_back(run_dir, "unevict", paths, force=force)
    emit(res, as_json, report_text)
