"""A shard daemon: one store, one mount, every volume of the store a directory of it.

    SHARD/fs/<volume>/     a volume's tree (for a Runs: a graph thread's files)
    SHARD/.vfsd/           the store (lmdb/, chunks/), vfsd.sock, vfsd.log, vfsd.pid

A volume is served from its first use (a lookup in the mount, a control
request naming it) for as long as the daemon runs; one that is only records
costs nothing until then. Volumes are made, dropped and copied through the
control socket (`volume_create`, `volume_drop`, `volume_copy`), never through
the mount, whose root is read-only. Control requests on a volume's files name
it (`"volume": NAME`); the shard refuses one naming a volume it does not hold.

A shard's volume names are 1-64 letters, digits, `_` and `-` (a Runs names
each thread `t` + 32 hex digits of its id's SHA-256; see mount_tool.runs), so
a name is always a plain directory entry. The thread id a volume serves is
kept with it (meta `thread`) and checked again whenever it is named, so two
ids with one hash never share files.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

import structlog
import trio

from vfsd.control.requests import RequestError, arg
from vfsd.fuse.diskspace import DiskSpace
from vfsd.fuse.provenance import ControlPeers
from vfsd.fuse.shardops import LOCAL_BITS, SLOT_LIMIT, Numbers, ShardOperations, VolumeKernel
from vfsd.fuse.writers import holders
from vfsd.snapshots.snapshots import drop_volume_in_steps, finish_drops_in_steps
from vfsd.steps import drive
from vfsd.store.store import Store

from .config import Config
from .daemon import DaemonBase, shown_path
from .errors import Exists, NoSuchVolume, StartupError, StoreLocked, StoreVersionError
from .rundir import SHARD_LOCK, RunDir, lock_volume
from .volume import Place, Volume

log = structlog.get_logger("vfsd.shard")

VOLUME_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: seconds a worker thread may keep the GIL from the loop (Python's default: 5 ms)
GIL_SWITCH_S = 0.001
#: requests a shard serves at once, at least (see `_fuse_main`)
SHARD_MAX_TASKS = 128
#: thread ids longer than this (UTF-8 bytes) are refused (as mount_tool refuses them)
MAX_THREAD_ID_BYTES = 64 * 1024
#: seconds `volumes` may hold the loop before it lets other requests in
VOLUMES_SLICE_S = 0.005


def valid_name(name: str | bytes) -> str | None:
    """The volume name as text, or None if it cannot name a volume of a shard."""
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            return None
    return name if isinstance(name, str) and VOLUME_NAME.fullmatch(name) else None


class ShardDaemon(DaemonBase):
    """Serves every volume of one store under one mount (see the module docstring)."""

    def __init__(self, run: RunDir, config: Config, store_dir=None) -> None:
        super().__init__(run, config, Path(store_dir) if store_dir else run.state)
        self.numbers = Numbers()
        #: the processes that reached the control socket: they may name tool
        #: calls in any volume (`fuse.provenance`)
        self.peers = ControlPeers()
        self.ops = ShardOperations(self, self.numbers)
        self.loaded: dict[str, Volume] = {}
        #: volumes being dropped or made again: served to no one meanwhile (a
        #: lookup between letting one go and deleting its name would serve it
        #: again, over records about to be deleted)
        self.leaving: set[str] = set()
        self._by_slot: dict[int, Volume] = {}
        self._by_vol: dict[int, Volume] = {}
        self._next_slot = 1
        self._lock_fd: int | None = None
        self._nursery: trio.Nursery | None = None
        self._process_handlers = None
        self._names_cache: tuple[float, list[bytes]] | None = None
        #: the remote tier (`vfsd.remote.shardtier.ShardTier`) with --remote, else None
        self.remote = None
        self.runs = None  # its ops (`vfsd.replicas.ThreadRuns`)
        self.shard_ops = {"volumes": self.op_volumes, "volume_create": self.op_volume_create,
                          "volume_drop": self.op_volume_drop, "volume_copy": self.op_volume_copy,
                          "volume_adopt": self.op_volume_adopt, "shard": self.op_shard,
                          **dict.fromkeys(REMOTE_OPS, self.op_no_remote)}

    # --------------------------------------------------------------- setup

    @property
    def operations(self):
        return self.ops

    @property
    def control_host(self):
        return self

    @property
    def store_dir_path(self):
        return self.store_dir

    def prepare(self) -> None:
        # A worker thread running Python (a diff, a plan) hands the GIL back
        # after this long at most: the loop serves every volume.
        sys.setswitchinterval(GIL_SWITCH_S)
        self._check_fuse()
        try:
            self._prepare_mountpoint()
            try:
                self._lock_fd = lock_volume(self.store_dir, SHARD_LOCK)
            except StoreLocked:
                raise StartupError(f"the store {self.store_dir} is in use by another vfsd "
                                   "(a shard's store is served by one daemon)") from None
            self._hold_store()
            try:
                self.store = Store.base(self.store_dir, chunk_size=self.config.chunk_size,
                                        inline_max=self.config.inline_max, defer_deletes=True)
            except StoreVersionError as exc:
                raise StartupError(str(exc)) from None
        except OSError as exc:
            raise StartupError(f"cannot prepare {self.run.path}: {exc}") from None
        self._fix_chunk_size()
        self._prepare_remote()
        gone = self.store.finish_deletes()
        if gone:
            log.info("deletes_finished", files=gone)

    def _prepare_remote(self) -> None:
        """With --remote (or a remote the store records): the shard's remote tier,
        its boto3 client loaded only then."""
        from vfsd.store import remotestate

        url = self.config.remote_url or remotestate.remote_url(self.store)
        if url is None:
            return
        from vfsd.remote.objstore import BadRemoteURL, RemoteURL
        from vfsd.remote.shardtier import ShardTier, ShardTierError

        from .replicas import ThreadRuns

        try:
            self.remote = ShardTier(RemoteURL.parse(url), self.config)
            self.remote.attach(self.store)
        except (ShardTierError, BadRemoteURL) as exc:
            if self.remote is not None:
                self.remote.close()
                self.remote = None
            raise StartupError(str(exc)) from None
        self.runs = ThreadRuns(self, self.remote)
        self.shard_ops.update(self.runs.ops)
        log.info("remote_tier", remote=url)

    def op_no_remote(self, req: dict) -> dict:
        raise RequestError("no_remote", "this shard has no remote tier (serve it with "
                                        "--remote s3://BUCKET/PREFIX)")

    def served(self) -> list[Volume]:
        return list(self.loaded.values())

    def titles(self) -> tuple[str, str]:
        """`vfsd shard 0 of /srv/runs` for shard 0 of a Runs root (ROOT/shards/0)."""
        path = self.run.path
        if path.parent.name == "shards":
            name = shown_path(Path(path.name))
            return f"vfsd shard {name} of {shown_path(path.parent.parent)}", f"vfsd shard {name}"
        return f"vfsd shard of {shown_path(path)}", f"vfsd shard {shown_path(Path(path.name))}"

    def in_use(self, vol: int, ino: int) -> bool:
        v = self._by_vol.get(vol)
        return v is not None and ino in v.files.files

    # ----------------------------------------------------------- volumes

    def volume_at_slot(self, slot: int) -> Volume | None:
        return self._by_slot.get(slot)

    @property
    def store_dir_str(self) -> str:
        return str(self.store_dir)

    def root_owner(self) -> tuple[int, int]:
        return os.getuid(), os.getgid()

    def volume_names(self) -> list[bytes]:
        """The names of the store's volumes that a shard serves, sorted."""
        return sorted(n.encode() for n in self.store.volumes() if valid_name(n))

    def open_volume(self, name: str | bytes) -> Volume | None:
        """The volume `name`, served from now on; None if the store has none."""
        text = valid_name(name)
        if text is None:
            return None
        volume = self.loaded.get(text)
        if volume is not None:
            return volume
        if text in self.leaving:
            return None
        try:
            view = self.store.view(text)
        except NoSuchVolume:
            return None
        if view.meta_u64(b"incomplete"):
            return None  # a copy still being made (or one that died: made again)
        return self._serve(view)

    def _serve(self, view: Store) -> Volume:
        slot = self._take_slot()
        kernel = VolumeKernel(slot, self.numbers)
        place = Place(self.run.path, self.run.mountpoint / view.volume, self.run.mountpoint)
        volume = Volume(view, self.config, place, kernel=kernel)
        volume.kernel = kernel
        volume.slot = slot
        volume.ops.in_use = self.in_use
        volume.ops.provenance.peers = self.peers
        if self.remote is not None:
            volume.attach_remote(self.remote.volume_tier(volume))
        try:
            volume.prepare(recover_now=False)
        except Exception:
            self._free_slot(slot)
            raise
        self.loaded[view.volume] = volume
        self._by_slot[slot] = volume
        self._by_vol[view.vol] = volume
        if self._nursery is not None:
            self._nursery.start_soon(self._run_volume, volume)
            if volume.held is not None:  # a change a crash cut short: finished first
                self._nursery.start_soon(volume.recover)
        log.info("volume_served", volume=view.volume, slot=slot)
        return volume

    async def _run_volume(self, volume: Volume) -> None:
        with trio.CancelScope() as scope:
            volume.cancel_scope = scope
            await volume.serve()

    def _take_slot(self) -> int:
        """A new slot. Never one used before in this daemon's life: the kernel
        may still hold numbers of a volume that went, and they must never
        name another volume's inodes (they answer ESTALE instead)."""
        if self._next_slot >= SLOT_LIMIT:
            raise RequestError("too_many_volumes", (
                f"this shard daemon has served {SLOT_LIMIT - 1:,} volumes since it started; "
                "restart it (unmount the shard) to serve more"))
        self._next_slot += 1
        return self._next_slot - 1

    def _free_slot(self, slot: int) -> None:
        self.numbers.forget_slot(slot)

    def forgotten(self, volume: Volume) -> None:
        """The kernel let go of something of `volume` (for idle bookkeeping)."""
        volume.last_used = time.monotonic()

    def _unserve(self, volume: Volume) -> None:
        """Stop serving `volume` (dropped): its tasks end, its slot is free."""
        scope = getattr(volume, "cancel_scope", None)
        if scope is not None:
            scope.cancel()
        self.loaded.pop(volume.name, None)
        self._by_slot.pop(volume.slot, None)
        self._by_vol.pop(volume.store.vol, None)
        self._free_slot(volume.slot)

    # ------------------------------------------------------- control host

    def handlers_for(self, op: str, req: dict):
        fn = self.process_handlers.table.get(op)
        if fn is not None:
            return fn, None
        fn = self.shard_ops.get(op)
        if fn is not None:
            return fn, None
        if "volume" not in req:
            if op in Volume.handler_names():
                raise RequestError("bad_request", f"{op!r} works on one volume of this shard: "
                                                  "name it with 'volume'")
            return None, None
        volume = self._volume_arg(req)
        return volume.control.handler(op), volume

    def known_ops(self) -> list[str]:
        return sorted({*self.process_handlers.table, *self.shard_ops,
                       *Volume.handler_names()})

    @property
    def process_handlers(self):
        if self._process_handlers is None:
            from vfsd.control.handlers import ProcessHandlers

            self._process_handlers = ProcessHandlers(self.run.mountpoint, self.stop_serving)
        return self._process_handlers

    def _name_arg(self, req: dict, key: str = "volume") -> str:
        raw = arg(req, key, str)
        name = valid_name(raw)
        if name is None:
            raise RequestError("bad_request", f"{key!r} must be 1-64 letters, digits, '_' or "
                                              f"'-', not {raw[:80]!r}")
        return name

    def _volume_arg(self, req: dict) -> Volume:
        name = self._name_arg(req)
        volume = self.open_volume(name)
        if volume is None:
            raise RequestError("no_such_volume", f"this shard ({self.run.path}) holds no "
                                                 f"volume {name!r}")
        if "thread" in req:
            self._check_thread(volume.store, arg(req, "thread", str))
        return volume

    def _thread_arg(self, req: dict, key: str = "thread") -> str | None:
        thread = arg(req, key, str, None)
        if thread is not None and len(thread.encode("utf-8", "surrogatepass")) > \
                MAX_THREAD_ID_BYTES:
            raise RequestError("bad_request", f"{key!r} is at most {MAX_THREAD_ID_BYTES} bytes")
        return thread

    @staticmethod
    def _recorded_thread(store: Store) -> str | None:
        raw = store.meta_bytes(b"thread")
        return raw.decode("utf-8", "surrogatepass") if raw is not None else None

    def _check_thread(self, store: Store, thread: str) -> None:
        recorded = self._recorded_thread(store)
        if recorded is not None and recorded != thread:
            raise RequestError("wrong_thread", (
                f"volume {store.volume!r} holds thread {recorded[:200]!r}, not {thread[:200]!r} "
                "(two thread ids with one hash, or a request for another thread): refusing "
                "to mix their files"))

    # ------------------------------------------------------- shard ops

    def op_shard(self, req: dict) -> dict:
        """What the shard serves: its store, the volumes it holds and serves."""
        names = self.volume_names()
        return {"shard": str(self.run.path), "store": str(self.store_dir),
                "mountpoint": str(self.run.mountpoint), "pid": os.getpid(),
                "volumes": len(names), "served": len(self.loaded),
                "uptime_s": round(time.monotonic() - self.started, 1)}

    async def op_volumes(self, req: dict) -> dict:
        """Every volume with its thread id, step, files, bytes, snapshots and
        whether it is served (from the store), and the store's totals. Gives
        the loop back between volumes: a shard may hold thousands. With
        `volume`: that volume alone (none if the shard holds no such volume)."""
        from .status import store_summary, volume_summary

        names = self.volume_names()
        if "volume" in req:
            wanted = self._name_arg(req).encode()
            names = [n for n in names if n == wanted]
        out = []
        since = time.monotonic()
        for raw in names:
            name = raw.decode()
            try:
                view = self.loaded[name].store if name in self.loaded else self.store.view(name)
            except NoSuchVolume:
                continue  # dropped meanwhile
            out.append({**volume_summary(view), "served": name in self.loaded})
            if time.monotonic() - since > VOLUMES_SLICE_S:
                await trio.sleep(0)
                since = time.monotonic()
        # Each served volume remembers the refusals it met; the disk alone otherwise.
        disks = [v.ops.disk for v in self.loaded.values()] or [DiskSpace(self.store_dir)]
        disk_full = any(d.full() for d in disks)
        return {"volumes": out, "store": {**store_summary(self.store), "disk_full": disk_full}}

    def op_volume_create(self, req: dict) -> dict:
        """Make a volume (a new thread's), or find it: the thread it records
        must be the one asked for."""
        name = self._name_arg(req)
        thread = self._thread_arg(req)
        try:
            view = self.store.view(name)
        except NoSuchVolume:
            view = None
        if view is not None:
            if view.meta_u64(b"incomplete"):
                raise RequestError("incomplete", f"volume {name!r} is a copy still being made")
            if thread is not None:
                self._check_thread(view, thread)
                if self._recorded_thread(view) is None:
                    view.set_meta_bytes(b"thread", thread.encode("utf-8", "surrogatepass"))
            return {"volume": name, "created": False}
        with self.store.txn(write=True) as txn:
            try:
                vol = self.store.create_volume(txn, name)
            except Exists:
                return {"volume": name, "created": False}
            if thread is not None:
                txn.put(b"v" + vol.to_bytes(4, "big") + b":thread",
                        thread.encode("utf-8", "surrogatepass"), db=self.store.db["meta"])
        log.info("volume_created", volume=name)
        return {"volume": name, "created": True}

    async def op_volume_drop(self, req: dict) -> dict:
        """Delete a volume: its files, snapshots and records; content other
        volumes hold stays. Refused while a program holds a file of it open."""
        name = self._name_arg(req)
        thread = self._thread_arg(req)
        try:
            view = self.loaded[name].store if name in self.loaded else self.store.view(name)
        except NoSuchVolume:
            return {"volume": name, "dropped": False}
        if thread is not None:
            self._check_thread(view, thread)
        volume = self.loaded.get(name)
        if volume is not None:
            self._refuse_if_running(volume)
        with self.leaving_volume(name):
            if volume is not None:
                await self._let_go(volume)
            # In short transactions: a large thread's records would otherwise hold
            # every other volume for as long as they take to delete.
            await drive(drop_volume_in_steps(self.store, name))
        log.info("volume_dropped", volume=name)
        return {"volume": name, "dropped": True}

    @contextlib.contextmanager
    def leaving_volume(self, name: str):
        """`name` is served to no one for the block (see `leaving`); a second
        drop or remake of it meanwhile is refused."""
        if name in self.leaving:
            raise RequestError("busy", f"volume {name!r} is being dropped or made again")
        self.leaving.add(name)
        try:
            yield
        finally:
            self.leaving.discard(name)

    def _refuse_if_running(self, volume: Volume) -> None:
        tier = volume.remote
        if tier is not None and getattr(tier, "run", None) is not None:
            raise self.runs._held_here(volume.name, tier)

    async def _let_go(self, volume: Volume) -> None:
        """Stop serving `volume`, and make the kernel forget it; refused
        (`busy`, naming them) while programs hold one of its files or
        directories (a descriptor, a mapping, a working directory)."""
        await volume.wait_free()
        slot = volume.slot
        held = await trio.to_thread.run_sync(
            holders, self.run.mountpoint, lambda kino: kino >> LOCAL_BITS == slot)
        if held:
            shown = ", ".join(f"pid {pid} {cmd}" for pid, cmd in held[:5])
            more = f" and {len(held) - 5} more" if len(held) > 5 else ""
            raise RequestError("busy", f"volume {volume.name!r} is in use by {shown}{more}: "
                                       "end those programs (or leave its directory) first")
        volume.shutdown()
        self._unserve(volume)
        name = volume.name.encode()
        root = volume.kernel.root_ino
        try:
            await trio.to_thread.run_sync(_invalidate_entry, 1, name, root)
        except OSError:
            pass  # the kernel had not cached it

    def op_volume_adopt(self, req: dict) -> dict:
        """Serve a volume a run dir of an earlier layout made (named by its
        path, which names no directory of a shard) as `volume`, recording
        `thread`. For a Runs root of the one-daemon-per-thread layout, whose
        shared store becomes a shard as it is."""
        old = arg(req, "from_name", str)
        name = self._name_arg(req)
        thread = self._thread_arg(req)
        if valid_name(old) is not None:
            raise RequestError("bad_request", f"{old!r} is a shard's volume name already")
        if old not in self.store.volumes():
            if name in self.store.volumes():
                return {"volume": name, "adopted": False}  # done by an earlier call
            raise RequestError("no_such_volume", f"the store holds no volume {old[:200]!r}")
        self.store.rename_volume(old, name)
        if thread is not None:
            self.store.view(name).set_meta_bytes(b"thread", thread.encode("utf-8",
                                                                           "surrogatepass"))
        log.info("volume_adopted", volume=name, was=old[:200])
        return {"volume": name, "adopted": True}

    async def op_volume_copy(self, req: dict) -> dict:
        """Give a new volume `target` (for thread `target_thread`) a copy of
        `volume` (its files now and its whole snapshot history under the same
        ids; content shared, not copied)."""
        if self.remote is not None:
            raise RequestError("bad_request", "a shard with a remote copies threads in the "
                                              "bucket: remote_copy (a local copy would be "
                                              "this replica's alone)")
        source = self._volume_arg(req)
        target = self._name_arg(req, "target")
        thread = self._thread_arg(req, "target_thread")
        res = await source.snapservice.copy_to_volume(target, thread=thread)
        return res

    # ------------------------------------------------------------------ run

    async def _start_tasks(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        if self.remote is not None:
            await self.remote.start(nursery)
        if self.store.pending_drops():  # a drop a crash cut short
            nursery.start_soon(drive, finish_drops_in_steps(self.store))
        for volume in list(self.loaded.values()):
            nursery.start_soon(self._run_volume, volume)
            if volume.held is not None:
                nursery.start_soon(volume.recover)

    async def _fuse_main(self, cancel_scope: trio.CancelScope) -> None:
        # Many volumes share the loop: requests waiting for a held volume must
        # leave room for everyone else's.
        import pyfuse3

        try:
            await pyfuse3.main(max_tasks=max(self.config.max_tasks, SHARD_MAX_TASKS))
        finally:
            cancel_scope.cancel()

    def _mounted_fields(self) -> dict:
        return {"shard": True, "remote": str(self.remote.url) if self.remote else None}

    def abandon(self) -> None:
        if self.remote is not None:
            self.remote.close()  # after a failed start

    def _after_close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


#: the ops of a shard's remote tier (`vfsd.replicas`)
REMOTE_OPS = ("remote_begin", "remote_end", "remote_delete", "remote_copy", "remote_runs",
              "remote_prune")


def _invalidate_entry(parent: int, name: bytes, deleted: int) -> None:
    import pyfuse3

    pyfuse3.invalidate_entry(parent, name, deleted=deleted)


def run_shard(run: RunDir, config: Config, store_dir=None, *, ready_fd: int | None = None,
              log_to_stderr: bool = False) -> int:
    """Serve a shard until unmounted (see `daemon.serve_process`)."""
    from .daemon import serve_process

    return serve_process(run, config, lambda: ShardDaemon(run, config, store_dir),
                         ready_fd=ready_fd, log_to_stderr=log_to_stderr)


