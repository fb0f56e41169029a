"""Names of the objects in the bucket, and their parsers (the layout is in the
package docstring, `vfsd.remote`). Other modules call these functions and never
build keys themselves."""

from __future__ import annotations

import re

CHUNKS_DIR = "chunks"
RUNS_DIR = "runs"
THREADS_DIR = "threads"
GC_DIR = "gc"
#: intents older than this (server clock) are ignored and deleted by GC
INTENT_MAX_AGE = 3600.0
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEX = re.compile(r"[0-9a-f]{32}")
_SEQ = re.compile(r"[1-9][0-9]{0,18}")
_INTENT = re.compile(r"([1-9][0-9]{0,18})-([1-9][0-9]{0,18})(?:-[0-9a-f]{16})?")
_ATTEMPT = re.compile(r"[0-9a-f]{16}")
_THREAD_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_run_id(run_id: str) -> str:
    """`run_id` if it is usable in a key (letters, digits, `._-`, 1-128 chars)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise ValueError(f"run id {run_id!r} must be 1-128 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return run_id


def chunk_key(digest: bytes) -> str:
    """Key of the chunk named by a 16-byte xxh3-128 digest."""
    if len(digest) != 16:
        raise ValueError(f"a chunk digest is 16 bytes, got {len(digest)}")
    hx = digest.hex()
    return f"{CHUNKS_DIR}/{hx[:2]}/{hx}"


def digest_of_chunk_key(key: str) -> bytes | None:
    """The digest a chunk key names, or None if `key` is not a chunk key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != CHUNKS_DIR or not _HEX.fullmatch(parts[2]) \
            or parts[1] != parts[2][:2]:
        return None
    return bytes.fromhex(parts[2])


def run_prefix(run_id: str) -> str:
    return f"{RUNS_DIR}/{check_run_id(run_id)}"


def lease_key(run_id: str) -> str:
    return f"{run_prefix(run_id)}/lease"


def head_key(run_id: str) -> str:
    return f"{run_prefix(run_id)}/head"


def manifests_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/snapshots/"


def manifest_key(run_id: str, seq: int) -> str:
    if not isinstance(seq, int) or not 0 < seq < 1 << 63:
        raise ValueError(f"bad snapshot seq {seq!r}")
    return f"{manifests_prefix(run_id)}{seq}"


def intents_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/intents/"


def intent_key(run_id: str, seq: int, generation: int, attempt: str | None = None) -> str:
    """Key of an intent; `attempt` (16 hex digits, fresh for each intent written)
    makes it unique, so deleting one attempt's intent never deletes another's."""
    if attempt is None:
        return f"{intents_prefix(run_id)}{seq}-{generation}"
    if not _ATTEMPT.fullmatch(attempt):
        raise ValueError(f"an intent attempt is 16 lowercase hex digits, got {attempt!r}")
    return f"{intents_prefix(run_id)}{seq}-{generation}-{attempt}"


GC_LEASE_KEY = f"{GC_DIR}/lease"


def check_thread_key(tkey: str) -> str:
    """`tkey` if it can name a thread record (a shard's volume name: 1-64 letters,
    digits, `_` or `-`; a Runs uses `t` + 32 hex digits of the id's SHA-256)."""
    if not isinstance(tkey, str) or not _THREAD_KEY.fullmatch(tkey):
        raise ValueError(f"thread key {tkey!r} must be 1-64 letters, digits, '_' or '-'")
    return tkey


def thread_key(tkey: str) -> str:
    """Key of a thread's record."""
    return f"{THREADS_DIR}/{check_thread_key(tkey)}"


def threads_prefix() -> str:
    return f"{THREADS_DIR}/"


def thread_of_key(key: str) -> str | None:
    """The thread key a record's object key names, or None."""
    parts = key.split("/")
    if len(parts) != 2 or parts[0] != THREADS_DIR or not _THREAD_KEY.fullmatch(parts[1]):
        return None
    return parts[1]


def run_objects_prefix(run_id: str) -> str:
    """Every object of a run (lease, head, manifests, intents) is under this."""
    return f"{run_prefix(run_id)}/"


def parse_run_key(key: str) -> tuple[str, str, str] | None:
    """(run, kind, rest) for keys under `runs/`: kind is "lease", "head",
    "snapshots" or "intents" and rest the part after it; None for other keys."""
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != RUNS_DIR or not _RUN_ID.fullmatch(parts[1]):
        return None
    if len(parts) == 3 and parts[2] in ("lease", "head"):
        return parts[1], parts[2], ""
    if len(parts) == 4 and parts[2] in ("snapshots", "intents"):
        return parts[1], parts[2], parts[3]
    return None


def seq_of_manifest_name(name: str) -> int | None:
    """The seq a manifest's last key segment names, or None."""
    return int(name) if _SEQ.fullmatch(name) and int(name) < 1 << 63 else None


def intent_of_name(name: str) -> tuple[int, int] | None:
    """(seq, generation) of an intent's last key segment, or None."""
    m = _INTENT.fullmatch(name)
    return (int(m[1]), int(m[2])) if m else None


class BadResumeSpec(ValueError):
    """A `--from RUN_ID[@SNAPSHOT]` that cannot name a published snapshot."""


def parse_resume_spec(text: str) -> tuple[str, int | None]:
    """(run id, seq) of "RUN_ID@sSEQ", or (run id, None) for "RUN_ID" (its latest
    published snapshot); BadResumeSpec saying what is wrong."""
    if not isinstance(text, str) or not text:
        raise BadResumeSpec("--from needs RUN_ID[@SNAPSHOT], e.g. 3f2a...9c@s12 or 3f2a...9c "
                            "(its latest published snapshot)")
    shown = text if len(text) <= 80 else text[:80] + "..."
    run, sep, snap = text.rpartition("@")
    if not sep:
        run, snap = text, None
    if not run:
        raise BadResumeSpec(f"--from {shown!r}: expected RUN_ID[@SNAPSHOT] (e.g. 3f2a...9c@s12); "
                            "the run id is what `vfsd status --json` reports as \"run\", and "
                            "`vfsd remote ls` lists them")
    try:
        check_run_id(run)
    except ValueError as exc:
        raise BadResumeSpec(f"--from {shown!r}: {exc}") from None
    if snap is None:
        return run, None
    if not snap.startswith("s") or not _SEQ.fullmatch(snap[1:]) or int(snap[1:]) >= 1 << 63:
        raise BadResumeSpec(f"--from {shown!r}: {snap!r} is not a snapshot id (ids look like s12)")
    return run, int(snap[1:])
