"""Runs: every graph thread a directory of a few long-lived shard daemons, under one root.

    with mount_tool.runs("runs") as runs:              # or `async with`
        m = runs.get(thread_id)                          # that thread's Mount
        saver = VfsdCheckpointer(InMemorySaver(), runs)  # routes by thread_id
        backend = VfsdBackend(runs)                       # the same

LangGraph serves many threads with one compiled graph and one checkpointer. A
`Runs` serves every thread from K shard daemons (`shards=K`, default: the
number of CPUs): each is one FUSE mount over a store of its own, and a thread
is a volume of one of them, seen as a directory of its mount. A new thread is
a new volume (no process, no mount); an idle one costs nothing but its
records. The layout:

    ROOT/shards/<k>/                 a shard's run dir (`vfsd mount --shard`, with the
                                     Runs' mount options): fs/ its mount, .vfsd/ its
                                     store, socket and log
    ROOT/shards/<k>/fs/t<hex>/       a thread's files (a volume of shard k)
    ROOT/threads/t<hex>/thread.json  {"version": 2, "thread_id": ..., "shard": "k"}
    ROOT/threads/t<hex>/.vfsd/       the thread's records (VfsdCheckpointer's:
                                     langgraph.position is rewritten at every checkpoint)
    ROOT/threads/t<hex>/fs           a link to ROOT/shards/<k>/fs/t<hex>

This layout is read by vfsd too (`vfsd threads ROOT`, `vfsd status ROOT`;
vfsd/cli/runsroot.py, which cannot import mount_tool): the records, the
shard run dirs, the volume names, ROOT/store of the earlier layout, and the
time of langgraph.position as a thread's last checkpoint. Change it there too.

A thread id is any string (a UUID, but also `../x`, 2,000 characters, control
characters, the empty string): its names are `t` + 32 hex digits of its
SHA-256, never the id itself, so no id can name a path outside ROOT; the id is
kept in `thread.json` and by its volume, which refuses requests naming another
id. A new thread goes to shard `hash % K`, and stays on the shard its record
names: K may change between runs, and a copy lives on its source's shard (a
copy shares its source's content, which only one store can do).

Shards are mounted on first use and stay mounted; `close()` (and leaving a
`with` or `async with` block) unmounts them all and leaves no daemon behind.
A shard daemon that dies (killed, out of memory) fails the calls in flight
with an error naming the shard, and is started again on the next use (what
was fsync'd or checkpointed is kept). `use(thread_id)` gives a thread's
Mount (a `ThreadMount`: its root is the thread's directory; its control
requests name its volume) for a `with` block; the integrations
(VfsdCheckpointer, VfsdBackend, VfsdMiddleware, offloading) take one for each
call they make. `max_mounted` and `idle_timeout`, which bounded the mounted
run dirs of the earlier layout (a daemon per thread), are accepted and
ignored: no thread holds a mount of its own.

A root of that earlier layout (ROOT/store, run dirs under ROOT/threads) is
served as is, from one more shard over its store (see `legacy`).

The package: this module (`Runs`, `runs()`, thread ids: `thread_key`,
`thread_dir_name`, `thread_of`; `lease` and the use hooks by which the
integrations reach the running thread's Mount), `config` (a Runs' TOML
configuration file, checked by `vfsd config check`), `shards` (the shard daemons
and their connections), `threadmount` (`ThreadMount`: one thread as a
Mount), `records` (the thread directories and their `thread.json`) and
`legacy` (a root of the earlier layout). It imports the one-thread Mount,
the daemon's client and what is below them, never an integration: what the
checkpointer keeps of a copied thread it copies itself (`copy(...,
before_done=)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ControlError, MountError, MountToolError, ThreadBusy
from ..mount import Mount
from . import config as runs_config
from . import legacy
from .config import RunsConfigError as RunsConfigError
from .records import (
    SHARDS_DIR,
    THREAD_RECORD,
    THREADS_DIR,
    ThreadRecord,
    link_thread_files,
    read_record,
    remove_thread_dir,
    write_record,
)
from .shards import Shard
from .threadmount import ThreadMount

logger = logging.getLogger(__name__)

#: a thread id longer than this (in UTF-8 bytes) is refused
MAX_THREAD_ID_BYTES = 64 * 1024
#: the file bytes a thread's snapshots may record (`snapshot_keep_bytes`)
DEFAULT_SNAPSHOT_BUDGET = 1 << 30
#: seconds a thread copy may take (the daemon copies a batch per loop turn)
COPY_TIMEOUT = 3600.0
#: seconds a delete may take (dropping a long history)
DROP_TIMEOUT = 600.0
#: threads whose Mount this process keeps (more are opened again: no round trip)
THREADS_KEPT = 4096
#: seconds `close` waits for the calls in flight before unmounting under them
CLOSE_GRACE_SECONDS = 5.0
#: mount options a Runs decides itself
_NOT_OPTIONS = {
    "store": "each shard keeps its own store (ROOT/shards/<k>/.vfsd)",
    "shard": "a Runs mounts its shards itself",
    "metrics_port": "a shard serves no metrics endpoint (every shard would bind the one "
                    "port): `vfsd status --json ROOT` and `vfsd threads ROOT --json` give "
                    "its numbers",
}
#: seconds a remote_begin may take besides its wait for the lease (its catch-up)
BEGIN_GRACE = 600.0
#: the daemon's lease TTL when none is given (vfsd.config remote_lease_ttl)
DEFAULT_LEASE_TTL = 30.0
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
class _Thread:
    """One thread as this process holds it: its Mount once opened, and the
    calls using it now."""

    thread_id: str
    name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    mount: ThreadMount | None = None
    leases: int = 0


class Runs:
    """Serves every graph thread from a few shard daemons under `root`.

    `mount_options` are the shards' daemon options, as for `mount_tool.mount`
    (done_retention_steps=3, quota_bytes="1G", ...); they apply to every
    thread (a quota is per thread). `config` (default: $VFSD_CONFIG) is a
    TOML file of the same options, as `vfsd mount --config` reads it, and
    its `[runs]` table may set `shards`: vfsd checks it here, before any
    thread runs (RunsConfigError naming the key), and keyword options win
    over it (see `config`). `shards` is how many shard daemons new
    threads spread over (default: the file's, else the number of CPUs). `max_mounted` and
    `idle_timeout` are accepted and ignored (see the module docstring).
    Closing the Runs unmounts every shard; the files stay in ROOT for the
    next one.

    Thread-safe: one Runs serves every thread of a graph, sync or async (the
    integrations call it from worker threads, never on the event loop). Use
    one Runs per ROOT at a time on a machine.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        shards: int | None = None,
        max_mounted: int | None = None,
        idle_timeout: float | None = None,
        config: str | os.PathLike[str] | None = None,
        **mount_options: Any,
    ) -> None:
        del max_mounted, idle_timeout  # no thread holds a mount of its own any more
        remote = _remote_option(mount_options)
        self.config_path = runs_config.config_path(config)
        from_file = runs_config.load(self.config_path, mount_options) \
            if self.config_path is not None else None
        if shards is None and from_file is not None:
            shards = from_file.runs.get("shards")
        if shards is None:
            shards = os.cpu_count() or 1
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 4096:
            raise ValueError(f"shards must be an integer from 1 to 4096, not {shards!r}")
        for key, why in _NOT_OPTIONS.items():
            if mount_options.get(key) not in (None, False):
                raise ValueError(f"{key}= is not an option of a Runs: {why}")
        self.root = Path(os.path.realpath(root))
        self.threads_dir = self.root / THREADS_DIR
        self.shards_dir = self.root / SHARDS_DIR
        self.shard_count = shards
        if from_file is not None:
            for key, why in _NOT_OPTIONS.items():
                if from_file.options.get(key) not in (None, False):
                    raise runs_config.RunsConfigError(
                        f"{key} in {self.config_path} is not an option of a Runs: {why}")
        # The file's options, then the keyword ones on top.
        options = {**(from_file.options if from_file is not None else {}), **mount_options}
        # Snapshots live as long as the checkpoints that name them (the
        # VfsdCheckpointer releases them), within a byte budget per thread.
        options.setdefault("snapshot_keep_last", 0)
        options.setdefault("snapshot_keep_steps", 0)
        options.setdefault("snapshot_keep_bytes", DEFAULT_SNAPSHOT_BUDGET)
        # The bucket from the file when no keyword names one (the keyword wins,
        # as for every option).
        from_file_remote = _remote_option(options)
        remote = remote if remote is not None else from_file_remote
        if remote is not None:
            options["remote"] = remote
        self.mount_options = options
        #: the bucket the shards serve their threads from (None: no remote tier)
        self.remote = remote
        #: seconds a run waits for another run of its thread to end (remote_lease_wait)
        self.lease_wait = _lease_wait(options)
        self._lock = threading.Lock()
        self._threads: OrderedDict[str, _Thread] = OrderedDict()
        self._shards: dict[str, Shard] = {}
        self._closed = False
        # A Runs dropped without close still unmounts what it mounted (at
        # exit, or when collected); never from a forked child.
        self._finalizer = weakref.finalize(self, _close_shards, self._shards, os.getpid())

    def __repr__(self) -> str:
        return f"Runs({str(self.root)!r}, shards={self.shard_count})"

    # -- naming ---------------------------------------------------------------

    def run_dir(self, thread_id: Any) -> Path:
        """The thread's directory of records under ROOT/threads (its `fs`
        leads to its files; nothing is created or mounted)."""
        return self.threads_dir / thread_dir_name(thread_id)

    def thread_of(self, config: Mapping[str, Any] | None = None) -> str:
        """The thread id of `config`, by default the running node's."""
        return thread_of(config if config is not None else current_config())

    def threads(self) -> list[str]:
        """Every thread that has files under ROOT (from their records; one
        that cannot be read is left out, and said in the log)."""
        out = []
        try:
            names = sorted(os.listdir(self.threads_dir))
        except FileNotFoundError:
            return []
        for name in names:
            try:
                record = read_record(self.threads_dir / name)
            except MountToolError as exc:
                logger.warning("vfsd: %s", exc)
                continue
            if record is not None:
                out.append(record.thread_id)
        return out

    def exists(self, thread_id: Any) -> bool:
        """Whether the thread has files (it has been used)."""
        return (self.run_dir(thread_id) / THREAD_RECORD).exists()

    def shard_for(self, name: str) -> str:
        """The shard a new thread named `name` (t<hex>) goes to."""
        return str(int(name[1:9], 16) % self.shard_count)

    def shard(self, name: str) -> Shard:
        """The shard `name` ("0", "1", ... or "legacy"), not started yet."""
        with self._lock:
            found = self._shards.get(name)
            if found is None:
                if self._closed:
                    raise MountToolError(f"{self!r} is closed")
                if name == legacy.LEGACY_SHARD and self.remote is not None:
                    raise MountToolError(
                        f"{self.root} holds threads of the earlier layout (ROOT/store): they "
                        "cannot be served from a bucket; serve the replicas from a new root")
                store = self.root / legacy.LEGACY_STORE if name == legacy.LEGACY_SHARD else None
                found = self._shards[name] = Shard(name, self.shards_dir / name,
                                                   self.mount_options, store=store)
            return found

    def shards(self) -> list[dict[str, Any]]:
        """The shards this Runs has used: {"name", "pid", "alive", "starts"}."""
        with self._lock:
            shards = list(self._shards.values())
        return [{"name": s.name, "pid": s.pid, "alive": s.alive(), "starts": s.starts}
                for s in shards]

    # -- using a thread --------------------------------------------------------

    def get(self, thread_id: Any) -> ThreadMount:
        """The thread's Mount (its files made on first use)."""
        with self.use(thread_id) as m:
            return m

    @contextlib.contextmanager
    def use(self, thread_id: Any, *, hooks: bool = True) -> Iterator[ThreadMount]:
        """`with runs.use(thread_id) as m:` the thread's Mount, its shard up,
        for the block (a delete waits for no block, it refuses one). (`hooks=False`:
        without the use hooks, for VfsdCheckpointer's own calls.)"""
        thread_id = thread_key(thread_id)
        entry = self._held(thread_id)
        try:
            m = entry.mount
            assert m is not None
            m.shard.ensure()  # started again if its daemon died since
            if hooks:
                _run_hooks(self, thread_id, m)
            yield m
        finally:
            with self._lock:
                entry.leases -= 1

    def current(self) -> ThreadMount:
        """The Mount of the running node's thread (inside a LangGraph run)."""
        return self.get(self.thread_of())

    def _held(self, thread_id: str) -> _Thread:
        """The thread's entry with its Mount open, counted as in use."""
        name = thread_dir_name(thread_id)
        with self._lock:
            if self._closed:
                raise MountToolError(f"{self!r} is closed")
            entry = self._threads.get(name)
            if entry is None:
                entry = self._threads[name] = _Thread(thread_id, name)
                self._trim()
            else:
                self._threads.move_to_end(name)
            if entry.thread_id != thread_id:
                raise _mixed(self.run_dir(thread_id), entry.thread_id, thread_id)
            entry.leases += 1
            if entry.mount is not None:
                return entry
        try:
            with entry.lock:
                if entry.mount is None:
                    entry.mount = self._open(thread_id, name)
        except BaseException:
            with self._lock:
                entry.leases -= 1
            raise
        return entry

    def _trim(self) -> None:
        """Forget the least recently used idle threads beyond THREADS_KEPT (self._lock held)."""
        excess = len(self._threads) - THREADS_KEPT
        for name in list(self._threads):
            if excess <= 0:
                return
            if not self._threads[name].leases:
                del self._threads[name]
                excess -= 1

    def _open(self, thread_id: str, name: str) -> ThreadMount:
        """The thread's Mount: its record made (a new thread) or checked, its
        volume made on its shard if need be, its links in place."""
        run_dir = self.threads_dir / name
        record = read_record(run_dir)
        if record is None:
            record = ThreadRecord(thread_id, self.shard_for(name))
            write_record(run_dir, record)
        elif record.thread_id != thread_id:
            raise _mixed(run_dir, record.thread_id, thread_id)
        if record.copying:
            raise MountToolError(
                f"thread {thread_id!r:.200} is a copy that did not finish ({run_dir}): "
                "delete it (Runs.delete, or the checkpointer's delete_thread) and copy again")
        if record.shard is None:  # a run dir of the earlier layout
            record = ThreadRecord(thread_id, legacy.adopt(self, run_dir, name, thread_id))
            write_record(run_dir, record)
        shard = self.shard(record.shard)
        try:
            shard.call("volume_create", volume=name, thread=thread_id)
        except ControlError as exc:
            if exc.code == "wrong_thread":
                raise MountToolError(f"{run_dir}: {exc.message}") from None
            raise
        link_thread_files(run_dir, shard, name)
        return ThreadMount(shard, name, thread_id, run_dir, lease_wait=self.lease_wait)

    # -- thread lifecycle ------------------------------------------------------

    def expected_run(self, thread_id: Any) -> str | None:
        """The run id a thread's files must be in, if the Runs fixes it (None: any)."""
        return None

    def delete(self, thread_id: Any) -> bool:
        """Delete the thread's files and snapshots (its volume leaves its
        shard; content other threads share stays) and its records under
        ROOT/threads. False when the thread has no files. MountError naming
        them while programs hold a file of it open; MountToolError for a call
        using it now, and for a directory whose record is missing, unreadable
        or names another thread (never deleted)."""
        thread_id = thread_key(thread_id)
        name = thread_dir_name(thread_id)
        run_dir = self.threads_dir / name
        with self._lock:
            entry = self._threads.get(name)
            if entry is not None and entry.leases:
                raise MountToolError(f"thread {thread_id!r:.200} is in use: its files cannot "
                                     "be deleted under a running call")
            self._threads.pop(name, None)
        if self.remote is not None:
            return self._delete_everywhere(thread_id, name, run_dir)
        if not os.path.lexists(run_dir):
            return False
        record = _record_to_delete(run_dir, thread_id)
        if record.shard is None:
            record = ThreadRecord(thread_id, legacy.adopt(self, run_dir, name, thread_id))
            write_record(run_dir, record)
        shard = self.shard(record.shard)
        try:
            shard.long_call("volume_drop", DROP_TIMEOUT, volume=name, thread=thread_id)
        except ControlError as exc:
            if exc.code == "busy":
                raise MountError(f"thread {thread_id!r:.200}: {exc.message}") from None
            raise
        remove_thread_dir(run_dir)
        return True

    def copy(self, source: Any, target: Any, *,
             before_done: Callable[[Path, Path], None] | None = None) -> ThreadMount | None:
        """Give thread `target` a copy of `source`'s files with every snapshot
        (same ids; content shared, not copied) on the source's shard; None
        when the source has no files. The target must have none yet, and
        nothing is deleted that this call did not make: a directory or a
        volume already there for the target is refused with the way out.

        `before_done(source_state, target_state)` is called with the two
        threads' record directories (`.vfsd`) once the files are copied and
        before the copy is marked complete (VfsdCheckpointer copies its own
        record there): if it raises, the target stays a copy that did not
        finish."""
        source, target = thread_key(source), thread_key(target)
        if source == target:
            raise ValueError("a thread cannot be copied onto itself")
        if self.remote is None and not self.exists(source):
            return None
        target_dir = self.run_dir(target)
        record = read_record(target_dir) if os.path.lexists(target_dir) else None
        if record is not None and record.copying:
            raise MountToolError(
                f"thread {target!r:.200} is a copy that did not finish ({target_dir}): "
                "delete it (Runs.delete, or the checkpointer's delete_thread) and copy again")
        if record is not None:
            raise MountToolError(f"thread {target!r:.200} already has files ({target_dir}): "
                                 "copy into a new thread")
        if os.path.lexists(target_dir):
            raise MountToolError(
                f"{target_dir} exists but has no {THREAD_RECORD}, so it is no thread this "
                f"Runs knows (a thread whose record was lost, or something else); nothing "
                f"was changed. Restore its {THREAD_RECORD}, or move it away, and copy again")
        if self.remote is not None:
            return self._copy_in_bucket(source, target, target_dir, before_done)
        name = target_dir.name
        with self.use(source, hooks=False) as m:
            write_record(target_dir, ThreadRecord(target, m.shard.name, copying=True))
            try:
                # A connection of its own: a long history may outlast the pool's timeout.
                m.client.long_call("volume_copy", COPY_TIMEOUT, target=name,
                                   target_thread=target)
            except ControlError as exc:
                remove_thread_dir(target_dir)  # the record this call wrote, and nothing else
                if "exists" in exc.message:
                    raise MountToolError(
                        f"{m.shard.shown} holds a volume for thread {target!r:.200} already "
                        f"({name}) that no record names (a copy that died half way, in a "
                        "version that wrote the record last); nothing was changed: drop it "
                        f"(the shard's control op volume_drop) and copy again") from None
                raise
            if before_done is not None:
                before_done(m.state_dir, target_dir / ".vfsd")
            write_record(target_dir, ThreadRecord(target, m.shard.name))
        return self.get(target)

    # -- replicas: a Runs with a remote ------------------------------------------

    @contextlib.contextmanager
    def hold(self, thread_id: Any, *, token: str | None = None) -> Iterator[ThreadMount]:
        """`with runs.hold(thread_id) as m:` the thread's Mount, held as one run
        holds it. With a remote, the thread's files are written only during a
        run: the block is one (`ThreadMount.begin_run`: caught up with the
        bucket, the thread's lease taken, waiting `lease_wait` seconds for
        another run of it; then `end_run`: what it snapshotted published and
        the lease given back). ThreadBusy when another run keeps it. Without
        a remote, the same as `use`. (VfsdCheckpointer holds a thread this way
        for what it writes outside graph runs: `update_state`, a prune, a
        copy's checkpoints; graph runs are held from their start to their end.)"""
        with self.use(thread_id, hooks=False) as m:
            if self.remote is None:
                yield m
                return
            token = token or f"hold-{uuid.uuid4()}"
            m.begin_run(token)
            try:
                yield m
            except BaseException:
                try:
                    m.end_run(token)
                except MountToolError as exc:  # the block's error is the one to see
                    logger.warning("vfsd: thread %.80r: ending its hold failed: %s",
                                   m.thread_id, exc)
                raise
            m.end_run(token)

    def _delete_everywhere(self, thread_id: str, name: str, run_dir: Path) -> bool:
        """Delete a thread of a Runs with a remote: a tombstone in the bucket
        (waiting for a run of it under way anywhere), its run's objects and
        this replica's copy; every other replica drops its copy at the
        thread's next run there. True when the thread had files anywhere."""
        record = None
        if os.path.lexists(run_dir):
            record = _record_to_delete(run_dir, thread_id)
        shard = self.shard(record.shard if record is not None and record.shard is not None
                           else self.shard_for(name))
        try:
            res = shard.long_call("remote_delete", DROP_TIMEOUT + self.lease_wait,
                                  volume=name, thread=thread_id, wait=self.lease_wait)
        except ControlError as exc:
            if exc.code == "busy":
                raise MountError(f"thread {thread_id!r:.200}: {exc.message}") from None
            if exc.code == "lease_held":
                raise ThreadBusy(f"thread {thread_id!r:.200} cannot be deleted while a run "
                                 f"holds it: {exc.message}", thread_id=thread_id,
                                 holder=exc.message) from None
            raise
        if record is not None:
            remove_thread_dir(run_dir)
        return record is not None or res.get("run") is not None

    def _copy_in_bucket(self, source: str, target: str, target_dir: Path,
                        before_done: Callable[[Path, Path], None] | None) -> ThreadMount | None:
        """`copy` with a remote: a new bucket run for the target holding the
        source's published snapshots (same ids; manifests written again, no
        chunk copied), never touching the source's lease or history. Its
        answer is the returned Mount's `copy_info`."""
        name, source_name = target_dir.name, thread_dir_name(source)
        source_dir = self.threads_dir / source_name
        record = read_record(source_dir) if os.path.lexists(source_dir) else None
        if record is not None and record.thread_id != source:
            raise _mixed(source_dir, record.thread_id, source)
        # Where the source's chunks are cached already, if anywhere here.
        shard_name = record.shard if record is not None and record.shard is not None \
            else self.shard_for(name)
        shard = self.shard(shard_name)
        write_record(target_dir, ThreadRecord(target, shard_name, copying=True))
        try:
            info = shard.long_call("remote_copy", COPY_TIMEOUT, volume=source_name,
                                   thread=source, target=name, target_thread=target)
        except ControlError as exc:
            remove_thread_dir(target_dir)  # the record this call wrote, and nothing else
            if exc.code == "not_found":
                return None  # the source has no files in the bucket
            if exc.code == "exists":
                raise MountToolError(f"thread {target!r:.200} exists in {self.remote} "
                                     f"already ({exc.message}): copy into a new thread") from None
            raise
        link_thread_files(target_dir, shard, name)
        if before_done is not None:
            before_done(source_dir / ".vfsd", target_dir / ".vfsd")
        write_record(target_dir, ThreadRecord(target, shard_name))
        m = self.get(target)
        m.copy_info = info
        return m

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Unmount every shard and wait for its daemon to exit (the calls in
        flight get CLOSE_GRACE_SECONDS to end; a shard still busy after that
        is detached lazily and its daemon stopped)."""
        with self._lock:
            self._closed = True
        deadline = time.monotonic() + CLOSE_GRACE_SECONDS
        while time.monotonic() < deadline:
            with self._lock:
                if not any(e.leases for e in self._threads.values()):
                    break
            time.sleep(0.05)
        errors = self._finalizer() or []
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


def _close_shards(shards: dict[str, Shard], pid: int) -> list[str]:
    """Close every shard at once (each waits for its daemon); the errors.
    (Also the Runs' finalizer: at exit, one after another.)"""
    if os.getpid() != pid or not shards:
        return []
    errors: list[str] = []

    def close(shard: Shard) -> None:
        try:
            shard.close()
        except MountError as exc:
            errors.append(f"{shard.shown}: {exc}")

    workers = [threading.Thread(target=close, args=(s,), name=f"vfsd-close-{s.name}")
               for s in list(shards.values())]
    try:
        for w in workers:
            w.start()
    except RuntimeError:  # interpreter shutdown: no new threads
        workers = [w for w in workers if w.ident is not None]
        for shard in list(shards.values())[len(workers):]:
            close(shard)
    for w in workers:
        w.join()
    return errors


def _remote_option(options: dict[str, Any]) -> str | None:
    """The `remote=` (or `remote_url=`) option taken out of `options`, checked."""
    remote = options.pop("remote", None)
    alias = options.pop("remote_url", None)
    if remote and alias and remote != alias:
        raise ValueError(f"remote={remote!r} and remote_url={alias!r} differ: pass one")
    remote = remote or alias
    if remote is None:
        return None
    if not isinstance(remote, str) or not remote.startswith("s3://") or len(remote) > 2048:
        raise ValueError(f"remote= is the bucket the replicas share, s3://BUCKET/PREFIX, not "
                         f"{remote!r:.100}")
    return remote


def _lease_wait(options: Mapping[str, Any]) -> float:
    """How long a run waits for another run of its thread (the daemon's
    `remote_lease_wait`, by default its lease TTL + 5 s)."""
    wait = options.get("remote_lease_wait")
    if wait is not None:
        return float(wait)
    return float(options.get("remote_lease_ttl") or DEFAULT_LEASE_TTL) + 5.0


def _record_to_delete(run_dir: Path, thread_id: str) -> ThreadRecord:
    """The record of the thread about to be deleted; a MountToolError when
    `run_dir` is not that thread's (a delete never takes what it cannot name)."""
    record = read_record(run_dir)
    if record is None:
        raise MountToolError(f"{run_dir} holds no {THREAD_RECORD}: it is not a thread a Runs "
                             "made (or its record was lost); not deleting it")
    if record.thread_id != thread_id:
        raise MountToolError(f"{run_dir} records thread {record.thread_id!r:.200}, not "
                             f"{thread_id!r:.200}: not deleting it")
    return record


def _mixed(run_dir: Path, recorded: str, asked: str) -> MountToolError:
    return MountToolError(
        f"{run_dir} records thread {recorded!r:.200}, not {asked!r:.200} (two ids with one "
        "hash, or a record edited by hand): refusing to mix them")


def runs(root: str | os.PathLike[str], **options: Any) -> Runs:
    """A `Runs` on `root`: every graph thread a directory of a few shard
    daemons (a context manager, sync or async). Options as for `Runs`."""
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
