"""Runs: one run dir per graph thread, under one root, mounted on demand.

    with mount_tool.runs("runs") as runs:              # or `async with`
        m = runs.get(thread_id)                          # that thread's Mount
        saver = VfsdCheckpointer(InMemorySaver(), runs)  # routes by thread_id
        backend = VfsdBackend(runs)                       # the same

LangGraph serves many threads with one compiled graph and one checkpointer;
vfsd's unit is the run dir. A `Runs` maps any thread id to its own run dir:

    ROOT/store/                  the store every thread shares (`--store`):
                                 content is deduplicated across threads and a
                                 copied thread shares its source's content
    ROOT/threads/<name>/         one run dir per thread: fs/ (the mount), .vfsd/
    ROOT/threads/<name>/thread.json   {"version": 1, "thread_id": ...}

A thread id is any string (a UUID, but also `../x`, 2,000 characters, control
characters, the empty string): the directory name is `t` + 32 hex digits of its
SHA-256, never the id itself, so no id can name a path outside ROOT; the id
itself is kept in `thread.json`. A thread's run dir is created on its first
use and found again afterwards, in this process or another.

Idle threads do not keep a daemon: at most `max_mounted` run dirs stay mounted;
beyond that, the least recently used ones that nothing is using are unmounted in
the background and mounted again (about one mount's time) on their next use.
`use(thread_id)` holds a thread's mount for the length of a `with` block; the
integrations (VfsdCheckpointer, VfsdBackend, VfsdMiddleware, offloading) hold it
for each call they make, so a mount never goes away under a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .client import ControlClient
from .errors import MountError, MountToolError
from .mount import Mount, is_mounted

logger = logging.getLogger(__name__)

THREADS_DIR = "threads"
STORE_DIR = "store"
THREAD_RECORD = "thread.json"
#: a thread id longer than this (in UTF-8 bytes) is refused
MAX_THREAD_ID_BYTES = 64 * 1024
DEFAULT_MAX_MOUNTED = 64
#: the file bytes a thread's snapshots may record (`snapshot_keep_bytes`)
DEFAULT_SNAPSHOT_BUDGET = 1 << 30
#: seconds a thread copy may take (the daemon copies a batch per loop turn)
COPY_TIMEOUT = 3600.0


class ThreadIdError(MountToolError, ValueError):
    """A thread id that cannot name a thread (not a string, too long, none)."""


def thread_key(thread_id: Any) -> str:
    """The thread id as the string that names its run: strings as they are,
    UUIDs and integers as `str()` gives them (LangGraph's savers store them so).

    ThreadIdError for None, other types and ids over 64 KiB."""
    if isinstance(thread_id, bool) or thread_id is None:
        raise ThreadIdError(
            f"a thread id is a string (config['configurable']['thread_id']), not {thread_id!r}")
    if isinstance(thread_id, uuid.UUID | int):
        thread_id = str(thread_id)
    if not isinstance(thread_id, str):
        raise ThreadIdError(
            f"a thread id is a string, not {type(thread_id).__name__} ({thread_id!r:.80})")
    if len(_id_bytes(thread_id)) > MAX_THREAD_ID_BYTES:
        raise ThreadIdError(f"a thread id is at most {MAX_THREAD_ID_BYTES} bytes; this one "
                            f"has {len(_id_bytes(thread_id)):,}")
    return thread_id


def _id_bytes(thread_id: str) -> bytes:
    # surrogatepass: a lone surrogate (from JSON) is still a distinct id.
    return thread_id.encode("utf-8", "surrogatepass")


def thread_dir_name(thread_id: Any) -> str:
    """The run dir name of a thread: `t` + 32 hex digits of SHA-256 of its id."""
    return "t" + hashlib.sha256(_id_bytes(thread_key(thread_id))).hexdigest()[:32]


def thread_of(config: Mapping[str, Any] | None) -> str:
    """The thread id of a LangGraph config (`config["configurable"]["thread_id"]`)."""
    configurable = (config or {}).get("configurable") or {}
    if "thread_id" not in configurable:
        raise ThreadIdError(
            "no thread_id in the config: a Runs serves each LangGraph thread from its own "
            "run dir; invoke the graph with config={'configurable': {'thread_id': ...}}")
    return thread_key(configurable["thread_id"])


def current_config() -> Mapping[str, Any]:
    """The config of the running LangGraph node or tool (RuntimeError elsewhere)."""
    from langgraph.config import get_config

    return get_config()


@dataclass(eq=False)
class _Entry:
    """One thread's run dir and its mount, as this process holds it."""

    thread_id: str
    run_dir: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    mount: Mount | None = None
    leases: int = 0
    last_used: float = 0.0


class Runs:
    """Maps graph threads to run dirs under `root`, mounting each on demand.

    `mount_options` are the options of every thread's mount, as for
    `mount_tool.mount` (done_retention_steps=3, remote="s3://...", ...);
    `store` defaults to ROOT/store, shared by every thread. At most
    `max_mounted` run dirs stay mounted (0: no bound); the least recently
    used idle ones are unmounted beyond that, and `idle_timeout` seconds
    (None: never) unmounts any idle one. Closing the Runs unmounts every run
    dir it holds; the files stay in ROOT for the next one.

    Thread-safe: one Runs serves every thread of a graph, sync or async (the
    integrations call it from worker threads, never on the event loop). Use one
    Runs per ROOT at a time on a machine.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_mounted: int = DEFAULT_MAX_MOUNTED,
        idle_timeout: float | None = None,
        **mount_options: Any,
    ) -> None:
        if isinstance(max_mounted, bool) or not isinstance(max_mounted, int) or max_mounted < 0:
            raise ValueError(f"max_mounted must be an integer >= 0, not {max_mounted!r}")
        if idle_timeout is not None and (
                isinstance(idle_timeout, bool) or not isinstance(idle_timeout, int | float)
                or idle_timeout <= 0):
            raise ValueError(f"idle_timeout must be a positive number of seconds or None, "
                             f"not {idle_timeout!r}")
        self.root = Path(os.path.abspath(root))
        self.threads_dir = self.root / THREADS_DIR
        options = dict(mount_options)
        options.setdefault("store", self.root / STORE_DIR)
        # Snapshots live as long as the checkpoints that name them (the
        # VfsdCheckpointer releases them), within a byte budget per thread.
        options.setdefault("snapshot_keep_last", 0)
        options.setdefault("snapshot_keep_steps", 0)
        options.setdefault("snapshot_keep_bytes", DEFAULT_SNAPSHOT_BUDGET)
        self.mount_options = options
        self.max_mounted = max_mounted
        self.idle_timeout = None if idle_timeout is None else float(idle_timeout)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._wake = threading.Condition(self._lock)
        self._reaper: threading.Thread | None = None
        self._closed = False
        self.counts = {"mounts": 0, "unmounts": 0, "unmount_failures": 0}

    def __repr__(self) -> str:
        return f"Runs({str(self.root)!r}, mounted={len(self.mounted())})"

    # -- naming ---------------------------------------------------------------

    def run_dir(self, thread_id: Any) -> Path:
        """Where the thread's files live (nothing is created or mounted)."""
        return self.threads_dir / thread_dir_name(thread_id)

    def thread_of(self, config: Mapping[str, Any] | None = None) -> str:
        """The thread id of `config`, by default the running node's."""
        return thread_of(config if config is not None else current_config())

    def threads(self) -> list[str]:
        """Every thread that has a run dir under ROOT (from their records)."""
        out = []
        try:
            names = sorted(os.listdir(self.threads_dir))
        except FileNotFoundError:
            return []
        for name in names:
            recorded = _read_record(self.threads_dir / name)
            if recorded is not None:
                out.append(recorded)
        return out

    def exists(self, thread_id: Any) -> bool:
        """Whether the thread has a run dir (it has been used)."""
        return (self.run_dir(thread_id) / THREAD_RECORD).exists()

    # -- mounting -----------------------------------------------------------

    def get(self, thread_id: Any) -> Mount:
        """The thread's Mount, mounted (and its run dir created) if need be.

        Without a `use` block around its use, an idle mount may be unmounted
        by the bound on mounted run dirs: prefer `use` in code that runs
        alongside other threads."""
        with self.use(thread_id) as m:
            return m

    @contextlib.contextmanager
    def use(self, thread_id: Any, *, hooks: bool = True) -> Iterator[Mount]:
        """`with runs.use(thread_id) as m:` the thread's Mount, kept mounted
        until the block ends. (`hooks=False`: without the use hooks, for
        VfsdCheckpointer's own calls.)"""
        thread_id = thread_key(thread_id)
        while True:
            entry = self._entry(thread_id)
            with entry.lock:
                with self._lock:
                    # Released and forgotten while this call waited for the lock?
                    current = self._entries.get(entry.run_dir.name) is entry
                if not current:
                    continue
                m = self._mounted(entry)
                with self._lock:
                    entry.leases += 1
                break
        try:
            if hooks:
                _run_hooks(self, entry.thread_id, m)
            yield m
        finally:
            with self._lock:
                entry.leases -= 1
                entry.last_used = time.monotonic()
                self._wake.notify()

    def current(self) -> Mount:
        """The Mount of the running node's thread (inside a LangGraph run)."""
        return self.get(self.thread_of())

    def mounted(self) -> list[str]:
        """Thread ids whose run dirs this Runs holds mounted now."""
        with self._lock:
            return [e.thread_id for e in self._entries.values() if e.mount is not None]

    def _entry(self, thread_id: str) -> _Entry:
        if self._closed:
            raise MountToolError(f"{self!r} is closed")
        name = thread_dir_name(thread_id)
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                entry = self._entries[name] = _Entry(thread_id, self.threads_dir / name)
            return entry

    def _mounted(self, entry: _Entry) -> Mount:
        """The entry's live mount (entry.lock held)."""
        m = entry.mount
        if m is not None:
            if m.is_mounted():
                return m
            entry.mount = None  # unmounted behind our back (a crash, `vfsd umount`)
        self._claim_dir(entry)
        self._make_room()
        m = Mount.start(entry.run_dir, **self.mount_options)
        m.started = True  # a Runs owns every mount under its root
        with self._lock:
            entry.mount = m
            self.counts["mounts"] += 1
        self._start_reaper()
        return m

    def _claim_dir(self, entry: _Entry) -> None:
        """Create the run dir with its record, or check the record names this thread."""
        recorded = _read_record(entry.run_dir)
        if recorded is not None:
            if recorded != entry.thread_id:
                raise MountToolError(
                    f"{entry.run_dir} records thread {recorded!r:.200}, not {entry.thread_id!r:.200} "
                    "(two ids with one hash, or a run dir edited by hand): refusing to mix them")
            return
        entry.run_dir.mkdir(parents=True, exist_ok=True)
        path = entry.run_dir / THREAD_RECORD
        tmp = path.with_name(f".{THREAD_RECORD}.{os.getpid()}.{threading.get_ident()}")
        # The owner's only: with --allow-other other users may reach the run dir.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"version": 1, "thread_id": entry.thread_id}))
        os.replace(tmp, path)

    # -- idle run dirs ---------------------------------------------------------

    def _make_room(self) -> None:
        """Before a mount: unmount idle run dirs, least recently used first, so
        that one more stays within `max_mounted`, here in the thread that needs
        the place. The reaper alone unmounts one at a time and falls behind
        threads that arrive faster (273 daemons for a bound of 64 in
        threads_bench); callers racing here release different run dirs."""
        if not self.max_mounted:
            return
        with self._lock:
            idle, over = self._idle_and_over(extra=1)
        for entry in idle:
            if over <= 0:
                break
            if self.release(entry):  # False: in use again, busy, or another caller's
                over -= 1

    def _idle_and_over(self, extra: int = 0) -> tuple[list[_Entry], int]:
        """Idle mounted entries, least recently used first, and how many
        mounted run dirs (with `extra` more) exceed the bound (self._lock held)."""
        idle = sorted((e for e in self._entries.values() if e.mount is not None and not e.leases),
                      key=lambda e: e.last_used)
        mounted = sum(1 for e in self._entries.values() if e.mount is not None)
        return idle, max(0, mounted + extra - self.max_mounted) if self.max_mounted else 0

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is None and (self.max_mounted or self.idle_timeout):
                self._reaper = threading.Thread(target=self._reap_loop, name="vfsd-runs-reaper",
                                                daemon=True)
                self._reaper.start()
            self._wake.notify()

    def _reap_loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._candidates():
                    self._wake.wait(timeout=self._wait_time())
                if self._closed:
                    return
                candidates = self._candidates()
            for entry in candidates:
                self.release(entry)

    def _wait_time(self) -> float | None:
        return None if self.idle_timeout is None else max(0.5, self.idle_timeout / 4)

    def _candidates(self) -> list[_Entry]:
        """Idle mounted entries to unmount now, least recently used first (self._lock held)."""
        idle, over = self._idle_and_over()
        chosen = idle[:over]
        if self.idle_timeout is not None:
            cutoff = time.monotonic() - self.idle_timeout
            chosen += [e for e in idle[over:] if e.last_used < cutoff]
        return chosen

    def release(self, which: Any) -> bool:
        """Unmount a thread's run dir now if nothing uses it (its files stay);
        True if it was unmounted. `which` is a thread id."""
        entry = which if isinstance(which, _Entry) else self._entries.get(
            thread_dir_name(which))
        if entry is None or not entry.lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                m = entry.mount
                if m is None or entry.leases:
                    return False
            try:
                m.unmount()
            except MountError as exc:  # busy: a shell still has a file open there
                with self._lock:
                    self.counts["unmount_failures"] += 1
                    entry.last_used = time.monotonic()
                logger.info("vfsd: %s stays mounted: %s", entry.run_dir, exc)
                return False
            with self._lock:
                entry.mount = None
                self.counts["unmounts"] += 1
                if not entry.leases:
                    self._entries.pop(entry.run_dir.name, None)
            return True
        finally:
            entry.lock.release()

    # -- thread lifecycle ------------------------------------------------------

    def expected_run(self, thread_id: Any) -> str | None:
        """The run id a thread's files must be in, if the Runs fixes it (None: any)."""
        return None

    def delete(self, thread_id: Any) -> bool:
        """Delete the thread's files, snapshots and run dir (unmounting it
        first); content other threads share stays in the store. False when
        the thread had no run dir. MountError if a program still holds a file
        of it open."""
        thread_id = thread_key(thread_id)
        entry = self._entry(thread_id)
        with entry.lock:
            with self._lock:
                if entry.leases:
                    raise MountToolError(f"thread {thread_id!r:.200} is in use: its files cannot "
                                         "be deleted under a running call")
            if entry.mount is not None or is_mounted(entry.run_dir / "fs"):
                m = entry.mount or Mount(entry.run_dir)
                m.unmount()
                with self._lock:
                    entry.mount = None
                    self.counts["unmounts"] += 1
            recorded = _read_record(entry.run_dir) if entry.run_dir.exists() else None
            if recorded is None:
                return False
            if recorded != thread_id:
                raise MountToolError(f"{entry.run_dir} records thread {recorded!r:.200}, not "
                                     f"{thread_id!r:.200}: not deleting it")
            _vfsd_cli("drop", str(entry.run_dir))
            with self._lock:
                self._entries.pop(entry.run_dir.name, None)
        return True

    def copy(self, source: Any, target: Any) -> Mount | None:
        """Give thread `target` a copy of `source`'s files with every snapshot
        (same ids; content shared, not copied); None when the source has no
        files. The target must not have a run dir yet."""
        source, target = thread_key(source), thread_key(target)
        if source == target:
            raise ValueError("a thread cannot be copied onto itself")
        if not self.exists(source):
            return None
        target_dir = self.run_dir(target)
        if self.exists(target):
            raise MountToolError(f"thread {target!r:.200} already has files ({target_dir}): "
                                 "copy into a new thread")
        with self.use(source, hooks=False) as m:
            target_entry = self._entry(target)
            with target_entry.lock:
                if target_dir.exists() and not (target_dir / THREAD_RECORD).exists():
                    # Never removed here: it may be a thread that lost its record
                    # as well as a copy that died half way (a copy deletes nothing
                    # it did not make in this call).
                    raise MountToolError(
                        f"{target_dir} exists but has no {THREAD_RECORD}, so it is no "
                        f"thread this Runs knows (a thread whose record was lost, or a "
                        f"copy that died half way); nothing was changed. Restore its "
                        f"{THREAD_RECORD}, or move the directory away, and copy again")
                # A connection of its own: a long history may outlast the shared
                # client's timeout.
                with ControlClient(m.client.socket_path, timeout=COPY_TIMEOUT) as c:
                    c.call("copy", run_dir=str(target_dir))
                _copy_checkpoint_record(m.state_dir, target_dir / ".vfsd", target)
                self._claim_dir(target_entry)
        return self.get(target)

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Unmount every run dir this Runs holds (waiting for any in use)."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            entries = list(self._entries.values())
        errors = []
        for entry in entries:
            with entry.lock:
                m, entry.mount = entry.mount, None
            if m is not None:
                try:
                    m.unmount()
                except MountError as exc:
                    errors.append(str(exc))
        if self._reaper is not None:
            self._reaper.join(timeout=30)
        if errors:
            raise MountError("; ".join(errors))

    def __enter__(self) -> Runs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Runs:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)


def _read_record(run_dir: Path) -> str | None:
    """The thread id a run dir records, None when it has no record yet."""
    try:
        doc = json.loads((run_dir / THREAD_RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise MountToolError(f"{run_dir / THREAD_RECORD} is unreadable ({exc}): it names the "
                             "thread whose files are there; fix or remove it") from exc
    thread = doc.get("thread_id") if isinstance(doc, dict) else None
    if not isinstance(thread, str):
        raise MountToolError(f"{run_dir / THREAD_RECORD} names no thread")
    return thread


def _vfsd_cli(*args: str) -> None:
    from .mount import _run_vfsd

    proc = _run_vfsd(*args)
    if proc.returncode != 0:
        raise MountError(f"vfsd {' '.join(args)} exited {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout).strip()}")


def _copy_checkpoint_record(source_state: Path, target_state: Path, target: str) -> None:
    """The copy's VfsdCheckpointer record: bound to the target thread, with
    the source's interrupt pins (the copied snapshots keep their pins, and
    the copied checkpoints are what releases them)."""
    from .threadfiles import RECORD_NAME

    try:
        doc = json.loads((source_state / RECORD_NAME).read_text())
    except (OSError, ValueError):
        doc = {}
    pins = doc.get("pins") if isinstance(doc, dict) else None
    out = {"version": 1, "thread": target, "pins": pins if isinstance(pins, dict) else {}}
    target_state.mkdir(parents=True, exist_ok=True)
    tmp = target_state / f".{RECORD_NAME}.tmp"
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, target_state / RECORD_NAME)


def runs(root: str | os.PathLike[str], **options: Any) -> Runs:
    """A `Runs` on `root`: one run dir per graph thread, mounted on demand
    (a context manager, sync or async). Options as for `Runs`."""
    return Runs(root, **options)


# -- routing: one mount, or the running thread's ----------------------------------------

#: Hooks run at the start of every `lease` of a Mount or a Runs: (thread_id or None, mount).
_USE_HOOKS: weakref.WeakKeyDictionary[Any, list[Callable[[str | None, Mount], None]]] = \
    weakref.WeakKeyDictionary()


def add_use_hook(target: Mount | Runs, hook: Callable[[str | None, Mount], None]) -> None:
    """Call `hook(thread_id, mount)` at the start of every `lease` of `target`
    (VfsdCheckpointer snapshots a step's files there, before the step's first
    file operation)."""
    _USE_HOOKS.setdefault(target, []).append(hook)


def _run_hooks(target: Mount | Runs, thread_id: str | None, m: Mount) -> None:
    for hook in list(_USE_HOOKS.get(target, ())):
        hook(thread_id, m)


def config_thread() -> str | None:
    """The running node's thread id, or None outside a LangGraph run."""
    try:
        config = current_config()
    except RuntimeError:
        return None
    try:
        return thread_of(config)
    except ThreadIdError:
        return None


@contextlib.contextmanager
def lease(target: Mount | Runs, thread_id: Any = None, *, hooks: bool = True) -> Iterator[Mount]:
    """The Mount a call works on: `target` itself, or with a Runs the mount of
    `thread_id` (default: the running node's thread), held for the block.

    For Deep Agents tools, middleware and LangGraph nodes, which find their
    thread in the config LangGraph sets for the running call."""
    if isinstance(target, Runs):
        if thread_id is None:
            thread_id = target.thread_of()
        with target.use(thread_id, hooks=hooks) as m:
            yield m
        return
    if not isinstance(target, Mount):
        raise TypeError(f"expected a mount_tool Mount or Runs, not {type(target).__name__}")
    if hooks:
        _run_hooks(target, thread_key(thread_id) if thread_id is not None else config_thread(),
                   target)
    yield target
