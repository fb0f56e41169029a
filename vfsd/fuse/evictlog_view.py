"""`.vfsd/evicted.ndjson` as a file served page by page, never rendered whole.

The eviction log holds up to 10,000 records per volume; rendering all of them
for every open (and every stat, to know the size) cost about 1 MB and 140 ms
of the FUSE loop each time. This view keeps instead, for the records it has
seen, only their sequence numbers and where each one's line ends in the file
(two 8-byte numbers a record: at most ~160 KB), and renders on read only the
records a read covers.

Offsets are "absolute": they count from the first record this daemon saw and
never move, so a handle keeps reading the same bytes while the log grows at
the end and is trimmed at the front. A handle sees the log as it was when it
was opened; records trimmed away under an open handle read as end of file.

The log is read straight from LMDB with the key layout documented in
`vfsd/store/store.py` (`evicted`: vol u32 + seq u64 -> JSON record), read-only, one
short read transaction per batch (`Store.eviction_page`).
"""

from __future__ import annotations

import json
import struct
from array import array
from bisect import bisect_left, bisect_right

_VOL_SEQ = struct.Struct(">IQ")
#: records indexed per read transaction (the caller yields between batches)
BATCH = 512


def render_record(raw: bytes) -> bytes:
    """The ndjson line of one stored record (the same bytes every time)."""
    try:
        return json.dumps(json.loads(raw)).encode() + b"\n"
    except (ValueError, UnicodeDecodeError, RecursionError):
        return b'{"error": "unreadable eviction record"}\n'


def _scan(store, from_seq: int, limit: int) -> list[tuple[int, bytes]]:
    """Up to `limit` (seq, raw record) of this volume from `from_seq` on."""
    return store.eviction_page(from_seq - 1, limit)


class EvictionLogView:
    """The eviction log of one volume as a growing, front-trimmed byte stream."""

    def __init__(self, store) -> None:
        self.store = store
        self.seqs = array("Q")  # sequence numbers of the indexed records, ascending
        self.ends = array("Q")  # absolute offset where each one's line ends
        self.start = 0  # absolute offset where the first indexed record begins
        self.end = 0  # absolute offset after the last indexed record

    # ----------------------------------------------------------- indexing

    def catch_up_batch(self) -> bool:
        """Index up to BATCH new records and drop trimmed ones; True when current."""
        next_seq = self.seqs[-1] + 1 if self.seqs else 0
        first = _scan(self.store, 0, 1)
        self._drop_before(first[0][0] if first else next_seq)
        batch = _scan(self.store, next_seq, BATCH)
        for seq, raw in batch:
            self.end += len(render_record(raw))
            self.seqs.append(seq)
            self.ends.append(self.end)
        return len(batch) < BATCH

    def _drop_before(self, seq: int) -> None:
        k = bisect_left(self.seqs, seq)
        if k:
            self.start = self.ends[k - 1]
            del self.seqs[:k]
            del self.ends[:k]

    def span(self) -> tuple[int, int]:
        """(start, end) absolute offsets of the log as indexed now."""
        return self.start, self.end

    # ------------------------------------------------------------ reading

    def read(self, start: int, end: int, off: int, size: int) -> bytes:
        """`size` bytes at file offset `off` of the snapshot [start, end)."""
        lo = start + off
        hi = min(lo + size, end)
        if lo >= hi or lo < self.start:
            return b""  # past the end, or trimmed from the log since the open
        first = bisect_right(self.ends, lo)
        last = bisect_left(self.ends, hi)
        if first >= len(self.seqs):
            return b""
        want = self.seqs[first:last + 1]
        records = _scan(self.store, want[0], len(want))
        rec_start = self.ends[first - 1] if first else self.start
        parts = []
        for expected, (seq, raw) in zip(want, records, strict=False):
            if seq != expected:
                break  # trimmed meanwhile: end of file here
            parts.append(render_record(raw))
        data = b"".join(parts)
        return data[lo - rec_start:hi - rec_start]
