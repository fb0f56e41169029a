"""Restore some paths of a snapshot into the live tree, leaving the rest alone.

A whole-tree restore (`Snapshots.restore`) makes the live tree exactly a
snapshot; bringing back one evicted file (`unevict`) or one directory
(`restore SNAPSHOT PATH...`) must not undo everything else done since. Here
each requested path is found in its snapshot (by name, entry by entry) and
its subtree is placed at the same path of the live tree, in one transaction:

- a missing live directory on the way is made from the snapshot's;
- a live directory where the snapshot has one is merged into: what the
  snapshot holds below it is placed, what only the live tree has stays;
- a live file equal to the snapshot's is left as it is; any other live
  entry in the way refuses the whole request (TargetExists, nothing
  changed) unless `force`, which replaces files and symlinks (never a
  directory: remove it first);
- an inode keeps its number and generation when nothing live uses them (so
  a FileRef to an evicted file resolves again), else it becomes a new inode
  sharing the same content.

Restored files are stamped with the current step, so their age starts again
and eviction treats them as any file written now; their eviction records say
`restored_step` from then on.
"""

from __future__ import annotations

import struct

from vfsd import errors
from vfsd.store.keys import now_ns
from vfsd.store.store import ROOT_INO

from .snapshots import (
    SnapshotError,
    SnapshotNotFound,
    pack_inode_entry,
    snapshot_id,
    unpack_inode_entry,
)

_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
#: objects one request may place (a restore commits in one transaction)
MAX_OBJECTS = 200_000


class TargetExists(SnapshotError):
    """A live entry is in the way of a path restore (nothing was changed)."""

    code = "exists"
    errno = 17  # EEXIST


class PathNotInSnapshot(SnapshotNotFound):
    """The snapshot has no such path."""


def split_path(path: str) -> list[str]:
    """The names of a mount-relative path; SnapshotError if it leaves the tree."""
    if not isinstance(path, str) or "\0" in path:
        raise SnapshotError(f"{path!r} is not a path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SnapshotError(f"path {path!r} leaves the mount ('..' is not allowed)")
    if not parts:
        raise SnapshotError("the root is not a path to restore: restore the whole snapshot "
                            "(`vfsd restore RUN SNAPSHOT` without paths)")
    return parts


class PathRestore:
    """One path-restore request against `snaps` (a `Snapshots`), in `txn`."""

    def __init__(self, snaps, txn, *, force: bool, step: int) -> None:
        self.snaps = snaps
        self.st = snaps.store
        self.txn = txn
        self.force = force
        self.step = step
        self.t = now_ns()
        self.placed = 0
        self.restored: list[str] = []  # paths of the regular files placed
        self.unchanged: list[str] = []
        self.dentries: list[tuple[int, bytes]] = []  # names to drop from the kernel's cache
        self.inodes: list[int] = []  # inodes whose content changed in place
        self.unlinked: list[int] = []
        self.freed: list[bytes] = []

    # ------------------------------------------------------------ finding

    def find(self, seq: int, path: str) -> int:
        """The inode at `path` in snapshot `seq`."""
        ino = ROOT_INO
        for name in split_path(path):
            ino = self.snaps.lookup_in(self.txn, seq, ino, name.encode(errors="surrogateescape"))
            if ino is None:
                raise PathNotInSnapshot(f"snapshot {snapshot_id(seq)} has no {path!r}")
        return ino

    def check(self, seq: int, src: str, target: str) -> None:
        """Refuse (TargetExists, PathNotInSnapshot) what `restore(seq, src,
        target)` would refuse for a file or link, changing nothing: for
        requests done in several transactions (`restore_paths_in_steps`)."""
        ino = self.find(seq, src)
        entry = self.snaps._inode_at(self.txn, seq, ino)
        if entry is None:
            raise PathNotInSnapshot(f"snapshot {snapshot_id(seq)} has no {target!r}")
        names = split_path(target)
        live = ROOT_INO
        for i, name in enumerate(names[:-1]):
            child = self._live_child(live, name.encode(errors="surrogateescape"))
            if child is None:
                return  # made from the snapshot's directories: nothing in the way below
            if not child.is_dir:
                raise TargetExists(f"{'/'.join(names[:i + 1])!r} is not a directory "
                                   "in the live tree: nothing can be restored below it")
            live = child.ino
        child = self._live_child(live, names[-1].encode(errors="surrogateescape"))
        if child is None or (child.ino == ino and self._same(ino, entry)):
            return
        if child.is_dir and entry.inode.is_dir:
            return  # merged into, file by file (see `_place`)
        if not self.force:
            raise TargetExists(f"{target!r} exists in the live tree (not as snapshot "
                               f"{snapshot_id(seq)} has it): --force (force=true) replaces it")
        if child.is_dir:
            raise TargetExists(f"{target!r} is a directory in the live tree and a "
                               f"{'file' if entry.inode.is_reg else 'link'} in snapshot "
                               f"{snapshot_id(seq)}: remove the directory first")

    def _live_child(self, parent: int, name: bytes):
        raw = self.txn.get(self.st._key(parent) + name, db=self.st.db["dentry"])
        return self.st._get_inode(self.txn, _U64X2.unpack(raw)[0]) if raw is not None else None

    def _ino_free(self, ino: int) -> bool:
        """True if no live name uses inode `ino` (absent, or an orphan)."""
        raw = self.txn.get(self.st._key(ino), db=self.st.db["inode"])
        if raw is None:
            return True
        return self.st._get_inode(self.txn, ino).nlink == 0

    # ------------------------------------------------------------ placing

    def restore(self, seq: int, src: str, target: str) -> None:
        """Place snapshot `seq`'s `src` (and what lies below it) at live `target`."""
        ino = self.find(seq, src)
        names = split_path(target)
        parent = self._live_parent(seq, names[:-1])
        self._place(seq, ino, parent, names[-1].encode(errors="surrogateescape"), target)

    def _live_parent(self, seq: int, names: list[str]) -> int:
        """The live directory at `names`, made from the snapshot's where missing."""
        live = ROOT_INO
        snap: int | None = ROOT_INO
        for i, name in enumerate(names):
            bname = name.encode(errors="surrogateescape")
            if snap is not None:
                snap = self.snaps.lookup_in(self.txn, seq, snap, bname)
            child = self._live_child(live, bname)
            if child is not None:
                if not child.is_dir:
                    raise TargetExists(f"{'/'.join(names[:i + 1])!r} is not a directory "
                                       "in the live tree: nothing can be restored below it")
                live = child.ino
                continue
            if snap is None:
                raise PathNotInSnapshot(f"the directory {'/'.join(names[:i + 1])!r} is in "
                                        f"neither the live tree nor snapshot {snapshot_id(seq)}")
            live = self._put(seq, snap, live, bname, directory=True)
        return live

    def _place(self, seq: int, ino: int, parent: int, name: bytes, path: str) -> None:
        entry = self.snaps._inode_at(self.txn, seq, ino)
        if entry is None:
            raise PathNotInSnapshot(f"snapshot {snapshot_id(seq)} has no {path!r}")
        live = self._live_child(parent, name)
        if live is not None:
            if live.is_dir and entry.inode.is_dir:
                for cname, child in self.snaps.readdir_in(self.txn, seq, ino):
                    self._place(seq, child, live.ino, cname,
                                f"{path}/{cname.decode(errors='surrogateescape')}")
                return
            if live.ino == ino and self._same(ino, entry):
                self.unchanged.append(path)
                return
            if not self.force:
                raise TargetExists(f"{path!r} exists in the live tree (not as snapshot "
                                   f"{snapshot_id(seq)} has it): --force (force=true) "
                                   "replaces it")
            if live.ino == ino and not live.is_dir:
                self._in_place(seq, ino, live, path)
                return
            if live.is_dir:
                raise TargetExists(f"{path!r} is a directory in the live tree and a "
                                   f"{'file' if entry.inode.is_reg else 'link'} in snapshot "
                                   f"{snapshot_id(seq)}: remove the directory first")
            self._drop(parent, name, live)
        new = self._put(seq, ino, parent, name, directory=entry.inode.is_dir)
        if entry.inode.is_dir:
            for cname, child in self.snaps.readdir_in(self.txn, seq, ino):
                self._place(seq, child, new, cname,
                            f"{path}/{cname.decode(errors='surrogateescape')}")
        elif entry.inode.is_reg:
            self.restored.append(path)

    def _same(self, ino: int, entry) -> bool:
        """Whether live inode `ino` holds what `entry` does (content, type,
        owner, mode, link target, xattrs; not times or step)."""
        now = self.snaps.live_value(self.txn, b"i" + _U64.pack(ino))
        if not now:
            return False
        cur = unpack_inode_entry(ino, now)
        a, b = cur.inode, entry.inode
        return ((a.mode, a.uid, a.gid, a.size) == (b.mode, b.uid, b.gid, b.size)
                and cur.blocks == entry.blocks and cur.target == entry.target
                and cur.xattrs == entry.xattrs)

    def _in_place(self, seq: int, ino: int, live, path: str) -> None:
        """--force over the same inode changed since: its content and attributes
        become the snapshot's, its names stay."""
        entry = self.snaps._inode_at(self.txn, seq, ino)
        entry.inode.nlink = live.nlink
        entry.inode.step = self.step
        entry.inode.ctime_ns = self.t
        self.freed += self.snaps._set_live_inode(self.txn, ino, pack_inode_entry(entry), [])
        self.inodes.append(ino)
        self.dentries.extend(self.st._names_of(self.txn, ino))
        if entry.inode.is_reg:
            self.restored.append(path)

    def _drop(self, parent: int, name: bytes, live) -> None:
        """--force: the live file or symlink in the way loses this name."""
        st, txn = self.st, self.txn
        p = st._get_inode(txn, parent)
        child = st._drop_name(txn, p, name, self.t, expect_dir=False)
        st._touch_dir(txn, p, self.t)
        if child.is_reg and child.nlink == 0:
            st._log_removed(txn, child, parent, name, "restore")
            self.unlinked.append(child.ino)
        self.dentries.append((parent, name))

    def _put(self, seq: int, ino: int, parent: int, name: bytes, *, directory: bool) -> int:
        """Make the snapshot's inode `ino` live under (parent, name); its live number."""
        self.placed += 1
        if self.placed > MAX_OBJECTS:
            raise SnapshotError(f"more than {MAX_OBJECTS} objects to restore in one request: "
                                "restore smaller subtrees")
        st, txn = self.st, self.txn
        entry = self.snaps._inode_at(txn, seq, ino)
        live_ino = ino if self._ino_free(ino) else st._alloc_ino(txn)
        entry.inode.ino = live_ino
        entry.inode.nlink = 2 if directory else 1
        entry.inode.step = self.step  # its age starts again now
        entry.inode.ctime_ns = self.t
        entry.parent, entry.name = parent, name
        if directory:
            entry.blocks = {}
        # A new inode number shares the content: `_set_live_inode` takes its references.
        self.freed += self.snaps._set_live_inode(txn, live_ino, pack_inode_entry(entry), [])
        st._add_entry(txn, parent, name, live_ino)
        st._touch_dir(txn, st._get_inode(txn, parent), self.t, 1 if directory else 0)
        self.dentries.append((parent, name))
        if entry.inode.is_reg and live_ino == ino:
            st.logs.mark_restored(txn, ino, entry.inode.gen, self.step, snapshot_id(seq))
        return live_ino


def restore_paths(snaps, items: list[tuple[int, str, str]], *, force: bool = False) -> dict:
    """Place each (seq, path in that snapshot, live target path) of `items`, in
    one transaction: all of them or, on any error, none.

    Returns what the caller tells the kernel and the open files: {"restored":
    [paths of the files placed], "unchanged": [...], "dentries": [(parent,
    name)], "inodes": [...], "unlinked": [...]}. The caller has committed every
    buffered write and settled hot blocks first.
    """
    st = snaps.store
    snaps.hot_reset = []  # hot files whose content `_set_live_inode` replaced
    with st.txn(write=True) as txn, st.batched_counters(txn):
        job = PathRestore(snaps, txn, force=force, step=st._step(txn))
        for seq, src, target in items:
            snaps._get(txn, seq)  # deleted meanwhile: a clear error
            try:
                job.restore(seq, src, target)
            except errors.NotFound as exc:
                raise PathNotInSnapshot(f"{target!r}: {exc}") from None
    st._delete_unreferenced(job.freed)
    for ino in snaps.hot_reset:
        st.hot.delete(st.vol, ino)
    return {"restored": sorted(job.restored), "unchanged": sorted(job.unchanged), "dentries": job.dentries,
            "inodes": job.inodes, "unlinked": job.unlinked}


def restore_paths_in_steps(snaps, items: list[tuple[int, str, str]], *, force: bool = False,
                           batch: int = 32):
    """`restore_paths` for many items (an unevict of thousands of files), in
    short transactions: every item is checked first (`PathRestore.check`,
    read only), so a refusal changes nothing; then `batch` items per
    transaction (a generator, see `vfsd.steps`; the caller holds the volume).
    A daemon stopped half way leaves the items placed so far, each whole."""
    st = snaps.store
    for i in range(0, len(items), 256):
        # A read transaction per batch: none may be held across a yield (with
        # group commit on, a read on the loop shares the group's, which the
        # loop commits meanwhile).
        with st.txn() as txn:
            job = PathRestore(snaps, txn, force=force, step=st._step(txn))
            for seq, src, target in items[i:i + 256]:
                snaps._get(txn, seq)
                try:
                    job.check(seq, src, target)
                except errors.NotFound as exc:
                    raise PathNotInSnapshot(f"{target!r}: {exc}") from None
        yield
    out = {"restored": [], "unchanged": [], "dentries": [], "inodes": [], "unlinked": []}
    for i in range(0, len(items), batch):
        res = restore_paths(snaps, items[i:i + batch], force=force)
        for key in out:
            out[key].extend(res[key])
        yield
    out["restored"].sort()
    out["unchanged"].sort()
    return out
