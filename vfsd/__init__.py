"""vfsd: a FUSE filesystem daemon for LLM agent artifacts.

The stack, top to bottom: `fs` (FUSE operations) -> `openfiles` (per-inode write
buffers) -> `store` (LMDB metadata, the only module that knows the key layout)
and `chunks` (content-addressed chunk files). `eviction` decides what leaves,
`control` serves the control socket, `daemon` wires them into one trio nursery,
and `cli` is the command line.
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
