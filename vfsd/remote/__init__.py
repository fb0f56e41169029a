"""The remote tier: the run's chunks and published snapshots in an S3 bucket.

Modules: `objstore` (the one S3 client), `layout` (key names), `lease`, `head`,
`manifest`, `threads` (the in-bucket formats below), `uploader`, `publisher`,
`fetcher`, `chunkcache`, `chunklink`, `resume`, `history` (a shard thread's
catch-up), `copyrun`, `bucketgc`, `remotetier`, which wires them into a run
dir's daemon, and `shardtier`, which wires them into a shard daemon (its
control ops are `vfsd.replicas`). This package imports the store and
snapshots, never the FUSE or control layers; `objstore` (boto3) is imported
only by a remote mount.

The bucket layout: the one place it is documented.

Everything lives under the prefix of `s3://BUCKET/PREFIX` (`objstore.RemoteURL`);
keys below are relative to it. Several workers, and several runs, share one
prefix: that is where dedup across workers pays.

```
chunks/<hh>/<hex>                    one chunk, immutable, content-addressed
runs/<run>/lease                     the run's writer lease, mutable (CAS on ETag)
runs/<run>/head                      the run's published snapshots, mutable (CAS on ETag)
runs/<run>/snapshots/<seq>           one published snapshot (a manifest), immutable
runs/<run>/intents/<seq>-<gen>-<a>   chunks a publication in progress relies on
threads/<key>                        which run holds a shard thread now, mutable (CAS)
gc/lease                             held while a GC sweep may delete chunks
```

`chunks/<hh>/<hex>`
    `hex` is the 32-digit lowercase hex of the chunk's xxh3-128 (the same name
    as in the local `chunks/` directory) and `hh` its first two digits. The
    body is the chunk's bytes, nothing else (no header, no compression, no
    encryption, in this version). Written only with `If-None-Match: *`
    (`ObjectStore.put_if_absent`), so an object under its final name is always
    complete and never rewritten: an interrupted PUT leaves nothing visible,
    and a second writer of the same bytes learns they are already there. A
    reader verifies the bytes against the name before using them
    (`vfsd.remote.fetcher`). Deleted only by GC (below). Only chunk files travel
    here; small content objects (LMDB blobs, at most `inline_max` bytes)
    travel packed inside manifests, so ten thousand 2 KB files cost no
    ten thousand PUTs.

`runs/<run>/lease`
    One writer per run (`vfsd.remote.lease`). A small JSON object:
    `{"vfsd_lease": 1, "run", "owner": {"host", "pid", "token"}, "generation",
    "ttl", "acquired_at", "renewed_at", "expires_at", "released", "seq",
    "session", "seq_floor"?}` (`seq_floor`: a shard run's, see "Shard
    threads" below). Created with `If-None-Match: *`; renewed, released and taken
    over with `If-Match: <ETag>` only. `generation` grows by one at every
    acquisition (one above the record replaced), also when a restarted daemon
    takes back its own lease: it is the run's fencing token, and no two
    holders ever share one. It stays below 2**62; a record at or above it
    is damaged (taken over once it lapses). `session` is random per acquiring process; a
    holder recognises its own earlier write (an answer lost) by session and
    generation, never by the owner token alone. Expiry is judged on the server's
    clock (its Last-Modified and Date headers), never on a worker's wall clock:
    the lease is expired when the server's Date is more than `ttl` + 1 s past
    the object's Last-Modified. `expires_at` and the other times are the
    holder's wall clock, for humans only. A released lease (`"released":
    true`, written by a clean shutdown) can be taken at once. A daemon keeps
    its owner token in its store, so a daemon restarted after a crash takes
    its own lease back at once instead of waiting for it to expire.

`runs/<run>/head`
    The run's index of published snapshots, JSON (`vfsd.remote.head.Head`):
    `{"vfsd_head": 1, "run", "generation", "latest", "writer": {"host", "pid"},
    "updated_ns", "snapshots": [{"seq", "parent", "full", "step",
    "created_ns", "pinned", "entries", "bytes", "generation", "retired"?}],
    "thread"?}`, oldest first. `latest` is the newest published seq (0: none
    yet). `retired` (a shard run's head): the snapshot is listed only because
    a kept delta's chain needs its manifest; a shard run's head lists what
    its holder's volume keeps (its retention, byte budget and deletions
    decide), and no replica imports a retired snapshot.
    `thread` (a shard thread's runs only) is the key of the thread whose
    record names this run, written by the fence (below) and kept by every
    rewrite; a head naming another thread than the one asked for is refused
    (a record pointing at another thread's run). A copied run's head
    (`copyrun`) is written with generation 0, which no lease has: its first
    run's fence writes its own. Created with
    `If-None-Match: *` and rewritten only with `If-Match: <ETag>`, each time
    with the writer's lease `generation`. A worker that takes the lease first
    rewrites the head with its new generation (the fence): from then on a
    stale writer (one that lost its lease without knowing it yet) fails its
    CAS instead of overwriting its successor's head. A worker that finds a
    head written by another generation than the one it last wrote with knows
    the run moved on elsewhere and stops writing (read-only mount). A
    snapshot is *published* once the head lists it.

`runs/<run>/snapshots/<seq>` (seq in decimal, no leading zeros; the snapshot id is "s<seq>")
    A manifest: one snapshot, immutable, written with `If-None-Match: *`
    only after every chunk it names is in the bucket (see "Publishing"). Its
    format, little to parse and versioned (`vfsd.remote.manifest`):

        offset  size  field
        0       8     magic b"VFSDMNF\\0"
        8       2     format version, u16 (1)
        10      1     kind: 0 full, 1 delta
        11      1     flags: bit 0 pinned
        12      8     seq, u64
        20      8     parent seq, u64 (0 for a full manifest)
        28      8     agent step, u64
        36      8     created_ns, u64 (writer's wall clock)
        44      8     generation of the writer's lease, u64
        52      4     chunk_size, u32 (block indexes mean nothing without it)
        56      4     entry count, u32
        60      4     blob count, u32
        64      8     body length in bytes (compressed), u64
        72      8     body length uncompressed, u64
        80      1     run id length n, then n bytes of run id (ascii)
        81+n    2     label length m, u16, then m bytes of label (utf-8)
        ...           body: zlib of
                        entries, sorted by object key:  okey len u16, okey,
                                                         value len u32, value
                        blobs, sorted by digest:         digest 16, len u32, bytes
        end-16  16    xxh3-128 of every byte before it

    Integers are big-endian. Entries are the snapshot format's own
    (`vfsd.snapshots`): `okey` is b"i" + ino u64 (value: an inode entry with
    its block references, 17 bytes each: digest + location) or b"d" +
    parent u64 + len u8 + name (value: child ino u64). A *full* manifest
    holds every object visible at the snapshot; a *delta* holds, for every
    object that changed since its parent (another published snapshot of the
    same run), the object's value at this snapshot, an empty value meaning
    "gone". State(seq) = state(parent) overlaid with the delta, down to a
    full manifest. The blobs are the small content objects (LMDB location)
    that the manifest's entries name, verified by their own digest on
    import. Chunks (file location) are named by the entries and fetched
    from `chunks/` lazily.
    Writers publish a full manifest every `remote_full_every` publications,
    and whenever the delta would hold more than half as many entries as the
    last full manifest of its chain, so a chain stays short: resuming
    downloads at most `remote_full_every` manifests.

`runs/<run>/intents/<seq>-<generation>-<attempt>`
    Written by a publication in progress before it checks for a GC sweep
    (see GC): the concatenated 16-byte digests of the chunks its manifest
    will name that no earlier manifest of its chain names. `attempt` is 16
    random hex digits, new for every intent written, so no two intents
    share a key: deleting one (a finished or failed attempt, a stale one
    GC removes) never deletes another. (Keys without `-<attempt>`, written
    by earlier versions, are read the same way.) Deleted by the publication
    once it is over, whether the head lists the snapshot or the attempt
    failed (a retry writes a new intent and checks for sweeps again). GC
    honours intents younger than `INTENT_MAX_AGE` and deletes older ones
    (left by crashed writers); a writer whose publication takes longer than
    half of it writes a new intent (a new key), deletes the old one and
    checks again.

`threads/<key>` (a shard thread; `key` is its volume name, 1-64 of `[A-Za-z0-9_-]`:
        a Runs uses `t` + 32 hex digits of the thread id's SHA-256)
    Which run holds the thread's snapshots now, JSON (`vfsd.remote.threads`):
    `{"vfsd_thread": 1, "key", "thread_id", "run", "generation", "state":
    "live" | "deleted", "copied_from": {"run", "upto"} | null, "old_runs":
    [run, ...], "updated_ns", "writer": {"host", "pid"}}`. A live record
    names a run, a tombstone (`state` "deleted") none. Created with
    `If-None-Match: *` (by the first `remote_begin` of the thread anywhere,
    naming the local volume's run, or by `remote_copy`, naming the copy's
    new run); changed only with `If-Match` on the ETag it was read with, each
    change one `generation` up: `remote_delete` makes it a tombstone (the run
    goes to `old_runs`), and the first `remote_begin` after a delete makes it
    live again with a new run (the id used again starts empty). `thread_id`
    is the whole id: a record of another id than the one asked for (two ids
    with one hash, a planted object) is refused (`wrong_thread`), never
    served. GC deletes the objects of the runs tombstones list (below).

`gc/lease`
    A lease object like a run's (`vfsd.remote.lease`, same format), held by a GC
    sweep for as long as it may delete chunks, plus `"grace"` (this sweep's
    grace period, seconds) and `"grace_floor"` (the shortest grace any sweep
    has used on this prefix, never raised). A sweep computes its floor from
    the very record its acquisition replaces (the min of that floor and its
    grace; the CAS fails and it computes again if another sweep wrote in
    between), so two sweeps racing cannot raise it; a damaged record, or one
    with no usable floor, gives `MIN_GRACE`. Its TTL is at least three
    request attempts (connect plus read timeout each). Released at the end
    of a sweep, so it normally exists, released.

Publishing a snapshot (`vfsd.remote.publisher`), by the run's lease holder:
    1. Build the manifest from the local snapshot (in a worker thread).
    2. Wait until every chunk named by the entries that changed since the
       parent is uploaded (`Uploader.ensure_uploaded`; an outage makes it
       wait, nothing fails).
    3. PUT the intent (those chunks' digests).
    4. Read `gc/lease`. While a sweep holds it (not released, not expired on
       the server's clock), wait; once free, note the time `b`.
    5. Confirm each of those chunks after `b`: one this worker created
       (PUT with `If-None-Match`) less than `grace_floor / 2` before `b` is
       confirmed by its age; any other is HEADed now, and uploaded again
       from the local copy if missing (a chunk stays local until a published
       manifest names it: the pending-upload table keeps it out of the
       local cache's eviction).
    6. PUT the manifest (`If-None-Match: *`); 7. CAS the head (generation,
       `If-Match`); 8. delete the intent (also when a step failed: the
       retry starts again at 3 with a new intent); 9. delete manifests that
       retention no longer keeps (after the head no longer lists them).

GC (`vfsd gc --remote URL`, `vfsd.remote.bucketgc`): mark and sweep.
    1. Take `gc/lease` (one sweep at a time); t0 = the server's Date.
    1b. List `threads/`: the runs tombstones list are *doomed* when no live
       record names them and their head is gone or names that very thread.
       Doomed runs count for nothing below; their objects are deleted after
       the mark (under the lease like chunks), then the tombstones stop
       listing them (CAS; a conflict leaves it to the next sweep).
    2. List `runs/`; mark every chunk named by an intent younger than
       `INTENT_MAX_AGE`, then by every manifest of any run under the prefix
       (a manifest that does not decode stops the sweep: nothing is deleted
       when what is referenced is unknown).
    3. List `runs/` again, and read what the listing shows that was not
       read yet; repeat until a listing shows nothing new (the fixpoint).
       An object listed but gone when read is why: an intent deleted
       because its manifest got published, a manifest retention retired
       (its chunks are named by the successor that made it retirable). That
       successor was PUT before the object went, so before the next listing.
       After `MAX_MARK_ROUNDS` listings that each showed something new, the
       sweep gives up, deleting nothing.
    4. Delete the stale intents; list `chunks/`; delete each chunk that is
       unmarked and whose Last-Modified is older than t0 - grace. Before
       each delete request the GC lease is checked (renewed past half its
       TTL), and the request carries the lease's end as a deadline: no
       attempt is sent unless it is given up (connect plus read timeout)
       before the lease would lapse on the sweep's own clock. A store too
       slow for that stops the sweep (GcError), deleting nothing more.
    5. Release `gc/lease`.

Why a chunk a manifest names is never deleted (the race of a worker that
found a chunk already present, then publishes a manifest naming it, while
GC decides it is garbage). Let M be a manifest naming chunk X, PUT at w by a
writer whose intent for X was written at a and whose check of `gc/lease`
found no sweep at b > a, and who confirmed X after b (step 5). Take any
sweep k, which took `gc/lease` at m_k and listed intents at g_k > m_k:
- m_k > b: then g_k > b > a. The intent is deleted only once the
  publication is over: after the head lists M (M was PUT before), or after
  the attempt failed (then M is PUT, if ever, by a later attempt with an
  intent and a check of `gc/lease` of its own, where this argument applies
  again). If sweep k's first listing showed the intent and it read it, it
  marked X; if the intent was gone when read, M was PUT before that read,
  so the next listing showed M and sweep k read it (step 3); if the
  listing did not show the intent, M was there before the listing reached
  `snapshots/` (listed after `intents/`). Either way it marked X, unless M
  was itself retired before being read, and then so was its successor's
  naming of X, found by the fixpoint in turn.
- m_k < b and sweep k still held the lease at b: impossible, the writer waits
  until it is released or expired, and a sweep stops deleting `margin`
  seconds before its lease expires on the server's clock (`vfsd.remote.lease`):
  every delete request of the sweep is given up before then (step 4).
- sweep k released its lease before b: all its deletions were done before b.
  If X was HEADed after b it was present after them. If X was confirmed by
  age instead (created by this writer at u with b - u < grace_floor / 2),
  sweep k had t0_k <= b and grace_k >= grace_floor, so it deleted only
  chunks last modified before t0_k - grace_k < u: not X.
- a sweep that ignored the intent because it was older than `INTENT_MAX_AGE`
  started more than `INTENT_MAX_AGE` after a, after M was PUT (the writer
  renews its intent past half that age), so it listed M and marked X.
And once M is listed by the head, retention deletes it only when no
retained manifest needs it (chains keep their ancestors), so every later
sweep marks X for as long as M is kept. Assumed, as for leases: the
server's clock does not jump, and a request a client gave up on does not
land on the server much later.

Shard threads: one run at a time, on any replica (`shardtier`, `vfsd.replicas`).
    A shard replica's store is a cache; a thread's truth is its record, its
    run's head and manifests (and the saver's checkpoints, which name
    snapshots by id). The run's lease (`runs/<run>/lease`, the same object,
    format and fencing as a run dir's) is held per graph run, not per mount:
      begin  1. read `threads/<key>` (create it, or revive a tombstone with a
                new run); refuse another thread id;
             2. take the run's lease, waiting up to `wait` for a holder's to be
                released (its run ended) or to lapse (it crashed);
             3. fence the head with the new generation (marking it the
                thread's; a head of another thread is refused);
             4. read the record again: if it no longer names this run (a delete
                or a new run came between 1 and 2), give the lease back, start over;
             5. make the local snapshot history exactly the head's (`history`):
                the unpublished tail of an earlier run here goes, snapshots
                retention retired elsewhere go, the head's snapshots the volume
                lacks are imported (metadata now, chunks on first read), all
                under their own seqs; then the live files are the head's latest
                snapshot (a volume of another run, or of a thread deleted since,
                is made again empty first);
             6. publish in the background while the run writes and snapshots.
      end    every local snapshot published, then the lease released (the next
             begin anywhere takes it at once). A run whose process exits without
             ending is ended by the shard (publishing for one TTL at most).
      delete take the run's lease (so no run of the thread is under way
             anywhere), fence, CAS the record to a tombstone, delete the run's
             objects (best effort: GC finishes), drop the local volume.
      copy   `copyrun`: a new run, the source's manifests written again under it
             (same seqs), its head, then the target's record (If-None-Match),
             after reading the source's record again; the source's lease and
             objects are only read.
    Why the bucket holds the lease rather than the saver's PostgreSQL: the
    fence that makes a lost lease harmless is a conditional write on the very
    objects a stale holder would overwrite (the head, with its generation), so
    the lease, its generation and the fenced objects must live in one store
    with one clock (expiry is judged on the object store's clock). A
    PostgreSQL row or advisory lock could say who runs a thread, but not stop
    a paused holder's late head write to the bucket; and vfsd runs without a
    saver (a run dir, `vfsd mount --from`) with the same protocol. One store
    to trust, one argument.
    Why one run at a time, and what a lost lease cannot do: a holder publishes
    only while its lease is valid, and every head write is a CAS naming the
    writer's generation; a replica that lost the lease without knowing it
    (paused, partitioned) fails its next head CAS once the successor fenced
    (step 3), so it never overwrites what the successor publishes, and its
    orphan manifests are replaced (generation order, "Publishing"). Why a
    deleted thread is never served again: a tombstone is written only by a
    holder of the run's lease; a begin reads the record again after taking
    the lease (step 4), so either the delete's lease came first and the begin
    sees the tombstone, or the begin holds the lease and the delete waits
    for its run to end. A tombstoned record is revived only with a new run,
    so an old run's objects are never read again, and GC may delete them.
    Why a copy never touches its source: it writes only under its new run and
    the target's key. Why snapshot ids mean the same files on every replica:
    a run's seqs are its head's; a local snapshot counts as the head's only
    when the head lists its seq with the same step and creation time and
    this volume recorded it published; every other is dropped or imported.
    Why an id never names two snapshots: a holder announces in its lease,
    before it takes a snapshot, the highest id it may use (`seq_floor`, a few
    ahead, so a snapshot seldom waits for the write; a snapshot that cannot be
    announced is refused), and writes the exact last id when it ends with
    everything published; a begin numbers its snapshots above the floor of
    the lease record it replaced. So a snapshot a crash kept from the head
    has an id no replica gives to other files.
    What a crash loses: the unpublished tail of the crashed run (snapshots
    not yet in the head, files never snapshotted), after at most
    `remote_lease_ttl` + 1 s (the lapse) before another replica runs the
    thread from what was published. A checkpointer that stores a checkpoint
    only once its snapshot is published (`publish="wait"`) loses no stored
    checkpoint's files; one that stores them ahead of publication loses those
    checkpoints' snapshots: restoring one says `not_found`, never other files.
    What a tenant of the prefix can and cannot do: it cannot make a replica
    serve another thread's files (the record's thread id, the head's run and
    thread, the manifests' run, seq, step, time and checksums are all
    checked), nor make GC delete another thread's run (a tombstone dooms only
    runs whose head names its own key, and no live record's run); it can
    delete or rewrite a thread (plant its tombstone, its manifests), as it
    could delete the thread's objects directly.

`<run>` is the volume's run id as the store keeps it (32 hex digits; see
`Store.run_id`); `check_run_id` accepts any id of 1-128 letters, digits, `._-`.

Names are fixed here; other modules call the functions below and never build
keys themselves.
"""
