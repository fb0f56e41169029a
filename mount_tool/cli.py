"""`mount-tool`: the agent-side command line (mount a run dir, take and read refs).

It is for the agent and its tools, next to `vfsd` (the operator's command):
every answer is one JSON document on stdout (a FileRef, a report), so a tool
call's output can go straight into graph state; errors are on stderr.

Exit codes: 0 ok, 1 usage or daemon error, 3 evicted, 4 stale ref, 5 missing,
6 damaged (the store cannot serve the content: `vfsd fsck --verify`).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .errors import ControlError, Damaged, Evicted, Missing, MountError, StaleRef
from .mount import Mount, mount

EXIT_EVICTED, EXIT_STALE, EXIT_MISSING, EXIT_DAMAGED = 3, 4, 5, 6


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=None, separators=(", ", ": ")))


def _parse_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected KEY=VALUE, got {text!r}")
    return key.replace("-", "_"), value


def _load_ref(text: str) -> dict[str, Any]:
    """A FileRef from JSON text, `-` (stdin) or `@FILE`."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise click.BadParameter("a FileRef is a JSON object")
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Agent-side tools for vfsd mounts: mount a run dir, take and read file refs.

    Every answer is JSON on stdout (for programs); `vfsd` is the operator's
    command for the same run dirs. Exit codes: 0 ok, 1 error, 3 evicted,
    4 stale ref, 5 missing, 6 damaged.
    """


@main.command("mount")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--done-retention-steps", type=int, help="Steps a done file is kept [3].")
@click.option("--max-age-steps", type=int, help="Steps any unpinned file is kept [20].")
@click.option("--quota-bytes", help="Byte quota, e.g. 10G; oldest unpinned files go first.")
@click.option("--max-files", type=int, help="File-count limit; oldest unpinned files go first.")
@click.option("--store", type=click.Path(file_okay=False),
              help="Store directory, shared by several run dirs [RUN_DIR/.vfsd].")
@click.option("-o", "--option", "extra", multiple=True,
              help="Any `vfsd mount` option as KEY=VALUE (repeatable), e.g. -o remote=s3://B/P.")
def mount_command(run_dir: str, extra: tuple[str, ...], **flags: Any) -> None:
    """Mount RUN_DIR (RUN_DIR/fs) and print the mounted directory; the daemon keeps running."""
    options = {k: v for k, v in flags.items() if v is not None}
    options.update(_parse_option(text) for text in extra)
    try:
        m = mount(run_dir, **options)
    except (MountError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    m.detach()
    click.echo(str(m.root))


@main.command("umount")
@click.argument("run_dir", type=click.Path(file_okay=False))
def umount_command(run_dir: str) -> None:
    """Unmount RUN_DIR."""
    try:
        Mount(run_dir).unmount()
    except MountError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command("ref")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("path")
def ref_command(run_dir: str, path: str) -> None:
    """Print the FileRef (JSON) of PATH inside the mount."""
    with _attached(run_dir) as m:
        _print_json(m.ref(path))


@main.command("write")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("path")
@click.argument("source", type=click.File("rb"), default="-")
def write_command(run_dir: str, path: str, source: Any) -> None:
    """Write SOURCE (a file, default stdin) to PATH in the mount; print its FileRef."""
    with _attached(run_dir) as m:
        _print_json(m.write(path, source.read()))


@main.command("read")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("ref_json")
def read_command(run_dir: str, ref_json: str) -> None:
    """Write the content of REF_JSON (JSON, `-` for stdin, `@FILE`) to stdout, hash-checked."""
    ref = _load_ref(ref_json)
    with _attached(run_dir) as m:
        data = m.read(ref)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@main.command("step")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("step", type=int, required=False)
def step_command(run_dir: str, step: int | None) -> None:
    """Print the current step, or advance to STEP and print the eviction report."""
    with _attached(run_dir) as m:
        _print_json({"step": m.get_step()} if step is None else m.set_step(step))


@main.command("changes")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("since", type=int)
def changes_command(run_dir: str, since: int) -> None:
    """Print files changed and removed since step SINCE."""
    with _attached(run_dir) as m:
        _print_json(m.changes(since))


class _attached:
    """Attach to RUN_DIR's daemon and turn mount_tool errors into exit codes."""

    def __init__(self, run_dir: str) -> None:
        try:
            self.mount = Mount.attach(run_dir)
        except MountError as exc:
            raise click.ClickException(str(exc)) from exc

    def __enter__(self) -> Mount:
        return self.mount

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.mount.detach()
        if exc is None:
            return False
        for kind, code in (
            (Evicted, EXIT_EVICTED),
            (StaleRef, EXIT_STALE),
            (Missing, EXIT_MISSING),
            (Damaged, EXIT_DAMAGED),
        ):
            if isinstance(exc, kind):
                click.echo(f"mount-tool: {exc}", err=True)
                sys.exit(code)
        if isinstance(exc, (ControlError, ValueError, OSError)):
            raise click.ClickException(str(exc)) from exc
        return False


if __name__ == "__main__":
    main()
