"""What every record of a volume must satisfy, whoever wrote it.

Local operations keep these by construction: the FUSE layer and the store
refuse what would break them (EFBIG past `MAX_FILE_SIZE`, ENAMETOOLONG,
E2BIG for xattrs, a second name for a directory). Records that come from
elsewhere are checked against them instead: `vfsd fsck` checks a store's
volumes, and an import (`vfsd mount --from`, `vfsd.remote.resume`) checks
every record of a manifest before it writes any. One definition serves both.

Each function returns the problems it found as sentences (empty: none), so
fsck can report them all and an import can refuse with the first ones.
"""

from __future__ import annotations

import stat
from collections import Counter, defaultdict
from collections.abc import Iterable

from .inode import STATUS_NAMES, Inode
from .namespace import MAX_NAME, valid_link_target
from .xattrstore import XATTR_FILE_MAX, XATTR_LIST_MAX

#: The largest file: a truncate or write past it is EFBIG.
MAX_FILE_SIZE = 1 << 44
#: Steps are unsigned 64-bit in the store but signed in JSON tools: 2**63 - 1.
MAX_STEP = (1 << 63) - 1
#: One xattr value and one xattr name, as the kernel takes them.
XATTR_VALUE_MAX = 64 * 1024
XATTR_NAME_MAX = 255
#: Names the daemon serves itself: no user attribute may be stored under them.
VIRTUAL_XATTR_PREFIX = b"user.vfsd."

_TYPES = {stat.S_IFREG: "file", stat.S_IFDIR: "directory", stat.S_IFLNK: "symlink",
          stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
          stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}


def inode_problems(inode: Inode) -> list[str]:
    """What is wrong with one inode record on its own."""
    out = []
    what = f"inode {inode.ino}"
    if stat.S_IFMT(inode.mode) not in _TYPES or inode.mode & ~(stat.S_IFMT(inode.mode) | 0o7777):
        out.append(f"{what}: mode {inode.mode:o} is not a file type and permissions")
    if inode.status not in STATUS_NAMES:
        out.append(f"{what}: status {inode.status} is neither active nor done")
    if not 0 <= inode.step <= MAX_STEP:
        out.append(f"{what}: step {inode.step} is past {MAX_STEP}")
    if inode.is_reg and not 0 <= inode.size <= MAX_FILE_SIZE:
        out.append(f"{what}: size {inode.size} is past the largest file ({MAX_FILE_SIZE})")
    return out


def link_target_problems(inode: Inode, target: bytes) -> list[str]:
    """A symlink has a target the kernel would take; nothing else has one."""
    what = f"inode {inode.ino}"
    if not inode.is_link:
        return [f"{what}: a {type_name(inode)} with a link target"] if target else []
    if not valid_link_target(target):
        return [f"{what}: symlink target of {len(target)} bytes is empty, too long or "
                "holds a NUL"]
    if inode.size != len(target):
        return [f"{what}: symlink of size {inode.size} has a {len(target)}-byte target"]
    return []


def xattr_problems(ino: int, attrs: Iterable[tuple[bytes, int]]) -> list[str]:
    """Per-file xattr limits, from (name, value length) pairs."""
    out = []
    total = listed = 0
    seen = set()
    for name, vlen in attrs:
        if not name or len(name) > XATTR_NAME_MAX or b"\0" in name or name in seen:
            out.append(f"inode {ino}: xattr name {name[:40]!r} is empty, too long, holds a "
                       "NUL or appears twice")
        elif name.startswith(VIRTUAL_XATTR_PREFIX):
            out.append(f"inode {ino}: xattr {name.decode(errors='replace')} is the daemon's "
                       "own, never stored")
        if vlen > XATTR_VALUE_MAX:
            out.append(f"inode {ino}: xattr value of {vlen} bytes (at most {XATTR_VALUE_MAX})")
        seen.add(name)
        total += len(name) + vlen
        listed += len(name) + 1
    if total > XATTR_FILE_MAX:
        out.append(f"inode {ino}: {total} bytes of xattrs (at most {XATTR_FILE_MAX} per file)")
    if listed > XATTR_LIST_MAX:
        out.append(f"inode {ino}: xattr names list in {listed} bytes (at most "
                   f"{XATTR_LIST_MAX} per file)")
    return out


def name_problems(parent: int, name: bytes, *, at_root: bool = False,
                  reserved: frozenset[bytes] = frozenset()) -> list[str]:
    """A directory entry's name is one the namespace would take; `reserved`
    are names the root may not hold (see `vfsd.RESERVED_ROOT_NAMES`)."""
    if not name or len(name) > MAX_NAME or b"/" in name or b"\0" in name \
            or name in (b".", b".."):
        return [f"name {name[:40]!r} in directory {parent} is empty, too long, or holds "
                "'/' or NUL"]
    if at_root and name in reserved:
        return [f"name {name.decode(errors='replace')!r} at the root is reserved for the "
                "mount's own directories"]
    return []


def expected_nlink(inode: Inode, *, is_root: bool, names: int, subdirs: int) -> int:
    """The link count an inode must have, given what names it and its subdirectories."""
    if inode.is_dir:
        return 2 + subdirs if (is_root or names) else 0
    return names


def tree_problems(inodes: dict[int, Inode], names: dict[int, list[tuple[int, bytes]]],
                  root: int) -> list[str]:
    """Directories form a tree under `root`: each has one name (the root
    none), in a directory, and can be reached from the root (no cycle)."""
    out = []
    children: dict[int, list[int]] = defaultdict(list)
    for child, where in names.items():
        for parent, _name in where:
            children[parent].append(child)
            p = inodes.get(parent)
            if p is not None and not p.is_dir:
                out.append(f"inode {child} is named in {parent}, which is a {type_name(p)}")
        inode = inodes.get(child)
        if inode is None or not inode.is_dir:
            continue
        if child == root and where:
            out.append(f"the root directory {root} has a name in a directory")
        elif len(where) > 1:
            out.append(f"directory {child} has {len(where)} names (a directory has one)")
    reached = {root}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in reached:
                reached.add(child)
                inode = inodes.get(child)
                if inode is not None and inode.is_dir:
                    todo.append(child)
    lost = [ino for ino in names if names[ino] and ino not in reached]
    if lost:
        out.append(f"{len(lost)} named inode(s) cannot be reached from the root (a directory "
                   f"inside itself?), e.g. inode {min(lost)}")
    return out


def link_count_problems(inodes: dict[int, Inode], names: dict[int, list[tuple[int, bytes]]],
                        root: int) -> list[str]:
    """Each inode's link count matches its names (and, for a directory, its subdirectories)."""
    subdirs: Counter = Counter()
    for child, where in names.items():
        inode = inodes.get(child)
        if inode is not None and inode.is_dir:
            for parent, _name in where:
                subdirs[parent] += 1
    out = []
    for ino, inode in inodes.items():
        want = expected_nlink(inode, is_root=ino == root, names=len(names.get(ino, ())),
                              subdirs=subdirs[ino])
        if inode.nlink != want:
            out.append(f"inode {ino}: link count {inode.nlink}, names found {want}")
    return out


def type_name(inode: Inode) -> str:
    return _TYPES.get(stat.S_IFMT(inode.mode), "inode of unknown type")
