"""`vfsd fsck`: check every invariant of a store, and repair what can be repaired.

Part of the storage layer (it reads the layouts documented in `store` and
`snapshots`). It runs with no daemon on the store: it takes every volume's
lock first, and first reads the whole LMDB file in a child process
(`lmdbcheck`), so damaged pages give a report, not a crash.

Checked, per volume: inode records decode and keep the per-record invariants
of `store.invariants` (mode, status, step and size bounds, link targets,
xattr limits, names), which an import checks too; every name points at a
live inode and the three name databases agree; directories form a tree
(one name each, reachable from the root); link counts; orphans; the step
indexes and counters match the inodes. Store-wide: every content reference (live
blocks and snapshot entries) names a record whose count equals the
references found, and whose object is present (and, with `verify`, hashes
right: inline objects and chunk files alike); no chunk file or temporary
without a record. Snapshots: entries decode, `sgen` lists exactly the
entries, each older entry is needed by a retained snapshot, and each
unchanged object's newest entry equals the live object. Entries of a first
snapshot that a crash cut short are a note, not a problem: the next snapshot
drops them.

Remote stores (`remotestate`): a referenced chunk file may be absent locally
when it is in the bucket ("remote-only", counted, not a problem); it is damage
if it is still pending upload (the only copy is gone). With `remote` (an
`ObjectStore` on the store's bucket), remote-only chunks are looked up in the
bucket (and, with `verify`, downloaded and hashed). The `upload` table must
name only referenced chunk files, and its counters must match it.

Repaired (`repair=True`): orphans freed, stray chunk files and temporaries
deleted, refcounts, indexes, counters and the `sgen` list rewritten, entries
no snapshot needs dropped (and those of an unfinished first snapshot, with
the content only they held), changed-but-unmarked objects marked, dangling
names dropped. Content that is gone (a missing or altered object) cannot
come back: such files are reported, and reading them keeps failing with EIO,
unless `quarantine` (`vfsd fsck --repair --quarantine`) moves them into
`lost+found/` with their damaged blocks dropped (read as zeros).
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import xxhash
from tqdm import tqdm

from vfsd.snapshots.snapshots import Snapshots, entry_refs, okey_len
from vfsd.store import invariants, remotestate
from vfsd.store.chunks import chunk_hash
from vfsd.store.content import HOT_REF, LOC_FILE, LOC_LMDB, pack_record, unpack_record
from vfsd.store.inode import Inode
from vfsd.store.lmdbcheck import check_readable
from vfsd.store.store import ROOT_INO, Store, _get_u64

from . import errors
from .rundir import SHARD_LOCK, lock_volume

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
_VI = struct.Struct(">IQ")


@dataclass
class FsckReport:
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    damaged_files: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    #: what is not damage but a repair tidies (left by a crash that vfsd recovers from)
    notes: list[str] = field(default_factory=list)
    #: (volume, inode, block indexes) of each live file with damaged content (`quarantine`)
    damaged_blocks: list[tuple[str, int, list[int]]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def problem(self, msg: str) -> None:
        self.problems.append(msg)

    def as_dict(self) -> dict:
        return {"clean": self.clean, "problems": self.problems, "repaired": self.repaired,
                "damaged_files": self.damaged_files, "stats": self.stats, "notes": self.notes}


def volumes(store: Store) -> dict[str, int]:
    return store.volumes()


def lock_all(store: Store) -> list[int]:
    """The shard lock and every volume's lock; StoreLocked if a daemon holds
    one (a shard daemon holds the shard lock alone, for all its volumes)."""
    fds: list[int] = []
    try:
        try:
            fds.append(lock_volume(store.dir, SHARD_LOCK))
        except errors.StoreLocked as exc:
            pid = re.search(r"\(pid [0-9]+\)", str(exc))
            raise errors.StoreLocked(f"store {store.dir} is served by a shard daemon"
                                     + (f" {pid[0]}" if pid else "")) from None
        fds += [lock_volume(store.dir, name) for name in volumes(store)]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def readable(store_dir) -> FsckReport | None:
    """A report of LMDB-level damage, or None if every page reads."""
    msg = check_readable(store_dir)
    if msg is None:
        return None
    rep = FsckReport()
    rep.problem(msg)
    rep.problem("damaged pages cannot be repaired in place, and vfsd will not mount the "
                "store: restore it from a backup")
    return rep


def fsck(store: Store, *, repair: bool = False, verify: bool = False,
         progress: bool = False, remote=None) -> FsckReport:
    rep = FsckReport()
    try:
        return _fsck(store, rep, repair=repair, verify=verify, progress=progress,
                     remote=remote)
    except errors.StoreError as exc:
        rep.problem(f"the store could not be read to the end: {exc}")
        return rep


class _Volume:
    """What fsck gathers about one volume."""

    def __init__(self, name: str, vol: int) -> None:
        self.name = name
        self.vol = vol
        self.inodes: dict[int, Inode] = {}
        self.names: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.subdirs: Counter = Counter()
        self.block_count: Counter = Counter()
        self.blocks: dict[int, dict[int, bytes]] = defaultdict(dict)
        self.dangling: list[tuple[int, bytes, int, int]] = []
        self.hot: set[int] = set()
        self.hot_index_fix: tuple[set[int], set[int]] | None = None
        self.fix_nlink: list[tuple[int, int]] = []


def _fsck(store: Store, rep: FsckReport, *, repair: bool, verify: bool,
          progress: bool, remote=None) -> FsckReport:
    db = store.db
    vols = {name: _Volume(name, vol) for name, vol in volumes(store).items()}
    by_id = {v.vol: v for v in vols.values()}
    refs_found: Counter = Counter()
    snap_fixes = []
    with store.txn() as txn:
        for k, v in tqdm(txn.cursor(db=db["inode"]), desc="inodes", disable=not progress,
                         unit=" inodes"):
            vol, ino = _VI.unpack(k)
            volume = by_id.get(vol)
            if volume is None:
                rep.problem(f"inode {ino} of unknown volume {vol}")
                continue
            try:
                inode = volume.inodes[ino] = Inode.unpack(ino, v)
            except struct.error:
                rep.problem(f"volume {volume.name!r}: inode {ino} does not decode")
                continue
            for msg in invariants.inode_problems(inode):
                rep.problem(f"volume {volume.name!r}: {msg}")
        for volume in vols.values():
            _check_names(txn, db, volume, rep)
            _check_links(txn, db, volume, rep)
            for msg in invariants.tree_problems(volume.inodes, volume.names, ROOT_INO):
                rep.problem(f"volume {volume.name!r}: {msg}")
        for k, v in tqdm(txn.cursor(db=db["block"]), desc="blocks", disable=not progress,
                         unit=" blocks"):
            vol, ino = _VI.unpack(k[:12])
            volume = by_id.get(vol)
            if volume is None or ino not in volume.inodes:
                rep.problem(f"block of missing inode {ino} (volume {vol})")
                continue
            if bytes(v) == HOT_REF:
                volume.hot.add(ino)
                volume.block_count[ino] += 1
                continue
            refs_found[bytes(v)] += 1
            volume.block_count[ino] += 1
            volume.blocks[ino][_U64.unpack(k[12:])[0]] = bytes(v)
        for volume in vols.values():
            _check_hot(store, txn, volume, rep)
            snap_fixes += _check_snapshots(store, txn, volume, rep, refs_found)
        damaged, remote_only = _check_content(store, txn, rep, refs_found, verify, progress,
                                              remote)
        upload_fix = _check_upload(store, txn, rep)
        if damaged:
            for volume in vols.values():
                for ino, blocks in volume.blocks.items():
                    if any(ref[:16] in damaged for ref in blocks.values()):
                        rep.damaged_blocks.append((volume.name, ino, sorted(
                            idx for idx, ref in blocks.items() if ref[:16] in damaged)))
                        view = store.view(volume.name)
                        path = view._path_in(txn, ino) or f"<inode {ino}>"
                        rep.damaged_files.append(
                            path if len(vols) == 1 else f"{volume.name}: {path}")
        index_fix, counter_fix = _check_indexes(store, txn, vols, rep)
        rep.stats = {"inodes": sum(len(v.inodes) for v in vols.values()),
                     "content_referenced": len(refs_found),
                     "chunk_files": len(set(store.chunks.iter_all())), "volumes": len(vols),
                     "remote_only": remote_only}
    if not repair or (rep.clean and not snap_fixes):
        return rep
    _repair(store, vols, rep, refs_found, index_fix, counter_fix, snap_fixes)
    # The repair may itself drop content the upload table names: checked again.
    with store.txn() as txn:
        upload_fix = _check_upload(store, txn, FsckReport()) or upload_fix
    if upload_fix:
        _repair_upload(store, rep)
    return rep


#: where `quarantine` puts files whose content is damaged, at each volume's root
LOST_FOUND = b"lost+found"


def quarantine(store: Store, damaged: list[tuple[str, int, list[int]]]) -> list[str]:
    """Move each file with damaged content into `lost+found/` at its volume's
    root (named `INO-NAME`, as fsck does elsewhere), its damaged blocks dropped
    so that they read as zeros and the store holds no reference to them; what
    was done, a line each. Run after a repair, on a store no daemon uses.

    Snapshot entries that name the same content are left alone: they are the
    snapshots' own (delete those snapshots to clean the store)."""
    done = []
    for name, ino, blocks in damaged:
        view = store.view(name)
        try:
            folder = view.lookup(ROOT_INO, LOST_FOUND)
        except errors.NotFound:
            folder = view.create(ROOT_INO, LOST_FOUND, stat.S_IFDIR | 0o700, 0, 0)
        if not folder.is_dir:
            done.append(f"volume {name!r}: lost+found is not a directory; inode {ino} "
                        "left where it is")
            continue
        was = view.path_of(ino) or f"<inode {ino}>"
        names = view.names_of(ino)
        # lost+found keeps one name (the one already there, on a second run);
        # other hard links would go on serving the zeros under their old names.
        kept = next((n for n in names if n[0] == folder.ino), names[0] if names else None)
        also = []
        for parent, base in names:
            if (parent, base) != kept:
                also.append(_name_in(view, parent, base))
                view.unlink(parent, base)
        if kept is not None and kept[0] != folder.ino:
            parent, base = kept
            view.rename(parent, base, folder.ino, (b"%d-" % ino + base)[:255], noreplace=True)
        freed = []
        with view.txn(write=True) as txn:
            inode = view._get_inode(txn, ino)
            for idx in blocks:
                key = view._key(ino) + _U64.pack(idx)
                raw = txn.get(key, db=view.db["block"])
                if raw is None:
                    continue
                digest = view.content.decref(txn, bytes(raw))
                if digest is not None:
                    freed.append(digest)
                txn.delete(key, db=view.db["block"])
                inode.nblocks = max(0, inode.nblocks - 1)
            view._put_inode(txn, inode)  # the next snapshot records the change
        view._delete_unreferenced(freed)
        now = view.path_of(ino) or was
        line = f"quarantined {was} as {now}: {len(blocks)} damaged block(s) dropped " \
               "(they read as zeros)"
        if also:
            line += f"; its other name(s) removed: {', '.join(also)}"
        done.append(line if len(store.volumes()) == 1 else f"volume {name!r}: {line}")
    return done


def _name_in(view, parent: int, base: bytes) -> str:
    """The path of name `base` in directory `parent` (path_of names the root "")."""
    above = view.path_of(parent)
    name = base.decode(errors="surrogateescape")
    return f"{above}/{name}" if above else name


def _check_upload(store: Store, txn, rep: FsckReport) -> bool:
    """The `upload` table names only referenced chunk files; its counters add up."""
    db = store.db
    if db.get("upload") is None:
        return False
    bad = False
    want = {remotestate.PENDING: [0, 0], remotestate.UPLOADED: [0, 0]}
    for k, v in txn.cursor(db=db["upload"]):
        state, size, _ = remotestate._unpack(v)
        raw = txn.get(bytes(k), db=db["content"])
        if raw is None or unpack_record(raw)[0] == 0 or unpack_record(raw)[2] != LOC_FILE:
            rep.problem(f"pending upload {bytes(k).hex()}: no referenced chunk file")
            bad = True
            continue
        if state in want:
            want[state][0] += 1
            want[state][1] += size
    for state, (n_key, bytes_key) in remotestate._COUNTERS.items():
        for key, value in ((n_key, want[state][0]), (bytes_key, want[state][1])):
            have = _get_u64(txn, db["meta"], key)
            if have != value:
                rep.problem(f"counter {key.decode()} is {have}, want {value}")
                bad = True
    return bad


def _repair_upload(store: Store, rep: FsckReport) -> None:
    db = store.db
    with store.txn(write=True) as txn:
        for k in [bytes(k) for k in txn.cursor(db=db["upload"]).iternext(values=False)]:
            raw = txn.get(k, db=db["content"])
            if raw is None or unpack_record(raw)[0] == 0 or unpack_record(raw)[2] != LOC_FILE:
                txn.delete(k, db=db["upload"])
        totals = {key: 0 for pair in remotestate._COUNTERS.values() for key in pair}
        for _, v in txn.cursor(db=db["upload"]):
            state, size, _ = remotestate._unpack(v)
            if state in remotestate._COUNTERS:
                n_key, bytes_key = remotestate._COUNTERS[state]
                totals[n_key] += 1
                totals[bytes_key] += size
        for key, value in totals.items():
            txn.put(key, _U64.pack(value), db=db["meta"])
    rep.repaired.append("pending-upload table and its counters rewritten")


def _check_names(txn, db, volume: _Volume, rep: FsckReport) -> None:
    vb = _U32.pack(volume.vol)
    inodes = volume.inodes
    cur = txn.cursor(db=db["dentry"])
    n_dentry = 0
    if cur.set_range(vb):
        for k, v in cur:
            if k[:4] != vb:
                break
            n_dentry += 1
            parent, name = _U64.unpack(k[4:12])[0], bytes(k[12:])
            child, cookie = _U64X2.unpack(v)
            for msg in invariants.name_problems(parent, name):
                rep.problem(f"volume {volume.name!r}: {msg}")
            if child not in inodes or parent not in inodes:
                rep.problem(f"volume {volume.name!r}: name {name!r} in dir {parent} points "
                            f"at missing inode {child}")
                volume.dangling.append((parent, name, child, cookie))
                continue
            volume.names[child].append((parent, name))
            if inodes[child].is_dir:
                volume.subdirs[parent] += 1
            dl = txn.get(vb + _U64X2.pack(parent, cookie), db=db["dirlist"])
            if dl is None or _U64.unpack(dl[:8])[0] != child or bytes(dl[8:]) != name:
                rep.problem(f"volume {volume.name!r}: readdir entry missing for {name!r}")
            if txn.get(vb + _U64X2.pack(child, parent) + name, db=db["backlink"]) is None:
                rep.problem(f"volume {volume.name!r}: backlink missing for {name!r}")
    for table in ("dirlist", "backlink"):
        n = 0
        cur = txn.cursor(db=db[table])
        if cur.set_range(vb):
            for k in cur.iternext(values=False):
                if k[:4] != vb:
                    break
                n += 1
        if n != n_dentry:
            rep.problem(f"volume {volume.name!r}: {n_dentry} names but {n} {table} records")
    orphans = set()
    cur = txn.cursor(db=db["orphan"])
    if cur.set_range(vb):
        for k in cur.iternext(values=False):
            if k[:4] != vb:
                break
            orphans.add(_VI.unpack(k)[1])
    for ino, inode in inodes.items():
        want = invariants.expected_nlink(inode, is_root=ino == ROOT_INO,
                                         names=len(volume.names[ino]),
                                         subdirs=volume.subdirs[ino])
        if inode.nlink != want:
            rep.problem(f"volume {volume.name!r}: inode {ino}: link count {inode.nlink}, "
                        f"names found {want}")
            volume.fix_nlink.append((ino, want))
        if ino != ROOT_INO and not volume.names[ino]:
            if ino in orphans:
                rep.problem(f"volume {volume.name!r}: inode {ino}: orphan (no names) left "
                            "by an unclean stop")
            else:
                rep.problem(f"volume {volume.name!r}: inode {ino}: no names and not "
                            "registered as orphan")
    if ROOT_INO not in inodes and not _incomplete(txn, db, volume.vol):
        rep.problem(f"volume {volume.name!r}: root directory missing")


def _check_links(txn, db, volume: _Volume, rep: FsckReport) -> None:
    """Symlinks have targets the kernel would take; nothing else has one."""
    targets: dict[int, bytes] = {}
    vb = _U32.pack(volume.vol)
    cur = txn.cursor(db=db["link"])
    if cur.set_range(vb):
        for k, v in cur:
            if k[:4] != vb:
                break
            targets[_VI.unpack(k)[1]] = bytes(v)
    for ino, inode in volume.inodes.items():
        if inode.is_link or ino in targets:
            for msg in invariants.link_target_problems(inode, targets.get(ino, b"")):
                rep.problem(f"volume {volume.name!r}: {msg}")


def _check_hot(store: Store, txn, volume: _Volume, rep: FsckReport) -> None:
    """Hot blocks: their inodes are indexed, and their hot files exist."""
    vb = _U32.pack(volume.vol)
    indexed = set()
    cur = txn.cursor(db=store.db["hotino"])
    if cur.set_range(vb):
        for k in cur.iternext(values=False):
            if k[:4] != vb:
                break
            indexed.add(_VI.unpack(k)[1])
    if indexed != volume.hot:
        rep.problem(f"volume {volume.name!r}: hot-file index has {len(indexed - volume.hot)} "
                    f"stale and {len(volume.hot - indexed)} missing inodes")
        volume.hot_index_fix = (indexed - volume.hot, volume.hot - indexed)
    for ino in volume.hot:
        if not store.hot.exists(volume.vol, ino):
            rep.problem(f"volume {volume.name!r}: inode {ino} has hot blocks but no hot file")
            path = store.view(volume.name).path_of(ino) or f"<inode {ino}>"
            rep.damaged_files.append(path)


def _incomplete(txn, db, vol: int) -> bool:
    return txn.get(b"v" + _U32.pack(vol) + b":incomplete", db=db["meta"]) is not None


def _check_snapshots(store: Store, txn, volume: _Volume, rep: FsckReport,
                     refs_found: Counter) -> list[tuple[str, bytes, bytes]]:
    """Snapshot invariants of one volume; fixes as (action, table key, value)."""
    db = store.db
    vb = _U32.pack(volume.vol)
    view = store.view(volume.name)
    snaps = Snapshots(view)
    fixes: list[tuple[str, bytes, bytes]] = []
    retained = []
    cur = txn.cursor(db=db["snap"])
    if cur.set_range(vb):
        for k, v in cur:
            if k[:4] != vb:
                break
            try:
                json.loads(bytes(v))
            except ValueError:
                rep.problem(f"volume {volume.name!r}: snapshot record {bytes(k).hex()} "
                            "does not decode")
            retained.append(_U64.unpack(k[4:12])[0])
    # Entries, grouped by object.
    entries: dict[bytes, list[tuple[int, bytes]]] = defaultdict(list)
    cur = txn.cursor(db=db["sver"])
    if cur.set_range(vb):
        for k, v in cur:
            if k[:4] != vb:
                break
            okey = bytes(k[4:-8])
            entries[okey].append((_U64.unpack(k[-8:])[0], bytes(v)))
    gen = set()
    cur = txn.cursor(db=db["sgen"])
    if cur.set_range(vb):
        for k in cur.iternext(values=False):
            if k[:4] != vb:
                break
            gen.add((_U64.unpack(k[4:12])[0], bytes(k[12:])))
    want_gen = set()
    last = _get_u64(txn, db["meta"], b"v" + vb + b":snap_seq")
    leftovers = 0
    for okey, versions in entries.items():
        for i, (seq, value) in enumerate(versions):
            want_gen.add((seq, okey))
            if seq > last == 0:
                # A first snapshot writes its entries in steps and publishes
                # last: a crash meanwhile leaves them, holding references,
                # until the next first snapshot drops them.
                leftovers += 1
                fixes.append(("drop_counted", vb + okey + _U64.pack(seq), value))
            elif seq > last:
                rep.problem(f"volume {volume.name!r}: entry at seq {seq} after the last "
                            f"snapshot {last}")
            try:
                held = entry_refs(okey, value)
            except errors.Corrupt as exc:
                rep.problem(f"volume {volume.name!r}: {exc}")
                continue
            nxt = versions[i + 1][0] if i + 1 < len(versions) else None
            needed = nxt is None or any(seq <= s < nxt for s in retained)
            if not needed:
                rep.problem(f"volume {volume.name!r}: snapshot entry {okey.hex()}@{seq} is "
                            "needed by no snapshot")
                fixes.append(("drop", vb + okey + _U64.pack(seq), value))
                continue
            for ref in held:
                refs_found[ref] += 1
    if leftovers:
        rep.notes.append(f"volume {volume.name!r}: {leftovers} entries of a first snapshot "
                         "that did not finish (a crash during it, or one in progress); the "
                         "next snapshot drops them, `vfsd fsck --repair` does now")
    if gen != want_gen:
        rep.problem(f"volume {volume.name!r}: snapshot change list has "
                    f"{len(gen - want_gen)} stale and {len(want_gen - gen)} missing records")
        fixes.append(("regen", vb, b""))
    if last:
        dirty = set()
        cur = txn.cursor(db=db["sdirty"])
        if cur.set_range(vb):
            for k in cur.iternext(values=False):
                if k[:4] != vb:
                    break
                dirty.add(bytes(k[4:]))
        live_okeys = {okey for _, _, okey in snaps._live_okeys(txn)}
        for okey in live_okeys | set(entries):
            if okey in dirty:
                continue
            newest = entries[okey][-1][1] if entries.get(okey) else b""
            if snaps.live_value(txn, okey) != newest:
                rep.problem(f"volume {volume.name!r}: object {okey.hex()} changed since the "
                            "last snapshot but is not marked")
                fixes.append(("mark", vb + okey, b""))
    return fixes


def _check_content(store: Store, txn, rep: FsckReport, refs_found: Counter, verify: bool,
                   progress: bool, remote=None) -> tuple[set[bytes], int]:
    """Refcounts and presence of content objects; (digests of damaged ones,
    chunks present only in the bucket)."""
    db = store.db
    records = {bytes(k): unpack_record(v) for k, v in txn.cursor(db=db["content"])}
    damaged = set()
    on_disk = set(store.chunks.iter_all())
    remote_url = remotestate.remote_url(store) if db.get("upload") is not None else None
    in_bucket = _bucket_chunks(remote) if remote is not None else None
    remote_only = 0
    by_digest: Counter = Counter()
    for ref, n in refs_found.items():
        by_digest[ref[:16]] += n
    for digest, n in tqdm(by_digest.items(), desc="content", disable=not progress,
                          unit=" objects"):
        rec = records.get(digest)
        if rec is None or rec[0] != n:
            rep.problem(f"content {digest.hex()}: refcount {rec[0] if rec else 'absent'}, "
                        f"references found {n}")
        loc = rec[2] if rec else None
        if loc == LOC_LMDB or (loc is None and txn.get(digest, db=db["blob"]) is not None):
            blob = txn.get(digest, db=db["blob"])
            if blob is None:
                rep.problem(f"inline content {digest.hex()}: missing")
                damaged.add(digest)
            elif verify and xxhash.xxh3_128_digest(bytes(blob)) != digest:
                rep.problem(f"inline content {digest.hex()}: bytes do not match their hash")
                damaged.add(digest)
        elif digest not in on_disk:
            pending = remotestate.entry(txn, db, digest) if remote_url else None
            if remote_url is None:
                rep.problem(f"chunk {digest.hex()}: file missing")
                damaged.add(digest)
            elif pending is not None and pending[0] == remotestate.PENDING:
                rep.problem(f"chunk {digest.hex()}: missing locally before it was uploaded")
                damaged.add(digest)
            elif in_bucket is not None and digest not in in_bucket:
                rep.problem(f"chunk {digest.hex()}: missing locally and in {remote.url}")
                damaged.add(digest)
            else:
                remote_only += 1
                if verify and remote is not None and not _remote_chunk_ok(remote, digest):
                    rep.problem(f"chunk {digest.hex()} in {remote.url} does not match its hash")
                    damaged.add(digest)
        elif verify:
            data = store.chunks.path(digest).read_bytes()
            if chunk_hash(data) != digest:
                rep.problem(f"chunk {digest.hex()}: content does not match its hash")
                damaged.add(digest)
    for ref in refs_found:
        rec = records.get(ref[:16])
        if rec is not None and rec[2] != ref[16]:
            rep.problem(f"content {ref[:16].hex()}: a reference names the wrong location")
    for digest, (count, _size, loc) in records.items():
        if digest not in by_digest and (count or loc == LOC_LMDB):
            rep.problem(f"content {digest.hex()}: refcount {count} but no references")
    cur = txn.cursor(db=db["blob"])
    stray_blobs = sum(1 for k in cur.iternext(values=False) if bytes(k) not in by_digest)
    if stray_blobs:
        rep.problem(f"{stray_blobs} inline object(s) without references")
    stray = [d for d in on_disk if d not in by_digest]
    if stray:
        rep.problem(f"{len(stray)} chunk file(s) without references")
    temps = list(store.chunks.iter_temps())
    if temps:
        rep.problem(f"{len(temps)} leftover temporary chunk file(s)")
    live = {d: records[d] for d in by_digest if d in records}
    for key, want in (
            ("chunk_count", sum(1 for r in live.values() if r[2] == LOC_FILE)),
            ("chunk_bytes", sum(r[1] for r in live.values() if r[2] == LOC_FILE)),
            ("blob_count", sum(1 for r in live.values() if r[2] == LOC_LMDB)),
            ("blob_bytes", sum(r[1] for r in live.values() if r[2] == LOC_LMDB))):
        have = _get_u64(txn, db["meta"], key.encode())
        if have != want:
            rep.problem(f"counter {key} is {have}, want {want}")
    return damaged, remote_only


def _bucket_chunks(remote) -> set[bytes]:
    from vfsd.remote.layout import CHUNKS_DIR, digest_of_chunk_key

    out = set()
    for info in remote.list(CHUNKS_DIR + "/"):
        digest = digest_of_chunk_key(info.key)
        if digest is not None:
            out.add(digest)
    return out


def _remote_chunk_ok(remote, digest: bytes) -> bool:
    from vfsd.remote.layout import chunk_key

    try:
        data = remote.get(chunk_key(digest), max_bytes=64 << 20).data
    except Exception:  # noqa: BLE001 - unreadable counts as damaged
        return False
    return chunk_hash(data) == digest


def _check_indexes(store: Store, txn, vols: dict[str, _Volume], rep: FsckReport):
    db = store.db
    want_index: dict[str, set[bytes]] = {"bystep": set(), "agestep": set(), "donestep": set()}
    counters: dict[int, Counter] = defaultdict(Counter)
    for volume in vols.values():
        c = counters[volume.vol]
        for inode in volume.inodes.values():
            if inode.is_reg and inode.nlink > 0:
                for name, key in store._index_keys(inode):
                    want_index[name].add(key)
                c["files"] += 1
                c["logical_bytes"] += inode.size
                if inode.inline:
                    c["inline_bytes"] += inode.size
            elif inode.is_reg:
                c["orphan_bytes"] += inode.size
            if inode.is_reg and inode.nblocks != volume.block_count[inode.ino]:
                rep.problem(f"volume {volume.name!r}: inode {inode.ino}: block count "
                            f"{inode.nblocks}, found {volume.block_count[inode.ino]}")
        cur = txn.cursor(db=db["xattr"])
        vb = _U32.pack(volume.vol)
        attrs: dict[int, list[tuple[bytes, int]]] = defaultdict(list)
        if cur.set_range(vb):
            for k, v in cur:
                if k[:4] != vb:
                    break
                ino = _VI.unpack(k[:12])[1]
                attrs[ino].append((bytes(k[12:]), len(v)))
                owner = volume.inodes.get(ino)
                if owner is not None:  # an orphan's count as its own until it is freed
                    c["xattr_bytes" if owner.nlink > 0 else "orphan_bytes"] += len(k) - 12 + len(v)
        for ino, pairs in attrs.items():
            for msg in invariants.xattr_problems(ino, pairs):
                rep.problem(f"volume {volume.name!r}: {msg}")
    index_bad = False
    for name, want in want_index.items():
        have = {bytes(k) for k in txn.cursor(db=db[name]).iternext(values=False)}
        if have != want:
            index_bad = True
            rep.problem(f"index {name}: {len(have - want)} stale, {len(want - have)} missing")
    counter_bad = []
    for volume in vols.values():
        vp = b"v" + _U32.pack(volume.vol) + b":"
        for key in ("files", "logical_bytes", "inline_bytes", "xattr_bytes", "orphan_bytes"):
            have = _get_u64(txn, db["meta"], vp + key.encode())
            want = counters[volume.vol][key]
            if have != want:
                rep.problem(f"volume {volume.name!r}: counter {key} is {have}, want {want}")
                counter_bad.append((vp + key.encode(), want))
    return (want_index if index_bad else None), counter_bad


def _repair(store: Store, vols: dict[str, _Volume], rep: FsckReport, refs_found: Counter,
            index_fix, counter_fix, snap_fixes) -> None:
    db = store.db
    with store.txn(write=True) as txn:
        for volume in vols.values():
            vb = _U32.pack(volume.vol)
            for parent, name, child, cookie in volume.dangling:
                txn.delete(vb + _U64.pack(parent) + name, db=db["dentry"])
                txn.delete(vb + _U64X2.pack(parent, cookie), db=db["dirlist"])
                txn.delete(vb + _U64X2.pack(child, parent) + name, db=db["backlink"])
                rep.repaired.append(f"dropped dangling name {name!r}")
            for ino, want in volume.fix_nlink:
                inode = volume.inodes[ino]
                inode.nlink = want
                txn.put(_VI.pack(volume.vol, ino), inode.pack(), db=db["inode"])
                rep.repaired.append(f"volume {volume.name!r}: inode {ino}: link count set "
                                    f"to {want}")
            for ino in volume.inodes:
                if ino != ROOT_INO and not volume.names[ino]:
                    txn.put(_VI.pack(volume.vol, ino), b"", db=db["orphan"])
            for ino, inode in volume.inodes.items():
                if inode.is_reg and inode.nblocks != volume.block_count[ino]:
                    inode.nblocks = volume.block_count[ino]
                    txn.put(_VI.pack(volume.vol, ino), inode.pack(), db=db["inode"])
            if volume.hot_index_fix is not None:
                stale, missing = volume.hot_index_fix
                for ino in stale:
                    txn.delete(_VI.pack(volume.vol, ino), db=db["hotino"])
                for ino in missing:
                    txn.put(_VI.pack(volume.vol, ino), b"", db=db["hotino"])
                rep.repaired.append(f"volume {volume.name!r}: hot-file index rebuilt")
        dropped_leftovers = 0
        for action, key, value in snap_fixes:
            if action == "drop":
                # Its references were left out of `refs_found` when it was found.
                txn.delete(key, db=db["sver"])
                rep.repaired.append("dropped a snapshot entry no snapshot needs")
            elif action == "drop_counted":
                for ref in entry_refs(key[4:-8], value):
                    refs_found[ref] -= 1
                txn.delete(key, db=db["sver"])
                dropped_leftovers += 1
            elif action == "mark":
                txn.put(key, b"", db=db["sdirty"])
                rep.repaired.append("marked an unrecorded change for the next snapshot")
        if dropped_leftovers:
            rep.repaired.append(f"dropped {dropped_leftovers} entries of an unfinished first "
                                "snapshot")
        for vb in {key[:4] for action, key, _ in snap_fixes
                   if action in ("regen", "drop", "drop_counted")}:
            _rebuild_sgen(txn, db, vb)
        if any(a == "regen" for a, _, _ in snap_fixes):
            rep.repaired.append("snapshot change lists rebuilt")
        records = {bytes(k): unpack_record(v) for k, v in txn.cursor(db=db["content"])}
        by_digest: Counter = Counter()
        loc_of = {}
        for ref, n in refs_found.items():
            by_digest[ref[:16]] += n
            loc_of[ref[:16]] = ref[16]
        for digest, n in by_digest.items():
            rec = records.get(digest)
            if n <= 0:
                continue
            if rec is None:
                size = len(txn.get(digest, db=db["blob"]) or b"")
                if loc_of[digest] == LOC_FILE:
                    try:
                        size = store.chunks.path(digest).stat().st_size
                    except FileNotFoundError:
                        size = 0
                txn.put(digest, pack_record(n, size, loc_of[digest]), db=db["content"])
            elif rec[0] != n:
                txn.put(digest, pack_record(n, rec[1], rec[2]), db=db["content"])
        for digest in records:
            if by_digest.get(digest, 0) <= 0:
                txn.delete(digest, db=db["content"])
                txn.delete(digest, db=db["blob"])
        for k in list(txn.cursor(db=db["blob"]).iternext(values=False)):
            if by_digest.get(bytes(k), 0) <= 0:
                txn.delete(bytes(k), db=db["blob"])
        if index_fix is not None:
            for name, want in index_fix.items():
                txn.drop(db[name], delete=False)
                for key in want:
                    txn.put(key, b"", db=db[name])
            rep.repaired.append("step indexes rebuilt")
        for key, want in counter_fix:
            txn.put(key, _U64.pack(want), db=db["meta"])
        live = [unpack_record(v) for k, v in txn.cursor(db=db["content"])]
        for key, want in (
                (b"chunk_count", sum(1 for r in live if r[2] == LOC_FILE and r[0])),
                (b"chunk_bytes", sum(r[1] for r in live if r[2] == LOC_FILE and r[0])),
                (b"blob_count", sum(1 for r in live if r[2] == LOC_LMDB)),
                (b"blob_bytes", sum(r[1] for r in live if r[2] == LOC_LMDB))):
            txn.put(key, _U64.pack(want), db=db["meta"])
        if counter_fix:
            rep.repaired.append("counters rewritten")
    # Orphans: nothing can reach them with no daemon running.
    for volume in vols.values():
        view = store.view(volume.name)
        for ino in view.orphans():
            view.free_inode(ino)
            rep.repaired.append(f"volume {volume.name!r}: freed orphan inode {ino}")
    gc = store.gc_chunks(min_temp_age_s=0)
    if gc["chunks_removed"] or gc["temps_removed"]:
        rep.repaired.append(f"removed {gc['chunks_removed']} stray chunk file(s) and "
                            f"{gc['temps_removed']} temporary file(s)")


def _rebuild_sgen(txn, db, vb: bytes) -> None:
    cur = txn.cursor(db=db["sgen"])
    if cur.set_range(vb):
        while cur.key()[:4] == vb:
            if not cur.delete() or not cur.key():
                break
    cur = txn.cursor(db=db["sver"])
    if cur.set_range(vb):
        for k in list(cur.iternext(values=False)):
            k = bytes(k)
            if k[:4] != vb:
                break
            okey = k[4:-8]
            assert okey_len(k, 4) == len(okey)
            txn.put(vb + k[-8:] + okey, b"", db=db["sgen"])
