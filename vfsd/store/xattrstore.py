"""Extended attributes of a volume's inodes, with their limits.

A mixin of `store.Store` (table `xattr`, whose layout `store` documents).
Names and values of one inode together are limited to XATTR_FILE_MAX bytes,
and the list of its names to XATTR_LIST_MAX, so `listxattr` always fits
the kernel's 64 KiB; the bytes of inodes that have a name count in the
volume's `xattr_bytes`, those of orphans in its `orphan_bytes`; the quota
includes both.
"""

from __future__ import annotations

from vfsd import errors

#: extended attributes of one inode: names and values together, and the name list
XATTR_FILE_MAX = 256 * 1024
XATTR_LIST_MAX = 60 * 1024


class XattrMixin:
    """The extended-attribute half of `Store`."""

    def get_xattr(self, ino: int, name: bytes) -> bytes | None:
        with self.txn() as txn:
            raw = txn.get(self._key(ino) + name, db=self.db["xattr"])
        return bytes(raw) if raw is not None else None

    def _xattr_totals(self, txn, ino: int) -> tuple[int, int]:
        """(name and value bytes, name-list bytes) of an inode's xattrs."""
        total = listed = 0
        prefix = self._key(ino)
        cur = txn.cursor(db=self.db["xattr"])
        if cur.set_range(prefix):
            for k, v in cur:
                if k[:12] != prefix:
                    break
                total += len(k) - 12 + len(v)
                listed += len(k) - 12 + 1
        return total, listed

    def xattr_bytes(self, ino: int) -> int:
        """Bytes of an inode's xattr names and values (what freeing it gives back)."""
        with self.txn() as txn:
            return self._xattr_totals(txn, ino)[0]

    def xattr_growth(self, ino: int, name: bytes, value: bytes) -> int:
        """Bytes setting this xattr would add (negative if it shrinks)."""
        with self.txn() as txn:
            old = txn.get(self._key(ino) + name, db=self.db["xattr"])
        return len(name) + len(value) - (len(name) + len(old) if old is not None else 0)

    def set_xattr(self, ino: int, name: bytes, value: bytes, *, create: bool = False,
                  replace: bool = False) -> int:
        """Set an xattr; the bytes it added. Limits per inode are enforced here."""
        key = self._key(ino) + name
        with self.txn(write=True) as txn:
            inode = self._get_inode(txn, ino)
            old = txn.get(key, db=self.db["xattr"])
            if create and old is not None:
                raise errors.Exists("the attribute exists")
            if replace and old is None:
                raise errors.NoAttr("no such attribute")
            total, listed = self._xattr_totals(txn, ino)
            growth = len(name) + len(value) - (len(name) + len(old) if old is not None else 0)
            if total + growth > XATTR_FILE_MAX:
                raise errors.AttrTooBig(
                    f"extended attributes of one file are limited to {XATTR_FILE_MAX} bytes")
            if old is None and listed + len(name) + 1 > XATTR_LIST_MAX:
                raise errors.AttrTooBig("too many extended attribute names on one file")
            txn.put(key, value, db=self.db["xattr"])
            self._bump(txn, b"xattr_bytes" if inode.nlink > 0 else b"orphan_bytes", growth)
            self._put_inode(txn, inode)  # ctime is the kernel's; the record is touched
        return growth

    def remove_xattr(self, ino: int, name: bytes) -> bool:
        key = self._key(ino) + name
        with self.txn(write=True) as txn:
            old = txn.get(key, db=self.db["xattr"])
            if old is None:
                return False
            txn.delete(key, db=self.db["xattr"])
            inode = self._get_inode(txn, ino)
            self._bump(txn, b"xattr_bytes" if inode.nlink > 0 else b"orphan_bytes",
                       -(len(name) + len(old)))
            self._put_inode(txn, inode)
        return True

    def list_xattrs(self, ino: int) -> list[bytes]:
        prefix = self._key(ino)
        out = []
        with self.txn() as txn:
            cur = txn.cursor(db=self.db["xattr"])
            if cur.set_range(prefix):
                for k in cur.iternext(values=False):
                    if k[:12] != prefix:
                        break
                    out.append(bytes(k[12:]))
        return out

    def _xattrs_of(self, txn, ino: int) -> list[tuple[bytes, bytes]]:
        prefix = self._key(ino)
        out = []
        cur = txn.cursor(db=self.db["xattr"])
        if cur.set_range(prefix):
            for k, v in cur:
                if k[:12] != prefix:
                    break
                out.append((bytes(k[12:]), bytes(v)))
        return out

    def _drop_xattrs(self, txn, ino: int) -> int:
        """Delete every xattr of `ino`; the bytes they held."""
        prefix = self._key(ino)
        held = 0
        cur = txn.cursor(db=self.db["xattr"])
        if cur.set_range(prefix):
            while cur.key()[:12] == prefix:
                held += len(cur.key()) - 12 + len(cur.value())
                if not cur.delete() or not cur.key():
                    break
        return held
