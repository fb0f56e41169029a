"""Which paths eviction removed, and what to tell whoever asks for one.

The eviction log (`store.eventlog`) is keyed by sequence number; answering
"why is `out/report.txt` missing?" needs it by path. This index keeps, in
memory, the newest record's sequence number per evicted path (about as many
paths as the log keeps records), built from the log a batch at a time and brought up to
date before each question. It holds no record bodies: a question reads the
one record it needs.

A path is reported evicted only while nothing lives there: a file made again
at that path, or one brought back (`unevict`, `restore` of paths: its record
then says `restored_step`, and the index forgets it), is not.

`explain` is the one place the words are made: the file tools, `Mount.read_bytes`,
`.vfsd/evicted/PATH` and the control op `eviction` all say the same thing.
"""

from __future__ import annotations

import json
from collections import Counter

from vfsd import errors

#: records indexed per read transaction (the caller yields between batches)
BATCH = 512
#: paths held before those whose records the log trimmed are dropped (the log
#: keeps 10,000 records, so the index stays within about twice that)
INDEX_MAX = 12_000


def parent_dirs(path: str):
    """'a/b/c' -> 'a', 'a/b' (the directories a path lies in, not the root)."""
    parts = path.split("/")
    for n in range(1, len(parts)):
        yield "/".join(parts[:n])


class EvictedIndex:
    """Path -> newest eviction record, for one volume."""

    def __init__(self, store, snaps) -> None:
        self.store = store
        self.snaps = snaps
        self.seq_of: dict[str, int] = {}
        self.dirs: Counter = Counter()  # directory path -> indexed paths below it
        self.next_seq = 0

    # ----------------------------------------------------------- indexing

    def reset(self) -> None:
        """Forget everything: the next question builds the index again (after a
        whole-tree restore, which marks records restored in place)."""
        self.seq_of.clear()
        self.dirs.clear()
        self.next_seq = 0

    def _drop_trimmed(self) -> None:
        """Paths whose records the log trimmed away (it keeps EVICT_LOG_MAX)."""
        first = self.store.eviction_page(-1, 1)
        oldest = first[0][0] if first else self.next_seq
        for path in [p for p, s in self.seq_of.items() if s < oldest]:
            self._drop(path)

    def catch_up_batch(self) -> bool:
        """Index up to BATCH new records; True when current."""
        if len(self.seq_of) > INDEX_MAX:
            self._drop_trimmed()
        page = self.store.eviction_page(self.next_seq - 1, BATCH)
        for seq, raw in page:
            self.next_seq = seq + 1
            try:
                rec = json.loads(raw)
                path = rec["path"]
            except (ValueError, KeyError, TypeError):
                continue
            if not isinstance(path, str) or not path:
                continue
            if rec.get("restored_step") is not None:
                self._drop(path, seq)
            else:
                self._add(path, seq)
        return len(page) < BATCH

    def _add(self, path: str, seq: int) -> None:
        if path not in self.seq_of:
            self.dirs.update(parent_dirs(path))
        self.seq_of[path] = seq

    def _drop(self, path: str, seq: int | None = None) -> None:
        if path in self.seq_of and (seq is None or self.seq_of[path] <= seq):
            del self.seq_of[path]
            self.dirs.subtract(parent_dirs(path))
            for d in parent_dirs(path):
                if self.dirs[d] <= 0:
                    del self.dirs[d]

    def forget(self, paths) -> None:
        """Paths that are back (restored): no longer reported evicted."""
        for path in paths:
            self._drop(path)

    # ------------------------------------------------------------- asking

    def _record(self, seq: int) -> dict | None:
        page = self.store.eviction_page(seq - 1, 1)
        if not page or page[0][0] != seq:
            return None  # trimmed from the log since
        try:
            rec = json.loads(page[0][1])
        except ValueError:
            return None
        return rec if isinstance(rec, dict) and rec.get("restored_step") is None else None

    def _live(self, path: str) -> bool:
        try:
            self.store.resolve_path(path)
        except (errors.NotFound, errors.StoreError):
            return False
        return True

    def record(self, path: str, *, even_if_live: bool = False) -> dict | None:
        """The eviction record of `path` if it was evicted and nothing lives
        there now (`even_if_live`: whatever lives there)."""
        seq = self.seq_of.get(path)
        if seq is None or (not even_if_live and self._live(path)):
            return None
        return self._record(seq)

    def is_dir(self, path: str) -> bool:
        """True if evicted paths lie below `path` ('' is the root)."""
        return path == "" and bool(self.seq_of) or path in self.dirs

    def below(self, path: str, limit: int, *,
              even_if_live: bool = False) -> tuple[list[dict], int]:
        """(up to `limit` records of evicted files below `path`, how many there are),
        newest first; files that live again are left out."""
        prefix = f"{path}/" if path else ""
        seqs = sorted((s for p, s in self.seq_of.items() if p.startswith(prefix)), reverse=True)
        out = []
        total = 0
        for seq in seqs:
            rec = self._record(seq)
            if rec is None or (not even_if_live and self._live(rec["path"])):
                continue
            total += 1
            if len(out) < limit:
                out.append(rec)
        return out, total

    def children(self, path: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of the entries right below `path` in the view."""
        prefix = f"{path}/" if path else ""
        names: dict[str, bool] = {}
        for p in self.seq_of:
            if p.startswith(prefix):
                name, sep, _ = p[len(prefix):].partition("/")
                names[name] = names.get(name, False) or bool(sep)
        return sorted(names.items())

    # ------------------------------------------------------------- words

    def where(self, rec: dict) -> dict | None:
        """{"id", "path"} of a retained snapshot holding the evicted version, or None."""
        try:
            return self.snaps.locate(int(rec["ino"]), int(rec["gen"]), bytes.fromhex(rec["hash"]))
        except (KeyError, TypeError, ValueError):
            return None

    def holder(self, rec: dict) -> str | None:
        """The id of a retained snapshot that holds the evicted version, or None."""
        found = self.where(rec)
        return found["id"] if found else None

    def explain(self, rec: dict) -> dict:
        """`rec` with `snapshot` (who holds it, or None) and `message` (what to say)."""
        snap = self.holder(rec)
        return {**rec, "snapshot": snap, "message": describe(rec, snap)}


def describe(rec: dict, snapshot: str | None) -> str:
    """'evicted at step 5 (max_age, written at step 0); snapshot s3 holds it: ...'."""
    path = rec.get("path", "")
    text = (f"evicted at step {rec.get('evicted_step')} ({rec.get('reason')}, "
            f"written at step {rec.get('step')})")
    if snapshot:
        return (f"{text}; snapshot {snapshot} holds it: `vfsd unevict RUN {path}` "
                f"(Mount.unevict) brings it back")
    return f"{text}; no retained snapshot holds it, so its content is gone"
