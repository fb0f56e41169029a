"""Where Deep Agents keeps its canonical records in the mount, and the path of
one whose name comes from input.

deepagents 0.7.32 writes what summarization takes out of the context window
to `/conversation_history/{session_id}.md` (its media under `media/`), and an
oversized human message to `/conversation_history/{uuid}.md`. The daemon's
built-in eviction rule keeps that directory (`vfsd.evictrules`). The session
id comes from the graph's state, which a caller may set: `../notes` would
make the record `/notes.md`, aged like any file (and appended to the agent's
own notes). So below a record directory every name is taken literally:
`record_path` turns `.` and `..` into names (`%2E`, `%2E%2E`), a NUL or a
lone surrogate into `%XX`, and cuts a name over 255 bytes (keeping a hash
of the whole and its extension). The file tools apply it to every path they
are given, so the path the summary names reads back the same record.
"""

from __future__ import annotations

import xxhash

#: directories (at the mount root) whose files are records named from input
RECORD_DIRS = ("conversation_history",)
#: the longest name the filesystem takes, in bytes
NAME_MAX = 255
#: bytes a cut name keeps of the original before its hash
CUT_KEEP = 180


def is_record(virtual: str) -> bool:
    """Whether the absolute path `virtual` is below a record directory."""
    parts = virtual.split("/")
    return len(parts) >= 3 and parts[0] == "" and parts[1] in RECORD_DIRS


def record_path(virtual: str) -> str:
    """`virtual` (an absolute path) with each name below a record directory
    made literal (see the module docstring; empty names go, as `//` is `/`);
    any other path unchanged."""
    if not is_record(virtual):
        return virtual
    parts = virtual.split("/")
    return "/".join(["", parts[1], *(literal_name(n) for n in parts[2:] if n)])


def literal_name(name: str) -> str:
    """A name that means itself: never `.`/`..`, no NUL or surrogate, at most
    NAME_MAX bytes (a longer one keeps its start, a hash of it and its extension)."""
    if name in (".", ".."):
        return "%2E" * len(name)
    if any(c == "\0" or "\ud800" <= c <= "\udfff" for c in name):
        name = "".join(f"%{ord(c):02X}" if c == "\0" or "\ud800" <= c <= "\udfff" else c
                       for c in name)
    raw = name.encode("utf-8")
    if len(raw) <= NAME_MAX:
        return name
    stem, dot, ext = name.rpartition(".")
    suffix = f".{ext}" if dot and stem and len(ext.encode("utf-8")) <= 16 else ""
    head = raw[:CUT_KEEP].decode("utf-8", errors="ignore")
    return f"{head}~{xxhash.xxh3_128(raw).hexdigest()}{suffix}"
