"""`vfsd remote ls`: the runs and published snapshots in a bucket prefix."""

from __future__ import annotations

from pathlib import Path

import click

from .common import EXIT_USAGE, cli, emit, fail, json_option


@cli.group()
def remote() -> None:
    """Look into a remote tier's bucket without mounting anything."""


@remote.command("ls")
@click.argument("url", metavar="s3://BUCKET/PREFIX")
@click.argument("run", required=False)
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file with the remote_* options (endpoint, credentials...).")
@click.option("--quiet", "-q", is_flag=True,
              help="Print only the run ids that have published, one per line (for scripts).")
@json_option
def ls(url: str, run: str | None, config_path: Path | None, quiet: bool, as_json: bool) -> None:
    """List the runs in a bucket prefix (or RUN's published snapshots), with what `--from` takes.

    Each run shows its latest published snapshot and its lease (held by
    which worker, or free); `vfsd mount NEW_RUN_DIR --remote URL --from RUN`
    resumes its latest snapshot, `--from RUN@sN` a given one.
    """
    from vfsd.remote.head import HeadError, read_head
    from vfsd.remote.layout import check_run_id, parse_run_key
    from vfsd.remote.lease import Lease
    from vfsd.remote.objstore import RemoteError

    from .gc import remote_store

    if run is not None:
        try:
            check_run_id(run)
        except ValueError as exc:
            fail(str(exc), EXIT_USAGE)
    store, _config = remote_store(url, config_path)
    try:
        if run is None:
            runs = sorted({p[0] for p in (parse_run_key(o.key) for o in store.list("runs/"))
                           if p is not None})
        else:
            runs = [run]
        listed = []
        for r in runs:
            try:
                head = read_head(store, r)
            except HeadError as exc:
                listed.append({"run": r, "error": str(exc)})
                continue
            lease = Lease(store, r).read()
            listed.append(_run_doc(r, head, lease, detail=run is not None))
    except RemoteError as exc:
        fail(str(exc))
    finally:
        store.close()
    if run is not None and listed[0].get("latest") is None and "error" not in listed[0]:
        fail(f"run {run} has published nothing in {url}")
    if quiet and not as_json:
        for r in listed:
            if r.get("latest"):
                click.echo(r["run"])
        return
    emit({"remote": url, "runs": listed}, as_json,
         lambda doc: _text(doc, detail=run is not None))


def _run_doc(run: str, head, lease, detail: bool) -> dict:
    doc: dict = {"run": run, "latest": None, "published": 0, "lease": _lease_doc(lease)}
    if head is not None:
        doc["latest"] = f"s{head.latest}" if head.latest else None
        doc["published"] = len(head.snapshots)
        doc["generation"] = head.generation
        doc["writer"] = head.writer
        if detail:
            doc["snapshots"] = [{"id": f"s{s['seq']}", "step": s["step"],
                                 "full": not s["parent"],
                                 "parent": f"s{s['parent']}" if s["parent"] else None}
                                for s in head.snapshots]
    return doc


def _lease_doc(state) -> dict:
    if state is None:
        return {"state": "none"}
    owner = (state.record or {}).get("owner") or {}
    if state.expired:
        return {"state": "free", "last_holder": owner or None}
    return {"state": "held", "holder": owner or None,
            "expires_in_s": round(max(0.0, state.expires_in), 1)}


def _lease_text(lease: dict) -> str:
    if lease["state"] != "held":
        return lease["state"]
    who = lease.get("holder") or {}
    where = f"{who.get('host', '?')}/pid {who.get('pid', '?')}"
    return f"held by {where} (lapses in {lease['expires_in_s']:.0f} s unless renewed)"


def _text(doc: dict, detail: bool):
    runs = doc["runs"]
    if not runs:
        yield f"no runs in {doc['remote']}"
        return
    width = max(len(r["run"]) for r in runs)
    if not detail:
        yield f"{'RUN':<{width}}  {'LATEST':<8}  {'PUBLISHED':>9}  LEASE"
    for r in runs:
        if "error" in r:
            yield f"{r['run']:<{width}}  damaged: {r['error']}"
            continue
        if detail:
            yield f"run {r['run']}: latest {r['latest']}, lease {_lease_text(r['lease'])}"
            for s in r.get("snapshots", []):
                kind = "full" if s["full"] else f"delta on {s['parent']}"
                yield f"  {s['id']:>8}  step {s['step']:<6} {kind}"
        else:
            yield (f"{r['run']:<{width}}  {r['latest'] or '-':<8}  {r['published']:>9}  "
                   f"{_lease_text(r['lease'])}")
    latest = [r for r in runs if r.get("latest")]
    if latest:
        r = latest[0]
        yield (f"resume with: vfsd mount NEW_RUN_DIR --remote {doc['remote']} --from "
               f"{r['run']}  (its latest, {r['latest']}; or --from {r['run']}@{r['latest']})")
