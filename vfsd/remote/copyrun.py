"""A thread copied in the bucket: a new run with the source's published snapshots.

`copy_run` gives a target thread a run of its own whose manifests are the
source run's, written again under the new run id (same seqs, so checkpoints
copied with the thread name the same snapshot ids; chunks shared, none
copied), its head, and the target's thread record. The source's lease, head
and manifests are only read: a copy never disturbs a run of the source under
way anywhere.

The new manifests name chunks that other manifests name, but nothing here
holds those alive while they are written (the source's retention may retire
a manifest meanwhile, a sweep may run): the copy shakes hands with GC as a
publication does (`vfsd.remote`, "Publishing a snapshot", steps 3-8): an
intent naming every chunk of the copied manifests, a look at `gc/lease`,
every chunk confirmed after it (HEAD; one missing is uploaded again from the
local store, if it has it, else the copy fails), then the manifests, the
head, and the intent goes. The target's record is written last, with
If-None-Match (or over a tombstone, with If-Match), after the source's
record was read again: a copy whose source was deleted meanwhile, or whose
target appeared meanwhile, fails and removes what it wrote.
"""

from __future__ import annotations

import secrets

import structlog
import trio

from vfsd.store.chunks import chunk_hash

from .head import Head, fetch_manifest, read_head, write_head
from .layout import chunk_key, intent_key, manifest_key, run_objects_prefix
from .manifest import encode
from .objstore import ObjectStore, RemoteConflict, RemoteError
from .publisher import confirm_chunks, wait_for_no_sweep
from .threads import (
    ThreadRecord,
    check_mine,
    create_record,
    new_run_id,
    read_record,
    write_record,
)

log = structlog.get_logger("vfsd.remote")


class CopyError(Exception):
    """A copy that cannot be made; `code` is the control error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


async def _t(fn, *args):
    return await trio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)


def _fetch_for_copy(store: ObjectStore, run: str, seq: int, new_run: str):
    """In a worker thread: manifest `seq` of `run`, made the new run's (no lease
    wrote it: its first run's fence does), and the chunks it names."""
    m, _ = fetch_manifest(store, run, seq)
    m.run, m.generation = new_run, 0
    return m, m.chunk_digests()


def _stored(store: ObjectStore, key: str, limit: int) -> bytes:
    return store.get(key, max_bytes=limit).data


async def copy_run(store: ObjectStore, source: str, thread: str, target: str,
                   target_thread: str, uploader=None, chunks=None) -> dict:
    """Copy thread `source` (id `thread`) to thread `target` (id `target_thread`);
    {"run", "copied_from": {"run", "upto"}, "snapshots": [ids]}. CopyError
    (`not_found`, `exists`) or the bucket's errors otherwise."""
    src = await _t(read_record, store, source)
    if src is None or not src.live:
        raise CopyError("not_found", f"thread {source!r} has no run in {store.url} (never run "
                                     "on a replica with this bucket, or deleted)")
    check_mine(src, thread)
    old = await _t(read_record, store, target)
    if old is not None:
        check_mine(old, target_thread)
        if old.live:
            raise CopyError("exists", f"thread {target!r} exists in {store.url} (run "
                                      f"{old.run}): copy into a new thread")
    head = await _t(read_head, store, src.run)
    run = new_run_id()
    entries = list(head.snapshots) if head is not None else []
    written: list[str] = []
    try:
        manifests = []
        names: set[bytes] = set()
        for e in entries:
            m, chunk_names = await _t(_fetch_for_copy, store, src.run, e["seq"], run)
            manifests.append(m)
            names |= chunk_names
        ikey = intent_key(run, max((e["seq"] for e in entries), default=1), 1,
                          secrets.token_hex(8))
        await _t(store.put, ikey, b"".join(sorted(names)))
        written.append(ikey)
        floor, b = await wait_for_no_sweep(store)

        def reupload(digest: bytes) -> None:
            data = chunks.read_all(digest) if chunks is not None else None
            if data is None or chunk_hash(data) != digest:
                raise CopyError("remote_damaged", f"chunk {digest.hex()} of thread {source!r} "
                                                  "is neither in the bucket nor here")
            store.put_if_absent(chunk_key(digest), data)

        try:
            await confirm_chunks(store, uploader, reupload, names, b,
                                 floor if floor is not None else 0.0)
        except Exception as exc:
            if isinstance(exc, CopyError | RemoteError):
                raise
            raise CopyError("remote_damaged", f"a chunk of thread {source!r} is missing: "
                                              f"{exc}") from None
        for m in manifests:
            key = manifest_key(run, m.seq)
            data = await _t(encode, m)
            if not await _t(store.put_if_absent, key, data) and \
                    await _t(_stored, store, key, len(data) + 1) != data:
                raise CopyError("remote_error", f"{key} exists already: a new run cannot "
                                                "have manifests")
            written.append(key)
        new = Head(run, 0, head.latest if head else 0,
                   [dict(e, generation=0) for e in entries], thread=target)
        await _t(lambda: write_head(store, new, create=True))
        written.append(run_objects_prefix(run) + "head")
        await _t(store.delete, [ikey])
        now = await _t(read_record, store, source)
        if now is None or not now.live or now.run != src.run:
            raise CopyError("not_found", f"thread {source!r} was deleted (or started a new "
                                         "run) while it was copied")
        upto = head.latest if head else 0
        copied = {"run": src.run, "upto": upto}
        try:
            if old is None:
                await _t(create_record, store, ThreadRecord(target, target_thread, run,
                                                            copied_from=copied))
            else:
                await _t(write_record, store, old.revived(run, copied))
        except RemoteConflict:
            raise CopyError("exists", f"thread {target!r} appeared in {store.url} while it "
                                      "was copied") from None
    except BaseException:
        with trio.move_on_after(10) as scope:
            scope.shield = True
            try:
                await _t(store.delete, written)
            except RemoteError as exc:
                log.warning("copy_not_undone", run=run, error=str(exc))
        raise
    return {"run": run, "copied_from": copied, "snapshots": [f"s{e['seq']}" for e in entries]}
