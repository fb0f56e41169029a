"""The small JSON records a Runs keeps beside a thread's files, read as input."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MountToolError

#: a record larger than this is damaged, not read (a thread id is at most 64 KiB)
MAX_RECORD_BYTES = 1 << 20


def read_json_record(path: Path, what: str) -> dict | None:
    """The JSON object at `path`; None when there is none. MountToolError,
    saying `what` it records and what to do, when it cannot be used."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MountToolError(f"{path} is unreadable ({exc}): it names {what}; fix it") \
            from exc
    if len(raw) > MAX_RECORD_BYTES:
        raise MountToolError(f"{path} is over {MAX_RECORD_BYTES:,} bytes, no record a Runs "
                             f"writes: it should name {what}; fix it")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise MountToolError(f"{path} is unreadable ({exc}): it names {what}; fix it") \
            from exc
    if not isinstance(doc, dict):
        raise MountToolError(f"{path} holds no JSON object: it should name {what}; fix it")
    return doc
