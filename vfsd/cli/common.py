"""What every verb shares: the `vfsd` group, output, failing with a message, control calls.

The conventions these helpers carry are written in `vfsd.cli`'s docstring.
"""

from __future__ import annotations

import json
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import click

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir, mount_state, pid_alive

# Exit codes. 0, 1 and 2 mean the same for every verb; the others belong to
# the verbs named and are documented in the command table (docs/operations.md).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad input: click's own usage errors use 2 as well
#: `vfsd umount`: unmounted, but snapshots or chunks were left unpublished
EXIT_UNPUBLISHED = 3
#: `vfsd status`: the run dir's daemon is dead (a stale mount is left)
EXIT_DEAD = 4
#: `vfsd status --check`: running, but not healthy (read-only, remote degraded)
EXIT_DEGRADED = 5


def fail(msg: str, code: int = EXIT_FAILED):
    """`vfsd: msg` on stderr, then exit with `code` (control characters
    escaped: a message may name files, see `printable`)."""
    click.echo(printable(f"vfsd: {msg}"), err=True)
    sys.exit(code)


def warn(msg: str) -> None:
    """`vfsd: msg` on stderr; the command goes on."""
    click.echo(printable(f"vfsd: {msg}"), err=True)


def human(n: float) -> str:
    """A byte count in binary units: `512 B`, `1.5 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def rows(pairs: list[tuple[str, object]]) -> str:
    """Aligned `key  value` lines, the text form of a status-like answer."""
    if not pairs:
        return ""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in pairs)


def table(header: tuple[str, ...], body: list[tuple[str, ...]],
          right: frozenset[int] = frozenset()) -> list[str]:
    """Aligned columns, a header line first: the text form of a list (the
    columns at the indexes in `right` aligned right, as numbers are)."""
    out = [header, *body]
    widths = [max(len(r[i]) for r in out) for i in range(len(header))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in out]


def emit(doc, as_json: bool, text=None) -> None:
    """Print a verb's answer: `doc` as JSON with --json, else `text(doc)` (a str
    or lines); without `text` the doc is printed as compact JSON either way."""
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    if text is None:
        click.echo(json.dumps(doc))
        return
    out = text(doc)
    if isinstance(out, str):
        if out:
            click.echo(printable(out))
    else:
        for line in out:
            click.echo(printable(line))


#: C0 and C1 control characters but tab and newline, and DEL
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with control characters written as escapes: names, labels and
    paths can come from anyone (a planted run in a bucket included), and a
    terminal takes ESC sequences as orders (set the title, write the
    clipboard, hide lines)."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


#: what `escaped` leaves as it is: printable ASCII but the backslash
_PLAIN = re.compile(r"[!-\[\]-~]*")


def escaped(text: str, errors: str = "surrogatepass") -> str:
    """`text` as one field of a line: spaces, control characters, backslashes
    and everything beyond ASCII as `\\xNN` escapes of its UTF-8 bytes, as
    the access log writes paths (`vfsd.fuse.accesslog.escape`). Unambiguous
    (two texts never look alike), free of spaces, and safe for a terminal:
    a thread id may hold ESC sequences, bidi overrides or invisible
    characters. Lone surrogates (a thread id decoded from JSON may hold one)
    are written as the bytes they are hashed as (UTF-8, surrogatepass); a
    path's undecodable bytes as they are with `errors="surrogateescape"`."""
    if _PLAIN.fullmatch(text):
        return text
    out = []
    for ch in text:
        if ch != "\\" and "!" <= ch <= "~":
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", errors))
    return "".join(out)


def shown_id(thread_id: str | None) -> str:
    """A thread id for a terminal: in quotes (the empty id shows), escaped as
    `escaped` does, a quote inside as \\x22."""
    if thread_id is None:
        return "?"
    return '"' + escaped(thread_id).replace('"', "\\x22") + '"'


def json_option(fn):
    """The --json flag every verb has."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document instead of text.")(fn)


@contextmanager
def progress(total: int | None, desc: str, unit: str = "it", enabled: bool = True):
    """A tqdm bar on stderr when it is a terminal (and `enabled`), else a no-op
    object with the same `update()`."""
    if enabled and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                   unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000)
        try:
            yield bar
        finally:
            bar.close()
    else:
        yield _NoBar()


@contextmanager
def phase_progress(enabled: bool = True, unit: str = "it"):
    """A callback `tell(phase, done, total)` that keeps one progress bar per
    phase of a long job (total None: not known yet), on stderr when it is a
    terminal and `enabled`; a no-op otherwise."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda phase, done, total: None
        return
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def tell(phase: str, done: int, total: int | None) -> None:
        bar = bars.get(phase)
        if bar is None:
            for other in bars.values():
                other.close()
            bar = bars[phase] = tqdm(total=total, desc=phase, unit=unit, file=sys.stderr,
                                     leave=False, unit_scale=unit == "B",
                                     unit_divisor=1024 if unit == "B" else 1000)
        if total is not None and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield tell
    finally:
        for bar in bars.values():
            bar.close()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


class SizeType(click.ParamType):
    """A byte count typed as `65536`, `10G` or `256MiB`."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        from vfsd.config import ConfigError, parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(value, param.name if param else "size")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()


class VfsdCommand(click.Command):
    """A verb whose one-line summary is shown whole in the group's help."""

    def get_short_help_str(self, limit: int = 45) -> str:
        return super().get_short_help_str(limit=10_000)


class VfsdGroup(click.Group):
    """The `vfsd` group: its verbs are VfsdCommands (and nested groups VfsdGroups)."""

    command_class = VfsdCommand

    def get_short_help_str(self, limit: int = 45) -> str:
        return super().get_short_help_str(limit=10_000)


VfsdGroup.group_class = VfsdGroup

CONTEXT = {"help_option_names": ["-h", "--help"]}


@click.group(cls=VfsdGroup, context_settings=CONTEXT)
@click.version_option(package_name="vfsd", help="Print the version and exit.")
def cli() -> None:
    """vfsd: a FUSE filesystem for LLM agent artifacts.

    Exit codes: 0 done, 1 failed, 2 bad input; `vfsd umount` 3 (work left
    unpublished), `vfsd status` 4 (dead daemon) and 5 (`--check`: not healthy).
    """


def unreachable(run: RunDir, exc: DaemonUnreachable) -> str:
    """What to tell the user when the daemon did not answer."""
    pid = run.read_pid()
    # A killed process closes its sockets a moment before it is gone.
    deadline = time.monotonic() + 2.0
    while pid is not None and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid is not None and not pid_alive(pid):
        return (f"{exc}: the daemon (pid {pid}) has exited; see {run.log}. "
                f"`vfsd umount {run.path}` removes the dead mount; `vfsd mount {run.path}` "
                "also does, and mounts again")
    if pid is None:
        return f"{exc}; is {run.path} mounted?"
    return f"{exc}; see {run.log}"


def control_failure(run: RunDir, exc: ControlError) -> str:
    if exc.code == "not_found":
        return f"not found: {exc.message}"
    if exc.code == "busy":
        return (f"the daemon of {run.path} is saturated ({exc.message}); "
                "retry in a moment")
    return exc.message


def call(run_path: Path, op: str, /, client_timeout: float = 60.0, **args) -> dict:
    """One control request; any failure ends the command with a clear message."""
    run = RunDir(run_path)
    try:
        with ControlClient(run.sock, timeout=client_timeout) as c:
            return c.call(op, **args)
    except DaemonUnreachable as exc:
        fail(unreachable(run, exc))
    except ControlError as exc:
        fail(control_failure(run, exc))


def running(run: RunDir) -> bool:
    """True when RUN_DIR's daemon process is alive."""
    return pid_alive(run.read_pid())


def daemon_state(run: RunDir, doc: dict) -> dict:
    """running, unmounted, unresponsive, or dead (a daemon that went away
    without unmounting); `doc` is what the daemon answered (`running`, `pid`)."""
    if doc.get("running"):
        return {"state": "running", "pid": doc.get("pid")}
    pid = run.read_pid()
    try:
        mount = mount_state(run.mountpoint)
    except OSError:
        mount = "stale"
    if mount == "stale" or (pid is not None and not pid_alive(pid)):
        return {"state": "dead", "pid": pid, "mount": mount,
                "advice": (f"the daemon of {run.path}"
                           + (f" (pid {pid})" if pid else "")
                           + " is dead" + (f" and {run.mountpoint} is a stale mount "
                                           "(\"Transport endpoint is not connected\")"
                                           if mount == "stale" else "")
                           + f"; see {run.log}. `vfsd umount {run.path}` cleans up; "
                             f"`vfsd mount {run.path}` cleans up and mounts again")}
    if pid is not None and pid_alive(pid):
        return {"state": "unresponsive", "pid": pid,
                "advice": f"the daemon (pid {pid}) runs but does not answer; see {run.log}"}
    return {"state": "unmounted", "pid": None}
