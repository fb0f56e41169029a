"""vfsd: a FUSE filesystem daemon for LLM agent artifacts.

The packages are the layers, lowest first: `store` (LMDB metadata, content
objects, chunk files; the only code that knows the key layout), `snapshots`
(versions of a volume's tree), `remote` (the object-store tier) and `fuse`
(pyfuse3 operations), then `config`, `eviction`, `status`, `metrics` and
`fsck`, then `control` (the control socket), `daemon` (one trio nursery wiring
them together) and `cli` (the command line). Imports run down that list only
(docs/architecture.md; `tests/test_layers.py` checks it).
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

#: Mount points of mount_tool's execute sandbox, which makes the mount root
#: its `/` (mount_tool/reserved.py keeps the same list). The root serves them
#: as virtual directories only once a sandbox has claimed them (the
#: `user.vfsd.sandbox` xattr on the root): until then they are ordinary names.
#: `tmp` is not among them: the sandbox's /tmp is a real directory of the run.
SANDBOX_MOUNT_POINTS = (b"bin", b"dev", b"etc", b"lib", b"lib32", b"lib64", b"libx32", b"proc",
                        b"run", b"sbin", b"usr")
#: Names the mount root always serves itself (`.vfsd/`): local operations
#: refuse real entries with these names at the root, and so does an import.
RESERVED_ROOT_NAMES = frozenset({STATE_DIRNAME.encode()})
