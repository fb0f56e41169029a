"""The nodes that keep a graph's `files` true to the mount.

    graph.add_node("vfsd_step", make_step_node(runs))   # advance step, evict, prune refs
    graph.add_node("vfsd_sync", make_sync_node(runs))   # refs for files the shell wrote

`write_artifact` writes a file and gives the state update with its ref. Each
takes a `Runs` (every call works on the files of the running node's thread)
or one `Mount` (a graph with one thread).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config

from ..errors import ControlError
from ..mount import Mount
from ..refs import FileRef, as_ref
from ..runs import Runs, lease

# How many recent eviction records the step node checks besides its own report,
# to catch evictions that happened between steps (quota, an explicit `evict`).
EVICTION_LOG_WINDOW = 256


def langgraph_step(config: RunnableConfig | None = None) -> int:
    """LangGraph's step counter for the running node (from config metadata)."""
    for candidate in (config, _current_config()):
        step = ((candidate or {}).get("metadata") or {}).get("langgraph_step")
        if isinstance(step, int):
            return step
    raise RuntimeError("no langgraph_step in the config: call this inside a LangGraph node")


def _current_config() -> RunnableConfig | None:
    try:
        return get_config()
    except RuntimeError:
        return None


def _thread_of(config: RunnableConfig | None) -> str:
    configurable = (config or {}).get("configurable") or {}
    return f"{configurable.get('thread_id')}|{configurable.get('checkpoint_ns', '')}"


def _files_of(state: Any, files_key: str) -> Mapping[str, FileRef]:
    files = state.get(files_key) if isinstance(state, Mapping) else getattr(state, files_key, None)
    return files or {}


def _still_at(mount: Mount, ref: Mapping[str, Any]) -> bool:
    """True when the ref's inode is still at its path (one lstat, answered from
    the kernel's attribute cache)."""
    try:
        return mount.volume_ino(os.lstat(mount.resolve_path(ref["path"])).st_ino) == ref["ino"]
    except (OSError, ValueError):
        return False


def make_step_node(
    files: Mount | Runs, files_key: str = "files"
) -> Callable[[Any, RunnableConfig], dict[str, Any]]:
    """A node that moves the daemon's step to LangGraph's and prunes evicted refs.

    The daemon's step never goes backwards: a subgraph (whose counter restarts
    at 0) or a second thread on the same mount just re-runs eviction at the
    current step. The node returns `{files_key: {key: None}}` for every ref in
    state whose inode was evicted, which `files_reducer` turns into deletions.
    """
    last_step_seen: dict[str, int] = {}
    lock = threading.Lock()

    def vfsd_step(state: Any, config: RunnableConfig) -> dict[str, Any]:
        with lease(files) as mount:
            return step(mount, state, config)

    def step(mount: Mount, state: Any, config: RunnableConfig) -> dict[str, Any]:
        target = langgraph_step(config)
        try:
            report = mount.set_step(target)
        except ControlError as exc:
            if exc.code != "bad_request":
                raise
            # LangGraph's counter is behind the daemon's: stay, but still evict.
            report = mount.set_step(mount.get_step())
        evicted = {rec["ino"] for rec in report.get("evicted", [])}
        thread = _thread_of(config)
        with lock:
            since = last_step_seen.get(thread)
            last_step_seen[thread] = int(report.get("step", target))
        refs = _files_of(state, files_key)
        if refs:
            # Evictions outside set_step (quota on write, explicit evict) are in the log.
            for rec in mount.evicted(limit=EVICTION_LOG_WINDOW):
                if since is None or rec.get("evicted_step", 0) >= since:
                    evicted.add(rec["ino"])
        gone = {key: None for key, ref in refs.items() if ref and ref.get("ino") in evicted}
        return {files_key: gone} if gone else {}

    return vfsd_step


def write_artifact(
    files: Mount | Runs,
    path: str,
    data: bytes | str,
    files_key: str = "files",
    *,
    status: str | None = None,
) -> dict[str, Any]:
    """Write `data` to `path` in the mount and return the state update with its ref only.

    `status="done"` marks the file done right away (evicted after the
    retention window). The key is the mount-relative path the daemon reports.
    With a Runs, the file goes to the running node's thread.
    """
    with lease(files) as mount:
        ref = mount.write(path, data)
        if status is not None:
            ref = mount.set_status(ref, status)
    return {files_key: {ref["path"]: ref}}


def make_sync_node(
    files: Mount | Runs, files_key: str = "files"
) -> Callable[[Any, RunnableConfig], dict[str, Any]]:
    """A node that adds refs for files changed since its last run and drops removed ones.

    Meant for files that tools wrote through the shell: it asks the daemon for
    `changes` since the last step it synced (per thread), puts the current ref
    of each changed file under its path, moves the key of a renamed inode, and
    sets None for refs whose inode was unlinked or evicted.
    """
    synced_step: dict[str, int] = {}
    lock = threading.Lock()

    def vfsd_sync(state: Any, config: RunnableConfig) -> dict[str, Any]:
        with lease(files) as mount:
            return sync(mount, state, config)

    def sync(mount: Mount, state: Any, config: RunnableConfig) -> dict[str, Any]:
        thread = _thread_of(config)
        with lock:
            since = synced_step.get(thread, 0)
        delta = mount.changes(since)
        with lock:
            synced_step[thread] = int(delta.get("step", since))
        view: dict[str, Any] = dict(_files_of(state, files_key))
        updates: dict[str, FileRef | None] = {}
        key_of_ino = {ref.get("ino"): key for key, ref in view.items() if ref}
        for ref in delta["changed"]:
            old_key = key_of_ino.get(ref["ino"])
            if old_key is not None and old_key != ref["path"]:
                del view[old_key]  # renamed: the inode's old key goes
                updates[old_key] = None
            key_of_ino[ref["ino"]] = ref["path"]
            if view.get(ref["path"]) != ref:
                view[ref["path"]] = updates[ref["path"]] = ref
        removed = {rec["ino"] for rec in delta["removed"]}
        for key, ref in list(view.items()):
            if ref and ref.get("ino") in removed:
                del view[key]
                updates[key] = None
        changed_inos = {ref["ino"] for ref in delta["changed"]}
        for key, ref in list(view.items()):
            if ref and ref.get("ino") not in changed_inos and not _still_at(mount, ref):
                # Moved (a rename keeps the step, so `changes` does not list it) or gone.
                current = mount.resolve(ref).get("ref")
                del view[key]
                updates[key] = None
                if current and current.get("path"):
                    updates[current["path"]] = as_ref(current)
        return {files_key: updates} if updates else {}

    return vfsd_sync
