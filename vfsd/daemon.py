"""The daemon process: open the store, mount, serve FUSE and control requests.

One trio nursery owns every task: the FUSE loop, the control server, the
signal watcher, and for a remote store the remote tier's tasks (uploads,
fetches, cache, publishing, the lease). Shutdown is cancellation: unmounting (by `vfsd umount`,
`fusermount3 -u` or SIGTERM) ends the FUSE loop, and the nursery is cancelled.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyfuse3
import structlog
import trio

from vfsd.store import compact, remotestate
from vfsd.store.lmdbcheck import check_readable
from vfsd.store.store import Store

from . import __version__, notify
from .config import Config
from .errors import StartupError, StoreError, StoreLocked, StoreVersionError
from .logs import setup_logging
from .rundir import RunDir, lock_volume, mount_state, remove_stale_mount
from .volume import Volume

if TYPE_CHECKING:
    from vfsd.remote.remotetier import RemoteTier

log = structlog.get_logger("vfsd.daemon")

#: seconds between syncs of the store while anything waits for one
SYNC_INTERVAL = 5.0
#: seconds a sync waits after a delete, to cover a burst with one
SYNC_BATCH_DELAY = 0.2


def _remote_tier(url: str, config: Config) -> RemoteTier:
    """The remote tier for `url`; its modules (and boto3) load only here."""
    from vfsd.remote.objstore import RemoteURL
    from vfsd.remote.remotetier import RemoteStartupError, RemoteTier

    try:
        return RemoteTier(RemoteURL.parse(url), config)
    except RemoteStartupError as exc:
        raise StartupError(str(exc)) from None


class DaemonBase:
    """What a daemon process has, whatever it serves: the store's environment
    (group commits, syncs), the FUSE session, signals, the control socket.

    A subclass opens `self.store` (the handle whose environment the process
    shares) and says what pyfuse3 serves (`operations`), what the control
    server asks which handler serves a request (`control_host`) and which
    volumes it serves (`served`)."""

    def __init__(self, run: RunDir, config: Config, store_dir: Path) -> None:
        self.run = run
        self.config = config
        self.store_dir = store_dir
        self.store: Store | None = None
        self.metrics = None
        self._hold_fd: int | None = None
        self.started = time.monotonic()
        #: `on_wait(seconds, text)`: startup is about to wait up to `seconds` (for the
        #: object store, another worker's lease); `run_daemon` tells `vfsd mount`
        self.on_wait = lambda seconds, text: None
        #: `on_progress(phase, done, total)`: how far a long start-up step got
        #: (a `--from` import, in entries), for `vfsd mount`'s progress bar
        self.on_progress = lambda phase, done, total: None

    def served(self) -> list[Volume]:
        """The volumes this process serves now."""
        raise NotImplementedError

    def titles(self) -> tuple[str, str]:
        """(process title, short name) for `ps` and `top` (`set_process_title`)."""
        return (f"vfsd daemon of {shown_path(self.run.path)}",
                f"vfsd {shown_path(Path(self.run.path.name))}")

    def in_use(self, vol: int, ino: int) -> bool:
        """Whether an inode of one of the served volumes is open (its hot file stays)."""
        return any(v.store.vol == vol and ino in v.files.files for v in self.served())

    def _check_fuse(self) -> None:
        if not os.path.exists("/dev/fuse"):
            raise StartupError("/dev/fuse is missing: load the fuse module, or run the "
                               "container with --device /dev/fuse")
        if not os.access("/dev/fuse", os.R_OK | os.W_OK):
            raise StartupError(f"/dev/fuse is not readable and writable by this user "
                               f"({_device_access('/dev/fuse')}): vfsd needs no other "
                               "privilege. As root, open it to every user, as Debian does "
                               "(chmod 0666 /dev/fuse; a udev rule keeps it after a reboot), "
                               "or to a group (chgrp GROUP /dev/fuse; chmod 0660 /dev/fuse) "
                               "and add this user to that group")

    def _prepare_mountpoint(self) -> None:
        mp = self.run.mountpoint
        self.run.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        state = mount_state(mp)
        if state == "live":
            raise StartupError(f"{mp} is already mounted")
        if state == "stale":
            log.warning("stale_mount_cleaned", mountpoint=str(mp))
            remove_stale_mount(mp)
            if mount_state(mp) != "none":
                raise StartupError(f"{mp} holds a stale mount that could not be removed")
        if mp.exists() and not mp.is_dir():
            raise StartupError(f"mountpoint {mp} exists and is not a directory")
        mp.mkdir(parents=True, exist_ok=True)
        if any(mp.iterdir()):
            raise StartupError(f"mountpoint {mp} is not empty")

    def _hold_store(self) -> None:
        """Keep compaction away for the daemon's life; a compaction cut short is
        finished (or undone) first, before anything reads the file. Then make
        sure what is there can be read."""
        try:
            self._hold_fd = compact.hold(self.store_dir)
        except StoreLocked as exc:
            raise StartupError(str(exc)) from None
        if (self.store_dir / "lmdb" / "data.mdb").exists():
            damage = check_readable(self.store_dir)
            if damage is not None:
                raise StartupError(f"{damage}; run `vfsd fsck {self.store_dir}` for a report")

    def _fix_chunk_size(self) -> None:
        if self.store.chunk_size != self.config.chunk_size:
            log.warning("chunk_size_from_store", store=self.store.chunk_size,
                        configured=self.config.chunk_size)
            self.config.chunk_size = self.store.chunk_size
            self.config.inline_max = min(self.config.inline_max, self.config.chunk_size)

    def _start_metrics(self, target) -> None:
        if self.config.metrics_port is not None:
            # prometheus_client (~2 MiB) is loaded only by daemons that serve it.
            from .metrics import start_metrics_server

            self.metrics = start_metrics_server(target, self.config.metrics_port)

    def mount_options(self) -> set[str]:
        opts = {"fsname=vfsd", "subtype=vfsd", "default_permissions"}
        if self.config.allow_other:
            opts.add("allow_other")
        return opts

    def ready_info(self) -> dict:
        return {"read_only": False}

    # ------------------------------------------------------------------ run

    async def main(self, ready) -> None:
        from vfsd.control.server import ControlServer

        from .stalls import watch_from_env

        watch_from_env()
        control = ControlServer(self.control_host, self.run.sock, self.config)
        async with trio.open_nursery() as nursery:
            await nursery.start(control.serve)
            await self._start_tasks(nursery)
            nursery.start_soon(self._watch_signals, nursery.cancel_scope)
            nursery.start_soon(self._fuse_main, nursery.cancel_scope)
            nursery.start_soon(self._sync_loop)
            if self.config.commit_window > 0:
                nursery.start_soon(self._group_commits, self.config.commit_window)
            nursery.start_soon(trio.to_thread.run_sync, self._tune_readahead)
            await trio.sleep(0)
            ready()
            log.info("mounted", mountpoint=str(self.run.mountpoint), store=str(self.store_dir),
                     version=__version__, pid=os.getpid(), **self._mounted_fields())

    async def _start_tasks(self, nursery: trio.Nursery) -> None:
        """The subclass's own tasks (its volumes')."""

    def _mounted_fields(self) -> dict:
        return {}

    async def _group_commits(self, window: float) -> None:
        """Commit each group of requests `window` seconds after it opened
        (see `vfsd.store.groupcommit`; whatever else needs it commits it sooner)."""
        store = self.store
        opened = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def on_open() -> None:  # on the loop: a group just opened
            opened.set()

        def request_flush() -> None:  # on another thread, before it reads or syncs
            try:
                trio.from_thread.run_sync(store.flush_group, trio_token=token)
            except trio.RunFinishedError:
                pass  # the loop is gone: it committed the last group on its way out

        def on_failure(exc: Exception) -> None:
            # The requests of the group were answered and are lost: stop serving,
            # as a crash would, rather than go on from a store the kernel's
            # caches no longer match.
            log.error("group_commit_failed", error=str(exc),
                      detail="the last requests before it are lost; the daemon stops")
            pyfuse3.terminate()

        store.group.enable(window, on_open, request_flush, on_failure)
        try:
            while True:
                await opened.wait()
                opened = trio.Event()
                await trio.sleep(window)
                try:
                    store.flush_group()
                except StoreError:
                    return  # on_failure said it and stops the daemon
        finally:
            store.flush_group()
            store.group.enabled = False

    async def _sync_loop(self) -> None:
        """Sync the store in a worker thread soon after something was freed
        (files that were deleted or rewritten go once their records' change is
        durable), and every SYNC_INTERVAL seconds while anything waits for
        one, which bounds what a machine crash can take (see `durability`)."""
        wake = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def doomed() -> None:
            try:
                token.run_sync_soon(wake.set)
            except trio.RunFinishedError:
                pass

        self.store.durability.on_doomed = doomed
        while True:
            with trio.move_on_after(SYNC_INTERVAL):
                await wake.wait()
            await trio.sleep(SYNC_BATCH_DELAY)  # one sync for a burst of deletes
            wake = trio.Event()
            try:
                if self.store.durability.pending():
                    await trio.to_thread.run_sync(self.store.sync)
                self.store.delete_synced(self.in_use)
            except StoreError as exc:
                log.error("sync_failed", error=str(exc))

    def _tune_readahead(self) -> None:
        """Let the kernel read ahead a whole chunk (it starts at 128 KiB).

        Fewer, larger READ requests: a cold sequential read costs a quarter of
        the round trips. Root only (sysfs); anyone else keeps the default.
        Runs in a thread: stat() of our own mountpoint is answered by our loop.
        """
        try:
            dev = os.stat(self.run.mountpoint).st_dev
            path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
            with open(path, "w") as f:
                f.write(str(max(self.config.chunk_size // 1024, 128)))
        except OSError as exc:
            log.debug("readahead_not_tuned", error=str(exc))

    async def _fuse_main(self, cancel_scope: trio.CancelScope) -> None:
        try:
            await pyfuse3.main(max_tasks=self.config.max_tasks)
        finally:
            cancel_scope.cancel()

    async def _watch_signals(self, cancel_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("signal", signum=signum)
                self.stop_serving()
                return

    def stop_serving(self) -> None:
        """End the FUSE session and shut down as after an unmount (on the loop)."""
        notify.notify("STOPPING=1")
        pyfuse3.terminate()

    def shutdown(self) -> None:
        """Commit buffers, free what the kernel no longer references, close."""
        if self.metrics is not None:
            self.metrics.close()  # a scrape must not read a closing store
        self._shutdown_volumes()
        if self.store is not None:
            self.store.on_chunk_files = None
            self.store.sync()
            self.store.close()
        self._after_close()
        if self._hold_fd is not None:
            os.close(self._hold_fd)
            self._hold_fd = None
        for path in (self.run.sock, self.run.pidfile):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def _shutdown_volumes(self) -> None:
        for volume in self.served():
            volume.shutdown()

    def _after_close(self) -> None:
        """What the subclass lets go of once the store is closed."""

    def abandon(self) -> None:
        """After a failed start: give back what `prepare` took on the way."""


class Daemon(DaemonBase):
    """A run dir's daemon: one volume, seen at the mount's root."""

    def __init__(self, run: RunDir, config: Config, store_dir: Path, volume: str,
                 resume_from: str | None = None) -> None:
        super().__init__(run, config, store_dir)
        self.volume_name = volume
        self.resume_from = resume_from
        self.remote: RemoteTier | None = None
        self.volume: Volume | None = None
        self._lock_fd: int | None = None
        self._process_handlers = None

    # The one volume's parts, under the names the rest of vfsd knows a daemon by.
    ops = property(lambda self: self.volume.ops if self.volume else None)
    evictor = property(lambda self: self.volume.evictor if self.volume else None)
    snapshots = property(lambda self: self.volume.snapshots if self.volume else None)
    snapservice = property(lambda self: self.volume.snapservice if self.volume else None)
    settler = property(lambda self: self.volume.settler if self.volume else None)

    def served(self) -> list[Volume]:
        return [self.volume] if self.volume is not None else []

    def in_use(self, vol: int, ino: int) -> bool:
        v = self.volume
        return v is not None and vol == v.store.vol and ino in v.files.files

    @property
    def control_host(self):
        return self

    @property
    def peers(self):
        """The processes that reached the control socket (they may name tool calls)."""
        return self.volume.ops.provenance.peers

    # ------------------------------------------------------- control host

    def handlers_for(self, op: str, req: dict):
        """(handler, volume) for a request: the process's own ops, or the one volume's."""
        fn = self.process_handlers.table.get(op)
        if fn is not None:
            return fn, None
        return self.volume.control.handler(op), self.volume

    def known_ops(self) -> list[str]:
        return sorted({*self.process_handlers.table, *self.volume.control.ops_known()})

    @property
    def process_handlers(self):
        if self._process_handlers is None:
            from vfsd.control.handlers import ProcessHandlers

            self._process_handlers = ProcessHandlers(self.run.mountpoint, self.stop_serving)
        return self._process_handlers

    # --------------------------------------------------------------- setup

    def prepare(self) -> None:
        """Everything that can fail before mounting, with clear messages."""
        self._check_fuse()
        try:
            self._prepare()
        except OSError as exc:
            raise StartupError(f"cannot prepare {self.run.path}: {exc}") from None

    def _prepare(self) -> None:
        self._prepare_mountpoint()
        try:
            self._lock_fd = lock_volume(self.store_dir, self.volume_name)
        except StoreLocked as exc:
            raise StartupError(str(exc)) from None
        self._hold_store()
        if self.resume_from is not None and self.config.remote_url is None:
            raise StartupError("--from needs --remote s3://BUCKET/PREFIX (or remote_url in "
                               "the config): where the run was published")
        if self.config.remote_url is not None:
            self.remote = _remote_tier(self.config.remote_url, self.config)
            self.remote.on_wait = self.on_wait
            self.remote.on_progress = self.on_progress
        try:
            if self.resume_from is not None:
                from vfsd.remote.remotetier import RemoteStartupError

                try:
                    self.store = self.remote.resume(self.store_dir, self.resume_from,
                                                    self._open_store)
                except RemoteStartupError as exc:
                    raise StartupError(str(exc)) from None
            else:
                self.store = self._open_store()
        except StoreVersionError as exc:
            raise StartupError(str(exc)) from None
        self.run.record_store(self.store_dir, self.volume_name)
        self._fix_chunk_size()
        self.volume = Volume(self.store, self.config, self.run,
                             stop_serving=self.stop_serving)
        self.volume.ops.in_use = self.in_use
        self._prepare_remote()
        self.volume.prepare()
        # What a crash (or the start itself) left waiting for a sync goes now.
        gone = self.store.finish_deletes()
        if gone:
            log.info("deletes_finished", files=gone)
        self._start_metrics(self)

    def _open_store(self, *, create: bool = True, chunk_size: int | None = None) -> Store:
        """The daemon's one handle on its volume. A resume opens it through
        this (with the run's chunk size for a new store) and may find a
        volume its last attempt left incomplete."""
        return Store(self.store_dir, self.volume_name, create=create,
                     chunk_size=chunk_size or self.config.chunk_size,
                     inline_max=self.config.inline_max, defer_deletes=True,
                     incomplete_ok=self.resume_from is not None)

    def _prepare_remote(self) -> None:
        """A store with a remote (given now or recorded earlier) gets its remote tier."""
        if self.remote is None:
            url = remotestate.remote_url(self.store)
            if url is None:
                return
            self.remote = _remote_tier(url, self.config)
            self.remote.on_wait = self.on_wait
        from vfsd.remote.remotetier import RemoteStartupError

        try:
            self.remote.attach(self.store, self.snapshots)
        except RemoteStartupError as exc:
            raise StartupError(str(exc)) from None
        self.volume.attach_remote(self.remote)
        log.info("remote_tier", remote=str(self.remote.url), run=self.remote.run_id,
                 state=self.remote.state, reason=self.remote.reason or None)

    @property
    def operations(self):
        return self.ops

    # ------------------------------------------------------------------ run

    async def _start_tasks(self, nursery: trio.Nursery) -> None:
        if self.remote is not None:
            await self.remote.start(nursery)
        await nursery.start(self.volume.serve)

    def _mounted_fields(self) -> dict:
        return {"volume": self.volume_name}

    def ready_info(self) -> dict:
        """What `vfsd mount` says once mounted: read-only or not, and why."""
        if self.remote is None:
            return {"read_only": False}
        return {"read_only": not self.remote.writable(), "remote": str(self.remote.url),
                "run": self.remote.run_id, "state": self.remote.state,
                "reason": self.remote.reason or None}

    def _warn_unpublished(self) -> None:
        """A remote run stopping with snapshots its bucket does not have yet: say so
        in the log (they stay in the local store; the next mount publishes them)."""
        try:
            status = self.remote.publish_status()
        except Exception:  # noqa: BLE001 - a report on the way out, never a failure
            return
        left = [s["id"] for s in status["snapshots"] if not s["published"]]
        if left and self.remote.state != "lost":
            log.warning("stopped_with_unpublished_snapshots", snapshots=left[-10:],
                        count=len(left), run=self.remote.run_id,
                        detail="kept in the local store; published by the next mount")

    def _shutdown_volumes(self) -> None:
        if self.remote is not None and self.remote.publisher is not None \
                and self.store is not None:
            self._warn_unpublished()
        super()._shutdown_volumes()

    def _after_close(self) -> None:
        if self.remote is not None:
            self.remote.close()

    def abandon(self) -> None:
        if self.remote is not None:
            self.remote.close()  # a lease taken on the way is given back


def run_daemon(run: RunDir, config: Config, store_dir: Path, volume: str,
               ready_fd: int | None = None, log_to_stderr: bool = False,
               resume_from: str | None = None) -> int:
    """Serve one run dir until unmounted (see `serve_process`)."""
    return serve_process(run, config, lambda: Daemon(run, config, store_dir, volume,
                                                     resume_from=resume_from),
                         ready_fd=ready_fd, log_to_stderr=log_to_stderr)


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


def shown_path(path: Path) -> str:
    """A path as a process title shows it: bytes that are not UTF-8 and
    control characters as \\xNN escapes."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return _CONTROLS.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def set_process_title(title: str, short: str) -> None:
    """Name this process for `ps` (its command line becomes `title`) and
    `top` (its name, 15 bytes at most, becomes `short`): a machine's daemons
    then say what each serves instead of all being `python -m ...`.

    The title takes the room of the process's own arguments only (cut if
    longer): the environment next to them stays as it was, so
    /proc/PID/environ still shows what the process runs with."""
    try:
        import setproctitle
    except ImportError:  # a cosmetic: never a reason not to serve
        return
    ours = "SPT_NOENV" not in os.environ
    os.environ.setdefault("SPT_NOENV", "1")  # read at setproctitle's first call
    try:
        setproctitle.setproctitle(title)
    finally:
        if ours:
            os.environ.pop("SPT_NOENV", None)
    setproctitle.setthreadtitle(short.encode()[:15].decode("utf-8", "ignore"))


def serve_process(run: RunDir, config: Config, build, *, ready_fd: int | None = None,
                  log_to_stderr: bool = False) -> int:
    """Run the daemon `build()` makes until unmounted. Reports readiness (or
    the startup error) on `ready_fd`."""

    # The ready pipe (`vfsd mount` reads it; spawn_daemon documents the lines):
    # WAIT lines while starting, then one READY or ERROR line, and it is closed.
    def say(line: str) -> None:
        if ready_fd is not None:
            try:
                os.write(ready_fd, line.replace("\n", " ").encode() + b"\n")
            except OSError:
                pass

    def report(msg: str) -> None:
        say(msg)
        if ready_fd is not None:
            try:
                os.close(ready_fd)
            except OSError:
                pass

    def on_wait(seconds: float, text: str) -> None:
        log.info("startup_wait", seconds=round(seconds, 1), reason=text)
        say(f"WAIT {max(0.0, seconds):.1f} {text}")

    def on_progress(phase: str, done: int, total: int | None) -> None:
        say(f"PROGRESS {phase} {int(done)} {'' if total is None else int(total)}")

    # The store holds file contents: nobody but the owner may read it,
    # whatever the caller's umask (files in the mount get their own modes).
    os.umask(0o077)
    run.state.mkdir(parents=True, exist_ok=True, mode=0o700)
    stream = sys.stderr if log_to_stderr else open(run.log, "a", buffering=1)
    setup_logging(config.log_level, stream)
    daemon = build()
    set_process_title(*daemon.titles())
    daemon.on_wait = on_wait
    daemon.on_progress = on_progress
    try:
        daemon.prepare()
    except StartupError as exc:
        log.error("startup_failed", error=str(exc))
        report(f"ERROR {exc}")
        daemon.abandon()
        return 1
    run.pidfile.write_text(str(os.getpid()))
    try:
        pyfuse3.init(daemon.operations, str(run.mountpoint), daemon.mount_options())
    except Exception as exc:
        log.error("mount_failed", error=str(exc))
        report(f"ERROR cannot mount {run.mountpoint}: {exc}")
        daemon.shutdown()
        return 1

    def ready() -> None:
        report("READY " + json.dumps(daemon.ready_info()))
        notify.notify("READY=1")

    code = 0
    try:
        trio.run(daemon.main, ready)
    except BaseException:
        log.exception("daemon_failed")
        code = 1
    finally:
        try:
            pyfuse3.close(unmount=True)
        except Exception as exc:  # already unmounted is fine
            if getattr(exc, "errno", None) not in (errno.EINVAL, None):
                log.warning("unmount_failed", error=str(exc))
        daemon.shutdown()
        log.info("stopped", code=code)
    return code


def _device_access(path: str) -> str:
    """`mode 0600, owner root, group root` of a device node, for an error message."""
    import grp
    import pwd
    import stat

    st = os.stat(path)

    def name(lookup, number: int) -> str:
        try:
            return lookup(number)[0]
        except KeyError:
            return str(number)

    return (f"mode {stat.S_IMODE(st.st_mode):04o}, owner {name(pwd.getpwuid, st.st_uid)}, "
            f"group {name(grp.getgrgid, st.st_gid)}")
