"""`vfsd stats`: a live view of a mounted run dir, a line per second."""

from __future__ import annotations

import time
from pathlib import Path

import click

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.latency import Latency
from vfsd.rundir import RunDir

from .common import cli, control_failure, emit, fail, human, json_option, unreachable

#: how many header-less lines before the header is printed again
HEADER_EVERY = 20


def _latency(raw: dict) -> Latency:
    lat = Latency()
    lat.count, lat.errors, lat.total_ns = raw["count"], raw["errors"], raw["total_ns"]
    for i, n in enumerate(raw["buckets"]):
        lat.buckets[i] = n
    return lat


def _delta(new: dict, old: dict | None) -> Latency:
    """The requests between two cumulative samples of one operation."""
    lat = _latency(new)
    if old is not None:
        prev = _latency(old)
        lat.count -= prev.count
        lat.errors -= prev.errors
        lat.total_ns -= prev.total_ns
        lat.buckets = [a - b for a, b in zip(lat.buckets, prev.buckets, strict=True)]
    return lat


def rates(new: dict, old: dict) -> dict:
    """What happened between two `perf` samples, per second."""
    dt = max(new["uptime_s"] - old["uptime_s"], 1e-6)
    ops = {}
    total = Latency()
    timed_n = 0
    for op, count in sorted(new["requests"].items()):
        n = count - old["requests"].get(op, 0)
        if n <= 0:
            continue
        entry: dict = {"per_s": round(n / dt, 1)}
        raw = new["latency"].get(op)
        if raw is not None:
            lat = _delta(raw, old["latency"].get(op))
            if lat.count > 0:
                entry.update(avg_ms=round(lat.total_ns / lat.count / 1e6, 4),
                             p99_ms=round(lat.quantile(0.99) * 1e3, 4),
                             errors=lat.errors)
                total.count += lat.count
                total.total_ns += lat.total_ns
                timed_n += lat.count
        ops[op] = entry
    c_new, c_old = new["counters"], old["counters"]
    hits = new["chunk_cache"]["hits"] - old["chunk_cache"]["hits"]
    misses = new["chunk_cache"]["misses"] - old["chunk_cache"]["misses"]
    doc = {
        "interval_s": round(dt, 3),
        "step": new["step"],
        "requests_per_s": round((sum(new["requests"].values())
                                 - sum(old["requests"].values())) / dt, 1),
        "avg_ms": round(total.total_ns / total.count / 1e6, 4) if total.count else None,
        "read_bytes_per_s": round((c_new["bytes_read"] - c_old["bytes_read"]) / dt),
        "write_bytes_per_s": round((c_new["bytes_written"] - c_old["bytes_written"]) / dt),
        "chunk_cache_hit_ratio": round(hits / (hits + misses), 3) if hits + misses else None,
        "open_files": new["open_files"],
        "dirty_bytes": new["dirty_bytes"],
        "ops": ops,
        "remote": None,
    }
    r_new, r_old = new.get("remote"), old.get("remote")
    if r_new is not None and r_old is not None:
        local = r_new["fetch_local"] - r_old["fetch_local"]
        fetched = r_new["fetch_downloads"] - r_old["fetch_downloads"]
        doc["remote"] = {
            "state": r_new["state"],
            "fetch_bytes_per_s": round((r_new["fetch_bytes"] - r_old["fetch_bytes"]) / dt),
            "local_hit_ratio": round(local / (local + fetched), 3) if local + fetched else None,
            "upload_bytes_per_s": round((r_new["sent_bytes"] - r_old["sent_bytes"]) / dt),
            "upload_backlog": r_new["upload_backlog"],
            "upload_backlog_bytes": r_new["upload_backlog_bytes"],
        }
    return doc


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def _header(remote: bool) -> str:
    line = (f"{'time':<8}  {'step':>5}  {'req/s':>8}  {'avg ms':>7}  {'read/s':>10}  "
            f"{'write/s':>10}  {'cache':>5}  {'open':>4}")
    if remote:
        line += f"  {'fetch/s':>10}  {'local':>5}  {'upload/s':>10}  {'backlog':>10}"
    return line + "  busiest (req/s, avg ms)"


def _line(doc: dict) -> str:
    avg = "-" if doc["avg_ms"] is None else f"{doc['avg_ms']:.3f}"
    line = (f"{time.strftime('%H:%M:%S'):<8}  {doc['step']:>5}  {doc['requests_per_s']:>8.0f}  "
            f"{avg:>7}  {human(doc['read_bytes_per_s']):>10}  "
            f"{human(doc['write_bytes_per_s']):>10}  {_pct(doc['chunk_cache_hit_ratio']):>5}  "
            f"{doc['open_files']:>4}")
    r = doc["remote"]
    if r is not None:
        line += (f"  {human(r['fetch_bytes_per_s']):>10}  {_pct(r['local_hit_ratio']):>5}  "
                 f"{human(r['upload_bytes_per_s']):>10}  {human(r['upload_backlog_bytes']):>10}")
    busiest = sorted(doc["ops"].items(), key=lambda kv: -kv[1]["per_s"])[:3]
    shown = [f"{op} {e['per_s']:.0f}" + (f" {e['avg_ms']:.3f}" if "avg_ms" in e else "")
             for op, e in busiest]
    return line + "  " + (", ".join(shown) or "idle")


def _op_lines(doc: dict):
    for op, e in sorted(doc["ops"].items(), key=lambda kv: -kv[1]["per_s"]):
        lat = (f"avg {e['avg_ms']:.3f} ms, p99 < {e['p99_ms']:.3f} ms"
               if "avg_ms" in e else "not timed")
        errs = f", {e['errors']} failed" if e.get("errors") else ""
        yield f"    {op:<12} {e['per_s']:>9.1f}/s  {lat}{errs}"


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=1.0, show_default=True,
              help="Seconds between lines.")
@click.option("--count", type=click.IntRange(1), default=None,
              help="Stop after this many lines [until interrupted; 1 with --json].")
@click.option("--ops", "per_op", is_flag=True,
              help="Under each line, every FUSE operation seen with its rate and latency.")
@json_option
def stats(run_dir: Path, interval: float, count: int | None, per_op: bool,
          as_json: bool) -> None:
    """A live view of a mounted run dir: requests per second and their latency, bytes, cache and tier hits, upload backlog.

    Each line covers one interval. Requests are timed only while someone
    watches (this command, a Prometheus endpoint, an access log reader).
    """
    run = RunDir(run_dir)
    if count is None and as_json:
        count = 1
    watch = max(3 * interval, 5.0)
    samples = []
    try:
        with ControlClient(run.sock, timeout=30) as client:
            prev = client.call("perf", watch=watch)
            shown = 0
            while count is None or shown < count:
                time.sleep(interval)
                cur = client.call("perf", watch=watch)
                doc = rates(cur, prev)
                prev = cur
                if as_json:
                    samples.append(doc)
                else:
                    if shown % HEADER_EVERY == 0:
                        click.echo(_header(doc["remote"] is not None))
                    click.echo(_line(doc))
                    if per_op:
                        for line in _op_lines(doc):
                            click.echo(line)
                shown += 1
    except DaemonUnreachable as exc:
        fail(unreachable(run, exc))
    except ControlError as exc:
        fail(control_failure(run, exc))
    except KeyboardInterrupt:
        pass
    if as_json:
        emit({"samples": samples}, True)
