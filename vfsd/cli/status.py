"""`vfsd status`: what a run dir holds and how its daemon is doing."""

from __future__ import annotations

import json
from pathlib import Path

import click

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir

from .common import cli, control_failure, fail, human


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(run_dir: Path, as_json: bool) -> None:
    """Files, bytes per tier, chunks, dedup ratio and live counters."""
    run = RunDir(run_dir)
    try:
        with ControlClient(run.sock, timeout=30) as c:
            doc = c.call("stats")
    except ControlError as exc:
        fail(control_failure(run, exc))
    except DaemonUnreachable:
        from vfsd.status import store_status
        from vfsd.store.store import Store

        try:
            store_dir, volume = run.store_location()
            st = Store(store_dir, volume, readonly=True, create=False)
        except Exception as exc:
            fail(f"no vfsd store for {run.path}: {exc}")
        doc = {**store_status(st), "running": False}
        st.close()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    rows = [
        ("running", "yes" if doc.get("running") else "no"),
        ("store", doc["store"]),
        ("step", doc["step"]),
        ("files", doc["files"]),
        ("logical bytes", human(doc["logical_bytes"])),
        ("  inline (LMDB)", human(doc["inline_bytes"])),
        ("  chunked", human(doc["chunked_bytes"])),
        ("chunks", f"{doc['chunk_count']} ({human(doc['chunk_bytes'])})"),
        ("stored bytes", human(doc["stored_bytes"])),
        ("dedup ratio", f"{doc['dedup_ratio']:.2f}x"),
        ("xattrs", human(doc["xattr_bytes"])),
    ]
    remote = doc.get("remote")
    if remote:
        backlog = remote.get("backlog", {})
        age = remote.get("oldest_unpublished_change_age_s")
        rows += [
            ("remote", remote.get("url")),
            ("  run", remote.get("run")),
            ("  lease", remote.get("state") + (f" ({remote['reason']})"
                                               if remote.get("reason") else "")),
            ("  upload backlog", f"{backlog.get('chunks', 0)} chunk(s), "
                                 f"{human(backlog.get('bytes', 0))}"),
            ("  uploaded, unpublished", f"{backlog.get('unpublished_chunks', 0)} chunk(s)"),
            ("  published", (remote.get("publisher") or {}).get("published") or "none"),
            ("  oldest unpublished change", "none" if age is None else f"{age:.1f} s ago"),
            ("  last error", remote.get("last_error") or "none"),
        ]
        cache = remote.get("cache") or {}
        if cache:
            limit = cache.get("limit")
            rows.append(("  local chunk cache", f"{human(cache.get('bytes', 0))}"
                         + (f" of {human(limit)}" if limit else " (no bound)")))
    if "quota_used_bytes" in doc:
        limit = f" of {human(doc['quota_bytes'])}" if doc.get("quota_bytes") else ""
        rows.append(("quota used", f"{human(doc['quota_used_bytes'])}{limit}"))
    for key, value in doc.get("counters", {}).items():
        rows.append((key.replace("_", " "), value))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
