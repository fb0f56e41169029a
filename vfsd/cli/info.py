"""`vfsd info`: everything vfsd knows about one file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from vfsd.config import ConfigError, load_config
from vfsd.rundir import RunDir

from .common import EXIT_USAGE, call, cli, emit, fail, human, json_option, rows, running


def mount_relative(run: RunDir, path: str) -> str:
    """PATH relative to the mount root (an absolute path must lie inside the mount)."""
    p = Path(path)
    if p.is_absolute():
        try:
            return str(Path(os.path.abspath(p)).relative_to(run.mountpoint))
        except ValueError:
            fail(f"{path} is not inside {run.mountpoint}", EXIT_USAGE)
    return path


def call_text(doc: dict | None) -> str:
    """One tool call (`calls.describe`) as people read it."""
    if doc is None:
        return "no tool call"
    if doc.get("unknown"):
        return "unknown (written before vfsd kept provenance)"
    if "tool" not in doc:
        return f"call {doc['key']} (recorded by another worker)"
    thread = f", thread {doc['thread']}" if doc.get("thread") else ""
    step = f", step {doc['step']}" if doc.get("step") is not None else ""
    return f"{doc['tool']} {doc['id']}{thread}{step}"


def _text(doc: dict) -> str:
    c = doc["content"]
    parts = [f"{c['blocks']} block(s)"]
    if c["inline"]:
        parts.append(f"{c['inline']} inline ({human(c['inline_bytes'])})")
    if c["local"]:
        parts.append(f"{c['local']} chunk file(s) here ({human(c['local_bytes'])})")
    if c["remote_only"]:
        parts.append(f"{c['remote_only']} only in the bucket ({human(c['remote_only_bytes'])})")
    if c["in_bucket"]:
        parts.append(f"{c['in_bucket']} in the bucket")
    if c["pending_upload"]:
        parts.append(f"{c['pending_upload']} waiting for upload")
    if c["hot"]:
        parts.append(f"{c['hot']} being rewritten in place")
    snaps = [f"{s['id']} (step {s['step']}{'' if s['same_content'] else ', older content'}"
             + (f", {s['label']}" if s["label"] else "") + ")" for s in doc["snapshots"]]
    pairs = [
        ("path", doc["path"]), ("size", f"{human(doc['size'])} ({doc['size']} bytes)"),
        ("made by", call_text(doc["made_by"])), ("changed by", call_text(doc["changed_by"])),
        ("step", doc["step"]), ("status", doc["status"] + (", pinned" if doc["pinned"] else "")),
        ("modified", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc["mtime_ns"] / 1e9))),
        ("tier", doc["tier"]), ("content", ", ".join(parts)),
        ("snapshots", ", ".join(snaps) or "none holds it"),
        ("eviction", doc["eviction"]["text"]),
        ("hash", doc["hash"] or "-"),
    ]
    if doc.get("open_handles"):
        pairs.append(("open", f"{doc['open_handles']} handle(s)"))
    return rows(pairs)


def offline_info(run: RunDir, path: str, config_file: Path | None) -> dict:
    """The `info` document from an unmounted run dir's store, read-only."""
    from vfsd.errors import NotFound, StoreError
    from vfsd.fileinfo import file_info
    from vfsd.store import filehash, remotestate
    from vfsd.store.calls import describe
    from vfsd.store.content import ref_digest

    from .snapshots import offline_snapshots

    try:
        config = load_config(config_file, {})
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    with offline_snapshots(run) as (snaps, st):
        try:
            inode = st.resolve_path(path)
        except NotFound:
            fail(f"not found: {path}")
        except StoreError as exc:
            fail(str(exc), EXIT_USAGE)
        if not inode.is_reg:
            fail(f"{path} is not a regular file", EXIT_USAGE)
        digests = {i: ref_digest(r) for i, r in st.block_map(inode.ino).items()}
        content_hash = filehash.file_hash(inode.size, digests, st.chunk_size).hex()
        doc = file_info(st, snaps, inode, st.path_of(inode.ino) or path, config=config,
                        step=st.get_step(),
                        describe_call=lambda key: describe(key, st.get_call(key)),
                        content_hash=content_hash,
                        remote=st.db.get("upload") is not None
                        and remotestate.remote_url(st) is not None)
    doc["mounted"] = False
    return doc


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("path")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="The run's config file, for the eviction rule of an unmounted run dir "
                   "[the defaults]; a mounted one uses its daemon's.")
@json_option
def info(run_dir: Path, path: str, config_file: Path | None, as_json: bool) -> None:
    """Everything about one file: which tool call made and changed it, tier, where its chunks are, snapshots holding it, when eviction takes it.

    Works on an unmounted run dir too (from the store). PATH is relative to
    the mount root, or absolute inside the mount.
    """
    run = RunDir(run_dir)
    path = mount_relative(run, path)
    if running(run):
        doc = {**call(run_dir, "info", path=path), "mounted": True}
    else:
        doc = offline_info(run, path, config_file)
    emit(doc, as_json, _text)
