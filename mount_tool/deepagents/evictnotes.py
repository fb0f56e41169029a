"""What the model is told about files eviction removed.

A model that reads a file it wrote ten steps ago and gets "not found" will
guess (write it again from memory, or give up). The daemon knows better: its
eviction log says when and why the file went and a retained snapshot may
still hold it. These helpers turn the daemon's answer (`Mount.eviction`)
into the words the file tools and VfsdMiddleware add: only on a miss, so a
found file costs nothing more.

A tool's output saved in full (`large_tool_results/`, by deepagents or by
vfsd's offloading) ages like any file, since the tool can make it again;
the words for one say how the model gets it back by itself: `read_file` on
the copy a retained snapshot keeps (`/.vfsd/snapshots/<id>/<path>`, which
the shell sees too), or running the tool again. (The records Deep Agents
keeps, `conversation_history/`, are pinned by a built-in rule of the daemon.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from deepagents.backends.utils import InvalidGlobPatternError, compile_grep_include_glob

from ..errors import MountToolError
from ..mount import Mount

logger = logging.getLogger(__name__)

#: evicted files named in one note, at most
NOTE_FILES = 5
#: where tool outputs saved in full live: re-creatable, so they age
TOOL_OUTPUT_DIRS = ("large_tool_results/",)
#: the read-only view of retained snapshots, at the mount root
SNAPSHOTS_VIEW = "/.vfsd/snapshots"


def _ask(mount: Mount, virtual: str, limit: int = 20) -> dict[str, Any]:
    try:
        return mount.eviction(virtual.lstrip("/") or ".", limit=limit)
    except (MountToolError, OSError, ValueError) as exc:
        logger.debug("eviction lookup of %s failed: %s", virtual, exc)
        return {}


def recovery(mount: Mount, rec: Mapping[str, Any]) -> str:
    """For an evicted tool output (`TOOL_OUTPUT_DIRS`): a sentence on how the
    model gets it back itself, starting with a space; "" for other files."""
    path = str(rec.get("path", ""))
    if not path.startswith(TOOL_OUTPUT_DIRS):
        return ""
    found: Mapping[str, Any] = {}
    if rec.get("snapshot"):
        try:
            found = mount.locate(rec)
        except (MountToolError, OSError, ValueError) as exc:
            logger.debug("locating the evicted %s failed: %s", path, exc)
    if found.get("found"):
        copy = f"{SNAPSHOTS_VIEW}/{found['id']}/{found['path']}"
        return (f" It was a tool's output saved in full: `read_file {copy}` reads the copy "
                f"snapshot {found['id']} keeps, or run the tool again.")
    return " It was a tool's output saved in full: run the tool again to get it back."


def why_missing(mount: Mount, virtual: str) -> str | None:
    """'it was evicted at step 5 (...)' for a path eviction removed (with how
    to get a tool's output back), a sentence about the evicted files below it
    for a directory, or None."""
    why = _ask(mount, virtual)
    if why.get("evicted"):
        return f"it was {why['message']}" + recovery(mount, why["evicted"])
    return why.get("message")


def glob_note(mount: Mount, virtual: str, pattern: str) -> str | None:
    """For a glob that matched nothing: the evicted files it would have matched."""
    why = _ask(mount, virtual, limit=200)
    records = why.get("below") or []
    if not records:
        return None
    try:
        matches = compile_grep_include_glob(pattern)
    except InvalidGlobPatternError:
        return None
    base = virtual.strip("/")
    hit = [r for r in records
           if matches(r["path"][len(base) + 1:] if base else r["path"])]
    if not hit:
        return None
    return (f"No live file matches '{pattern}' under '{virtual}', but eviction removed "
            f"{len(hit)} that did: " + "; ".join(f"/{r['path']} ({r['message']})"
                                                 for r in hit[:NOTE_FILES])
            + ("; ..." if len(hit) > NOTE_FILES else ""))


def turn_note(mount: Mount, evicted: Iterable[Mapping[str, Any]],
              touched: Iterable[int]) -> str | None:
    """The note for the model after a step that evicted files it had used
    (`touched`: inode numbers of its `files` refs), or None."""
    inos = set(touched)
    mine = [r for r in evicted if r.get("ino") in inos]
    if not mine:
        return None
    parts = []
    for rec in mine[:NOTE_FILES]:
        told: Mapping[str, Any] = {}
        with contextlib.suppress(KeyError, TypeError):
            told = _ask(mount, rec["path"], limit=1).get("evicted") or {}
        said = told.get("message") or f"evicted at step {rec.get('evicted_step')}"
        again = recovery(mount, {**rec, **told}).strip().rstrip(".")
        parts.append(f"/{rec['path']} ({said}" + (f"; {again[0].lower()}{again[1:]}"
                                                    if again else "") + ")")
    more = f" and {len(mine) - NOTE_FILES} more" if len(mine) > NOTE_FILES else ""
    return ("[vfsd] Eviction removed files you used: " + "; ".join(parts) + more
            + ". They are gone from the mount (the shell says 'No such file'); do not "
            "rewrite them from memory: ask for `vfsd unevict` if you need one back.")
