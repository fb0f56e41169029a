"""The bucket layout of the remote tier: the one place it is documented.

DRAFT: chunks, runs and the lease are settled; manifests and run pointers wait
for the snapshot format (vfsd/snapshots.py) and are placeholders below.

Everything lives under the prefix of `s3://BUCKET/PREFIX` (`objstore.RemoteURL`);
keys below are relative to it. Several workers, and several runs, share one
prefix: that is where dedup across workers pays.

```
chunks/<hh>/<hex>             one chunk, immutable, content-addressed
runs/<run_id>/lease           the run's writer lease, mutable (CAS on ETag)
runs/<run_id>/manifests/...   PLACEHOLDER: published snapshots, immutable
runs/<run_id>/head            PLACEHOLDER: pointer to the latest published snapshot
```

`chunks/<hh>/<hex>`
    `hex` is the 32-digit lowercase hex of the chunk's xxh3-128 (the same name
    as in the local `chunks/` directory) and `hh` its first two digits. The
    body is the chunk's bytes, nothing else (no header, no compression, no
    encryption, in this version). Written only with `If-None-Match: *`
    (`ObjectStore.put_if_absent`), so an object under its final name is always
    complete and never rewritten: an interrupted PUT leaves nothing visible,
    and a second writer of the same bytes learns they are already there. A
    reader verifies the bytes against the name before using them
    (`vfsd.fetcher`). Never deleted except by GC (below).
    The `hh` level is not for S3, which does not care, but for humans and
    for listing a slice of the chunks (GC can sweep `chunks/00/` to `ff/` in
    parallel).
    Every content object (`vfsd.content`) is named the same way, whether it
    lives locally as a chunk file or as a small blob in LMDB: the uploader
    reads it through a callback and does not care where. Whether small
    objects travel one per object here or packed into manifests is for the
    manifest format to decide (tens of thousands of 2 KB objects cost a PUT
    each).

`runs/<run_id>/lease`
    One writer per run (`vfsd.lease`). A small JSON object:
    `{"vfsd_lease": 1, "run", "owner": {"host", "pid", "token"}, "generation",
    "ttl", "acquired_at", "renewed_at", "expires_at", "released", "seq"}`.
    Created with `If-None-Match: *`; renewed, released and taken over with
    `If-Match: <ETag>` only. `generation` grows by one at every change of
    owner: it is the run's fencing token. Expiry is judged on the server's
    clock (its Last-Modified and Date headers), never on a worker's wall clock:
    the lease is expired when the server's Date is more than `ttl` + 1 s past
    the object's Last-Modified. `expires_at` and the other times are the
    holder's wall clock, for humans only. A released lease (`"released":
    true`, written by a clean shutdown) can be taken at once.

`<run_id>` is the volume's run id as the store keeps it (32 hex digits; see
`Store.run_id`); `check_run_id` accepts any id of 1-128 letters, digits, `._-`.

PLACEHOLDER `runs/<run_id>/manifests/<snapshot id>` (ids as `vfsd.snapshots` names them)
    A published snapshot: an immutable object, written with `If-None-Match: *`
    only after every chunk it names is in the bucket
    (`uploader.ensure_uploaded`). Format: versioned, compact, to be defined
    with the snapshot format.

PLACEHOLDER `runs/<run_id>/head`
    The latest published snapshot of the run, with the lease `generation` of
    the writer. Written with `If-Match` on the ETag the writer last read or
    wrote, so a writer that lost its lease without knowing it yet (a stalled
    process) cannot overwrite its successor's head: its CAS fails. The lease
    says who should write; the CAS on the head makes a stale writer harmless.

GC (to design with the manifests): chunks are named by no retained manifest of
any run and older than a grace period are deleted. A chunk found present by
`put_if_absent` (or a HEAD) may be an old one that GC is about to delete: the
grace period must cover "found present, then named by a manifest", not only
"being uploaded".

Names are fixed here; other modules call the functions below and never build
keys themselves.
"""

from __future__ import annotations

import re

CHUNKS_DIR = "chunks"
RUNS_DIR = "runs"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEX = re.compile(r"[0-9a-f]{32}")


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
