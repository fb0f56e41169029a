"""What eviction must know of a file's place in the tree: its path, whether a
directory above it is pinned, and the unit it belongs to.

A unit is a directory evicted whole or not at all: one marked with
`user.vfsd.unit=1`, or, unless marked `0`, one that holds `.git` (a git work
tree) or `pyvenv.cfg` (a virtualenv). A file belongs to the outermost unit
above it, so a venv inside a repository goes with the repository. The mount
root is a unit only when marked: a repository at the root would otherwise
make every file of the run one unit.

Facts are cached for one eviction pass (`Scope`): candidates share their
directories, so a pass costs a lookup or two per directory, not per file.
A tree may be any depth (past PATH_MAX, past 4,096 directories): a directory's
facts keep its name and its parent's facts, and a path is built only when
asked, so a deep chain costs memory per directory, not per path character.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from vfsd import errors

log = structlog.get_logger("vfsd.eviction")

#: the xattr that marks a directory a unit ("1") or not one ("0")
UNIT_XATTR = b"user.vfsd.unit"
#: entries that make a directory a unit unless it is marked "0"
UNIT_MARKERS = (b".git", b"pyvenv.cfg")


@dataclass(frozen=True, slots=True)
class DirFacts:
    up: DirFacts | None  # the parent's facts, None for the root
    name: str  # this directory's name in it ("" for the root)
    pinned: bool  # this directory or one above it is pinned
    unit: int | None  # the outermost unit at or above it

    @property
    def path(self) -> str:
        """Relative to the root, "" for the root."""
        names = []
        facts: DirFacts | None = self
        while facts is not None and facts.up is not None:
            names.append(facts.name)
            facts = facts.up
        return "/".join(reversed(names))


def unit_flag(store, ino: int) -> bool | None:
    """True / False if `ino` is marked a unit or not one, None if unmarked."""
    value = store.get_xattr(ino, UNIT_XATTR)
    if value is None:
        return None
    return value.strip() in (b"1", b"true")


class Scope:
    """Tree facts of one eviction pass over `store`."""

    def __init__(self, store) -> None:
        self.store = store
        self.root = store.root_ino
        self._dirs: dict[int, DirFacts | None] = {}
        self.units: dict = {}  # unit ino -> its members, filled by the evictor

    def dir_facts(self, ino: int) -> DirFacts | None:
        """Facts of directory `ino`, None if it is no longer in the tree."""
        if ino in self._dirs:
            return self._dirs[ino]
        chain: list[tuple[int, bytes]] = []  # (dir, its name), leaf first
        on_chain: set[int] = set()
        cur = ino
        while cur != self.root and cur not in self._dirs:
            up = self.store.parent_of(cur)
            if up is None or cur in on_chain:
                if up is not None:  # a directory inside itself: a damaged store
                    log.error("eviction_tree_cycle", ino=ino, at=cur,
                              hint="run `vfsd fsck` on the unmounted store")
                for d, _ in chain:
                    self._dirs[d] = None
                self._dirs[cur] = None
                return None
            on_chain.add(cur)
            chain.append((cur, up[1]))
            cur = up[0]
        if cur == self.root and cur not in self._dirs:
            self._dirs[cur] = DirFacts(None, "", self._pinned(cur),
                                       cur if unit_flag(self.store, cur) else None)
        facts = self._dirs[cur]
        for d, name in reversed(chain):
            if facts is not None:
                unit = facts.unit if facts.unit is not None else (d if self._is_unit(d) else None)
                facts = DirFacts(facts, name.decode(errors="surrogateescape"),
                                 facts.pinned or self._pinned(d), unit)
            self._dirs[d] = facts
        return self._dirs[ino]

    def file_facts(self, ino: int) -> tuple[str, DirFacts] | None:
        """(path, facts of its directory) of a file, None if it has no name."""
        up = self.store.parent_of(ino)
        return None if up is None else self.placed_at(*up)

    def placed_at(self, parent: int, name: bytes) -> tuple[str, DirFacts] | None:
        """(path, facts of `parent`) of the entry `name` in directory `parent`."""
        facts = self.dir_facts(parent)
        if facts is None:
            return None
        name = name.decode(errors="surrogateescape")
        path = facts.path
        return (path + "/" + name if path else name), facts

    def _pinned(self, ino: int) -> bool:
        try:
            return self.store.get_inode(ino).pinned
        except errors.NotFound:
            return False

    def _is_unit(self, ino: int) -> bool:
        flag = unit_flag(self.store, ino)
        if flag is not None:
            return flag
        return any(self.store.has_entry(ino, m) for m in UNIT_MARKERS)
