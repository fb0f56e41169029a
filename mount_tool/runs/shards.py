"""The shard daemons of a Runs: mounted on first use, kept mounted, restarted when they die.

A shard is a run dir served by `vfsd mount --shard` (see vfsd/shard.py): one
long-lived daemon and one FUSE mount whose every volume is a directory, each
volume a graph thread's files. `Shard` starts (or attaches to) that daemon,
watches it through a pidfd (a poll of it is the liveness check every use
makes: no round trip), restarts it on the next use after it died (the stale
mount goes with `vfsd mount`'s own cleanup), and unmounts it when the Runs
closes. Its control socket is reached through a small pool of connections
(`ShardConnections`), so threads of one shard do not queue behind one socket;
`VolumeClient` is what one thread's Mount talks through: every request names
the thread's volume and its thread id, which the daemon checks.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..daemon.client import ControlClient
from ..daemon.mountinfo import mount_point_listed
from ..daemon.spawn import mount_flags, vfsd_command
from ..errors import ControlError, MountError

logger = logging.getLogger(__name__)

#: connections a process keeps open to one shard's socket, at most
MAX_CONNECTIONS = 16
#: idle connections kept for reuse
IDLE_CONNECTIONS = 8
#: seconds a shard's daemon may take to unmount and exit when the Runs closes
UNMOUNT_TIMEOUT = 20.0
#: `vfsd mount --shard` answers within this many seconds, or the mount failed
MOUNT_TIMEOUT = 120.0
#: seconds a failed request waits to learn whether the daemon died
DEATH_GRACE_SECONDS = 1.0
#: a volume's root inode number in the kernel is its slot << 40 | 1
LOCAL_BITS = 40


class ShardConnections:
    """Up to MAX_CONNECTIONS control connections to one socket, each used by
    one request at a time (the protocol answers in order on a connection)."""

    def __init__(self, socket_path: Path, timeout: float = 30.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._idle: list[ControlClient] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        with self._slots:
            with self._lock:
                client = self._idle.pop() if self._idle else None
            if client is None:
                client = ControlClient(self.socket_path, timeout=self.timeout)
            try:
                return client.call(op, **args)
            finally:
                with self._lock:
                    if len(self._idle) < IDLE_CONNECTIONS:
                        self._idle.append(client)
                        client = None
                if client is not None:
                    client.close()

    def close(self) -> None:
        """Close the idle connections (a later call opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for client in idle:
            client.close()


class Shard:
    """One shard of a Runs: `ROOT/shards/<name>/` (fs/ its mount, .vfsd/ its
    store and socket; with `store`, the store is elsewhere)."""

    def __init__(self, name: str, run_dir: Path, options: Mapping[str, Any],
                 store: Path | None = None) -> None:
        self.name = name
        self.run_dir = run_dir
        self.mountpoint = run_dir / "fs"
        self.socket_path = run_dir / ".vfsd" / "vfsd.sock"
        self.store = store
        self.options = dict(options)
        self.connections = ShardConnections(self.socket_path)
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.dev: int | None = None
        self.chunk_size: int | None = None
        self.starts = 0  # daemons this process started or attached to for the shard
        self._pidfd: int | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Shard({self.name!r}, pid={self.pid})"

    @property
    def shown(self) -> str:
        """The shard as messages name it."""
        return f"shard {self.name} ({self.run_dir})"

    # -- liveness -------------------------------------------------------------------

    def alive(self) -> bool:
        """Whether the daemon this process knows is running (a poll of its
        pidfd: no round trip, no lookup in the mount)."""
        fd = self._pidfd
        if fd is None:
            return False
        try:
            return not select.select([fd], [], [], 0)[0]
        except (OSError, ValueError):  # closed under us by a restart or close
            return False

    def ensure(self) -> None:
        """The daemon is running: started (or restarted after it died, its
        stale mount removed) if need be."""
        if self.alive():
            return
        with self.lock:
            if self._closed:
                raise MountError(f"{self.shown} was unmounted: its Runs is closed")
            if self.alive():
                return
            if self._pidfd is not None:
                logger.warning("vfsd: the daemon of %s (pid %s) is gone (killed, or out of "
                               "memory); starting it again", self.shown, self.pid)
            self._forget()
            self._start()

    def _forget(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
        self._pidfd = None
        self.pid = self.dev = None
        self.connections.close()

    def _start(self) -> None:
        """Mount the shard, or attach to the daemon serving it already (one a
        process of this Runs' root left: the Runs owns every shard under it)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        live = mount_point_listed(os.fsencode(self.mountpoint)) and self._pings()
        if not live:
            args = ["mount", "--shard", str(self.run_dir)]
            if self.store is not None:
                args += ["--store", str(self.store)]
            proc = vfsd_command(*args, *mount_flags(self.options), timeout=MOUNT_TIMEOUT)
            if proc.returncode != 0:
                raise MountError(f"vfsd mount --shard {self.run_dir} exited {proc.returncode}: "
                                 f"{(proc.stderr or proc.stdout).strip()}")
        info = self._call_plain("shard")
        if not info.get("shard"):
            raise MountError(f"{self.run_dir} is served by a vfsd that is no shard daemon")
        pid = int(info["pid"])
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise MountError(f"the daemon of {self.shown} exited as it started; see "
                             f"{self.run_dir / '.vfsd' / 'vfsd.log'}") from None
        self._pidfd, self.pid = pidfd, pid
        self.dev = os.stat(self.mountpoint).st_dev
        self.starts += 1

    def _pings(self) -> bool:
        try:
            with ControlClient(self.socket_path, timeout=10.0) as c:
                return c.ping()
        except ControlError:
            return False

    def _call_plain(self, op: str, **args: Any) -> dict[str, Any]:
        try:
            return self.connections.call(op, **args)
        except ControlError as exc:
            raise self.explain(exc, op) from None

    # -- requests -----------------------------------------------------------------

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """A control request on this shard (started first if need be)."""
        self.ensure()
        return self._call_plain(op, **args)

    def long_call(self, op: str, timeout: float, /, **args: Any) -> dict[str, Any]:
        """A request that may take longer than the pool's timeout, on a
        connection of its own."""
        self.ensure()
        try:
            with ControlClient(self.socket_path, timeout=timeout) as c:
                return c.call(op, **args)
        except ControlError as exc:
            raise self.explain(exc, op) from None

    def explain(self, exc: ControlError, op: str) -> ControlError:
        """`exc` naming the shard when the socket failed, and saying whether
        its daemon died."""
        if exc.code != "connection":
            return exc
        # A killed daemon's sockets close as it exits, a moment before its
        # pidfd tells: wait that moment (an error path only).
        if self._pidfd is not None and self._wait_exit(DEATH_GRACE_SECONDS):
            why = (f"the daemon of {self.shown} (pid {self.pid}) died (killed, or out of "
                   f"memory) while {op!r} was in flight; what was fsync'd or checkpointed "
                   "is kept, and the shard is started again on the next use")
        else:
            why = f"the daemon of {self.shown} did not answer {op!r}: {exc.message}"
        return ControlError("connection", why)

    # -- closing --------------------------------------------------------------------

    def close(self) -> None:
        """Unmount the shard and wait for its daemon to exit; a mount still in
        use (a process holds a file of it) is detached lazily and its daemon
        told to stop, so nothing is left behind either way."""
        with self.lock:
            self._closed = True
            pid = self.pid
            self.connections.close()
            listed = mount_point_listed(os.fsencode(self.mountpoint))
            if not self.starts or (not listed and not self.alive()):
                self._forget()
                return  # never mounted by this Runs, or gone with nothing left
            # A live mount, or the stale one a dead daemon left: `vfsd umount` removes either.
            proc = vfsd_command("umount", str(self.run_dir), "--timeout", str(UNMOUNT_TIMEOUT),
                             timeout=UNMOUNT_TIMEOUT + 30)
            if proc.returncode != 0 and mount_point_listed(os.fsencode(self.mountpoint)):
                logger.warning("vfsd: %s is busy (%s): detaching it",
                               self.shown, (proc.stderr or proc.stdout).strip())
                subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)],
                               capture_output=True, check=False)
                with contextlib.suppress(ControlError):
                    with ControlClient(self.socket_path, timeout=10.0) as c:
                        c.call("stop")
            gone = self._wait_exit(UNMOUNT_TIMEOUT)
            self._forget()
        if not gone:
            raise MountError(f"the daemon of {self.shown} (pid {pid}) did not exit within "
                             f"{UNMOUNT_TIMEOUT:g} s of its unmount")
        if mount_point_listed(os.fsencode(self.mountpoint)):
            raise MountError(f"{self.mountpoint} is still mounted")

    def _wait_exit(self, timeout: float) -> bool:
        fd = self._pidfd
        if fd is None:
            return True
        try:
            return bool(select.select([fd], [], [], timeout)[0])
        except OSError as exc:
            return exc.errno == errno.EBADF


class VolumeClient:
    """The control client of one thread's Mount: every request names its
    volume and thread on its shard's socket (as a ControlClient would, for
    `Mount`'s methods)."""

    def __init__(self, shard: Shard, volume: str, thread: str) -> None:
        self.shard = shard
        self.volume = volume
        self.thread = thread
        self.timeout = shard.connections.timeout

    @property
    def socket_path(self) -> Path:
        return self.shard.socket_path

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        try:
            return self.shard.call(op, volume=self.volume, thread=self.thread, **args)
        except ControlError as exc:
            raise self._explained(exc) from None

    def long_call(self, op: str, timeout: float, /, **args: Any) -> dict[str, Any]:
        try:
            return self.shard.long_call(op, timeout, volume=self.volume, thread=self.thread,
                                        **args)
        except ControlError as exc:
            raise self._explained(exc) from None

    def _explained(self, exc: ControlError) -> ControlError:
        if exc.code == "no_such_volume":
            return ControlError(exc.code, f"thread {self.thread!r:.200}'s files (volume "
                                          f"{self.volume} of {self.shard.shown}) are gone: "
                                          "the thread was deleted")
        return exc

    def ping(self) -> bool:
        try:
            self.shard.call("ping")
        except ControlError:
            return False
        return True

    def close(self) -> None:
        """Nothing to close: the connections are the shard's."""
