"""Whether a path is a mount point: what /proc/self/mountinfo lists.

A mount's point is compared as bytes (a mount point's name need not be
UTF-8) and canonical (realpath), as the kernel lists it.
"""

from __future__ import annotations

import os
import re

_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a mount point in this process's mount namespace."""
    return mount_point_listed(os.fsencode(os.path.realpath(path)))


def mount_point_listed(target: bytes) -> bool:
    """Whether /proc/self/mountinfo lists the canonical path `target` (bytes: a
    mount point's name need not be UTF-8)."""
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            # mountinfo escapes space, tab, newline and backslash as \ooo.
            field = line.split(b" ")[4]
            if _OCTAL_ESCAPE.sub(lambda m: bytes([int(m[1], 8)]), field) == target:
                return True
    return False
