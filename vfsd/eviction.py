"""Eviction: which files leave, and when, measured in agent steps.

A regular file is evicted when it is `done` and older than
`done_retention_steps`, or older than `max_age_steps`, unless pinned (itself,
a directory above it, or a rule); past `quota_bytes` or `max_files`, the
oldest unpinned files go first. Age is the current step minus the step of the
file's last use: its last write or open (`age_from = "use"`, the default), or
its last write (`"written"`). Opens are recorded in memory and written by the
next pass (`flush_uses`), never one transaction per read.

Ordered rules by path (`vfsd.evictrules`) set the limits or a pin of the files
they match, the first match wins: the user's rules, then the built-in ones
(records an agent framework keeps, pinned), the global policy last. A quota
never takes a pinned file: when only such files (records among them) are
left to take, the write that needs the room is refused with ENOSPC, and the
refusal (`refusal`: the log, `vfsd status`) says what held the room. A unit
(`vfsd.evictscope`: a git work tree, a virtualenv, a directory marked so) is
evicted whole or not at all, by quota too: it goes when every file of it is
due, so its age is its youngest file's, and one open file defers it all.
When it goes, its directories and other entries go too (`remove_unit_rest`).

Every pass starts from range scans of the store's step indexes bounded by
the lowest limit any rule sets, so the cost follows what is due (and what the
rules keep), not how many files exist.

A file open anywhere (a program's descriptor or mapping, or the daemon's own
handle while it settles hot blocks) is never evicted: it is deferred, listed
as such in the report and the log, and reconsidered when its last handle
goes (`run_rechecks`). Removing the name of a file being written would send
every later write into an inode nobody can reach again.
"""

from __future__ import annotations

import math
import time

import structlog
import trio

from vfsd.store.inode import STATUS_DONE, STATUS_NAMES

from . import errors
from .config import Config
from .evictrules import Rule, RuleSet, volume_rules
from .evictscope import Scope
from .latency import Latency

log = structlog.get_logger("vfsd.eviction")

#: reasons reconsidered when a deferred file closes (the limits are looked at
#: again by the next write that needs room)
RECHECKED = frozenset({"done", "max_age"})
#: recorded opens written per transaction by an eviction pass made in steps
USES_BATCH = 1000


def explain(inode, step: int, config: Config, *, path: str | None = None,
            scope: Scope | None = None) -> dict:
    """The rule that will evict a regular file, and at which step, by the policy
    alone (`vfsd info`): a quota may take it earlier, an open file later, and
    the unit it belongs to (said under `unit`) only with the rest of it."""
    policy = Policy(config)
    facts = scope.file_facts(inode.ino) if scope is not None else None
    if path is None and facts is not None:
        path = facts[0]
    rule = policy.rules.match(path) if path is not None and policy.rules else None
    where = {"rule_index": rule.index, "rule_path": rule.path} if rule else {}
    if facts is not None and facts[1].unit is not None:
        unit = scope.dir_facts(facts[1].unit)
        where["unit"] = unit.path if unit is not None else None
    if inode.pinned or (facts is not None and facts[1].pinned) or (rule and rule.pin):
        by = "the file" if inode.pinned else "a directory above it" \
            if facts is not None and facts[1].pinned else rule.describe()
        return {"rule": "pinned", "due_step": None, "text": f"pinned ({by}): never evicted",
                **where}
    max_age, retention = policy.limits(rule)
    since = policy.since(inode)
    age = step - since
    due = [("max_age", since + max_age + 1,
            f"max age: leaves when older than {max_age} steps")]
    if inode.status == STATUS_DONE:
        due.append(("done", since + retention + 1,
                    f"done: leaves when older than {retention} steps"))
    name, at, text = min(due, key=lambda d: d[1])
    return {"rule": name, "due_step": at, "age_steps": age, "age_from": config.age_from,
            "text": f"{text} (at step {at}, {max(at - step, 0)} from now)"
            + ("; a quota may take it sooner" if config.quota_bytes or config.max_files else "")
            + ("; only with the rest of its unit" if "unit" in where else ""),
            **where}


class Policy:
    """The global limits, the rules by path, and what age counts from."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.rules = RuleSet(volume_rules(config.eviction_rules, config.builtin_eviction_rules))
        self.from_use = config.age_from == "use"

    def since(self, inode) -> int:
        """The step a file's age counts from."""
        return inode.use_step if self.from_use else inode.step

    def limits(self, rule: Rule | None) -> tuple[int, int]:
        """(max_age_steps, done_retention_steps) under `rule` (None: the global ones)."""
        cfg = self.config
        if rule is None:
            return cfg.max_age_steps, cfg.done_retention_steps
        return (cfg.max_age_steps if rule.max_age_steps is None else rule.max_age_steps,
                cfg.done_retention_steps if rule.done_retention_steps is None
                else rule.done_retention_steps)

    def reason(self, inode, step: int, rule: Rule | None) -> str | None:
        """Why the policy evicts a closed, unpinned file at `step`, or None."""
        max_age, retention = self.limits(rule)
        age = step - self.since(inode)
        if inode.status == STATUS_DONE and age > retention:
            return "done"
        if age > max_age:
            return "max_age"
        return None


class HeldBack:
    """What a quota pass passed over: records a built-in rule keeps (inos by
    rule), other pinned files (and units) and open files (counts)."""

    __slots__ = ("records", "pinned", "open")

    def __init__(self) -> None:
        self.records: dict[Rule, list[int]] = {}
        self.pinned = 0
        self.open = 0


class UnitMembers:
    """A unit's regular files [(ino, path, inode)], and whether a pin keeps it."""

    __slots__ = ("path", "files", "kept")

    def __init__(self, path: str, files: list, kept: bool) -> None:
        self.path, self.files, self.kept = path, files, kept


def _rule_fields(rule: Rule | None) -> dict:
    """What an eviction record adds when a rule by path decided it."""
    return {"rule_index": rule.index, "rule_path": rule.path} if rule is not None else {}


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
        #: awaited before a background recheck (the volume's: waits while it is held)
        self.gate = None
        # What the last quota pass could not take, and the last ENOSPC refusal
        # of the quota or max_files (None once a write that needed room got it).
        self.held = HeldBack()
        self.refusal: dict | None = None
        # ino -> reason, for files that were due but open: reconsidered at
        # their last close (`closed`, `run_rechecks`).
        self.deferred: dict[int, str] = {}
        self.deferred_total = 0
        self._recheck_send, self._recheck_recv = trio.open_memory_channel(math.inf)
        ops.on_last_close = self.closed
        self.policy = Policy(config)
        # ino -> the step it was last opened, not in the store yet (`flush_uses`)
        self.opened_at: dict[int, int] = {}
        ops.on_open = self.opened

    # ------------------------------------------------------------ last use

    def opened(self, ino: int) -> None:
        """A program opened `ino` (called by the FUSE layer on every open).

        Kept in memory and folded into the store by the next pass
        (`flush_uses`): a read costs no write transaction.
        """
        if not self.policy.from_use:
            return
        step = self.store.get_step()
        of = self.files.get(ino)
        if of is not None and of.inode.used < step:
            of.inode.used = step
        if self.opened_at.get(ino, -1) < step:
            self.opened_at[ino] = step

    def flush_uses(self) -> int:
        """Write the recorded opens to the store, in one transaction; how many changed."""
        if not self.opened_at:
            return 0
        marks, self.opened_at = self.opened_at, {}
        return self._fold_uses(marks)

    def _flush_uses_in_steps(self):
        """`flush_uses`, USES_BATCH opens per transaction (a generator: yields
        between them). An open stays in `opened_at` until its batch is written,
        so `used_step` counts it meanwhile."""
        pending = list(self.opened_at)
        for i in range(0, len(pending), USES_BATCH):
            batch = [ino for ino in pending[i:i + USES_BATCH] if ino in self.opened_at]
            self._fold_uses({ino: self.opened_at[ino] for ino in batch})
            for ino in batch:
                del self.opened_at[ino]
            yield

    def _fold_uses(self, marks: dict[int, int]) -> int:
        changed = self.store.mark_used(marks)
        for inode in changed:
            of = self.files.get(inode.ino)
            if of is not None and of.inode.used < inode.used:
                of.inode.used = inode.used
        return len(changed)

    def used_step(self, inode) -> int:
        """The last step `inode` was written or opened, opens not yet stored included."""
        return max(inode.use_step, self.opened_at.get(inode.ino, 0))

    # ------------------------------------------------------------ planning

    def plan(self, step: int, *, extra_bytes: int = 0, extra_files: int = 0,
             exclude: int | None = None) -> list[tuple[int, str]]:
        """[(ino, reason)] that policy removes at `step`, oldest first (open
        files included: `run` defers them)."""
        decided = self._judge(step, extra_bytes, extra_files, exclude)
        return [(ino, reason) for ino, (reason, _, _) in decided.items()]

    def _judge(self, step: int, extra_bytes: int, extra_files: int,
               exclude: int | None) -> dict[int, tuple[str, dict, bool]]:
        """ino -> (reason, extra record fields, held: it or a file of its unit is open)."""
        steps = self._judge_in_steps(step, extra_bytes, extra_files, exclude, None)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            return done.value

    def _judge_in_steps(self, step: int, extra_bytes: int, extra_files: int,
                        exclude: int | None, budget: float | None):
        """`_judge`, yielding every `budget` seconds of work (None: never)."""
        if budget is None:
            self.flush_uses()
        else:  # 20,000 opens in one transaction held every thread of a shard ~0.1 s
            yield from self._flush_uses_in_steps()
        cfg, rules = self.config, self.policy.rules
        scope = Scope(self.store)
        decided: dict[int, tuple[str, dict, bool]] = {}
        seen: set[int] = set() if exclude is None else {exclude}
        # The lowest limit any rule sets bounds the scan; each candidate is
        # then judged by its own rule.
        retention = rules.lowest("done_retention_steps", cfg.done_retention_steps)
        max_age = rules.lowest("max_age_steps", cfg.max_age_steps)
        started = time.perf_counter()
        for index, before in (("donestep", step - retention), ("agestep", step - max_age)):
            found = [ino for _, ino in self.store.scan_index(index, before_step=before)]
            for i in range(0, len(found), 256):
                part = found[i:i + 256]
                placed = self.store.placed(ino for ino in part if ino not in seen)
                for ino in part:
                    if ino not in seen:
                        self._consider(ino, step, scope, decided, seen, placed.get(ino))
                if budget is not None and time.perf_counter() - started > budget:
                    yield
                    started = time.perf_counter()
        if cfg.quota_bytes is not None or cfg.max_files is not None:
            self._plan_limits(decided, scope, extra_bytes, extra_files, exclude)
        return decided

    def _consider(self, ino: int, step: int, scope: Scope, decided: dict, seen: set[int],
                  placed: tuple | None = None) -> None:
        """Judge one candidate (its whole unit, if it is in one); `placed` is
        its (inode, parent, name) when the caller read it already."""
        seen.add(ino)
        if placed is None:
            try:
                inode = self.files.attrs(ino)
            except errors.NotFound:
                return
            facts = scope.file_facts(ino)
        else:
            inode = placed[0]
            if ino in self.files.files:
                inode = self.files.attrs(ino)  # newer than the store while open
            facts = scope.placed_at(placed[1], placed[2])
        if not inode.is_reg or inode.nlink == 0 or facts is None:
            return
        path, where = facts
        if where.unit is not None:
            self._consider_unit(where.unit, step, scope, decided, seen)
            return
        if inode.pinned or where.pinned:
            return
        rule = self.policy.rules.match(path) if self.policy.rules else None
        if rule is not None and rule.pin:
            return
        reason = self.policy.reason(inode, step, rule)
        if reason is not None:
            decided[ino] = (reason, {"path": path, **_rule_fields(rule)},
                            ino in self.files.files)

    def _consider_unit(self, unit: int, step: int, scope: Scope,
                       decided: dict, seen: set[int]) -> None:
        """A unit goes when every file of it is due, none pinned; held if one is open."""
        members = self._unit_members(unit, scope)
        seen.update(ino for ino, _, _ in members.files)
        if members.kept:
            return
        verdicts = {}
        for ino, path, inode in members.files:
            rule = self.policy.rules.match(path) if self.policy.rules else None
            reason = self.policy.reason(inode, step, rule)
            if reason is None:
                return  # its youngest file keeps it
            verdicts[ino] = (reason, {"path": path, **_rule_fields(rule), "unit": members.path,
                                      "unit_ino": unit})
        held = any(ino in self.files.files for ino in verdicts)
        for ino, (reason, extra) in verdicts.items():
            decided[ino] = (reason, extra, held)

    def _unit_members(self, unit: int, scope: Scope) -> UnitMembers:
        """The regular files of a unit, and whether anything keeps it whole (cached per pass)."""
        got = scope.units.get(unit)
        if got is not None:
            return got
        facts = scope.dir_facts(unit)
        path = facts.path if facts is not None else ""
        kept = facts is None or facts.pinned
        files = []
        for rel, inode in self.store.subtree(unit):
            if inode.pinned:
                kept = True  # a pinned file or directory keeps its unit whole
            if not inode.is_reg or inode.nlink == 0:
                continue
            inode = self.files.attrs(inode.ino) if inode.ino in self.files.files else inode
            full = f"{path}/{rel}" if path else rel
            rule = self.policy.rules.match(full) if self.policy.rules else None
            if rule is not None and rule.pin:
                kept = True
            files.append((inode.ino, full, inode))
        got = scope.units[unit] = UnitMembers(path, files, kept)
        return got

    def _plan_limits(self, decided: dict, scope: Scope, extra_bytes: int, extra_files: int,
                     exclude: int | None) -> None:
        cfg = self.config
        held = self.held = HeldBack()
        counters = self.store.counters()
        used = self.usage(counters) + extra_bytes
        nfiles = counters["files"] + extra_files
        open_files = self.files.files
        for ino, (_, _, held) in decided.items():
            if not held:  # an open file (or its unit) stays: it frees nothing now
                used -= self._frees(ino)
                nfiles -= 1

        def over_quota() -> bool:
            return cfg.quota_bytes is not None and used > cfg.quota_bytes

        def over_files() -> bool:
            return cfg.max_files is not None and nfiles > cfg.max_files

        if not (over_quota() or over_files()):
            return
        for _, ino in self.store.iter_index("agestep"):
            if ino in decided or ino == exclude:
                continue
            if ino in open_files:
                held.open += 1
                continue
            group = self._quota_group(ino, scope, exclude, held)
            if not group:
                continue
            frees = sum(self._frees(i) for i, _ in group)
            if not over_files() and frees == 0:
                continue  # over the quota only: a file that frees nothing stays
            reason = "quota" if over_quota() else "max_files"
            for i, extra in group:
                decided[i] = (reason, extra, False)
            used -= frees
            nfiles -= len(group)
            if not (over_quota() or over_files()):
                return

    def _quota_group(self, ino: int, scope: Scope, exclude: int | None,
                     held: HeldBack) -> list | None:
        """What a quota must take to take `ino`: the file, or its whole unit;
        None if a pin (of the file, a directory, a rule) or an open file keeps
        it, counted in `held`."""
        facts = scope.file_facts(ino)
        if facts is None:
            return None
        path, where = facts
        if where.pinned:
            held.pinned += 1
            return None
        if where.unit is not None:
            members = self._unit_members(where.unit, scope)
            inos = [i for i, _, _ in members.files]
            if members.kept:
                held.pinned += 1
                return None
            if any(i in self.files.files for i in inos):
                held.open += 1
                return None
            if exclude in inos:
                return None
            return [(i, {**_rule_fields(self.policy.rules.match(p) if self.policy.rules
                                        else None), "unit": members.path,
                         "unit_ino": where.unit})
                    for i, p, _ in members.files]
        rule = self.policy.rules.match(path) if self.policy.rules else None
        if rule is not None and rule.pin:
            if rule.builtin:
                held.records.setdefault(rule, []).append(ino)
            else:
                held.pinned += 1
            return None
        return [(ino, _rule_fields(rule))]

    def _frees(self, ino: int) -> int:
        """Bytes the quota gets back when `ino` goes: its content and its xattrs."""
        return self.files.attrs(ino).size + self.store.xattr_bytes(ino)

    def usage(self, counters: dict | None = None) -> int:
        """Bytes the quota counts: file content (writes still buffered
        included) and extended attributes, of files with a name and of those
        whose last name went while something still holds them (until freed)."""
        counters = counters or self.store.counters()
        pending = sum(max(of.inode.size - of.committed_size, 0)
                      for of in self.files.files.values())
        return (counters["logical_bytes"] + counters["xattr_bytes"]
                + counters["orphan_bytes"] + pending)

    def unlinked_usage(self) -> int:
        """What of `usage` is held by files with no name left (open, or held
        by the kernel): content, buffered writes included, and xattrs."""
        pending = sum(max(of.inode.size - of.committed_size, 0)
                      for of in self.files.files.values() if of.inode.nlink == 0)
        return self.store.counters()["orphan_bytes"] + pending

    # ------------------------------------------------------------ applying

    def run(self, step: int | None = None, *, dry_run: bool = False,
            extra_bytes: int = 0, extra_files: int = 0, exclude: int | None = None) -> dict:
        """Evict what policy says at `step` (default: the current step); a report.

        Open files (and the units they are in) are left alone; the open ones
        are listed under `deferred`.
        """
        steps = self.run_in_steps(step, dry_run=dry_run, extra_bytes=extra_bytes,
                                  extra_files=extra_files, exclude=exclude, budget=None)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            return done.value

    #: seconds of removals per transaction of a pass made in steps
    STEP_BUDGET_S = 0.005

    def run_in_steps(self, step: int | None = None, *, dry_run: bool = False,
                     extra_bytes: int = 0, extra_files: int = 0, exclude: int | None = None,
                     budget: float | None = STEP_BUDGET_S):
        """`run`, the removals cut into transactions of about `budget` seconds
        each (None: one): a generator that yields between them and returns the
        report. The caller holds the volume, so what was judged stays true. A
        daemon that stops half way leaves files that are still due: its next
        start evicts them (`Volume.prepare`), units whole."""
        t0 = time.perf_counter()
        current = self.store.get_step()
        step = current if step is None else step
        decided = yield from self._judge_in_steps(step, extra_bytes, extra_files, exclude,
                                                  budget)
        due = [(ino, r, e) for ino, (r, e, held) in decided.items() if not held]
        open_files = self.files.files
        held = [(ino, r, e) for ino, (r, e, h) in decided.items() if h and ino in open_files]
        if budget is None or dry_run:
            records = self._apply(due, step, dry_run)
        else:
            records = []
            size, i = 64, 0
            while i < len(due):
                started = time.perf_counter()
                part = due[i:i + size]
                records += self._apply(part, step, dry_run, units_last=True)
                i += len(part)
                took = time.perf_counter() - started
                size = max(8, min(4096, int(size * budget / max(took, 1e-4))))
                yield i, len(due)
            self._remove_units(due)
        deferred = [self._deferral(ino, reason, extra) for ino, reason, extra in held]
        if not dry_run:
            for ino, reason, _ in held:
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
            units = sorted({r["unit"] for r in records if "unit" in r})
            log.info("evicted", step=step, dry_run=dry_run, files=len(records),
                     bytes=report["bytes"], duration_ms=report["duration_ms"],
                     **({"units": units[:20]} if units else {}))
        if deferred:
            log.info("eviction_deferred", step=step, dry_run=dry_run, files=len(deferred),
                     why="open", paths=[d["path"] for d in deferred[:20]])
        return report

    def _apply(self, victims: list[tuple[int, str, dict]], step: int,
               dry_run: bool, *, units_last: bool = False) -> list[dict]:
        """Eviction records for closed files `victims`; removed unless `dry_run`
        (the rest of their units too, unless `units_last`: the caller does it
        once every batch is done, `_remove_units`)."""
        # The judge found each path already (`extra["path"]`), a quota victim's not.
        facts = self.store.eviction_facts(
            [ino for ino, _, _ in victims],
            {ino: extra["path"] for ino, _, extra in victims if "path" in extra})
        records = []
        units = {extra["unit_ino"] for _, _, extra in victims if "unit_ino" in extra}
        for ino, reason, extra in victims:
            inode, path, digest = facts[ino]
            extra = {k: v for k, v in extra.items() if k not in ("path", "unit_ino")}
            records.append({
                "path": path, "ino": ino, "gen": inode.gen, "hash": digest.hex(),
                "size": inode.size, "step": inode.step, "evicted_step": step,
                "reason": reason, "status": STATUS_NAMES[inode.status],
                "used_step": inode.use_step, **extra,
            })
        if not dry_run and records:
            removed = self.store.evict([(r["ino"], r) for r in records])
            self._tell_kernel(removed)
            self.evicted_total += len(records)
            if not units_last:
                for unit in sorted(units):
                    self._remove_unit_rest(unit)
        return records

    def _remove_units(self, victims: list[tuple[int, str, dict]]) -> None:
        for unit in sorted({extra["unit_ino"] for _, _, extra in victims
                            if "unit_ino" in extra}):
            self._remove_unit_rest(unit)

    def _remove_unit_rest(self, unit: int) -> None:
        """A unit goes whole: its directories (its own included), symlinks and
        other entries go with its files, so no skeleton (an empty `.git/`)
        is left to mislead tools that look for one."""
        fuse_ino = self.ops._fuse_ino
        gone = self.store.remove_unit_rest(unit)
        for parent, name, ino in gone:
            self.pending_invalidations.append((fuse_ino(parent), name, fuse_ino(ino)))
        self.ops._maybe_free(*(ino for _, _, ino in gone))

    def _deferral(self, ino: int, reason: str, extra: dict) -> dict:
        """What the report says of a due file left alone because it is open."""
        inode = self.files.attrs(ino)
        of = self.files.get(ino)
        return {"path": self.store.path_of(ino) or "", "ino": ino, "reason": reason,
                "size": inode.size, "step": inode.step, "why": "open",
                "handles": of.handles if of is not None else 0, **extra}

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
        """Evict the deferred files among `inos` that are closed and still due
        (with their units: a unit held by one open file goes when it closes)."""
        self.flush_uses()
        step = self.store.get_step()
        scope = Scope(self.store)
        decided: dict[int, tuple[str, dict, bool]] = {}
        seen: set[int] = set()
        for ino in sorted(inos):
            if ino in self.files.files or ino not in self.deferred:
                continue  # opened again meanwhile: its next close brings it back
            self.deferred.pop(ino)
            if ino not in seen:
                self._consider(ino, step, scope, decided, seen)
        due = [(ino, r, e) for ino, (r, e, held) in decided.items() if not held]
        for ino, (reason, _, held) in decided.items():
            if held and ino in self.files.files and reason in RECHECKED:
                self.deferred[ino] = reason  # another file of its unit is still open
        records = self._apply(due, step, dry_run=False)
        if records:
            log.info("evicted", step=step, files=len(records),
                     bytes=sum(r["size"] for r in records), after_close=True,
                     paths=[r["path"] for r in records[:20]])
        return {"step": step, "evicted": records}

    async def run_rechecks(self) -> None:
        """The background task: deferred files are reconsidered once closed."""
        async for ino in self._recheck_recv:
            if self.gate is not None:
                await self.gate()  # nothing changes under a long operation
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
        """Queue kernel invalidations for removed names; free what nobody has open."""
        fuse_ino = self.ops._fuse_ino
        for ino, names in removed:
            of = self.files.get(ino)
            if of is not None:
                of.inode.nlink = 0
            for parent, name in names:
                self.pending_invalidations.append((fuse_ino(parent), name, fuse_ino(ino)))
        # Freed now, not at the kernel's FORGET: the quota counts a nameless
        # inode until it is freed, and the room eviction makes must be there
        # for the write that asked for it. Nothing can open an evicted file
        # again (a request for the stale inode gets ENOENT); open ones wait
        # for their last close, as an unlinked file does.
        closed = [ino for ino, _ in removed if ino not in self.files.files]
        if closed:
            self.store.free_inodes(closed)

    def take_invalidations(self) -> list[tuple[int, bytes, int]]:
        pending, self.pending_invalidations = self.pending_invalidations, []
        return pending

    def invalidate_now(self, pending: list[tuple[int, bytes, int]]) -> None:
        """Tell the kernel and wait for it; run in a worker thread, never in a handler."""
        kernel = self.ops.kernel
        for parent, name, ino in pending:
            try:
                kernel.invalidate_entry(parent, name, deleted=ino)
            except OSError:
                pass  # not in the kernel's cache: nothing to drop

    def set_step(self, step: int) -> dict:
        steps = self.set_step_in_steps(step, budget=None)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            return done.value

    def set_step_in_steps(self, step: int, *, budget: float | None = STEP_BUDGET_S):
        """Advance to `step` and evict what is due, the removals in steps (a
        generator returning the report, see `run_in_steps`)."""
        current = self.store.get_step()
        if step < current:
            raise errors.InvalidArgument(f"step {step} is before the current step {current}")
        self.ops.journal.advance(step)  # the record of the step that ends (timeline)
        self.store.set_step(step)
        report = yield from self.run_in_steps(step, budget=budget)
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
        usage = self.usage()
        if usage + grow > quota:
            self.enospc_total += 1
            self.refusal = self._refusal(
                "quota_bytes", f"quota of {quota:,} bytes exceeded ({usage:,} in use, "
                               f"{grow:,} more needed)", needed=grow, usage=usage)
            log.warning("quota_exceeded", quota_bytes=quota, usage=usage, needed=grow, ino=ino,
                        **self._refusal_fields())
            raise errors.QuotaExceeded(self.refusal["message"])
        self.refusal = None  # room was made: the last refusal no longer holds

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
            self.refusal = self._refusal("max_files", f"max_files limit of {limit:,} reached",
                                         needed=1)
            log.warning("max_files_exceeded", max_files=limit, **self._refusal_fields())
            raise errors.QuotaExceeded(self.refusal["message"])
        self.refusal = None

    def _refusal(self, limit: str, what: str, **numbers: int) -> dict:
        """The record of an ENOSPC refusal of `limit`: what the last pass could
        not take, and the words that say so (`vfsd status`, the file tools)."""
        held = self.held
        records = []
        for rule, inos in sorted(held.records.items(), key=lambda kv: kv[0].index):
            size = 0
            for i in inos:
                try:
                    size += self._frees(i)
                except errors.NotFound:
                    pass
            records.append({"rule_index": rule.index, "rule_path": rule.path,
                            "files": len(inos), "bytes": size})
        kept = []
        if records:
            kept.append("; ".join(
                f"{r['files']:,} record file(s) of {r['bytes']:,} bytes under built-in rule "
                f"{r['rule_index']} ({r['rule_path']})" for r in records)
                + ", which eviction never drops to make room (the only full copy of what "
                  "left the model's context)")
        if held.pinned:
            kept.append(f"{held.pinned:,} pinned file(s)")
        if held.open:
            kept.append(f"{held.open:,} open file(s)")
        if kept:
            message = f"{what}: eviction took what it may; what holds the room is kept: " \
                + "; ".join(kept)
        else:
            message = f"{what}: eviction found nothing more it may take"
        if records:
            message += (f". Raise {limit}, remove files, or give those paths a rule of your own "
                        "(eviction_rules, ahead of the built-in ones)")
        return {"limit": limit, "step": self.store.get_step(), "time": time.time(),
                "message": message, "records": records, "pinned": held.pinned,
                "open": held.open, **numbers}

    def _refusal_fields(self) -> dict:
        """What the log's refusal event adds: the records that held the room."""
        rec = self.refusal or {}
        if not rec.get("records"):
            return {}
        return {"kept_records": rec["records"], "why": rec["message"]}
