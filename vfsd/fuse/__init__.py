"""The kernel-facing layer: pyfuse3 operations over the store.

`fs` (the Operations class: every FUSE request), `openfiles` (per-inode write
buffers and hot blocks), `settle` (hot blocks back into content), `ctldir`
(the inode numbers and names of the `.vfsd` control directory), `snapview`
and `evictlog_view` (`.vfsd/snapshots/` and `.vfsd/evicted`), `snapservice`
(snapshot, restore and fork with the kernel's caches kept in step).

This package imports the store and snapshots; it knows nothing of LMDB keys,
the remote tier or the control socket.
"""
