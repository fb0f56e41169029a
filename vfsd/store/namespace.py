"""Names of a volume: create, link, unlink, rename, readdir, paths, and the
removal of every name of evicted files.

A mixin of `store.Store`: its methods run inside the store's transactions and
use the `dentry`, `dirlist` and `backlink` databases whose layout `store`
documents. Every name change marks the directory entry and the child inode
for the next snapshot (`Store._mark`).
"""

from __future__ import annotations

import random
import stat
import struct

from vfsd import errors

from .inode import NO_CALL, Inode
from .keys import dentry_key, inode_key, now_ns

MAX_NAME = 255
#: A symlink target, as the kernel takes it (PATH_MAX without its NUL).
MAX_LINK_TARGET = 4095
#: generation numbers tell inode versions apart; they need no secrecy, and
#: the system's random source costs a system call per file
_generations = random.Random()

_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")


def _u64(n: int) -> bytes:
    return _U64.pack(n)



def valid_link_target(target: bytes) -> bool:
    return 0 < len(target) <= MAX_LINK_TARGET and b"\0" not in target

class NamespaceMixin:
    """The namespace half of `Store` (see `store` for the layout)."""

    @staticmethod
    def _check_name(name: bytes) -> None:
        if len(name) > MAX_NAME:
            raise errors.NameTooLong(f"a name is longer than {MAX_NAME} bytes")
        if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
            raise errors.InvalidArgument(f"bad name {name!r}")

    def lookup(self, parent: int, name: bytes) -> Inode:
        if len(name) > MAX_NAME:
            raise errors.NameTooLong(f"a name is longer than {MAX_NAME} bytes")
        return self._read(self._lookup_in, parent, name)

    def _lookup_in(self, txn, parent: int, name: bytes) -> Inode:
        raw = txn.get(self._key(parent) + name, db=self.db["dentry"])
        if raw is None:
            raise errors.NotFound(name.decode(errors="replace"))
        return self._get_inode(txn, _U64X2.unpack(raw)[0])

    def _add_entry(self, txn, parent: int, name: bytes, child: int) -> None:
        cookie = self._alloc_cookie(txn)
        vb = self._vb
        txn.put(self._key(parent) + name, _U64X2.pack(child, cookie), db=self.db["dentry"])
        txn.put(vb + _U64X2.pack(parent, cookie), _u64(child) + name, db=self.db["dirlist"])
        txn.put(vb + _U64X2.pack(child, parent) + name, b"", db=self.db["backlink"])
        self._mark(txn, dentry_key(parent, name))
        self._mark(txn, inode_key(child))  # its path changed

    def _del_entry(self, txn, parent: int, name: bytes) -> int:
        key = self._key(parent) + name
        raw = txn.get(key, db=self.db["dentry"])
        if raw is None:
            raise errors.NotFound(name.decode(errors="replace"))
        child, cookie = _U64X2.unpack(raw)
        vb = self._vb
        txn.delete(key, db=self.db["dentry"])
        txn.delete(vb + _U64X2.pack(parent, cookie), db=self.db["dirlist"])
        txn.delete(vb + _U64X2.pack(child, parent) + name, db=self.db["backlink"])
        self._mark(txn, dentry_key(parent, name))
        self._mark(txn, inode_key(child))
        return child

    def _parent_dir(self, txn, parent: int) -> Inode:
        p = self._get_inode(txn, parent)
        if not p.is_dir:
            raise errors.NotADirectory()
        if p.nlink == 0:
            raise errors.NotFound("the directory was removed")
        return p

    def _touch_dir(self, txn, dir_inode: Inode, t: int, nlink_delta: int = 0) -> None:
        dir_inode.mtime_ns = dir_inode.ctime_ns = t
        dir_inode.nlink += nlink_delta
        self._put_inode(txn, dir_inode)

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               rdev: int = 0, target: bytes | None = None, call: int = NO_CALL) -> Inode:
        """Make a file, directory, device node or (with `target`) a symlink,
        made by tool call `call` (a key, see `calls`)."""
        self._check_name(name)
        if target is not None and not valid_link_target(target):
            # What fsck and an import refuse is never made (the kernel sends
            # none of these; the store's own callers could).
            raise errors.InvalidArgument(
                f"a symlink target is 1 to {MAX_LINK_TARGET} bytes without a NUL")
        t = now_ns()
        with self.txn(write=True) as txn:
            p = self._parent_dir(txn, parent)
            if txn.get(self._key(parent) + name, db=self.db["dentry"]) is not None:
                raise errors.Exists()
            ino = self._alloc_ino(txn)
            is_dir = stat.S_ISDIR(mode)
            if p.mode & stat.S_ISGID:
                # POSIX: a setgid directory gives new entries its group, and
                # new subdirectories its setgid bit.
                gid = p.gid
                if is_dir:
                    mode |= stat.S_ISGID
            inode = Inode(ino, self.vol, mode, nlink=2 if is_dir else 1, uid=uid, gid=gid,
                          rdev=rdev, atime_ns=t, mtime_ns=t, ctime_ns=t,
                          gen=_generations.getrandbits(32), step=self._step(txn),
                          made_by=call, changed_by=call)
            if target is not None:
                inode.size = len(target)
                txn.put(self._key(ino), target, db=self.db["link"])
            self._put_inode(txn, inode)
            self._reindex(txn, None, inode)
            self._add_entry(txn, parent, name, ino)
            self._touch_dir(txn, p, t, 1 if is_dir else 0)
        return inode

    def link(self, ino: int, new_parent: int, new_name: bytes) -> Inode:
        self._check_name(new_name)
        t = now_ns()
        with self.txn(write=True) as txn:
            p = self._parent_dir(txn, new_parent)
            if txn.get(self._key(new_parent) + new_name, db=self.db["dentry"]) is not None:
                raise errors.Exists()
            inode = self._get_inode(txn, ino)
            if inode.is_dir:
                raise errors.StoreError("cannot hard-link a directory")
            if inode.nlink == 0:
                raise errors.NotFound("the file was removed")
            old = inode.copy()
            inode.nlink += 1
            inode.ctime_ns = t
            self._reindex(txn, old, inode)
            self._put_inode(txn, inode)
            self._add_entry(txn, new_parent, new_name, ino)
            self._touch_dir(txn, p, t)
        return inode

    def _drop_name(self, txn, parent: Inode, name: bytes, t: int,
                   expect_dir: bool | None) -> Inode:
        """Remove one name; returns the child with its new link count."""
        raw = txn.get(self._key(parent.ino) + name, db=self.db["dentry"])
        if raw is None:
            raise errors.NotFound(name.decode(errors="replace"))
        child = self._get_inode(txn, _U64X2.unpack(raw)[0])
        if expect_dir is True:
            if not child.is_dir:
                raise errors.NotADirectory()
            if self._has_entries(txn, child.ino):
                raise errors.NotEmpty()
        elif expect_dir is False and child.is_dir:
            raise errors.IsADirectory()
        self._del_entry(txn, parent.ino, name)
        old = child.copy()
        child.nlink = 0 if child.is_dir else child.nlink - 1
        child.ctime_ns = t
        self._reindex(txn, old, child)
        self._put_inode(txn, child)
        if child.nlink == 0:
            txn.put(self._key(child.ino), b"", db=self.db["orphan"])
        return child

    def _has_entries(self, txn, ino: int) -> bool:
        cur = txn.cursor(db=self.db["dirlist"])
        prefix = self._key(ino)
        return cur.set_range(prefix) and cur.key()[:12] == prefix

    def _log_removed(self, txn, child: Inode, parent: int, name: bytes, reason: str) -> None:
        parent_path = self._path_in(txn, parent) or ""
        name_s = name.decode(errors="surrogateescape")
        path = f"{parent_path}/{name_s}" if parent_path else name_s
        self.logs.log_removed(txn, child.ino, child.gen, path, self._step(txn), reason)

    def unlink(self, parent: int, name: bytes, *, rmdir: bool = False) -> Inode:
        """Remove a name. The inode stays until `free_inodes` (no names, no users)."""
        t = now_ns()
        with self.txn(write=True) as txn:
            p = self._parent_dir(txn, parent)
            child = self._drop_name(txn, p, name, t, expect_dir=rmdir)
            self._touch_dir(txn, p, t, -1 if rmdir else 0)
            if not rmdir and child.is_reg and child.nlink == 0:
                self._log_removed(txn, child, parent, name, "unlink")
        return child

    def rename(self, old_parent: int, old_name: bytes, new_parent: int,
               new_name: bytes, *, noreplace: bool = False,
               exchange: bool = False) -> Inode | None:
        """Rename; returns the inode that lost its name at the target, if any."""
        self._check_name(new_name)
        t = now_ns()
        with self.txn(write=True) as txn:
            op = self._parent_dir(txn, old_parent)
            raw = txn.get(self._key(old_parent) + old_name, db=self.db["dentry"])
            if raw is None:
                raise errors.NotFound(old_name.decode(errors="replace"))
            src = self._get_inode(txn, _U64X2.unpack(raw)[0])
            np_ = op if new_parent == old_parent else self._parent_dir(txn, new_parent)
            if src.is_dir:
                self._check_not_ancestor(txn, src.ino, new_parent)
            traw = txn.get(self._key(new_parent) + new_name, db=self.db["dentry"])
            target = self._get_inode(txn, _U64X2.unpack(traw)[0]) if traw else None
            if target is not None and target.ino == src.ino:
                return None  # same inode under both names: POSIX says do nothing
            if exchange:
                if target is None:
                    raise errors.NotFound(new_name.decode(errors="replace"))
                if target.is_dir:
                    self._check_not_ancestor(txn, target.ino, old_parent)
                self._del_entry(txn, old_parent, old_name)
                self._del_entry(txn, new_parent, new_name)
                self._add_entry(txn, new_parent, new_name, src.ino)
                self._add_entry(txn, old_parent, old_name, target.ino)
                if src.is_dir != target.is_dir and old_parent != new_parent:
                    d = 1 if src.is_dir else -1
                    op.nlink -= d
                    np_.nlink += d
                for node in (src, target):
                    node.ctime_ns = t
                    self._put_inode(txn, node)
                self._touch_dir(txn, op, t)
                if np_ is not op:
                    self._touch_dir(txn, np_, t)
                return None
            replaced = None
            if target is not None:
                if noreplace:
                    raise errors.Exists()
                if src.is_dir and not target.is_dir:
                    raise errors.NotADirectory()
                if not src.is_dir and target.is_dir:
                    raise errors.IsADirectory()
                replaced = self._drop_name(txn, np_, new_name, t, expect_dir=target.is_dir)
                if target.is_dir:
                    np_.nlink -= 1
                elif replaced.is_reg and replaced.nlink == 0:
                    self._log_removed(txn, replaced, new_parent, new_name, "unlink")
            self._del_entry(txn, old_parent, old_name)
            self._add_entry(txn, new_parent, new_name, src.ino)
            if src.is_dir and old_parent != new_parent:
                op.nlink -= 1
                np_.nlink += 1
            src = self._get_inode(txn, src.ino)
            src.ctime_ns = t
            self._put_inode(txn, src)
            self._touch_dir(txn, op, t)
            if np_ is not op:
                self._touch_dir(txn, np_, t)
            return replaced

    def _parent_of(self, txn, ino: int) -> tuple[int, bytes] | None:
        """One (parent, name) of `ino`, or None if it has no name."""
        cur = txn.cursor(db=self.db["backlink"])
        key = self._key(ino)
        if not cur.set_range(key) or cur.key()[:12] != key:
            return None
        k = cur.key()
        return _U64.unpack(k[12:20])[0], bytes(k[20:])

    def parent_of(self, ino: int) -> tuple[int, bytes] | None:
        """One (parent, name) of `ino`, or None if it has no name."""
        with self.txn() as txn:
            return self._parent_of(txn, ino)

    def placed(self, inos) -> dict[int, tuple[Inode, int, bytes]]:
        """ino -> (inode, a parent, its name there) for those of `inos` that
        have a name, in one read transaction (eviction's candidates)."""
        out = {}
        inodes = self.db["inode"]
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["backlink"])
            for ino in inos:
                key = self._key(ino)
                raw = txn.get(key, db=inodes)
                if raw is None or not cur.set_range(key):
                    continue
                k = cur.key()
                if k[:12] != key:
                    continue
                out[ino] = (Inode.unpack(ino, raw), _U64.unpack(k[12:20])[0], bytes(k[20:]))
        return out

    def has_entry(self, parent: int, name: bytes) -> bool:
        with self.txn() as txn:
            return txn.get(self._key(parent) + name, db=self.db["dentry"]) is not None

    def subtree(self, ino: int, limit: int = 1 << 20) -> list[tuple[str, Inode]]:
        """(path below `ino`, inode) of everything under directory `ino`,
        parents before children, in one read transaction; at most `limit`
        entries (eviction judges a unit on them)."""
        out: list[tuple[str, Inode]] = []
        todo = [(ino, "")]
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["dentry"])
            while todo and len(out) < limit:
                d, base = todo.pop()
                prefix = self._key(d)
                if not cur.set_range(prefix):
                    continue
                for key, val in cur:
                    if key[:12] != prefix or len(out) >= limit:
                        break
                    child = self._get_inode(txn, _U64X2.unpack(val)[0])
                    path = base + bytes(key[12:]).decode(errors="surrogateescape")
                    out.append((path, child))
                    if child.is_dir:
                        todo.append((child.ino, path + "/"))
        return out

    def names_of(self, ino: int) -> list[tuple[int, bytes]]:
        """Every (parent, name) of `ino`."""
        with self.txn() as txn:
            return self._names_of(txn, ino)

    def _names_of(self, txn, ino: int) -> list[tuple[int, bytes]]:
        """Every (parent, name) of `ino`."""
        out = []
        key = self._key(ino)
        cur = txn.cursor(db=self.db["backlink"])
        if cur.set_range(key):
            for k in cur.iternext(values=False):
                if k[:12] != key:
                    break
                out.append((_U64.unpack(k[12:20])[0], bytes(k[20:])))
        return out

    def _check_not_ancestor(self, txn, ancestor: int, ino: int) -> None:
        """Refuse to move a directory below itself."""
        hops = 0
        while ino != self.root_ino:
            if ino == ancestor:
                raise errors.InvalidArgument("cannot move a directory into itself")
            up = self._parent_of(txn, ino)
            hops += 1
            if up is None or hops > 1 << 20:
                return
            ino = up[0]

    def readdir(self, ino: int, after: int, limit: int = 256) -> list[tuple[int, bytes, Inode]]:
        """Entries of a directory with cookie > `after`, in cookie order."""
        out = []
        prefix = self._key(ino)
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["dirlist"])
            if not cur.set_range(self._vb + _U64X2.pack(ino, after + 1)):
                return out
            for key, val in cur:
                if key[:12] != prefix:
                    break
                child = _U64.unpack(val[:8])[0]
                out.append((_U64.unpack(key[12:])[0], bytes(val[8:]),
                            self._get_inode(txn, child)))
                if len(out) >= limit:
                    break
        return out

    def path_of(self, ino: int) -> str | None:
        """A path of `ino` relative to the volume root, or None if it has no name."""
        with self.txn() as txn:
            return self._path_in(txn, ino)

    def _path_in(self, txn, ino: int) -> str | None:
        # Any depth (a tree may be deeper than PATH_MAX or 4,096 directories);
        # only a directory met twice, a damaged store, has no path.
        parts: list[bytes] = []
        seen: set[int] = set()
        while ino != self.root_ino:
            up = self._parent_of(txn, ino)
            if up is None or ino in seen:
                return None
            seen.add(ino)
            parts.append(up[1])
            ino = up[0]
        return "/".join(p.decode(errors="surrogateescape") for p in reversed(parts))

    def resolve_path(self, path: str) -> Inode:
        """Look up a path relative to the volume root (no symlinks followed)."""
        with self.txn() as txn:
            inode = self._get_inode(txn, self.root_ino)
            for part in path.strip("/").split("/"):
                if part in ("", "."):
                    continue
                if part == "..":
                    raise errors.InvalidArgument("'..' is not allowed")
                name = part.encode(errors="surrogateescape")
                if len(name) > MAX_NAME:
                    raise errors.NameTooLong(f"a name is longer than {MAX_NAME} bytes")
                if not inode.is_dir:
                    raise errors.NotFound(part)  # a symlink or file on the way: no such path
                raw = txn.get(self._key(inode.ino) + name, db=self.db["dentry"])
                if raw is None:
                    raise errors.NotFound(part)
                inode = self._get_inode(txn, _U64X2.unpack(raw)[0])
        return inode

    def readlink(self, ino: int) -> bytes:
        with self.txn() as txn:
            raw = txn.get(self._key(ino), db=self.db["link"])
        if raw is None:
            raise errors.InvalidArgument("not a symlink")
        return bytes(raw)

    # ------------------------------------------------------------- eviction

    def eviction_facts(self, inos: list[int],
                       paths: dict[int, str] | None = None) -> dict[int, tuple[Inode, str, bytes]]:
        """(inode, path, content hash) per inode, in one read transaction;
        `paths` are those the caller knows already."""
        out = {}
        paths = paths or {}
        with self.txn() as txn:
            for ino in inos:
                inode = self._get_inode(txn, ino)
                digest = self.file_hash(inode.size, self._block_map(txn, ino), ino)
                path = paths.get(ino)
                out[ino] = (inode, path if path is not None else self._path_in(txn, ino) or "",
                            digest)
        return out

    def remove_unit_rest(self, unit: int) -> list[tuple[int, bytes, int]]:
        """What is left of a unit once eviction took its files: its directories
        (the unit's own too, unless it is the root), symlinks and other
        entries that are not regular files, deepest first, in one
        transaction. A regular file still named keeps itself and the
        directories above it. Returns [(parent, name, ino)] removed, so the
        caller can tell the kernel and free them."""
        t = now_ns()
        out: list[tuple[int, bytes, int]] = []
        with self.txn(write=True) as txn:
            up = self._parent_of(txn, unit) if unit != self.root_ino else None
            order: list[tuple[int, bytes, Inode]] = []  # parents' entries before children's
            if up is not None:
                order.append((up[0], up[1], self._get_inode(txn, unit)))
            todo = [unit]
            cur = txn.cursor(db=self.db["dentry"])
            while todo:
                d = todo.pop()
                prefix = self._key(d)
                if not cur.set_range(prefix):
                    continue
                for key, val in cur:
                    if key[:12] != prefix:
                        break
                    child = self._get_inode(txn, _U64X2.unpack(val)[0])
                    order.append((d, bytes(key[12:]), child))
                    if child.is_dir:
                        todo.append(child.ino)
            kept: set[int] = set()  # directories that keep something
            for parent, name, child in reversed(order):  # children before their directory
                if (child.is_reg and child.nlink > 0) or child.ino in kept:
                    kept.add(parent)
                    continue
                p = self._get_inode(txn, parent)
                self._drop_name(txn, p, name, t, expect_dir=child.is_dir)
                self._touch_dir(txn, p, t, -1 if child.is_dir else 0)
                out.append((parent, name, child.ino))
        return out

    def evict(self, victims: list[tuple[int, dict]]) -> list[tuple[int, list[tuple[int, bytes]]]]:
        """Remove every name of each victim and log it, in one transaction.

        `victims` is [(ino, eviction record)]. Returns [(ino, [(parent, name)])]
        so the caller can tell the kernel. The inodes become orphans, freed once
        nothing uses them.
        """
        t = now_ns()
        out = []
        parents: set[int] = set()
        with self.txn(write=True) as txn, self.batched_counters(txn):
            for ino, record in victims:
                inode = self._get_inode(txn, ino)
                names: list[tuple[int, bytes]] = []
                cur = txn.cursor(db=self.db["backlink"])
                key = self._key(ino)
                if cur.set_range(key):
                    for k in cur.iternext(values=False):
                        if k[:12] != key:
                            break
                        names.append((_U64.unpack(k[12:20])[0], bytes(k[20:])))
                for parent, name in names:
                    self._del_entry(txn, parent, name)
                    parents.add(parent)
                old = inode.copy()
                inode.nlink = 0
                inode.ctime_ns = t
                self._reindex(txn, old, inode)
                self._put_inode(txn, inode)
                txn.put(key, b"", db=self.db["orphan"])
                self.logs.log_eviction(txn, ino, record)
                self.logs.log_removed(txn, ino, inode.gen, record.get("path", ""),
                                      record["evicted_step"], record["reason"])
                out.append((ino, names))
            for parent in parents:  # once per directory, not once per file
                self._touch_dir(txn, self._get_inode(txn, parent), t)
        return out
