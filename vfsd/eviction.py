"""Eviction: which files leave, and when, measured in agent steps.

A regular file is evicted when it is `done` and older than
`done_retention_steps`, or older than `max_age_steps`, unless pinned; past
`quota_bytes` or `max_files`, the oldest unpinned files go first. Age is the
current step minus the step of the file's last change. Every decision comes
from range scans of the store's step indexes, so the cost follows what is
evicted, not how many files exist.

A file open anywhere (a program's descriptor or mapping, or the daemon's own
handle while it settles hot blocks) is never evicted: it is deferred, listed
as such in the report and the log, and reconsidered when its last handle
goes (`run_rechecks`). Removing the name of a file being written would send
every later write into an inode nobody can reach again.
"""

from __future__ import annotations

import math
import time

import pyfuse3
import structlog
import trio

from vfsd.store.inode import STATUS_DONE, STATUS_NAMES

from . import errors
from .config import Config
from .latency import Latency

log = structlog.get_logger("vfsd.eviction")

#: reasons reconsidered when a deferred file closes (the limits are looked at
#: again by the next write that needs room)
RECHECKED = frozenset({"done", "max_age"})


def explain(inode, step: int, config: Config) -> dict:
    """The rule that will evict a regular file, and at which step, by the policy
    alone (`vfsd info`): a quota may take it earlier, an open file later."""
    if inode.pinned:
        return {"rule": "pinned", "due_step": None, "text": "pinned: never evicted"}
    age = step - inode.step
    due = [("max_age", inode.step + config.max_age_steps + 1,
            f"max age: leaves when older than {config.max_age_steps} steps")]
    if inode.status == STATUS_DONE:
        due.append(("done", inode.step + config.done_retention_steps + 1,
                    f"done: leaves when older than {config.done_retention_steps} steps"))
    rule, at, text = min(due, key=lambda d: d[1])
    return {"rule": rule, "due_step": at, "age_steps": age,
            "text": f"{text} (at step {at}, {max(at - step, 0)} from now)"
            + ("; a quota may take it sooner" if config.quota_bytes or config.max_files else "")}


class Evictor:
    """Plans and applies evictions for one mounted volume."""

    def __init__(self, store, ops, config: Config) -> None:
        self.store = store
        self.ops = ops
        self.files = ops.files
        self.config = config
        self.evicted_total = 0
        self.enospc_total = 0
        self.latency = Latency()  # eviction passes that removed (or looked for) files
        # (parent, name, ino) in FUSE numbering, for names removed by eviction.
        self.pending_invalidations: list[tuple[int, bytes, int]] = []
        # Called after the step advances (snapshot retention by age).
        self.after_step = None
        # ino -> reason, for files that were due but open: reconsidered at
        # their last close (`closed`, `run_rechecks`).
        self.deferred: dict[int, str] = {}
        self.deferred_total = 0
        self._recheck_send, self._recheck_recv = trio.open_memory_channel(math.inf)
        ops.on_last_close = self.closed

    # ------------------------------------------------------------ planning

    def plan(self, step: int, *, extra_bytes: int = 0, extra_files: int = 0,
             exclude: int | None = None) -> list[tuple[int, str]]:
        """[(ino, reason)] that policy removes at `step`, oldest first."""
        cfg = self.config
        victims: dict[int, str] = {}
        for _, ino in self.store.scan_index("donestep", before_step=step - cfg.done_retention_steps):
            victims[ino] = "done"
        for _, ino in self.store.scan_index("agestep", before_step=step - cfg.max_age_steps):
            victims.setdefault(ino, "max_age")
        victims.pop(exclude, None)
        if cfg.quota_bytes is not None or cfg.max_files is not None:
            self._plan_limits(victims, extra_bytes, extra_files, exclude)
        return list(victims.items())

    def _plan_limits(self, victims: dict[int, str], extra_bytes: int, extra_files: int,
                     exclude: int | None) -> None:
        cfg = self.config
        counters = self.store.counters()
        used = self.usage(counters) + extra_bytes
        nfiles = counters["files"] + extra_files
        open_files = self.files.files
        for ino in victims:
            if ino not in open_files:  # an open file stays: it frees nothing now
                used -= self._frees(ino)
                nfiles -= 1

        def over_quota() -> bool:
            return cfg.quota_bytes is not None and used > cfg.quota_bytes

        def over_files() -> bool:
            return cfg.max_files is not None and nfiles > cfg.max_files

        if not (over_quota() or over_files()):
            return
        for _, ino in self.store.iter_index("agestep"):
            if ino in victims or ino == exclude or ino in open_files:
                continue
            frees = self._frees(ino)
            if not over_files() and frees == 0:
                continue  # over the quota only: a file that frees nothing stays
            victims[ino] = "quota" if over_quota() else "max_files"
            used -= frees
            nfiles -= 1
            if not (over_quota() or over_files()):
                return

    def _frees(self, ino: int) -> int:
        """Bytes the quota gets back when `ino` goes: its content and its xattrs."""
        return self.files.attrs(ino).size + self.store.xattr_bytes(ino)

    def usage(self, counters: dict | None = None) -> int:
        """Bytes the quota counts: file content (writes still buffered
        included) and extended attributes."""
        counters = counters or self.store.counters()
        pending = sum(max(of.inode.size - of.committed_size, 0)
                      for of in self.files.files.values())
        return counters["logical_bytes"] + counters["xattr_bytes"] + pending

    # ------------------------------------------------------------ applying

    def run(self, step: int | None = None, *, dry_run: bool = False,
            extra_bytes: int = 0, extra_files: int = 0, exclude: int | None = None) -> dict:
        """Evict what policy says at `step` (default: the current step); a report.

        Open files are left alone and listed under `deferred`.
        """
        t0 = time.perf_counter()
        current = self.store.get_step()
        step = current if step is None else step
        plan = self.plan(step, extra_bytes=extra_bytes, extra_files=extra_files,
                         exclude=exclude)
        open_files = self.files.files
        due = [(ino, reason) for ino, reason in plan if ino not in open_files]
        held = [(ino, reason) for ino, reason in plan if ino in open_files]
        records = self._apply(due, step, dry_run)
        deferred = [self._deferral(ino, reason) for ino, reason in held]
        if not dry_run:
            for ino, reason in held:
                if reason in RECHECKED:
                    self.deferred[ino] = reason
            self.deferred_total += len(held)
        report = {
            "step": step, "dry_run": dry_run, "evicted": records, "files": len(records),
            "bytes": sum(r["size"] for r in records), "deferred": deferred,
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3),
        }
        if not dry_run:
            self.latency.observe(time.perf_counter() - t0)
            if records:
                self.ops.journal.files_evicted(records)
        if records:
            log.info("evicted", step=step, dry_run=dry_run, files=len(records),
                     bytes=report["bytes"], duration_ms=report["duration_ms"])
        if deferred:
            log.info("eviction_deferred", step=step, dry_run=dry_run, files=len(deferred),
                     why="open", paths=[d["path"] for d in deferred[:20]])
        return report

    def _apply(self, victims: list[tuple[int, str]], step: int, dry_run: bool) -> list[dict]:
        """Eviction records for closed files `victims`; removed unless `dry_run`."""
        facts = self.store.eviction_facts([ino for ino, _ in victims])
        records = []
        for ino, reason in victims:
            inode, path, digest = facts[ino]
            records.append({
                "path": path, "ino": ino, "gen": inode.gen, "hash": digest.hex(),
                "size": inode.size, "step": inode.step, "evicted_step": step,
                "reason": reason, "status": STATUS_NAMES[inode.status],
            })
        if not dry_run and records:
            removed = self.store.evict([(r["ino"], r) for r in records])
            self._tell_kernel(removed)
            self.evicted_total += len(records)
        return records

    def _deferral(self, ino: int, reason: str) -> dict:
        """What the report says of a due file left alone because it is open."""
        inode = self.files.attrs(ino)
        of = self.files.get(ino)
        return {"path": self.store.path_of(ino) or "", "ino": ino, "reason": reason,
                "size": inode.size, "step": inode.step, "why": "open",
                "handles": of.handles if of is not None else 0}

    # ------------------------------------------------------- deferred files

    def deferred_paths(self, limit: int) -> list[str]:
        """Paths of the files waiting for their last close, at most `limit`."""
        return sorted(self.store.path_of(ino) or f"#{ino}"
                      for ino in list(self.deferred)[:limit])

    def closed(self, ino: int) -> None:
        """The last handle of `ino` went (called by the FUSE layer)."""
        if ino in self.deferred:
            self._recheck_send.send_nowait(ino)

    def recheck(self, inos: set[int]) -> dict:
        """Evict the deferred files among `inos` that are closed and still due."""
        step = self.store.get_step()
        victims = []
        for ino in sorted(inos):
            if ino in self.files.files or ino not in self.deferred:
                continue  # opened again meanwhile: its next close brings it back
            self.deferred.pop(ino)
            reason = self._due(ino, step)
            if reason is not None:
                victims.append((ino, reason))
        records = self._apply(victims, step, dry_run=False)
        if records:
            log.info("evicted", step=step, files=len(records),
                     bytes=sum(r["size"] for r in records), after_close=True,
                     paths=[r["path"] for r in records[:20]])
        return {"step": step, "evicted": records}

    def _due(self, ino: int, step: int) -> str | None:
        """The reason the policy evicts `ino` at `step`, or None."""
        try:
            inode = self.store.get_inode(ino)
        except errors.NotFound:
            return None
        if not inode.is_reg or inode.nlink == 0 or inode.pinned:
            return None
        cfg = self.config
        age = step - inode.step
        if inode.status == STATUS_DONE and age > cfg.done_retention_steps:
            return "done"
        if age > cfg.max_age_steps:
            return "max_age"
        return None

    async def run_rechecks(self) -> None:
        """The background task: deferred files are reconsidered once closed."""
        async for ino in self._recheck_recv:
            batch = {ino}
            while True:
                try:
                    batch.add(self._recheck_recv.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                self.recheck(batch)
            except errors.StoreError as exc:  # a full disk: the next step advance retries
                log.warning("recheck_failed", error=str(exc), files=len(batch))
            pending = self.take_invalidations()
            if pending:
                await trio.to_thread.run_sync(self.invalidate_now, pending)

    def _tell_kernel(self, removed: list[tuple[int, list[tuple[int, bytes]]]]) -> None:
        """Queue kernel invalidations for removed names; free what nobody uses."""
        fuse_ino = self.ops._fuse_ino
        for ino, names in removed:
            of = self.files.get(ino)
            if of is not None:
                of.inode.nlink = 0
            for parent, name in names:
                self.pending_invalidations.append((fuse_ino(parent), name, fuse_ino(ino)))
        self.ops._maybe_free(*(ino for ino, _ in removed))

    def take_invalidations(self) -> list[tuple[int, bytes, int]]:
        pending, self.pending_invalidations = self.pending_invalidations, []
        return pending

    @staticmethod
    def invalidate_now(pending: list[tuple[int, bytes, int]]) -> None:
        """Tell the kernel and wait for it; run in a worker thread, never in a handler."""
        for parent, name, ino in pending:
            try:
                pyfuse3.invalidate_entry(parent, name, deleted=ino)
            except OSError:
                pass  # not in the kernel's cache: nothing to drop

    def set_step(self, step: int) -> dict:
        current = self.store.get_step()
        if step < current:
            raise errors.InvalidArgument(f"step {step} is before the current step {current}")
        self.ops.journal.advance(step)  # the record of the step that ends (timeline)
        self.store.set_step(step)
        report = self.run(step)
        if self.after_step is not None:
            report["snapshots_deleted"] = self.after_step()
        return report

    # --------------------------------------------------------------- quota

    def limits(self) -> tuple[int | None, int, int | None]:
        """(quota bytes, bytes used, max files) for statfs."""
        return self.config.quota_bytes, self.usage(), self.config.max_files

    def reserve(self, grow: int, ino: int | None = None) -> None:
        """Make room for `grow` more bytes, evicting if needed; NoSpace if impossible."""
        quota = self.config.quota_bytes
        if quota is None or grow <= 0:
            return
        if self.usage() + grow <= quota:
            return
        self.run(extra_bytes=grow, exclude=ino)
        if self.usage() + grow > quota:
            self.enospc_total += 1
            log.warning("quota_exceeded", quota_bytes=quota, usage=self.usage(), needed=grow,
                        ino=ino)
            raise errors.NoSpace(f"quota of {quota} bytes exceeded")

    def reserve_file(self) -> None:
        """Make room for one more file under max_files."""
        limit = self.config.max_files
        if limit is None:
            return
        if self.store.counters()["files"] < limit:
            return
        self.run(extra_files=1)
        if self.store.counters()["files"] >= limit:
            self.enospc_total += 1
            log.warning("max_files_exceeded", max_files=limit)
            raise errors.NoSpace(f"max_files limit of {limit} reached")
