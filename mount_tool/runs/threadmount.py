"""ThreadMount: one thread of a Runs, as a Mount.

A thread of a `Runs` is a volume of a shard daemon: a directory of the
shard's mount (`ROOT/shards/<k>/fs/t<hex>`), with its own tree, step clock,
eviction, snapshots, provenance and `.vfsd/` views. `ThreadMount` is the
`Mount` of that directory: `root` is it, every control request names the
volume and the thread on the shard's socket, and `state_dir` is the thread's
own record directory (`ROOT/threads/t<hex>/.vfsd`, where VfsdCheckpointer
keeps its records). Everything the integrations do with a Mount (file
tools, `execute`'s sandbox, offloading, checkpoints) works on it unchanged.

What a thread has no use for is refused with the way to do it: it is not
unmounted alone (closing the Runs unmounts the shards), it is copied with
`Runs.copy` rather than forked into a run dir, and it is not resumed from a
bucket by hand.

With a remote (`Runs(ROOT, remote=...)`: replicas sharing a bucket), a
thread's files are written only during a run: `begin_run` (the daemon's
`remote_begin`: the thread caught up with the bucket, its lease taken) and
`end_run` (`remote_end`: what the run snapshotted published, the lease given
back) bracket it (docs/control.md, "Replicas").
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ControlError, MountError, MountToolError, ThreadBusy
from ..mount import SYNC_GRACE_SECONDS, Mount
from ..refs import DEFAULT_CHUNK_SIZE
from .shards import LOCAL_BITS, Shard, VolumeClient

_LOCAL_MASK = (1 << LOCAL_BITS) - 1
#: a volume root's inode number within its volume
_VOLUME_ROOT = 1
#: seconds a remote_begin may take besides its wait for the lease (its catch-up)
BEGIN_GRACE = 600.0


class ThreadMount(Mount):
    """The files of one thread of a Runs: `root` is its volume's directory in
    its shard's mount; see the module docstring."""

    def __init__(self, shard: Shard, volume: str, thread_id: str, run_dir: Path, *,
                 lease_wait: float = 35.0) -> None:
        # Not Mount.__init__: this Mount starts and stops no daemon of its own.
        self.shard = shard
        self.volume = volume
        self.thread_id = thread_id
        self.run_dir = run_dir
        self.root = shard.mountpoint / volume
        self.state_dir = run_dir / ".vfsd"
        self.client = VolumeClient(shard, volume, thread_id)  # type: ignore[assignment]
        self.started = False
        self._closed = False
        self._chunk_size = None
        self._step = None
        #: seconds `begin_run` waits for another run of the thread by default
        self.lease_wait = lease_wait
        #: the daemon's `remote_copy` answer when `Runs.copy` made this thread
        self.copy_info: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"ThreadMount({self.thread_id!r:.80}, {self.volume}, shard {self.shard.name})"

    @property
    def chunk_size(self) -> int:
        """The shard store's chunk size (asked once per shard)."""
        if self.shard.chunk_size is None:
            self.shard.chunk_size = int(self.stats().get("chunk_size") or DEFAULT_CHUNK_SIZE)
        return self.shard.chunk_size

    def volume_ino(self, st_ino: int) -> int:
        """The volume's own inode number of a kernel one (slot << 40 | inode)."""
        return st_ino & _LOCAL_MASK

    def is_mounted(self) -> bool:
        """Whether the thread's shard is up (its daemon alive)."""
        return self.shard.alive()

    @contextlib.contextmanager
    def root_fd(self) -> Iterator[int]:
        """An O_PATH fd of the thread's directory, checked to be its volume's
        root in the live shard mount (as `Mount.root_fd`)."""
        try:
            fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise self._unreachable(exc) from None
        try:
            try:
                st = os.fstat(fd)
            except OSError as exc:  # the open met a cached entry of a shard gone since
                raise self._unreachable(exc) from None
            if st.st_ino & _LOCAL_MASK != _VOLUME_ROOT or st.st_dev != self.shard.dev:
                raise OSError(errno.ENOTCONN, f"{self.root} is not the root of thread "
                              f"{self.thread_id!r:.80}'s files in the live mount of "
                              f"{self.shard.shown}")
            try:
                yield fd
            except OSError as exc:  # what the use met: a shard gone under it is named
                if exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
                    raise
                raise self._unreachable(exc) from None
        finally:
            os.close(fd)

    def _unreachable(self, exc: OSError) -> OSError:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED) or not self.shard.alive():
            return OSError(errno.ENOTCONN, f"the daemon of {self.shard.shown} is gone "
                           "(killed, or out of memory); it is started again on the next use "
                           "of the thread", exc.filename or str(self.root))
        if exc.errno == errno.ENOENT:
            return FileNotFoundError(errno.ENOENT, f"thread {self.thread_id!r:.80}'s files "
                                     f"are gone from {self.shard.shown} (deleted)", str(self.root))
        return exc

    # -- what a thread does otherwise -------------------------------------------------

    def unmount(self) -> None:
        raise MountError(f"thread {self.thread_id!r:.80}'s files are a directory of "
                         f"{self.shard.shown}, which serves other threads too: close the "
                         "Runs to unmount its shards")

    def detach(self) -> None:
        """Nothing to let go of: the shard's connections stay for other threads."""

    def close(self) -> None:
        """Nothing to close (the Runs keeps its shards mounted until it closes)."""

    def fork(self, snapshot_id: str, new_run_dir: str | os.PathLike[str],
             **options: Any) -> Mount:
        raise MountToolError(
            "a thread of a Runs is not forked into a run dir: copy it to a new thread "
            "(runs.copy(source, target), or VfsdCheckpointer.copy_thread), then restore "
            f"{snapshot_id} there")

    def resume_from(self, run: str, snapshot_id: str, *, remote: str | None = None) -> None:
        raise MountError(f"a thread of a Runs is not resumed from a bucket by hand ({run}@"
                         f"{snapshot_id}): a Runs with a remote (Runs(ROOT, remote=...)) "
                         "catches each thread up with its bucket when a run of it begins")

    # -- replicas: one run at a time, on any replica --------------------------------

    def begin_run(self, token: str, *, wait: float | None = None,
                  force: bool = False) -> dict[str, Any]:
        """Hold the thread for one run (`remote_begin`): its files caught up with
        the bucket (the snapshots it lists here, the live files its latest),
        then written by this run only. `token` names the run (its `lease_held`
        messages and `remote_runs` show it; a second begin with it is the same
        run). Waits up to `wait` seconds (default the Runs' `lease_wait`) for
        another run of the thread, here or on another replica, to end or
        lapse; then ThreadBusy, naming the holder, with nothing changed. The
        daemon's answer ({"run", "latest", "snapshots", "imported", ...})."""
        wait = self.lease_wait if wait is None else float(wait)
        try:
            return self.client.long_call("remote_begin", wait + BEGIN_GRACE, token=token,
                                         wait=wait, force=bool(force))
        except ControlError as exc:
            if exc.code != "lease_held":
                raise
            raise ThreadBusy(f"thread {self.thread_id!r:.200} is held by another run (waited "
                             f"{wait:g} s): {exc.message}", thread_id=self.thread_id,
                             holder=exc.message) from None

    def end_run(self, token: str, *, timeout: float = 60.0) -> dict[str, Any]:
        """End the run `token` holds (`remote_end`): every snapshot it took
        published (within `timeout` seconds: ControlError "timeout" otherwise,
        the thread still held, call again), then the thread free for its next
        run anywhere. Idempotent ({"ended": False} when no run holds it here);
        ControlError "not_publishable" when the run's lease was lost (its
        unpublished snapshots are not the thread's)."""
        return self.client.long_call("remote_end", float(timeout) + SYNC_GRACE_SECONDS,
                                     token=token, timeout=float(timeout))

    def sync(self, snapshot_id: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
        args: dict[str, Any] = {"timeout": float(timeout)}
        if snapshot_id is not None:
            args["snapshot"] = str(snapshot_id)
        return self.client.long_call("sync", float(timeout) + SYNC_GRACE_SECONDS, **args)
