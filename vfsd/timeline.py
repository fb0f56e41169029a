"""The run's timeline: what each step did to the files, who did it, what was kept.

Built from what the store keeps, so it works on an unmounted run dir: the
step log (`vfsd.store.steplog`, written by the daemon's journal: one record
per stretch of a step, in the order things happened, so a restore that took
the run back shows as the step going back) and the retained snapshots with
their labels (VfsdCheckpointer labels each with its checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable

from vfsd.snapshots.snapshots import snapshot_id

#: the fields of a step record the timeline passes on as they are
_FIELDS = ("seq", "step", "first_ns", "last_ns", "files", "logical_bytes", "stored_bytes",
           "created", "created_paths", "changed", "changed_paths", "deleted",
           "deleted_paths", "evicted", "evicted_paths", "restores")


def timeline(store, snaps, *, describe_call: Callable[[int], dict | None]) -> dict:
    """The timeline document (`vfsd timeline --json`)."""
    labels = {snapshot_id(s["seq"]): s.get("label", "") for s in snaps.list()}
    steps = []
    for rec in store.step_records():
        entry = {key: rec.get(key) for key in _FIELDS}
        entry["snapshots"] = [{"id": i, "label": labels.get(i), "retained": i in labels}
                              for i in rec.get("snapshots", [])]
        entry["calls"] = [{"call": describe_call(int(key, 16)), **counts}
                          for key, counts in rec.get("calls", {}).items()]
        steps.append(entry)
    c = store.counters()
    return {"run": store.run_id, "volume": store.volume, "step": c["step"],
            "files": c["files"], "logical_bytes": c["logical_bytes"],
            "stored_bytes": c["blob_bytes"] + c["chunk_bytes"], "steps": steps}
