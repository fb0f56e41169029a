"""Snapshots: exact, cheap versions of a volume's whole tree.

A snapshot records every object of the volume (inodes with their content by
reference, and directory entries) as it was at one moment. It costs what
changed since the previous snapshot, not what the tree holds: the store marks
each object it changes (`Store._mark`), and taking a snapshot writes one
version entry per marked object. An object that did not change is found in
the entry written by an earlier snapshot. Content is never copied: entries
name content objects (see `content`) and hold a reference on each, so a
retained snapshot keeps its bytes readable after the live file changed or
was evicted.

On-disk format (named databases of the store's LMDB environment; integers
big-endian; `okey` is an object key):

    okey = b"i" + ino u64                     an inode
         | b"d" + parent u64 + len u8 + name  a directory entry

`snap`    vol u32 + seq u64 -> JSON {seq, step, created_ns, pinned, label,
          parent, entries}: one record per retained snapshot. `seq` numbers
          start at 1 and are never reused; a snapshot's id is "s<seq>".
`sgone`   vol u32 + seq u64 -> JSON {seq, step, deleted_step, reason}: snapshots
          that retention or a user deleted (bounded, for "why is it gone").
`sver`    vol u32 + okey + seq u64 -> value: the object's state from snapshot
          `seq` on, until its next entry. Empty value: the object does not
          exist. A directory entry's value is the child ino u64; an inode's is
          an inode entry (`pack_inode_entry`): the inode record, one name of it
          (parent, name) for paths, its block references, symlink target and
          xattrs.
`sgen`    vol u32 + seq u64 + okey -> b"": the entries written by snapshot
          `seq` (what changed in it), so deleting snapshots, restoring and
          diffing cost what changed, not what exists.
`sdirty`  vol u32 + okey -> b"": objects changed since the last snapshot.
`meta`    per volume: `snap_seq` (u64, the last seq taken; 0 = never: nothing
          is tracked until the first snapshot, which records the whole tree),
          `snap_base` (u64, the snapshot the live tree comes from: the last
          one taken, or the one restored), `base_changed` (present once
          the live tree changed after that) and `snap_bytes` (u64, the file
          bytes the retained entries record: the sum of the sizes of the
          regular-file inode entries in `sver`; what `snapshot_keep_bytes`
          bounds).

The state of object K at snapshot S is its entry with the greatest seq <= S
(none: K did not exist). Invariants (checked by `fsck`):
- every entry is needed: the newest entry of an object always (it is what
  future snapshots see while the object is unchanged); an older entry only
  while a retained snapshot lies in [its seq, the next entry's seq);
- `sgen` lists exactly the `sver` entries;
- each inode entry holds one reference on each content object it names;
- for an object not in `sdirty`, its newest entry equals the live object.

Creation, deletion, restore and fork each commit in one write transaction
(fork in batches into a volume marked incomplete until the last one), so a
crash leaves either the state before or the state after.
"""
