"""Per-call control groups: resource limits and a sure kill for one `execute` call.

Each call gets its own cgroup, created under this process's own cgroup (so it
stays inside whatever limits this process already has) and removed when the
call returns. The call's first process joins it before it runs anything, so
every process the command starts is in it: `pids.max` bounds a fork bomb
(RLIMIT_NPROC cannot, for root), `memory.max` bounds the sum of all
processes' memory (RLIMIT_AS only bounds each one), the CPU time of all
processes is accounted for, and everything in it can be killed.

Both cgroup v2 and the v1 controllers (`pids`, `memory`, `cpuacct`) are used,
whichever the machine provides for each resource; v2 controllers can only be
used where they are enabled for this process's cgroup (delegated). What is
in force is reported by `available()`; a resource without a cgroup falls back
to rlimits in mount_tool/sandbox/sandbox.py.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

#: The resources a per-call cgroup can take care of.
RESOURCES = ("pids", "memory", "cpu")
#: v1 controller name -> resource.
_V1_CONTROLLERS = {"pids": "pids", "memory": "memory", "cpuacct": "cpu"}
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy and this process's cgroup in it."""

    version: int  # 1 or 2
    own: Path  # this process's cgroup directory
    resources: frozenset[str]  # what a child group here can limit or account

    def describe(self, resource: str) -> str:
        """How `resource` is enforced here, for reports ("cgroup v1 pids")."""
        if self.version == 2:
            return f"cgroup v2 ({resource})"
        controller = "cpuacct" if resource == "cpu" else resource
        return f"cgroup v1 {controller}"


def _unescape(field_text: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), field_text)


def _own_cgroups() -> dict[str, str]:
    """Controller list ("" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3:
                paths[parts[1]] = parts[2]
    return paths


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, rest = pre.split(), post.split()
            if len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                found.append((rest[0], _unescape(fields[3]), _unescape(fields[4]),
                              set(rest[2].split(","))))
    return found


def _inside(mount_point: str, mount_root: str, path: str) -> Path | None:
    """Where cgroup `path` is under a mount of `mount_root` at `mount_point`."""
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None
    relative = path[len(mount_root):] if mount_root != "/" else path
    return Path(mount_point + "/" + relative.lstrip("/")).resolve()


def _v2_resources(own: Path) -> frozenset[str]:
    """Resources a child of `own` can use in a v2 hierarchy (cpu accounting always)."""
    try:
        enabled = set((own / "cgroup.subtree_control").read_text().split())
        offered = set((own / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()
    missing = {"pids", "memory"} & offered - enabled
    if missing:
        # Possible only where this cgroup holds no processes itself (the root of
        # a namespace, or a delegated subtree); otherwise EBUSY, and rlimits it is.
        try:
            (own / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
            enabled |= missing
        except OSError:
            pass
    return frozenset({"cpu"} | ({"pids", "memory"} & enabled))


def _probe(own: Path) -> bool:
    """True when a child cgroup can be made (and removed) under `own`."""
    probe = own / f"vfsd-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def _remove_stale(own: Path) -> None:
    """Remove per-call groups left by processes that died mid-call (empty by now)."""
    for path in own.glob("vfsd-*-*-*"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):  # still busy, or not ours to remove
                path.rmdir()


@functools.cache
def hierarchies() -> tuple[Hierarchy, ...]:
    """The usable hierarchies, v2 first (found once per process)."""
    try:
        own_paths = _own_cgroups()
        mounts = _mounts()
    except OSError:
        return ()
    found: list[Hierarchy] = []
    for fstype, mount_root, mount_point, options in mounts:
        if fstype == "cgroup2":
            own = _inside(mount_point, mount_root, own_paths.get("", "/"))
            if own is None or not own.is_dir() or not _probe(own):
                continue
            found.append(Hierarchy(2, own, _v2_resources(own)))
            continue
        controllers = [c for c in _V1_CONTROLLERS if c in options]
        if not controllers:
            continue
        key = next((k for k in own_paths if k and set(k.split(",")) & set(controllers)), None)
        own = _inside(mount_point, mount_root, own_paths.get(key, "/")) if key else None
        if own is None or not own.is_dir() or not _probe(own):
            continue
        found.append(Hierarchy(1, own, frozenset(_V1_CONTROLLERS[c] for c in controllers)))
    found.sort(key=lambda h: h.version != 2)
    for hierarchy in found:
        _remove_stale(hierarchy.own)
    return tuple(found)


def available() -> dict[str, Hierarchy]:
    """Resource -> the hierarchy that takes care of it, for the resources one can."""
    chosen: dict[str, Hierarchy] = {}
    for hierarchy in hierarchies():
        for resource in RESOURCES:
            if resource in hierarchy.resources and resource not in chosen:
                chosen[resource] = hierarchy
    return chosen


@dataclass
class CallGroup:
    """The cgroup(s) of one call: one directory per hierarchy in use.

    `dirs` is empty when no cgroup could be used; every method is then a no-op.
    """

    dirs: dict[Hierarchy, Path] = field(default_factory=dict)
    enforced: dict[str, str] = field(default_factory=dict)  # resource -> how

    @classmethod
    def create(cls, *, processes: int, memory_bytes: int) -> CallGroup:
        """Make the call's cgroups with their limits set (no processes in them yet)."""
        group = cls()
        chosen = available()
        name = f"vfsd-exec-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            for hierarchy in dict.fromkeys(chosen.values()):
                path = hierarchy.own / name
                path.mkdir()
                group.dirs[hierarchy] = path
            for resource, hierarchy in chosen.items():
                path = group.dirs[hierarchy]
                if resource == "pids":
                    (path / "pids.max").write_text(str(processes))
                elif resource == "memory":
                    group._limit_memory(hierarchy, path, memory_bytes)
                group.enforced[resource] = hierarchy.describe(resource)
        except OSError:
            group.remove()
            raise
        return group

    @staticmethod
    def _limit_memory(hierarchy: Hierarchy, path: Path, limit: int) -> None:
        if hierarchy.version == 2:
            (path / "memory.max").write_text(str(limit))
            # Swap would let the command use more than `limit` in all.
            with contextlib.suppress(FileNotFoundError):
                (path / "memory.swap.max").write_text("0")
            return
        (path / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(FileNotFoundError):  # without swap accounting
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit))

    @property
    def name(self) -> str | None:
        """The group's directory name (the same in every hierarchy), None without one."""
        for path in self.dirs.values():
            return path.name
        return None

    def add(self, pid: int) -> None:
        """Move `pid` into every directory of the group (before it starts the command)."""
        for path in self.dirs.values():
            (path / "cgroup.procs").write_text(str(pid))

    def cpu_seconds(self) -> float | None:
        """CPU time used by every process of the group so far; None if not accounted."""
        for hierarchy, path in self.dirs.items():
            if "cpu" not in hierarchy.resources:
                continue
            try:
                if hierarchy.version == 2:
                    stats = _keyed((path / "cpu.stat").read_text())
                    return stats.get("usage_usec", 0) / 1e6
                return int((path / "cpuacct.usage").read_text()) / 1e9
            except (OSError, ValueError):
                return None
        return None

    def events(self) -> dict[str, int]:
        """How often the limits bit: {"pids_max": refused forks, "oom_kill": kills}."""
        counts = {"pids_max": 0, "oom_kill": 0}
        for hierarchy, path in self.dirs.items():
            with contextlib.suppress(OSError, ValueError):
                if "pids" in hierarchy.resources:
                    counts["pids_max"] += _keyed((path / "pids.events").read_text()).get("max", 0)
            with contextlib.suppress(OSError, ValueError):
                if "memory" in hierarchy.resources:
                    source = "memory.events" if hierarchy.version == 2 else "memory.oom_control"
                    counts["oom_kill"] += _keyed((path / source).read_text()).get("oom_kill", 0)
        return counts

    def pids(self) -> set[int]:
        """Processes in the group now."""
        found: set[int] = set()
        for path in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                found |= {int(p) for p in (path / "cgroup.procs").read_text().split()}
        return found

    def kill(self, wait: float = 5.0) -> bool:
        """SIGKILL everything in the group until it is empty; True when it is."""
        if not self.dirs or not self.pids():
            return True
        for hierarchy, path in self.dirs.items():
            if hierarchy.version == 2:
                with contextlib.suppress(OSError):
                    (path / "cgroup.kill").write_text("1")  # kernel 5.14+: all at once
        deadline = time.monotonic() + wait
        while True:
            left = self.pids()
            if not left:
                return True
            if time.monotonic() > deadline:
                return False
            # Without cgroup.kill a fork can slip in between reading and killing:
            # go round again until nothing is left.
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def remove(self) -> None:
        """Remove the group's directories (processes that just died may take a moment)."""
        for path in self.dirs.values():
            for _ in range(200):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        logger.warning("could not remove cgroup %s: %s", path, exc)
                        break
                    time.sleep(0.01)
            else:
                logger.warning("cgroup %s still busy; left behind", path)
        self.dirs.clear()


def _keyed(text: str) -> dict[str, int]:
    """{"key": int} from "key value" lines (pids.events, memory.events, cpu.stat)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out
