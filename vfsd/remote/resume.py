"""Resume a run from its published snapshot: a manifest chain becomes a local volume.

`load_snapshot` downloads and checks everything first (worker thread or
before the mount: it blocks): the chain of manifests down to a full one
(`head.fetch_chain`), the state they make together, and that this state is a
tree (a root directory, names pointing at inodes that exist, small objects
present). Nothing is written until all of it checks, so a bad `--from`, an
unknown run or snapshot, or a damaged manifest leave the local store as it
was.

`import_snapshot` then writes that state into a new volume of a local store,
in batches, as `Snapshots.copy_into` does for forks: the live tree (inodes,
names, blocks, xattrs, step indexes) and the snapshot itself (its entries at
the snapshot's seq and its record), so the run goes on with the next seq and
the next publication is a delta on it. Content comes by reference: small
objects from the manifests' blobs, chunk files as records only ("remote-only",
see `remotestate`), fetched from the bucket on first read. The volume is
marked incomplete until the last batch commits; an import that died is done
again from scratch by the next `vfsd mount --from`.
"""

from __future__ import annotations

import json
import struct
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from vfsd import errors
from vfsd.snapshots.snapshots import (
    drop_volume,
    put_inode_entry,
    snapshot_id,
    unpack_inode_entry,
)
from vfsd.store import remotestate
from vfsd.store.content import LOC_LMDB, ref_digest, ref_loc
from vfsd.store.inode import Inode
from vfsd.store.store import ROOT_INO, Store

from .head import Head, fetch_chain, read_head
from .manifest import Manifest, ManifestError
from .objstore import ObjectStore

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
BATCH = 2000


class ResumeError(Exception):
    """The snapshot cannot be resumed here; the message says why."""


@dataclass
class RemoteSnapshot:
    """A published snapshot, downloaded and checked, ready to import."""

    run: str
    seq: int
    head: Head
    chain: list[Manifest]
    state: dict[bytes, bytes]  # object key -> value, every object that exists
    blobs: dict[bytes, bytes]
    sizes: dict[bytes, int]  # block reference -> object size

    @property
    def top(self) -> Manifest:
        return self.chain[-1]

    @property
    def chunk_size(self) -> int:
        return self.top.chunk_size


def load_snapshot(store: ObjectStore, run: str, seq: int) -> RemoteSnapshot:
    """Download and check snapshot `seq` of `run` (blocks). UnknownRun,
    UnknownSnapshot, ManifestError or ResumeError say what is wrong."""
    from .head import UnknownRun, UnknownSnapshot

    head = read_head(store, run)
    if head is None:
        raise UnknownRun(f"run {run} is unknown in {store.url} (no runs/{run}/head); the "
                         "run id is what `vfsd status --json` reports as \"run\"")
    try:
        chain = fetch_chain(store, run, seq)
    except UnknownSnapshot:
        listed = ", ".join(head.ids()[-10:]) or "none"
        raise UnknownSnapshot(f"run {run} has no published snapshot s{seq} in {store.url} "
                              f"(published: {listed})") from None
    state: dict[bytes, bytes] = {}
    blobs: dict[bytes, bytes] = {}
    for m in chain:
        for okey, value in m.entries:
            if value:
                state[okey] = value
            else:
                state.pop(okey, None)
        blobs.update(m.blobs)
    sizes = check_tree(state, blobs, chain[-1].chunk_size, f"snapshot s{seq} of run {run}")
    return RemoteSnapshot(run, seq, head, chain, state, blobs, sizes)


def check_tree(state: dict[bytes, bytes], blobs: dict[bytes, bytes], chunk_size: int,
               where: str) -> dict[bytes, int]:
    """ManifestError unless `state` is a whole tree; the size of every object it names."""
    inodes: dict[int, Inode] = {}
    sizes: dict[bytes, int] = {}
    for okey, value in state.items():
        if okey[:1] != b"i":
            continue
        ino = _U64.unpack(okey[1:9])[0]
        e = unpack_inode_entry(ino, value)
        inodes[ino] = e.inode
        for idx, ref in e.blocks.items():
            extent = min(chunk_size, e.inode.size - idx * chunk_size)
            if not e.inode.is_reg or extent <= 0:
                raise ManifestError(f"{where}: inode {ino} names a block past its end")
            if ref_loc(ref) == LOC_LMDB:
                blob = blobs.get(ref_digest(ref))
                if blob is None:
                    raise ManifestError(f"{where}: small object {ref_digest(ref).hex()} of "
                                        f"inode {ino} is in no manifest of the chain")
                extent = len(blob)
            sizes[ref] = extent
    root = inodes.get(ROOT_INO)
    if root is None or not root.is_dir:
        raise ManifestError(f"{where} has no root directory")
    for okey, value in state.items():
        if okey[:1] != b"d":
            continue
        parent = _U64.unpack(okey[1:9])[0]
        child = _U64.unpack(value)[0]
        if parent not in inodes or not inodes[parent].is_dir or child not in inodes:
            raise ManifestError(f"{where}: name {okey[10:]!r} in directory {parent} points "
                                f"at a missing inode")
    return sizes


# -------------------------------------------------------------------- import


def volume_state(store_dir: Path, volume: str) -> str:
    """"none", "empty", "incomplete" or "used": what the local volume holds."""
    if not (store_dir / "lmdb" / "data.mdb").exists():
        return "none"
    try:
        st = Store(store_dir, volume, create=False, incomplete_ok=True)
    except Exception:  # noqa: BLE001 - no such volume (or no store): a new one
        return "none"
    try:
        if st.meta_u64(b"incomplete"):
            return "incomplete"
        empty = not st.readdir(ROOT_INO, 0, limit=1) and not st.meta_u64(b"snap_seq")
        return "empty" if empty else "used"
    finally:
        st.close()


def origin_of(store_dir: Path, volume: str) -> dict | None:
    """Where an imported volume came from ({"run", "seq", "remote"}), or None."""
    st = Store(store_dir, volume, create=False)
    try:
        raw = remotestate.volume_meta(st, b"remote_origin")
        return json.loads(raw) if raw else None
    finally:
        st.close()


def check_importable(store_dir: Path, volume: str, snap: RemoteSnapshot, remote_url: str) -> None:
    """ResumeError unless `import_snapshot` can write `snap` there (reads only).

    Called before the run's lease is taken, so a resume that cannot work
    never takes (or disturbs) the lease of a worker still on the run.
    """
    state = volume_state(store_dir, volume)
    if state == "used":
        raise ResumeError(f"volume {volume!r} of {store_dir} already holds files; resume into "
                          "a new run dir")
    if state == "none" and not (store_dir / "lmdb" / "data.mdb").exists():
        return  # a new store: it takes the run's chunk size and remote
    try:
        st = Store(store_dir, None, readonly=True, create=False, incomplete_ok=True)
    except (errors.StoreError, errors.StoreVersionError) as exc:
        raise ResumeError(f"cannot read the store at {store_dir}: {exc}") from None
    try:
        current = remotestate.remote_url(st)
        size = st.chunk_size
    finally:
        st.close()
    _check_store_fits(store_dir, current, size, snap, remote_url)


def _check_store_fits(store_dir: Path, current: str | None, chunk_size: int | None,
                      snap: RemoteSnapshot, remote_url: str) -> None:
    if current is not None and current != remote_url:
        raise ResumeError(f"the store at {store_dir} keeps its chunks in {current}, not "
                          f"{remote_url}: resume into a run dir with a store of its own")
    if chunk_size is not None and chunk_size != snap.chunk_size:
        raise ResumeError(f"the store at {store_dir} cuts files into {chunk_size}-byte "
                          f"chunks, the run into {snap.chunk_size}: use another store")


def import_snapshot(store_dir: Path, volume: str, snap: RemoteSnapshot, *, remote_url: str,
                    latest: int, owner_token: str, generation: int,
                    inline_max: int) -> dict:
    """Write `snap` into volume `volume` (new, empty, or left incomplete) of the
    store at `store_dir`; the snapshot's record. `latest` is the newest seq the
    run has published (the run's next snapshot is after it); `generation` the
    lease generation this worker fenced the head with (0: read-only)."""
    state = volume_state(store_dir, volume)
    if state == "used":
        raise ResumeError(f"volume {volume!r} of {store_dir} already holds files; resume into "
                          "a new run dir")
    if state == "incomplete":
        st = Store(store_dir, volume, incomplete_ok=True)
        try:
            drop_volume(st, volume)  # an import that died half way: start over
        finally:
            st.close()
    st = Store(store_dir, volume, chunk_size=snap.chunk_size, inline_max=inline_max)
    try:
        _check_store_fits(store_dir, remotestate.remote_url(st), st.chunk_size, snap,
                          remote_url)
        return _import(st, snap, remote_url=remote_url, latest=latest, owner_token=owner_token,
                       generation=generation)
    finally:
        st.close()


def _import(st: Store, snap: RemoteSnapshot, *, remote_url: str, latest: int,
            owner_token: str, generation: int) -> dict:
    seq = snap.seq
    vb = st._vb
    meta = st.db["meta"]
    with st.txn(write=True) as txn:
        txn.put(st._vp + b"incomplete", _U64.pack(1), db=meta)
        txn.put(st._vp + b"run", snap.run.encode(), db=meta)
    # Inodes first, so every name added later points at an existing inode.
    okeys = sorted(snap.state, key=lambda k: (k[:1] != b"i", k))
    max_ino = ROOT_INO
    for start in range(0, len(okeys), BATCH):
        part = okeys[start:start + BATCH]
        with st.txn(write=True) as txn, st.batched_counters(txn):
            refs: Counter = Counter()
            for okey in part:
                value = snap.state[okey]
                if okey[:1] == b"i":
                    ino = _U64.unpack(okey[1:9])[0]
                    max_ino = max(max_ino, ino)
                    put_inode_entry(txn, st, ino, value, refs)
                    for ref in unpack_inode_entry(ino, value).blocks.values():
                        refs[ref] += 1  # the snapshot entry's own reference
                else:
                    st._add_entry(txn, _U64.unpack(okey[1:9])[0], okey[10:],
                                  _U64.unpack(value)[0])
                txn.put(vb + okey + _U64.pack(seq), value, db=st.db["sver"])
                txn.put(vb + _U64.pack(seq) + okey, b"", db=st.db["sgen"])
            for ref, n in refs.items():
                st.content.adopt(txn, ref, snap.sizes[ref], n,
                                 blob=snap.blobs.get(ref_digest(ref)))
    top = snap.top
    record = {"seq": seq, "id": snapshot_id(seq), "step": top.step,
              "created_ns": top.created_ns, "pinned": top.pinned, "label": top.label,
              "parent": 0, "entries": len(snap.state), "run": snap.run,
              "imported": {"remote": remote_url, "at_ns": time.time_ns()}}
    with st.txn(write=True) as txn:
        txn.put(vb + _U64.pack(seq), json.dumps(record).encode(), db=st.db["snap"])
        for key, value in ((b"snap_seq", max(seq, latest)), (b"snap_base", seq),
                           (b"step", top.step), (b"next_ino", max_ino + 1)):
            txn.put(st._vp + key, _U64.pack(value), db=meta)
        if remotestate.remote_url(st) is None:
            remotestate.set_remote_url(txn, st, remote_url)
        remotestate.set_volume_meta(txn, st, b"remote_owner", owner_token.encode())
        # An empty volume resumed in place may have fenced a run of its own.
        txn.delete(st._vp + b"remote_gen_next", db=meta)
        txn.delete(st._vp + b"remote_generation", db=meta)
        if generation:
            remotestate.set_generation(txn, st, generation)
        remotestate.set_volume_meta(txn, st, b"remote_origin", json.dumps(
            {"run": snap.run, "seq": seq, "remote": remote_url}).encode())
        entry = snap.head.entry(seq) or {}
        remotestate.record_published(txn, st, seq, {
            "seq": seq, "parent": top.parent, "full": top.full,
            "generation": top.generation, "entries": len(top.entries),
            "bytes": entry.get("bytes", 0), "published_ns": time.time_ns(), "imported": True})
        txn.delete(st._vp + b"incomplete", db=meta)
    return record
