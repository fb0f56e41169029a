"""vfsd: a FUSE filesystem daemon for LLM agent artifacts.

The packages are the layers, lowest first: `store` (LMDB metadata, content
objects, chunk files; the only code that knows the key layout), `snapshots`
(versions of a volume's tree), `remote` (the object-store tier) and `fuse`
(pyfuse3 operations), then `config`, `eviction`, `status`, `metrics` and
`fsck`, then `control` (the control socket), `daemon` (one trio nursery wiring
them together) and `cli` (the command line). Imports run down that list only
(README, "Architecture"; `tests/test_layers.py` checks it).
"""

__version__ = "0.1.0"

KiB = 1024
MiB = 1024 * KiB

#: Default size up to which file content lives inline in LMDB.
DEFAULT_INLINE_MAX = 64 * KiB
#: Default size of a content-addressed chunk.
DEFAULT_CHUNK_SIZE = 1 * MiB

#: Address space LMDB maps (the file itself grows only as the store does).
LMDB_MAP_SIZE = 1 << 38

#: Name of the per-run state directory inside a run dir.
STATE_DIRNAME = ".vfsd"
#: Name of the mountpoint inside a run dir.
MOUNT_DIRNAME = "fs"
