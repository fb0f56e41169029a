"""`vfsd fsck`: check every invariant of a store, and repair what can be repaired.

Part of the storage layer (it reads the LMDB layout documented in `store`).
It runs with no daemon on the store: it takes every volume's lock first.

Checked: inode records decode; every name points at a live inode and the three
name databases agree; link counts; every block names a chunk whose record has
references and whose file exists (and, with `verify`, hashes right); refcounts
equal the references found; no chunk file or temporary without a record; no
orphan inode; the step indexes and counters match the inodes.

Repaired (`repair=True`): orphans freed, stray chunk files and temporaries
deleted, refcounts, indexes and counters rewritten, dangling names dropped.
Content that is gone (a missing or altered chunk) cannot come back: such files
are reported, and reading the damaged range keeps failing with EIO.
"""

from __future__ import annotations

import struct
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tqdm import tqdm

from .chunks import chunk_hash
from .inode import Inode
from .rundir import lock_volume
from .store import _REF, _U64, _U64X2, Store, _get_u64


@dataclass
class FsckReport:
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    damaged_files: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.problems

    def problem(self, msg: str) -> None:
        self.problems.append(msg)

    def as_dict(self) -> dict:
        return {"clean": self.clean, "problems": self.problems, "repaired": self.repaired,
                "damaged_files": self.damaged_files, "stats": self.stats}


def volumes(store: Store) -> dict[str, tuple[int, int]]:
    out = {}
    with store.env.begin() as txn:
        for k, v in txn.cursor(db=store.db["volume"]):
            out[bytes(k).decode()] = struct.unpack(">IQ", v)
    return out


def lock_all(store: Store) -> list[int]:
    """Every volume's lock; StoreLocked if a daemon holds one."""
    return [lock_volume(store.dir, name) for name in volumes(store)]


def fsck(store: Store, *, repair: bool = False, verify: bool = False,
         progress: bool = False) -> FsckReport:
    rep = FsckReport()
    db = store.db
    vols = volumes(store)
    roots = {root for _, root in vols.values()}
    with store.env.begin() as txn:
        inodes: dict[int, Inode] = {}
        bad_inodes = []
        for k, v in tqdm(txn.cursor(db=db["inode"]), desc="inodes", disable=not progress,
                         unit=" inodes"):
            ino = _U64.unpack(k)[0]
            try:
                inodes[ino] = Inode.unpack(ino, v)
            except struct.error:
                bad_inodes.append(ino)
        for ino in bad_inodes:
            rep.problem(f"inode {ino}: record does not decode")

        # Names: dentry, dirlist and backlink must agree.
        names = defaultdict(list)  # child -> [(parent, name)]
        subdirs = Counter()
        dangling = []
        for k, v in txn.cursor(db=db["dentry"]):
            parent, name = _U64.unpack(k[:8])[0], bytes(k[8:])
            child, cookie = _U64X2.unpack(v)
            if child not in inodes or parent not in inodes:
                rep.problem(f"name {name!r} in dir {parent} points at missing inode {child}")
                dangling.append((parent, name, child, cookie))
                continue
            names[child].append((parent, name))
            if inodes[child].is_dir:
                subdirs[parent] += 1
            dl = txn.get(_U64X2.pack(parent, cookie), db=db["dirlist"])
            if dl is None or _U64.unpack(dl[:8])[0] != child or bytes(dl[8:]) != name:
                rep.problem(f"readdir entry missing for {name!r} in dir {parent}")
            if txn.get(_U64X2.pack(child, parent) + name, db=db["backlink"]) is None:
                rep.problem(f"backlink missing for {name!r} in dir {parent}")
        n_dirlist = txn.stat(db["dirlist"])["entries"]
        n_dentry = txn.stat(db["dentry"])["entries"]
        n_backlink = txn.stat(db["backlink"])["entries"]
        if not (n_dirlist == n_dentry == n_backlink):
            rep.problem(f"name databases disagree: {n_dentry} names, {n_dirlist} readdir "
                        f"entries, {n_backlink} backlinks")

        orphans = {_U64.unpack(k)[0] for k in txn.cursor(db=db["orphan"]).iternext(values=False)}
        fix_nlink = []
        for ino, inode in inodes.items():
            if ino in roots:
                continue
            want = (2 + subdirs[ino]) if inode.is_dir and names[ino] else len(names[ino])
            if inode.is_dir and not names[ino]:
                want = 0
            if inode.nlink != want:
                rep.problem(f"inode {ino}: link count {inode.nlink}, names found {want}")
                fix_nlink.append((ino, want))
            if not names[ino]:
                if ino in orphans:
                    rep.problem(f"inode {ino}: orphan (no names) left by an unclean stop")
                else:
                    rep.problem(f"inode {ino}: no names and not registered as orphan")
        for ino in roots:
            inode = inodes.get(ino)
            if inode is not None and inode.nlink != 2 + subdirs[ino]:
                rep.problem(f"root {ino}: link count {inode.nlink}, want {2 + subdirs[ino]}")
                fix_nlink.append((ino, 2 + subdirs[ino]))

        # Blocks and chunks.
        refs_found: Counter = Counter()
        sizes: dict[bytes, int] = {}
        block_count = Counter()
        bad_blocks = []
        for k, v in tqdm(txn.cursor(db=db["block"]), desc="blocks", disable=not progress,
                         unit=" blocks"):
            ino = _U64.unpack(k[:8])[0]
            digest = bytes(v)
            if ino not in inodes:
                rep.problem(f"block of missing inode {ino}")
                bad_blocks.append(bytes(k))
                continue
            refs_found[digest] += 1
            block_count[ino] += 1
        records = {bytes(k): _REF.unpack(v) for k, v in txn.cursor(db=db["chunkref"])}
        damaged_chunks = set()
        on_disk = set(store.chunks.iter_all())
        for digest, n in tqdm(refs_found.items(), desc="chunks", disable=not progress,
                              unit=" chunks"):
            rec = records.get(digest)
            if rec is None or rec[0] != n:
                rep.problem(f"chunk {digest.hex()}: refcount {rec[0] if rec else 'absent'}, "
                            f"references found {n}")
            if digest not in on_disk:
                rep.problem(f"chunk {digest.hex()}: file missing")
                damaged_chunks.add(digest)
            elif verify:
                data = store.chunks.path(digest).read_bytes()
                sizes[digest] = len(data)
                if chunk_hash(data) != digest:
                    rep.problem(f"chunk {digest.hex()}: content does not match its hash")
                    damaged_chunks.add(digest)
        for digest, (count, _size) in records.items():
            if digest not in refs_found and count:
                rep.problem(f"chunk {digest.hex()}: refcount {count} but no references")
        stray = [d for d in on_disk if d not in refs_found]
        if stray:
            rep.problem(f"{len(stray)} chunk file(s) without references")
        temps = list(store.chunks.iter_temps())
        if temps:
            rep.problem(f"{len(temps)} leftover temporary chunk file(s)")
        if damaged_chunks:
            for k, v in txn.cursor(db=db["block"]):
                if bytes(v) in damaged_chunks:
                    ino = _U64.unpack(k[:8])[0]
                    path = _path(store, txn, ino) or f"<inode {ino}>"
                    if path not in rep.damaged_files:
                        rep.damaged_files.append(path)
        for ino, inode in inodes.items():
            if inode.is_reg and not inode.inline and inode.nblocks != block_count[ino]:
                rep.problem(f"inode {ino}: block count {inode.nblocks}, found {block_count[ino]}")

        # Indexes and counters per volume.
        want_index: dict[str, set[bytes]] = {"bystep": set(), "agestep": set(), "donestep": set()}
        counters: dict[int, Counter] = defaultdict(Counter)
        for inode in inodes.values():
            if inode.is_reg and inode.nlink > 0:
                for name, key in store._index_keys(inode):
                    want_index[name].add(key)
                c = counters[inode.vol]
                c["files"] += 1
                c["logical_bytes"] += inode.size
                if inode.inline:
                    c["inline_bytes"] += inode.size
        index_bad = False
        for name, want in want_index.items():
            have = {bytes(k) for k in txn.cursor(db=db[name]).iternext(values=False)}
            if have != want:
                index_bad = True
                rep.problem(f"index {name}: {len(have - want)} stale, {len(want - have)} missing")
        counter_bad = []
        for _name, (vol, _root) in vols.items():
            vp = b"v" + struct.pack(">I", vol) + b":"
            for key in ("files", "logical_bytes", "inline_bytes"):
                have = _get_u64(txn, db["meta"], vp + key.encode())
                if have != counters[vol][key]:
                    rep.problem(f"volume {vol}: counter {key} is {have}, want {counters[vol][key]}")
                    counter_bad.append((vp + key.encode(), counters[vol][key]))
        live = {d: records.get(d, (0, 0))[1] for d in refs_found}
        for key, want in (("chunk_count", len(live)), ("chunk_bytes", sum(live.values()))):
            have = _get_u64(txn, db["meta"], key.encode())
            if have != want:
                rep.problem(f"counter {key} is {have}, want {want}")
                counter_bad.append((key.encode(), want))
        rep.stats = {"inodes": len(inodes), "chunks_referenced": len(refs_found),
                     "chunk_files": len(on_disk), "volumes": len(vols)}

    if not repair or rep.clean:
        return rep

    with store.env.begin(write=True) as txn:
        for parent, name, child, cookie in dangling:
            txn.delete(_U64.pack(parent) + name, db=db["dentry"])
            txn.delete(_U64X2.pack(parent, cookie), db=db["dirlist"])
            txn.delete(_U64X2.pack(child, parent) + name, db=db["backlink"])
            rep.repaired.append(f"dropped dangling name {name!r}")
        for ino, want in fix_nlink:
            inode = inodes[ino]
            inode.nlink = want
            txn.put(_U64.pack(ino), inode.pack(), db=db["inode"])
            if want == 0:
                txn.put(_U64.pack(ino), b"", db=db["orphan"])
            rep.repaired.append(f"inode {ino}: link count set to {want}")
        for ino in inodes:
            if not names[ino] and ino not in roots:
                txn.put(_U64.pack(ino), b"", db=db["orphan"])
        for key in bad_blocks:
            txn.delete(key, db=db["block"])
        for digest, n in refs_found.items():
            size = records.get(digest, (0, sizes.get(digest, 0)))[1]
            txn.put(digest, _REF.pack(n, size), db=db["chunkref"])
        for digest in records:
            if digest not in refs_found:
                txn.delete(digest, db=db["chunkref"])
        for ino, inode in inodes.items():
            if inode.is_reg and not inode.inline and inode.nblocks != block_count[ino]:
                inode.nblocks = block_count[ino]
                txn.put(_U64.pack(ino), inode.pack(), db=db["inode"])
        if index_bad:
            for name, want in want_index.items():
                txn.drop(db[name], delete=False)
                for key in want:
                    txn.put(key, b"", db=db[name])
            rep.repaired.append("step indexes rebuilt")
        for key, want in counter_bad:
            txn.put(key, _U64.pack(want), db=db["meta"])
        if counter_bad:
            rep.repaired.append("counters rewritten")
    # Orphans: nothing can reach them with no daemon running.
    for ino in store.orphans():
        store.free_inode(ino)
        rep.repaired.append(f"freed orphan inode {ino}")
    gc = store.gc_chunks(min_temp_age_s=0)
    if gc["chunks_removed"] or gc["temps_removed"]:
        rep.repaired.append(f"removed {gc['chunks_removed']} stray chunk file(s) and "
                            f"{gc['temps_removed']} temporary file(s)")
    return rep


def _path(store: Store, txn, ino: int) -> str | None:
    return store._path_in(txn, ino)

