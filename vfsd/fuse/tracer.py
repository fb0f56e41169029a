"""Per-request timing and the access log, switched on only while someone looks.

`_guard` (fs.py) checks `Tracer.on` once per request; while it is False a
request costs nothing more. It is True while a Prometheus endpoint is
serving (its latency histograms need every request), while `vfsd stats`
watches (each `perf` control request keeps it on for a few seconds), and
while `.vfsd/accesslog` has a reader. A traced request is timed into its
operation's `Latency`; with a log reader it also becomes one access-log
line (path, bytes, process, tool call), which costs a path lookup.
"""

from __future__ import annotations

import time

import pyfuse3

from vfsd.latency import Latencies

from . import ctldir
from .accesslog import AccessLog, escape, result_name

#: operations whose first two arguments are a parent directory and a name
_NAMED = frozenset({"lookup", "mknod", "mkdir", "symlink", "unlink", "rmdir", "create"})
#: openers remembered (for the process of read/write lines); cleared past this
_OPENERS_KEPT = 8192


class Tracer:
    """Latency per FUSE operation and the access log's feed."""

    def __init__(self) -> None:
        self.on = False
        self.latency = Latencies()
        self.always = False  # a metrics endpoint: time every request
        self.watch_until = 0.0
        self.log = AccessLog()
        self.log.on_change = self.update
        # ino -> pid of its last open or create, while tracing: read and write
        # requests carry no process, so their lines name the opener.
        self.openers: dict[int, int] = {}
        # pid -> "tool:id" of its tool call, or None; set by the daemon (provenance).
        self.call_name = lambda pid: None

    def update(self) -> None:
        """Recompute `on` from who is looking."""
        self.on = self.always or bool(self.log.readers) or time.monotonic() < self.watch_until

    def watch(self, seconds: float) -> None:
        """Time requests for the next `seconds` (a `vfsd stats` sample)."""
        self.watch_until = max(self.watch_until, time.monotonic() + seconds)
        self.on = True

    async def timed(self, ops, op: str, guarded, args: tuple):
        """Run `guarded(ops, *args)` and record it."""
        if op == "read" and args[0] in self.log.readers:
            # The log's own reader waits on purpose: neither timed nor counted.
            ops.counters.requests["read"] -= 1
            return await guarded(ops, *args)
        t0 = time.perf_counter_ns()
        err = None
        result = None
        try:
            result = await guarded(ops, *args)
            return result
        except pyfuse3.FUSEError as exc:
            err = exc.errno
            raise
        finally:
            ns = time.perf_counter_ns() - t0
            self.latency[op].observe_ns(ns, err is not None)
            if self.log.readers:
                try:
                    self._log(ops, op, args, result, ns, err)
                except Exception:  # noqa: BLE001 - a log line never fails a request
                    pass
            if not self.always and not self.log.readers and \
                    time.monotonic() >= self.watch_until:
                self.on = False

    def _log(self, ops, op: str, args: tuple, result, ns: int, err: int | None) -> None:
        first = args[0] if args and isinstance(args[0], int) else None
        if first is not None and first >= ctldir.BASE:
            return  # the control directory: the observer's own requests
        ctx = args[-1] if args and isinstance(args[-1], pyfuse3.RequestContext) else None
        pid = ctx.pid if ctx is not None else None
        if op in ("open", "opendir", "create") and err is None and ctx is not None:
            if len(self.openers) >= _OPENERS_KEPT:
                self.openers.clear()
            ino = result[0].fh if op == "create" else first
            self.openers[ino] = pid
        elif pid is None and first is not None:
            pid = self.openers.get(first)
        path = self._path(ops, op, args, first)
        nbytes = 0
        if op == "read" and isinstance(result, bytes):
            nbytes = len(result)
        elif op == "write" and isinstance(result, int):
            nbytes = result
        call = self.call_name(pid) if pid is not None else None
        self.log.publish(
            f"{self.log.stamp(time.time())} {op} {path} {nbytes} {ns / 1e9:.6f} "
            f"pid={pid if pid is not None else '-'} call={escape(call) if call else '-'} "
            f"{result_name(err)}\n")

    @staticmethod
    def _path(ops, op: str, args: tuple, first: int | None) -> str:
        store = ops.store

        def path_of(ino: int) -> str | None:
            if ino == ops.root:
                return "."
            return store.path_of(ino)

        def joined(parent: int, name: bytes) -> str:
            base = path_of(parent)
            name_text = name.decode(errors="surrogateescape")
            if base is None:
                return f"?/{name_text}"
            return name_text if base == "." else f"{base}/{name_text}"

        if op in _NAMED:
            path = joined(args[0], args[1])
        elif op == "rename":
            path = f"{escape(joined(args[0], args[1]))} -> {escape(joined(args[2], args[3]))}"
            return path
        elif op == "link":
            path = joined(args[1], args[2])
        elif first is not None:
            path = path_of(first) or f"ino:{first}"
        else:
            path = "-"
        return escape(path)
