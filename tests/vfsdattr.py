"""Read a file's vfsd attributes the way a shell user does: `.vfsd/attr/PATH`.

The daemon answers getxattr with ENOSYS by default (so the kernel stops asking
for security.capability before every write); the attributes are read from the
mirror tree in `.vfsd/attr/` instead, one JSON document per regular file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def mount_root(path: Path) -> Path:
    """The root of the vfsd mount holding `path` (the directory with `.vfsd/`)."""
    p = Path(os.path.abspath(path)).parent
    while not os.path.ismount(p):
        if p.parent == p:
            raise AssertionError(f"{path} is not on a mount")
        p = p.parent
    return p


def attr_doc(path: Path) -> dict:
    """The `.vfsd/attr/` document of a regular file."""
    root = mount_root(path)
    rel = os.path.relpath(os.path.abspath(path), root)
    with open(root / ".vfsd" / "attr" / rel, "rb") as f:
        return json.loads(f.read())


def vfsd_attr(path: Path, name: str) -> str:
    """`user.vfsd.NAME` as getfattr would print its value (step, status, pin, hash, tier)."""
    doc = attr_doc(path)
    if name.startswith("user.vfsd."):
        name = name[len("user.vfsd."):]
    if name == "pin":
        return "1" if doc["pin"] else "0"
    return str(doc[name])
