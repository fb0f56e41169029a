"""`vfsd profile`: where the time goes, from the access log."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import defaultdict
from pathlib import Path

import click

from vfsd.rundir import RunDir, mount_state

from .common import EXIT_USAGE, cli, emit, fail, human, json_option


class Entry:
    """One access log line, parsed (see `vfsd.fuse.accesslog` for the format)."""

    __slots__ = ("op", "path", "nbytes", "seconds", "pid", "call", "result")

    @classmethod
    def parse(cls, line: str) -> Entry | None:
        fields = line.split()
        if len(fields) < 9 or line.startswith("#"):
            return None
        e = cls()
        try:
            e.op, e.path = fields[2], " ".join(fields[3:-5])
            e.nbytes, e.seconds = int(fields[-5]), float(fields[-4])
            e.pid = fields[-3].removeprefix("pid=")
            e.call = fields[-2].removeprefix("call=")
            e.result = fields[-1]
        except ValueError:
            return None
        return e


class Profile:
    """Totals of parsed lines by tool call, path and operation."""

    def __init__(self) -> None:
        self.lines = 0
        self.dropped = 0
        self.skipped = 0
        self.by = {key: defaultdict(lambda: [0, 0.0, 0, defaultdict(int)])
                   for key in ("call", "path", "op")}

    def feed(self, line: str) -> None:
        if line.startswith("# dropped "):
            try:
                self.dropped += int(line.split()[2])
            except (IndexError, ValueError):
                pass
            return
        e = Entry.parse(line)
        if e is None:
            if line.strip() not in ("", "#"):
                self.skipped += 1
            return
        self.lines += 1
        for key, value in (("call", e.call), ("path", e.path), ("op", e.op)):
            row = self.by[key][value]
            row[0] += 1
            row[1] += e.seconds
            row[2] += e.nbytes
            if key != "op":
                row[3][e.op] += e.seconds

    def report(self, top: int, seconds: float | None) -> dict:
        def table(key: str) -> list[dict]:
            rows = sorted(self.by[key].items(), key=lambda kv: -kv[1][1])[:top]
            out = []
            for name, (n, t, nbytes, ops) in rows:
                row = {key: name, "ops": n, "seconds": round(t, 6), "bytes": nbytes}
                if key != "op":
                    row["busiest_ops"] = [op for op, _ in
                                          sorted(ops.items(), key=lambda kv: -kv[1])[:3]]
                out.append(row)
            return out

        total = sum(row[1] for row in self.by["op"].values())
        return {"operations": self.lines, "seconds_in_requests": round(total, 6),
                "watched_s": None if seconds is None else round(seconds, 3),
                "dropped": self.dropped, "unparsed": self.skipped,
                "by_call": table("call"), "by_path": table("path"), "by_op": table("op")}


def _text(doc: dict):
    watched = f" over {doc['watched_s']:.1f} s" if doc["watched_s"] is not None else ""
    yield (f"{doc['operations']} operations{watched}, {doc['seconds_in_requests']:.3f} s "
           f"in requests" + (f"; {doc['dropped']} lines dropped (the reader fell behind)"
                             if doc["dropped"] else ""))
    for title, key, rows in (("tool call", "call", doc["by_call"]),
                             ("path", "path", doc["by_path"]),
                             ("operation", "op", doc["by_op"])):
        if not rows:
            continue
        width = max(len(title), *(len(_name(key, r[key])) for r in rows))
        yield ""
        yield f"{title:<{width}}  {'ops':>8}  {'time s':>9}  {'bytes':>10}  busiest"
        for r in rows:
            busiest = ", ".join(r.get("busiest_ops", []))
            yield (f"{_name(key, r[key]):<{width}}  {r['ops']:>8}  {r['seconds']:>9.4f}  "
                   f"{human(r['bytes']):>10}  {busiest}")


def _name(key: str, value: str) -> str:
    if key == "call" and value == "-":
        return "(no tool call)"
    return value


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seconds", type=click.FloatRange(0.1, 86400), default=10.0, show_default=True,
              help="How long to watch the access log of the mounted run dir (Ctrl-C stops "
                   "early and still reports).")
@click.option("--file", "log_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read a saved access log instead (`cat .vfsd/accesslog > FILE`); "
                   "`-` reads standard input.")
@click.option("--top", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Rows per table.")
@json_option
def profile(run_dir: Path, seconds: float, log_file: Path | None, top: int,
            as_json: bool) -> None:
    """Top tool calls, paths and operations by time spent in the filesystem, from the access log.

    Watches RUN_DIR/fs/.vfsd/accesslog for --seconds, or reads a saved log.
    """
    prof = Profile()
    watched = None
    if log_file is not None:
        stream = sys.stdin if str(log_file) == "-" else None
        try:
            with (open(log_file, encoding="utf-8", errors="surrogateescape")
                  if stream is None else contextlib.nullcontext(stream)) as f:
                for line in f:
                    prof.feed(line)
        except OSError as exc:
            fail(f"cannot read {log_file}: {exc}", EXIT_USAGE)
    else:
        run = RunDir(run_dir)
        if mount_state(run.mountpoint) != "live":
            fail(f"{run.path} is not mounted (give --file to read a saved access log)")
        t0 = time.monotonic()
        try:
            with open(run.mountpoint / ".vfsd" / "accesslog", "rb", buffering=0) as f:
                pending = b""
                while time.monotonic() - t0 < seconds:
                    data = f.read(1 << 16)
                    if not data:
                        break
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        prof.feed(line.decode("utf-8", "surrogateescape"))
        except KeyboardInterrupt:
            pass
        except OSError as exc:
            fail(f"cannot read the access log of {run.path}: {exc}")
        watched = time.monotonic() - t0
    emit(prof.report(top, watched), as_json, _text)

