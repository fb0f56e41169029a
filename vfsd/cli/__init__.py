"""The `vfsd` command line: one module per verb (or family of verbs).

`common` holds the click group and what every verb shares; importing a verb
module registers its commands on the group.
"""

from __future__ import annotations

from . import eviction, fsck, gc, mount, ref, snapshots, status, sync  # noqa: F401  (registers the verbs)
from .common import cli


def main() -> None:
    cli(prog_name="vfsd")
