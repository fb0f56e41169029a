"""Thread records: which bucket run holds a shard thread's snapshots now.

`threads/<key>` (format in `vfsd.remote`) names, for one thread of a graph,
the run whose head lists its published snapshots, or says the thread was
deleted (a tombstone). Every replica reads it before it runs the thread, so
what one replica did (a delete, a copy, a new run after a delete) holds on
every other. Records are created with `If-None-Match: *` and changed with
`If-Match` on the ETag they were read with, so of two replicas changing one
record, exactly one wins and the other reads it again.

A record is parsed strictly (`ThreadRecordError` says what is wrong): a
damaged record is never guessed at. A record of another thread id than the
one asked for (two ids with one hash, a planted object) is `ThreadMismatch`:
nothing of it is used. Network functions block: call them from worker threads.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from dataclasses import dataclass, field, replace

from .layout import check_run_id, check_thread_key, thread_key
from .objstore import ObjectStore, RemoteConflict, RemoteNotFound, RemoteTooLarge

RECORD_FORMAT = 1
MAX_RECORD_BYTES = 1 << 20
#: thread ids longer than this (UTF-8 bytes) are refused (as a shard refuses them)
MAX_THREAD_ID_BYTES = 64 * 1024
#: runs a tombstone may list (a thread deleted this many times is damaged)
MAX_OLD_RUNS = 10_000
MAX_GENERATION = 1 << 62
LIVE = "live"
DELETED = "deleted"


class ThreadRecordError(Exception):
    """A thread record that is damaged or not a vfsd record; the message says why."""


class ThreadMismatch(ThreadRecordError):
    """The record names another thread id than the one asked for."""


@dataclass
class ThreadRecord:
    """What `threads/<key>` says, and the ETag it was read or written with."""

    key: str
    thread_id: str
    run: str | None
    generation: int = 1
    state: str = LIVE
    copied_from: dict | None = None
    old_runs: list[str] = field(default_factory=list)
    etag: str = ""

    @property
    def live(self) -> bool:
        return self.state == LIVE

    def to_bytes(self) -> bytes:
        return json.dumps({
            "vfsd_thread": RECORD_FORMAT, "key": self.key, "thread_id": self.thread_id,
            "run": self.run, "generation": self.generation, "state": self.state,
            "copied_from": self.copied_from, "old_runs": self.old_runs,
            "updated_ns": time.time_ns(),
            "writer": {"host": socket.gethostname(), "pid": os.getpid()},
        }, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes, etag: str, key: str) -> ThreadRecord:
        where = f"the thread record {thread_key(key)}"
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise ThreadRecordError(f"{where} is not valid JSON") from None
        if not isinstance(doc, dict) or doc.get("vfsd_thread") != RECORD_FORMAT:
            raise ThreadRecordError(f"{where} is not a vfsd thread record")
        if doc.get("key") != key:
            raise ThreadRecordError(f"{where} says it is the record of {doc.get('key')!r}")
        thread_id, run, gen = doc.get("thread_id"), doc.get("run"), doc.get("generation")
        state, old, copied = doc.get("state"), doc.get("old_runs"), doc.get("copied_from")
        if not isinstance(thread_id, str) or \
                len(thread_id.encode("utf-8", "surrogatepass")) > MAX_THREAD_ID_BYTES:
            raise ThreadRecordError(f"{where} has a damaged thread id")
        if not isinstance(gen, int) or isinstance(gen, bool) or not 1 <= gen < MAX_GENERATION:
            raise ThreadRecordError(f"{where} has a damaged generation")
        if state not in (LIVE, DELETED):
            raise ThreadRecordError(f"{where} has an unknown state {str(state)[:40]!r}")
        if not isinstance(old, list) or len(old) > MAX_OLD_RUNS:
            raise ThreadRecordError(f"{where} has a damaged list of old runs")
        try:
            for r in old:
                check_run_id(r)
            if run is not None:
                check_run_id(run)
            if copied is not None:
                if not isinstance(copied, dict) or not isinstance(copied.get("upto"), int):
                    raise ValueError("copied_from")
                check_run_id(copied.get("run"))
        except ValueError:
            raise ThreadRecordError(f"{where} names a damaged run id") from None
        if (run is None) != (state == DELETED):
            raise ThreadRecordError(f"{where}: a live record names a run, a tombstone none")
        return cls(key, thread_id, run, gen, state, copied, list(old), etag)

    # ------------------------------------------------------------ changes

    def deleted(self) -> ThreadRecord:
        """The tombstone that replaces this record (CAS on its ETag)."""
        old = self.old_runs + ([self.run] if self.run and self.run not in self.old_runs else [])
        return replace(self, run=None, state=DELETED, generation=self.generation + 1,
                       copied_from=None, old_runs=old)

    def revived(self, run: str, copied_from: dict | None = None) -> ThreadRecord:
        """A live record for a new run replacing this tombstone (the id used again)."""
        return replace(self, run=run, state=LIVE, generation=self.generation + 1,
                       copied_from=copied_from)


def new_run_id() -> str:
    """A fresh bucket run id (the form a store gives its volumes' runs)."""
    return secrets.token_hex(16)


def check_thread_id(thread_id: str) -> str:
    if not isinstance(thread_id, str) or \
            len(thread_id.encode("utf-8", "surrogatepass")) > MAX_THREAD_ID_BYTES:
        raise ValueError(f"a thread id is a string of at most {MAX_THREAD_ID_BYTES} bytes")
    return thread_id


def check_mine(rec: ThreadRecord, thread_id: str) -> ThreadRecord:
    """`rec` if it is the record of `thread_id`; ThreadMismatch otherwise."""
    if rec.thread_id != thread_id:
        raise ThreadMismatch(
            f"the bucket's record {thread_key(rec.key)} belongs to thread "
            f"{rec.thread_id[:200]!r}, not {thread_id[:200]!r} (two thread ids with one "
            "hash, or a planted record): refusing to serve another thread's files")
    return rec


# -------------------------------------------------------------------- network


def read_record(store: ObjectStore, key: str) -> ThreadRecord | None:
    """The record of thread `key`, or None if the bucket has none."""
    check_thread_key(key)
    try:
        fetched = store.get(thread_key(key), max_bytes=MAX_RECORD_BYTES)
    except RemoteNotFound:
        return None
    except RemoteTooLarge:
        raise ThreadRecordError(f"the thread record {thread_key(key)} is larger than "
                                f"{MAX_RECORD_BYTES} bytes: damaged") from None
    return ThreadRecord.parse(fetched.data, fetched.etag, key)


def create_record(store: ObjectStore, rec: ThreadRecord) -> ThreadRecord:
    """Write a record where there is none (If-None-Match); RemoteConflict if one appeared."""
    rec.etag = store.put(thread_key(rec.key), rec.to_bytes(), if_none_match=True)
    return rec


def write_record(store: ObjectStore, rec: ThreadRecord) -> ThreadRecord:
    """CAS a record on the ETag it was read with; RemoteConflict if it changed since."""
    try:
        rec.etag = store.put(thread_key(rec.key), rec.to_bytes(), if_match=rec.etag)
    except RemoteNotFound:
        raise RemoteConflict(f"the thread record {thread_key(rec.key)} was removed") from None
    return rec


def live_record(store: ObjectStore, key: str, thread_id: str,
                run_if_new: str) -> tuple[ThreadRecord, str]:
    """The live record of `thread_id`, made if need be: (record, how) where how is
    "found", "created" (there was none: its run is `run_if_new`) or "revived"
    (a tombstone: a new run). ThreadMismatch for another thread's record."""
    check_thread_id(thread_id)
    for _ in range(8):
        rec = read_record(store, key)
        try:
            if rec is None:
                return create_record(store, ThreadRecord(key, thread_id, run_if_new)), \
                    "created"
            check_mine(rec, thread_id)
            if rec.live:
                return rec, "found"
            return write_record(store, rec.revived(new_run_id())), "revived"
        except RemoteConflict:
            continue  # another replica wrote it first: read it again
    raise RemoteConflict(f"the thread record {thread_key(key)} keeps changing under us")
