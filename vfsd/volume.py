"""One served volume: its store handle and everything that works on it.

A run dir's daemon serves one volume at its mount root; a shard daemon serves
many, each a directory of its mount (`vfsd.shard`). Either way a volume has
its own open files, operations, evictor, snapshots and views, wired here the
same way, and its own background tasks. What belongs to the process (the
LMDB environment, group commit, syncs, the FUSE session, the control socket)
belongs to the daemon that holds the volume.

Callers that hold a volume (the control handlers, the status report, the
metrics) find the same names on it as on a daemon of one volume: `store`,
`ops`, `evictor`, `snapshots`, `snapservice`, `settler`, `remote`, `config`,
`run` (its place: `mountpoint` is where the volume's tree is seen) and
`started`.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from vfsd.fuse import ctldir
from vfsd.fuse.evictedview import EvictedView
from vfsd.fuse.evictindex import EvictedIndex
from vfsd.fuse.evictlog_view import EvictionLogView
from vfsd.fuse.fs import VfsdOperations
from vfsd.fuse.kernel import Kernel
from vfsd.fuse.openfiles import OpenFiles
from vfsd.fuse.settle import Settler
from vfsd.fuse.snapservice import SnapshotService
from vfsd.fuse.snapview import SnapshotView
from vfsd.snapshots.snapshots import Snapshots
from vfsd.store.store import Store

from .config import Config
from .errors import StoreError
from .eviction import Evictor

if TYPE_CHECKING:
    from vfsd.remote.remotetier import RemoteTier

log = structlog.get_logger("vfsd.volume")


@dataclass(frozen=True)
class Place:
    """Where a volume of a shard is seen: `mountpoint` is its directory in the
    shard's mount, `mount_root` the mount itself, `path` the shard's run dir
    (nothing may be forked inside it)."""

    path: Path
    mountpoint: Path
    mount_root: Path


class Volume:
    """A volume and the objects that serve it (see the module docstring)."""

    def __init__(self, store: Store, config: Config, place: Any, *,
                 kernel: Kernel | None = None, stop_serving=None) -> None:
        self.store = store
        self.config = config
        self.run = place
        self.name = store.volume
        self.started = time.monotonic()
        self.remote: RemoteTier | None = None
        self._stop_serving = stop_serving
        self.files = OpenFiles(store, chunk_size=config.chunk_size,
                               inline_max=config.inline_max)
        self.ops = VfsdOperations(store, self.files, entry_timeout=config.entry_timeout,
                                  durability=config.durability,
                                  xattr_reads=config.xattr_reads)
        if kernel is not None:
            self.ops.kernel = kernel
        self.evictor = Evictor(store, self.ops, config)
        self.settler = Settler(self.files)
        self.snapshots = Snapshots(store, keep_last=config.snapshot_keep_last,
                                   keep_steps=config.snapshot_keep_steps,
                                   keep_bytes=config.snapshot_keep_bytes)
        self.snapservice = SnapshotService(self, self.snapshots)
        self.ops.snapview = SnapshotView(self.snapshots, self.ops)
        self.ops.evicted = EvictedIndex(store, self.snapshots)
        self.ops.evictedview = EvictedView(self.ops.evicted, self.ops)
        self.evictor.after_step = self.snapservice.apply_retention
        self.ops.ctl.renderers = {ctldir.FILES[b"status.json"]: self._render_status}
        self.ops.ctl.paged = {ctldir.FILES[b"evicted.ndjson"]: EvictionLogView(store)}
        self.ops.quota = self.evictor.reserve
        self.ops.limits = self.evictor.limits
        self.ops.evicted_names = self.evictor.take_invalidations
        self.ops.reserve_file = self.evictor.reserve_file
        self.ops.used_step = self.evictor.used_step
        # Background changes wait while a long operation holds the volume.
        self.evictor.gate = self.wait_free
        self.settler.gate = self.wait_free
        self._control = None
        #: set while a long operation holds the volume: its requests wait (`hold`)
        self.held: trio.Event | None = None
        self.last_used = time.monotonic()

    # ------------------------------------------------------------ lifecycle

    def attach_remote(self, remote: RemoteTier) -> None:
        self.remote = remote
        self.ops.remote = remote

    def prepare(self, *, recover_now: bool = True) -> None:
        """Before the kernel sees any name: free what a previous run left
        nameless, finish a change in steps a crash cut short, and apply the
        policy at the stored step. With `recover_now` False, a change to
        finish is left to `recover` (then the volume is held until it is
        done: a shard's other volumes are served meanwhile)."""
        self._free_orphans()
        if self.snapshots.interrupted() is not None:
            if not recover_now:
                self.held = trio.Event()
                return
            steps = self.snapshots.finish_interrupted()
            try:
                while True:
                    next(steps)
            except StopIteration:
                pass
            self._free_orphans()
            log.info("interrupted_change_finished", volume=self.name)
        self._catch_up_with_step()

    def _free_orphans(self) -> None:
        for ino in self.store.orphans():
            self.store.free_inode(ino)

    async def recover(self) -> None:
        """Finish a change in steps a crash cut short, yielding between its
        transactions; the volume is held (by `prepare`) until then."""
        from vfsd.steps import drive

        found = self.snapshots.interrupted()
        try:
            await drive(self.snapshots.finish_interrupted())
            self._free_orphans()  # what the finished restore unlinked (nobody holds it)
            log.info("interrupted_change_finished", volume=self.name, change=found)
            self._catch_up_with_step()
        finally:
            held, self.held = self.held, None
            if held is not None:
                held.set()

    def _catch_up_with_step(self) -> None:
        """A step advance stores the step, then evicts in a second transaction:
        a daemon killed between the two left the step advanced and nothing
        evicted. Evicting at start finishes such an advance (and applies a
        policy made stricter since the last run); with nothing due it costs a
        range scan per step index."""
        if self.remote is not None and not self.remote.writable():
            return  # another worker holds the run: this store stays as it is
        try:
            report = self.evictor.run()
            deleted = self.snapshots.apply_retention()
        except StoreError as exc:  # a full disk, say: the next step advance retries
            log.warning("catch_up_failed", volume=self.name, error=str(exc))
            return
        finally:
            self.evictor.take_invalidations()  # the kernel holds no names of it yet
        if report["files"] or deleted:
            log.info("caught_up_with_step", volume=self.name, step=report["step"],
                     evicted=report["files"], bytes=report["bytes"],
                     snapshots_deleted=deleted)

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The volume's own background tasks, until cancelled."""
        from vfsd.fuse.journal import FLUSH_INTERVAL

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.ops.run_invalidator)
            nursery.start_soon(self.settler.run)
            nursery.start_soon(self.evictor.run_rechecks)
            task_status.started()
            while True:
                await trio.sleep(FLUSH_INTERVAL)
                self.ops.journal.flush_if_changed()

    def shutdown(self) -> None:
        """Commit buffers, free what the kernel no longer references, record
        the last step's uses (the daemon then syncs and closes the store)."""
        self.ops.forget_all()
        if self.remote is None or self.remote.writable():
            self.ops.journal.flush_if_changed()
            try:
                self.evictor.flush_uses()  # the opens of the last step
            except StoreError as exc:
                log.warning("uses_not_recorded", volume=self.name, error=str(exc))

    # ---------------------------------------------------------- holding

    async def wait_free(self) -> None:
        """Return once no long operation holds the volume."""
        while self.held is not None:
            await self.held.wait()

    @contextlib.asynccontextmanager
    async def hold(self):
        """Hold the volume for a long operation done in many short
        transactions: the volume's own requests wait until it is over (so it
        sees, and leaves, one consistent tree), every other volume's go on
        between its transactions."""
        await self.wait_free()
        self.held = trio.Event()
        try:
            yield
        finally:
            held, self.held = self.held, None
            held.set()

    # ------------------------------------------------------------- serving

    @staticmethod
    def handler_names() -> list[str]:
        """The control ops that work on one volume."""
        from vfsd.control.handlers import VolumeHandlers

        return VolumeHandlers.names()

    @property
    def control(self):
        """The control handlers of this volume (made on first use)."""
        if self._control is None:
            from vfsd.control.handlers import VolumeHandlers

            self._control = VolumeHandlers(self)
        return self._control

    def stop_serving(self) -> None:
        if self._stop_serving is not None:
            self._stop_serving()

    def _render_status(self) -> bytes:
        from .status import live_status

        return json.dumps(live_status(self), indent=2).encode() + b"\n"
