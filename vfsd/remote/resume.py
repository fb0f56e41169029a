"""Resume a run from its published snapshot: a manifest chain becomes a local volume.

`load_snapshot` downloads and checks everything first (worker thread or
before the mount: it blocks): the chain of manifests down to a full one
(`head.fetch_chain`), the state they make together, and that this state is a
volume the local filesystem could hold (`check_tree`: every record within
the invariants `vfsd fsck` checks, no name local operations refuse, a tree
under a root directory, small objects present). Nothing is written until all
of it checks, so a bad `--from`, an unknown run or snapshot, or a damaged or
hostile manifest leave the local store as it was.

`import_snapshot` then writes that state into a new volume of a local store,
in batches, as `Snapshots.copy_into` does for forks: the live tree (inodes,
names, blocks, xattrs, step indexes) and the snapshot itself (its entries at
the snapshot's seq and its record), so the run goes on with the next seq and
the next publication is a delta on it. Content comes by reference: small
objects from the manifests' blobs, chunk files as records only ("remote-only",
see `remotestate`), fetched from the bucket on first read. The volume is
marked incomplete until the last batch commits. An import that fails drops
the volume again; one whose process died is done again from scratch by the
next `vfsd mount --from`. The functions here take the daemon's own `Store`
handle, opened once (`RemoteTier.resume`).
"""

from __future__ import annotations

import json
import struct
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import structlog

from vfsd import RESERVED_ROOT_NAMES, errors
from vfsd.snapshots.snapshots import (
    clear_volume,
    drop_volume,
    entry_bytes,
    put_inode_entry,
    snapshot_id,
    unpack_inode_entry,
)
from vfsd.store import invariants, remotestate
from vfsd.store.content import LOC_LMDB, ref_digest, ref_loc
from vfsd.store.inode import Inode
from vfsd.store.store import ROOT_INO, Store

from .head import Head, fetch_chain, read_head
from .manifest import MAX_RAW_BYTES, Manifest, ManifestError
from .objstore import ObjectStore

log = structlog.get_logger("vfsd.remote")
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
        chain = fetch_chain(store, run, seq, memory=manifest_memory())
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


def manifest_memory() -> int:
    """Bytes of manifest bodies a resume may decompress: a quarter of the
    memory this process can still take (MemAvailable, and what its cgroup's
    memory.max leaves), as the decoded state costs about three times the
    body; at most `MAX_RAW_BYTES`. A planted chain that decompresses to more
    is refused before it takes the machine's memory."""
    avail = MAX_RAW_BYTES * 4
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        rel = Path("/proc/self/cgroup").read_text().split("::", 1)[1].strip()
        group = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            used = int((group / "memory.current").read_text())
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError, IndexError):
        pass  # no cgroup v2 limit here
    return max(0, min(MAX_RAW_BYTES, avail // 4))


def check_tree(state: dict[bytes, bytes], blobs: dict[bytes, bytes], chunk_size: int,
               where: str) -> dict[bytes, int]:
    """ManifestError unless `state` is a volume the local filesystem could hold;
    the size of every object it names.

    Every record within the invariants `vfsd fsck` checks (`store.invariants`:
    sizes, steps, statuses, modes, link targets, xattr limits, link counts),
    no name local operations refuse (reserved root names included), blocks
    inside their files and small objects present, and a tree: one root
    directory, every directory named once and reachable from it.
    """
    inodes: dict[int, Inode] = {}
    names: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    sizes: dict[bytes, int] = {}
    problems: list[str] = []
    for okey, value in state.items():
        if okey[:1] != b"i":
            continue
        ino = _U64.unpack(okey[1:9])[0]
        e = unpack_inode_entry(ino, value)
        inode = inodes[ino] = e.inode
        problems += invariants.inode_problems(inode)
        problems += invariants.link_target_problems(inode, e.target)
        problems += invariants.xattr_problems(ino, ((n, len(v)) for n, v in e.xattrs))
        if inode.is_reg and inode.nblocks != len(e.blocks):
            problems.append(f"inode {ino}: block count {inode.nblocks}, {len(e.blocks)} listed")
        for idx, ref in e.blocks.items():
            extent = min(chunk_size, inode.size - idx * chunk_size)
            if not inode.is_reg or extent <= 0:
                raise ManifestError(f"{where}: inode {ino} names a block past its end")
            if ref_loc(ref) == LOC_LMDB:
                blob = blobs.get(ref_digest(ref))
                if blob is None:
                    raise ManifestError(f"{where}: small object {ref_digest(ref).hex()} of "
                                        f"inode {ino} is in no manifest of the chain")
                extent = len(blob)
            if sizes.setdefault(ref, extent) != extent:
                problems.append(f"inode {ino}: object {ref_digest(ref).hex()} is named with "
                                f"two sizes")
            sizes[ref] = extent
        if problems:
            _refuse(where, problems)
    root = inodes.get(ROOT_INO)
    if root is None or not root.is_dir:
        raise ManifestError(f"{where} has no root directory")
    for okey, value in state.items():
        if okey[:1] != b"d":
            continue
        parent = _U64.unpack(okey[1:9])[0]
        child = _U64.unpack(value)[0]
        if parent not in inodes or child not in inodes:
            raise ManifestError(f"{where}: name {okey[10:]!r} in directory {parent} points "
                                f"at a missing inode")
        problems += invariants.name_problems(parent, okey[10:], at_root=parent == ROOT_INO,
                                             reserved=RESERVED_ROOT_NAMES)
        names[child].append((parent, okey[10:]))
    if not problems:
        problems += invariants.tree_problems(inodes, names, ROOT_INO)
        problems += invariants.link_count_problems(inodes, names, ROOT_INO)
        nameless = [ino for ino in inodes if ino != ROOT_INO and not names.get(ino)]
        if nameless:
            problems.append(f"inode {min(nameless)} is in no directory")
    if problems:
        _refuse(where, problems)
    return sizes


def _refuse(where: str, problems: list[str]) -> None:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise ManifestError(f"{where}: {problems[0]}{more}; nothing was imported")


# -------------------------------------------------------------------- import


def volume_state(st: Store | None) -> str:
    """"none", "empty", "incomplete" or "used": what the local volume holds
    (`st`, or None when the store or the volume does not exist yet)."""
    if st is None:
        return "none"
    if st.meta_u64(b"incomplete"):
        return "incomplete"
    empty = not st.readdir(ROOT_INO, 0, limit=1) and not st.meta_u64(b"snap_seq")
    return "empty" if empty else "used"


def origin_of(st: Store) -> dict | None:
    """Where an imported volume came from ({"run", "seq", "remote"}), or None."""
    raw = remotestate.volume_meta(st, b"remote_origin")
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def check_importable(st: Store, snap: RemoteSnapshot, remote_url: str) -> None:
    """ResumeError unless `import_snapshot` can write `snap` into `st` (reads only).

    Called before the run's lease is taken, so a resume that cannot work
    never takes (or disturbs) the lease of a worker still on the run.
    """
    if volume_state(st) == "used":
        raise ResumeError(f"volume {st.volume!r} of {st.dir} already holds files; resume into "
                          "a new run dir")
    current = remotestate.remote_url(st)
    if current is not None and current != remote_url:
        raise ResumeError(f"the store at {st.dir} keeps its chunks in {current}, not "
                          f"{remote_url}: resume into a run dir with a store of its own")
    if st.chunk_size is not None and st.chunk_size != snap.chunk_size:
        raise ResumeError(f"the store at {st.dir} cuts files into {st.chunk_size}-byte "
                          f"chunks, the run into {snap.chunk_size}: use another store")


def import_snapshot(st: Store, snap: RemoteSnapshot, *, remote_url: str, latest: int,
                    owner_token: str, generation: int, on_progress=None) -> dict:
    """Write `snap` into the volume of `st` (new, empty, or left incomplete by
    an import that died); the snapshot's record. `latest` is the newest seq
    the run has published (the run's next snapshot is after it);
    `generation` the lease generation this worker fenced the head with (0:
    read-only). `on_progress("import", entries written, entries)` after each
    batch (a progress bar). ResumeError if it cannot; the volume is then dropped (what
    the import wrote goes with it): close `st`, it serves no volume any more.
    """
    check_importable(st, snap, remote_url)
    try:
        if volume_state(st) == "incomplete":
            clear_volume(st)  # an import that died half way: start over
        record = _import(st, snap, remote_url=remote_url, latest=latest,
                         owner_token=owner_token, generation=generation,
                         tell=on_progress or (lambda phase, done, total: None))
    except BaseException as exc:
        try:
            drop_volume(st, st.volume)
        except errors.StoreError as drop_exc:
            log.error("import_not_undone", volume=st.volume, error=str(drop_exc))
        if isinstance(exc, errors.StoreError):
            raise ResumeError(f"snapshot s{snap.seq} of run {snap.run} could not be imported "
                              f"into {st.dir}: {exc}; nothing of it was kept") from None
        raise
    st.reload_snapshot_state()
    return record


def _import(st: Store, snap: RemoteSnapshot, *, remote_url: str, latest: int,
            owner_token: str, generation: int, tell) -> dict:
    seq = snap.seq
    vb = st._vb
    meta = st.db["meta"]
    with st.txn(write=True) as txn:
        txn.put(st._vp + b"incomplete", _U64.pack(1), db=meta)
        txn.put(st._vp + b"run", snap.run.encode(), db=meta)
    # Inodes first, so every name added later points at an existing inode.
    okeys = sorted(snap.state, key=lambda k: (k[:1] != b"i", k))
    max_ino = ROOT_INO
    recorded = 0  # the file bytes the imported snapshot records (`snap_bytes`)
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
                recorded += entry_bytes(okey, value)
            for ref, n in refs.items():
                st.content.adopt(txn, ref, snap.sizes[ref], n,
                                 blob=snap.blobs.get(ref_digest(ref)))
        tell("import", start + len(part), len(okeys))
    top = snap.top
    record = {"seq": seq, "id": snapshot_id(seq), "step": top.step,
              "created_ns": top.created_ns, "pinned": top.pinned, "label": top.label,
              "parent": 0, "entries": len(snap.state), "run": snap.run,
              "imported": {"remote": remote_url, "at_ns": time.time_ns()}}
    with st.txn(write=True) as txn:
        txn.put(vb + _U64.pack(seq), json.dumps(record).encode(), db=st.db["snap"])
        for key, value in ((b"snap_seq", max(seq, latest)), (b"snap_base", seq),
                           (b"step", top.step), (b"next_ino", max_ino + 1),
                           (b"snap_bytes", recorded)):
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
