"""A run's head and manifest chains in the bucket: reading, checking, writing.

The head (`runs/<run>/head`, format in `vfsd.remote`) is the run's index of
published snapshots. `Head` parses and checks it (a damaged head is an error
that says so, never a guess), and renders the next version. `read_head`,
`write_head` and `fetch_chain` block on the network: call them from worker
threads.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field

from .layout import check_run_id, check_thread_key, head_key, manifest_key
from .manifest import MAX_MANIFEST_BYTES, MAX_RAW_BYTES, Manifest, ManifestError, decode
from .objstore import ObjectStore, RemoteConflict, RemoteNotFound, RemoteTooLarge

HEAD_FORMAT = 1
MAX_HEAD_BYTES = 8 << 20
#: a chain longer than this is damaged (a cycle cannot happen: parents are older)
MAX_CHAIN = 100_000


class HeadError(Exception):
    """The head of a run is damaged, or not the run's; the message says why."""


class UnknownRun(Exception):
    """No head for this run in the bucket: nothing was ever published."""


class UnknownSnapshot(Exception):
    """The run has no published manifest for that snapshot."""


@dataclass
class Head:
    """What `runs/<run>/head` says, and the ETag it was read or written with."""

    run: str
    generation: int
    latest: int = 0
    snapshots: list[dict] = field(default_factory=list)  # oldest first
    etag: str = ""
    writer: dict = field(default_factory=dict)
    #: the thread key of a shard thread's run (`threads/<key>` names this run); None
    #: for a run dir's run
    thread: str | None = None

    # ------------------------------------------------------------------ format

    def to_bytes(self) -> bytes:
        doc = {
            "vfsd_head": HEAD_FORMAT, "run": self.run, "generation": self.generation,
            "latest": self.latest, "updated_ns": time.time_ns(),
            "writer": {"host": socket.gethostname(), "pid": os.getpid()},
            "snapshots": self.snapshots,
        }
        if self.thread is not None:
            doc["thread"] = self.thread
        return json.dumps(doc, sort_keys=True).encode()

    def successor(self, generation: int, latest: int, snapshots: list[dict]) -> Head:
        """The next version of this head (same run and thread, CAS on this ETag)."""
        return Head(self.run, generation, latest, snapshots, self.etag, thread=self.thread)

    @classmethod
    def parse(cls, data: bytes, etag: str, run: str) -> Head:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise HeadError(f"the head of run {run} is not valid JSON") from None
        if not isinstance(doc, dict) or doc.get("vfsd_head") != HEAD_FORMAT:
            raise HeadError(f"the head of run {run} is not a vfsd head (format "
                            f"{doc.get('vfsd_head') if isinstance(doc, dict) else '?'})")
        if doc.get("run") != run:
            raise HeadError(f"the head under run {run} names run {doc.get('run')!r}")
        gen, latest, snaps = doc.get("generation"), doc.get("latest"), doc.get("snapshots")
        if not _uint(gen) or not _uint(latest) or not isinstance(snaps, list):
            raise HeadError(f"the head of run {run} is damaged (generation, latest or list)")
        seen = set()
        for s in snaps:
            if not isinstance(s, dict) or not all(_uint(s.get(k)) for k in
                                                  ("seq", "parent", "step")) \
                    or not 0 < s["seq"] <= latest or s["parent"] >= s["seq"] \
                    or s["seq"] in seen \
                    or not all(_uint(s[k]) for k in _COUNTS if k in s) \
                    or not isinstance(s.get("pinned", False), bool) \
                    or not isinstance(s.get("retired", False), bool):
                raise HeadError(f"the head of run {run} lists a damaged snapshot entry")
            seen.add(s["seq"])
        writer = doc.get("writer") if isinstance(doc.get("writer"), dict) else {}
        thread = doc.get("thread")
        if thread is not None:
            try:
                check_thread_key(thread)
            except ValueError:
                raise HeadError(f"the head of run {run} names a damaged thread key") from None
        return cls(run, gen, latest, snaps, etag, writer, thread)

    # ----------------------------------------------------------------- queries

    def entry(self, seq: int) -> dict | None:
        for s in self.snapshots:
            if s["seq"] == seq:
                return s
        return None

    def ids(self) -> list[str]:
        return [f"s{s['seq']}" for s in self.snapshots]

    def current(self) -> list[dict]:
        """The entries of snapshots the run keeps (not those listed only because a
        kept delta needs their manifest: `retired`)."""
        return [s for s in self.snapshots if not s.get("retired")]

    def chain_length(self, seq: int) -> int:
        """Deltas from `seq` down to its full manifest (0 for a full one)."""
        n = 0
        e = self.entry(seq)
        while e is not None and e["parent"]:
            n += 1
            e = self.entry(e["parent"])
            if n > MAX_CHAIN:
                break
        return n

    def chain_root_entries(self, seq: int) -> int:
        """Entries of the full manifest at the root of `seq`'s chain (0 if unknown)."""
        e = self.entry(seq)
        for _ in range(MAX_CHAIN):
            if e is None:
                return 0
            if not e["parent"]:
                return int(e.get("entries", 0))
            e = self.entry(e["parent"])
        return 0

    def with_ancestors(self, seqs: set[int]) -> set[int]:
        """`seqs` plus every chain parent they need, as far as the head lists them."""
        out = set()
        for seq in seqs:
            e = self.entry(seq)
            for _ in range(MAX_CHAIN):
                if e is None or e["seq"] in out:
                    break
                out.add(e["seq"])
                e = self.entry(e["parent"]) if e["parent"] else None
        return out


#: optional numbers of a head's snapshot entry, bounded like the required ones
_COUNTS = ("entries", "bytes", "generation", "created_ns")


def _uint(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


# -------------------------------------------------------------------- network


def read_head(store: ObjectStore, run: str, deadline: float | None = None) -> Head | None:
    """The run's head, or None if the run never published (or took a lease) here."""
    check_run_id(run)
    try:
        fetched = store.get(head_key(run), max_bytes=MAX_HEAD_BYTES, deadline=deadline)
    except RemoteNotFound:
        return None
    except RemoteTooLarge:
        raise HeadError(f"the head of run {run} is larger than {MAX_HEAD_BYTES} bytes: "
                        "damaged") from None
    return Head.parse(fetched.data, fetched.etag, run)


def write_head(store: ObjectStore, head: Head, *, create: bool = False) -> str:
    """CAS the head (If-Match its etag, or If-None-Match when `create`); its new ETag.

    RemoteConflict if it changed since it was read: the caller reads it again
    to learn whether a newer generation wrote it.
    """
    if create:
        etag = store.put(head_key(head.run), head.to_bytes(), if_none_match=True)
    else:
        etag = store.put(head_key(head.run), head.to_bytes(), if_match=head.etag)
    head.etag = etag
    return etag


def fetch_manifest(store: ObjectStore, run: str, seq: int, deadline: float | None = None,
                   max_raw: int = MAX_RAW_BYTES) -> tuple[Manifest, int]:
    """One manifest, checked: (manifest, bytes). UnknownSnapshot if there is none;
    ManifestError if its body would decompress to more than `max_raw`."""
    try:
        fetched = store.get(manifest_key(run, seq), max_bytes=MAX_MANIFEST_BYTES,
                            deadline=deadline)
    except RemoteNotFound:
        raise UnknownSnapshot(f"run {run} has no published snapshot s{seq} in "
                              f"{store.url}") from None
    except RemoteTooLarge as exc:
        raise ManifestError(f"manifest {run}/s{seq}: {exc}") from None
    return decode(fetched.data, run=run, seq=seq, max_raw=max_raw), len(fetched.data)


def fetch_chain(store: ObjectStore, run: str, seq: int,
                memory: int = MAX_RAW_BYTES) -> list[Manifest]:
    """The manifests that make snapshot `seq`: its full manifest first, `seq` last.

    Every manifest is checked (`manifest.decode`); a missing parent, a chunk
    size that changes along the chain, a chain that does not end in a full
    manifest, or bodies that together decompress to more than `memory`
    bytes raise ManifestError or UnknownSnapshot.
    """
    chain: list[Manifest] = []
    want = seq
    left = memory
    while True:
        try:
            m, _ = fetch_manifest(store, run, want, max_raw=left)
            left -= m.raw_len
        except UnknownSnapshot:
            if want == seq:
                raise
            raise ManifestError(f"snapshot s{seq} of run {run} needs s{want}, which is no "
                                "longer in the bucket") from None
        if chain and m.chunk_size != chain[-1].chunk_size:
            raise ManifestError(f"manifest {run}/s{want} has another chunk size than s{seq}")
        chain.append(m)
        if m.full:
            break
        if len(chain) > MAX_CHAIN:
            raise ManifestError(f"the manifest chain of {run}/s{seq} is too long")
        want = m.parent
    chain.reverse()
    return chain


def fence(store: ObjectStore, run: str, generation: int,
          thread: str | None = None) -> tuple[Head, int]:
    """Write the head with our new lease generation (creating it if need be).

    Called right after taking a run's lease: from then on a stale writer's
    CAS on the head fails. Returns the head as written and the generation
    that had written it before (0 for a new head). With `thread` (a shard
    thread's key), the head is marked as that thread's; a head that names
    another thread raises HeadError (a record pointing at another thread's run).
    """
    for _ in range(5):
        head = read_head(store, run)
        if head is None:
            head = Head(run, generation, thread=thread)
            try:
                write_head(store, head, create=True)
                return head, 0
            except RemoteConflict:
                continue
        if thread is not None and head.thread not in (None, thread):
            raise HeadError(f"the head of run {run} belongs to thread {head.thread}, not "
                            f"{thread}: refusing to serve another thread's snapshots")
        if head.generation > generation:
            raise HeadError(f"the head of run {run} was written by generation "
                            f"{head.generation}, newer than our lease's {generation}")
        previous = head.generation
        if previous == generation and head.thread == (thread or head.thread):
            return head, previous
        head.generation = generation
        head.thread = thread or head.thread
        try:
            write_head(store, head)
        except RemoteConflict:
            continue
        return head, previous
    raise HeadError(f"the head of run {run} keeps changing under us")
