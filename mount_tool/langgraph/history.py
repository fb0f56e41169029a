"""Does time travel give me the right files? A check of a thread's checkpoints.

    report = verify_history(saver, {"configurable": {"thread_id": "t1"}})
    print(report)            # one line per checkpoint, newest first
    assert report.ok, report

For each checkpoint of the thread (the root graph's, newest first), what a
run from it would bring back is compared with what the checkpoint's state
says about its files:

- "ok": the snapshot the checkpoint names holds every file its `files` state
  refers to, with the same content;
- "mismatch": a file of the state is missing from the snapshot or differs
  (`missing`, `changed`);
- "unbound": the wrapper could not bind the checkpoint's files when it was
  written (`reason`; a run from it raises SnapshotUnavailable);
- "gone": the snapshot is no longer retained (a run from it raises
  SnapshotUnavailable);
- "not recorded": the checkpoint was written without a VfsdCheckpointer.

Files in the snapshot that no ref of the state names are listed as
`untracked`. A graph whose state tracks every file it makes (a Deep Agents
graph with VfsdMiddleware: every tool call's changes, `execute`'s included)
should have none: `strict=True` counts them as a mismatch. A StateGraph whose
nodes also write through the shell has some, legitimately.

It reads the snapshots through the thread's mount (`.vfsd/snapshots/<id>`),
so it runs where the files are: in the process that serves the threads, or
with a `mount_tool.runs(ROOT)` of its own while no server uses ROOT.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..mount import Mount
from ..refs import is_ref
from ..runs import thread_of
from .checkpointer import VfsdCheckpointer
from .threadfiles import NO_FILES, FilesVersion

#: directories of the mount whose files graph state never refers to
UNTRACKED_DIRS = (".tool_args/", "tmp/")
#: names listed per checkpoint in the report's text
LISTED = 8


@dataclass
class CheckpointCheck:
    """One checkpoint's verdict (see the module docstring)."""

    checkpoint_id: str
    step: int | None
    snapshot: str | None
    status: str
    reason: str | None = None
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = f"step {self.step} {self.checkpoint_id} {self.snapshot or '-'}: {self.status}"
        if self.reason:
            text += f" ({self.reason})"
        for name, paths in (("missing", self.missing), ("changed", self.changed),
                            ("untracked", self.untracked)):
            if paths:
                more = f" and {len(paths) - LISTED} more" if len(paths) > LISTED else ""
                text += f"; {name}: {', '.join(paths[:LISTED])}{more}"
        return text


@dataclass
class HistoryReport:
    """The checks of a thread's checkpoints, newest first."""

    thread_id: str
    checkpoints: list[CheckpointCheck]
    strict: bool = False

    @property
    def problems(self) -> list[CheckpointCheck]:
        """The checkpoints whose files do not come back as their state says."""
        return [c for c in self.checkpoints
                if c.status not in ("ok", "not recorded") or (self.strict and c.untracked)]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = (f"thread {self.thread_id!r}: {len(self.checkpoints)} checkpoint(s), "
                f"{len(self.problems)} with a problem")
        return "\n".join([head, *(f"  {c}" for c in self.checkpoints)])


def verify_history(saver: VfsdCheckpointer, config: Mapping[str, Any], *,
                   strict: bool = False, limit: int | None = None) -> HistoryReport:
    """Check every checkpoint of the thread `config` names (see the module
    docstring); `limit`: the newest that many. Reads snapshots, changes
    nothing (a thread whose run dir is not mounted is mounted)."""
    if not isinstance(saver, VfsdCheckpointer):
        raise TypeError(f"saver must be a VfsdCheckpointer, not {type(saver).__name__}")
    thread = thread_of(config)
    listing = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    tuples = list(saver.saver.list(listing, limit=limit))
    checks: list[CheckpointCheck] = []
    with saver._thread_files(thread) as tf:
        retained = {s["id"] for s in tf.m.snapshots()}
        held: dict[str, dict[str, str]] = {}
        for tup in tuples:
            checks.append(_check(saver, tf.m, tup, retained, held))
    return HistoryReport(thread, checks, strict)


def _check(saver: VfsdCheckpointer, m: Mount, tup: Any, retained: set[str],
           held: dict[str, dict[str, str]]) -> CheckpointCheck:
    checkpoint_id = tup.checkpoint["id"]
    step = (tup.metadata or {}).get("step")
    version = FilesVersion.of(tup.metadata, strict=True)
    if version is None:
        return CheckpointCheck(checkpoint_id, step, None, "not recorded")
    if version.unbound is not None:
        return CheckpointCheck(checkpoint_id, step, None, "unbound", version.unbound)
    snapshot = version.snapshot
    if snapshot == NO_FILES:
        files: dict[str, str] = {}
    elif snapshot not in retained:
        return CheckpointCheck(checkpoint_id, step, snapshot, "gone",
                               "not retained: deleted by retention or by hand")
    else:
        if snapshot not in held:
            held[snapshot] = snapshot_files(m, snapshot)
        files = held[snapshot]
    refs = {ref["path"]: ref["hash"] for ref in saver._files_of(tup).values()
            if is_ref(ref)}
    missing = sorted(p for p in refs if p not in files)
    changed = sorted(p for p, h in refs.items() if p in files and files[p] != h)
    untracked = sorted(p for p in files if p not in refs and not p.startswith(UNTRACKED_DIRS))
    status = "mismatch" if missing or changed else "ok"
    return CheckpointCheck(checkpoint_id, step, snapshot, status, None, missing, changed,
                           untracked)


def snapshot_files(m: Mount, snapshot: str) -> dict[str, str]:
    """{mount-relative path: content hash} of the regular files a snapshot holds."""
    top = Path(m.root) / ".vfsd" / "snapshots" / snapshot
    files: dict[str, str] = {}
    for dirpath, _dirnames, filenames in os.walk(top, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_file() or path.is_symlink():
                continue
            files[path.relative_to(top).as_posix()] = m.hash_of(path.read_bytes())
    return files
