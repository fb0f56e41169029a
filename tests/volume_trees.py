"""A volume's tree as a dict, live or as a snapshot holds it: what the
model-based tests compare with their models."""

from __future__ import annotations

from vfsd.fuse.openfiles import OpenFiles
from vfsd.snapshots.snapshots import Snapshots
from vfsd.store.store import ROOT_INO, Store


def live_tree(store: Store, files: OpenFiles) -> dict:
    """path -> (kind, payload, ino) of the live volume."""
    out = {}

    def walk(ino: int, prefix: bytes) -> None:
        for _, name, inode in store.readdir(ino, 0, limit=10_000):
            path = prefix + name
            if inode.is_dir:
                out[path] = ("dir", None, inode.ino)
                walk(inode.ino, path + b"/")
            elif inode.is_link:
                out[path] = ("link", store.readlink(inode.ino), inode.ino)
            else:
                of = files.acquire(inode.ino)
                try:
                    data = files.read(of, 0, of.inode.size)
                finally:
                    files.release(of)
                out[path] = ("file", data, inode.ino)

    walk(ROOT_INO, b"")
    return out


def snap_tree(store: Store, snaps: Snapshots, seq: int) -> dict:
    """path -> (kind, payload, ino) of snapshot `seq`, through the snapshot API."""
    out = {}

    def walk(ino: int, prefix: bytes) -> None:
        for name, child in snaps.readdir(seq, ino):
            e = snaps.inode_at(seq, child)
            assert e is not None, f"entry {name!r} names inode {child} absent at s{seq}"
            path = prefix + name
            if e.inode.is_dir:
                out[path] = ("dir", None, child)
                walk(child, path + b"/")
            elif e.inode.is_link:
                out[path] = ("link", e.target, child)
            else:
                parts = []
                cs = store.chunk_size
                for idx in range(-(-e.inode.size // cs)):
                    n = min(cs, e.inode.size - idx * cs)
                    ref = e.blocks.get(idx)
                    piece = store.read_block(ref, 0, n) if ref else b""
                    parts.append(piece.ljust(n, b"\0"))
                out[path] = ("file", b"".join(parts), child)

    walk(ROOT_INO, b"")
    return out
