"""The store: one LMDB environment and the chunk files it names; this package
is the only code that knows the key layout below.

A store directory holds `lmdb/` (this environment), `chunks/` (see `chunks`)
and `locks/`. One store may serve several volumes (one per run dir or fork);
every per-file key starts with the volume id, so volumes never see each
other's inodes and inode numbers are per volume (a volume's root is inode 1).

Schema version 4 (version 2 and 3 stores are upgraded in place by their
first writer, see `Store._upgrade`). Integers are big-endian, so range scans run in order;
`vi` below is vol u32 + ino u64.

`meta`      ascii key -> value. Global: `schema` (u32 SCHEMA_VERSION),
            `chunk_size` (u64, fixed when the store is created), `next_vol`,
            `chunk_count`, `chunk_bytes`, `blob_count`, `blob_bytes` (u64, over
            content objects that have references). Per volume, the key is
            prefixed `v<vol u32>:`: `name` (utf-8), `run` (run id, ascii hex),
            `next_ino`, `next_cookie`, `step` (u64 current agent step),
            `files`, `logical_bytes`, `inline_bytes` (u64 counters over live
            regular files), `xattr_bytes` (over every inode with a name: an
            orphan's xattrs stop counting when its last name goes),
            `orphan_bytes` (content of regular files and xattrs of every
            inode with no name left, until it is freed: the quota counts
            them, so a file unlinked while open still takes room), `evict_seq`,
            `evicted_n`, `removed_n`, `steplog_n` (log bookkeeping), `incomplete` (present
            while a fork is being copied in), and the keys of `snapshots`.
`volume`    volume name (utf-8) -> vol u32 + root ino u64 (always 1).
`inode`     vi -> `Inode.pack()`. Inode numbers are never reused in a volume.
            Its last 16 bytes are two call keys (u64): the tool call that
            created the inode and the one that last changed its content
            (0: no tool call; 2**64-1: unknown, for records written by
            schema 2, which are 16 bytes shorter and read as such), then
            (schema 4) the step of last use u64: the last step the file was
            opened (0 in schema 3 records, 8 bytes shorter).
`call`      call key u64 -> JSON {tool, id, thread, step}: the tool calls that
            inode records name, store-wide. The key is the xxh3-64 of
            thread, tool and id (`calls.call_key`), so it means the same call
            in every store; a key without a record (a run resumed from
            another worker) is a call recorded elsewhere.
`dentry`    vi(parent) + name -> child u64 + cookie u64.
`dirlist`   vi(parent) + cookie u64 -> child u64 + name. The cookie is the
            entry's readdir offset, allocated from `next_cookie` when the entry
            is made, so offsets stay valid while other entries come and go.
`backlink`  vi(child) + parent u64 + name -> b"". Names of an inode, to build
            paths for references and logs without a tree walk.
`link`      vi -> symlink target.
`block`     vi + block index u64 -> block reference (17 bytes: digest and
            location, see `content`), or `HOT_REF`: the block's bytes are in
            the inode's hot file (`hotfiles`). A missing block inside the file
            size is a hole (reads as zeros).
`hotino`    vi -> b"": inodes that have hot blocks (to settle them after a
            restart, before a snapshot).
`content`   digest (16) -> refcount u64 + size u32 + location u8. Invariant:
            a record with refcount > 0 names an object that is present, in
            `blob` (location LMDB) or as a chunk file (location FILE). A FILE
            record with refcount 0 is a tombstone waiting for its file to be
            deleted (once the change that freed it is synced, see
            `durability`) and counts as absent; LMDB records go with their
            last reference. References are held by live blocks and snapshot entries.
`blob`      digest -> bytes of a small (inline) object.
`xattr`     vi + name -> value.
`bystep`    vol u32 + step u64 + ino u64 -> b"", every regular file with a
            name, by the step of its last change (for `changes`).
`agestep`   vol u32 + step of last use u64 (the later of the step written
            and the step last opened) + ino u64 -> b"", unpinned regular
            files only (max-age and quota eviction).
`donestep`  same key as agestep, unpinned regular files with status done.
`orphan`    vi -> b"". Inodes with no names left whose storage waits for the
            last open handle or kernel reference; freed at the volume's next start.
`evicted`, `evictino`, `removed`: the bounded logs, see `eventlog`.
`steplog`: the bounded history of each step (the timeline), see `steplog`.
`snap`, `sgone`, `sver`, `sgen`, `sdirty`: snapshots, see `snapshots`.
`upload`, `published` and the `remote_*`, `upload_*`, `unpub_*` meta keys:
the remote tier, see `remotestate`.

Chunk files are created (renamed into place) and deleted only inside an LMDB
write transaction, which serializes them against other processes sharing the
store: a daemon never deletes a chunk another one has just re-referenced.
LMDB's own exceptions never leave this module: `txn()` turns them into
`errors.NoSpace`, `errors.Corrupt` or `errors.StoreError`.
"""
