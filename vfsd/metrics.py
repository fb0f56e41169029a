"""Optional Prometheus endpoint: the daemon's counters on 127.0.0.1:PORT/metrics.

Nothing is counted twice: a custom collector reads the daemon's own state at
scrape time (the store's counters in one read-only LMDB transaction, the
operation and eviction counters as plain integers, the latency histograms of
`vfsd.latency`), and `Endpoint` serves it from one thread of its own. A
scrape never opens a write transaction, so it cannot stall or block FUSE
requests. While the endpoint serves, every FUSE request is timed
(`fuse.tracer`), which costs a clock read and a bucket increment.

The endpoint has no authentication and every local user may connect, so what
a client can take is bounded: one thread serves every connection (a
selector loop), at most `MAX_CONNECTIONS` at once (a newcomer closes the
oldest), each with `REQUEST_TIMEOUT_S` to send a request of at most
`MAX_REQUEST_BYTES` and take its answer. prometheus_client's own server ran
a thread per connection with no limit and no timeout: 2,000 half-open
requests made 2,003 daemon threads, and closing 15,000 at once held a lookup
in the mount for 153 s (the threads all wanted the GIL).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Iterator

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.registry import Collector

from . import __version__
from .errors import StartupError
from .latency import Latency, bucket_bounds

log = structlog.get_logger("vfsd.metrics")

#: Address the endpoint listens on: never reachable from other hosts.
METRICS_ADDR = "127.0.0.1"
#: connections served at once; a newcomer past it closes the oldest
MAX_CONNECTIONS = 16
#: seconds a connection has, from accept, to send its request and take the answer
REQUEST_TIMEOUT_S = 10.0
#: bytes of request (line and headers) read before the client is dropped
MAX_REQUEST_BYTES = 8192

# (store counter key, metric name, help)
_STORE_GAUGES = (
    ("files", "vfsd_files", "Files in the volume."),
    ("logical_bytes", "vfsd_logical_bytes", "Bytes of file content, as programs see it."),
    ("inline_bytes", "vfsd_inline_bytes", "Bytes of file content kept inline in LMDB."),
    ("chunk_count", "vfsd_chunks", "Content-addressed chunks in the store (all volumes)."),
    ("chunk_bytes", "vfsd_chunk_bytes", "Bytes in chunk files (all volumes)."),
    ("step", "vfsd_step", "Current agent step of the volume."),
)

# (operation counter key, metric name without _total, help)
_OP_COUNTERS = (
    ("bytes_read", "vfsd_read_bytes", "Bytes returned by read requests."),
    ("bytes_written", "vfsd_written_bytes", "Bytes accepted by write requests."),
    ("reads", "vfsd_reads", "FUSE read requests."),
    ("writes", "vfsd_writes", "FUSE write requests."),
    ("lookups", "vfsd_lookups", "FUSE lookup requests."),
    ("creates", "vfsd_creates", "Files created."),
    ("unlinks", "vfsd_unlinks", "Names removed."),
)


class DaemonCollector(Collector):
    """Turns a running daemon's counters into metric families at each scrape."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self._closed = False
        # Held while a scrape reads the store, so close() can wait for it.
        self._store_lock = threading.Lock()

    def close(self) -> None:
        """Stop reading the store (call before the store closes)."""
        with self._store_lock:
            self._closed = True

    def collect(self) -> Iterator:
        d = self.daemon
        info = InfoMetricFamily("vfsd_daemon", "The daemon serving this endpoint.")
        info.add_metric(
            [],
            {
                "version": __version__,
                "mountpoint": str(d.run.mountpoint),
                "store": str(d.store.dir),
                "volume": d.store.volume,
            },
        )
        yield info
        yield from self._store_metrics()
        ops = d.ops.counters.as_dict()
        for key, name, doc in _OP_COUNTERS:
            yield CounterMetricFamily(name, doc, value=ops[key])
        yield CounterMetricFamily(
            "vfsd_evicted_files", "Files removed by eviction.", value=d.evictor.evicted_total
        )
        yield CounterMetricFamily(
            "vfsd_enospc", "Writes refused for lack of room (ENOSPC): a quota, max_files "
            "or the store's disk.", value=d.evictor.enospc_total + d.ops.disk.refusals
        )
        yield GaugeMetricFamily(
            "vfsd_dirty_bytes",
            "Written bytes not yet committed to the store.",
            value=d.ops.files.dirty_bytes,
        )
        yield GaugeMetricFamily(
            "vfsd_open_files", "Files with open handles.", value=len(d.ops.files.files)
        )
        yield from self._remote_metrics()
        yield from self._latency_metrics()

    def _latency_metrics(self) -> Iterator:
        d = self.daemon
        yield _histogram("vfsd_fuse_request_seconds", "Time to answer FUSE requests, by operation.",
                         "op", dict(d.ops.tracer.latency))
        snapservice = getattr(d, "snapservice", None)
        if snapservice is not None:
            yield _histogram("vfsd_snapshot_seconds",
                             "Time to take or restore a snapshot (request to reply).",
                             "op", dict(snapservice.latency))
            with self._store_lock:
                if not self._closed:
                    try:
                        count = len(snapservice.snaps.list())
                    except Exception as exc:  # a scrape must never take the daemon down
                        log.warning("metrics_store_unreadable", error=str(exc))
                        count = None
            if count is not None:
                yield GaugeMetricFamily("vfsd_snapshots", "Snapshots retained.", value=count)
        yield _histogram("vfsd_eviction_seconds", "Time of an eviction pass (a step advance, "
                         "a quota, a request).", None, {"": d.evictor.latency})
        remote = getattr(d, "remote", None)
        if remote is None:
            return
        objstore = getattr(remote, "objstore", None)
        if objstore is not None:
            with objstore._lock:
                kinds = {op: _copy(lat) for op, lat in objstore.latency.items()}
            yield _histogram("vfsd_remote_request_seconds",
                             "Time of object store requests (each attempt), by kind.", "op", kinds)
        with self._store_lock:
            if self._closed:
                return
            try:
                age = remote.status()["oldest_unpublished_change_age_s"]
            except Exception as exc:  # a scrape must never take the daemon down
                log.warning("metrics_store_unreadable", error=str(exc))
                return
        yield GaugeMetricFamily(
            "vfsd_remote_oldest_unpublished_change_age_seconds",
            "Age of the oldest change no published snapshot holds yet (0: none).",
            value=age or 0.0)

    def _remote_metrics(self) -> Iterator:
        remote = getattr(self.daemon, "remote", None)
        if remote is None:
            return
        from vfsd.store import remotestate

        with self._store_lock:
            if self._closed:
                return
            try:
                counts = remotestate.counts(self.daemon.store)
            except Exception as exc:  # a scrape must never take the daemon down
                log.warning("metrics_store_unreadable", error=str(exc))
                return
        yield GaugeMetricFamily("vfsd_remote_backlog_chunks", "Chunks waiting for upload.",
                                value=counts["upload_chunks"])
        yield GaugeMetricFamily("vfsd_remote_backlog_bytes", "Bytes waiting for upload.",
                                value=counts["upload_bytes"])
        yield GaugeMetricFamily("vfsd_remote_unpublished_chunks",
                                "Uploaded chunks no published manifest names yet.",
                                value=counts["unpublished_chunks"])
        yield GaugeMetricFamily("vfsd_remote_lease_held", "1 while this worker writes the run.",
                                value=int(remote.state == "held"))
        yield GaugeMetricFamily("vfsd_remote_read_only",
                                "1 once another worker holds the run (writes fail).",
                                value=int(remote.state == "lost"))
        pub = remote.publisher
        yield GaugeMetricFamily("vfsd_remote_published_seq",
                                "Newest published snapshot (its seq).",
                                value=max(pub.published, default=0) if pub else 0)
        if remote.uploader is not None:
            for key in ("uploaded", "existed", "failed", "sent_bytes"):
                yield CounterMetricFamily(f"vfsd_remote_upload_{key}",
                                          f"Chunk uploads: {key.replace('_', ' ')}.",
                                          value=remote.uploader.stats[key])
        if remote.fetcher is not None:
            for key in ("downloads", "downloaded_bytes", "timeouts", "errors"):
                yield CounterMetricFamily(f"vfsd_remote_fetch_{key}",
                                          f"Chunk fetches: {key.replace('_', ' ')}.",
                                          value=remote.fetcher.stats[key])

    def _store_metrics(self) -> Iterator:
        with self._store_lock:
            if self._closed:
                return
            try:
                c = self.daemon.store.counters()
            except Exception as exc:  # a scrape must never take the daemon down
                log.warning("metrics_store_unreadable", error=str(exc))
                return
        for key, name, doc in _STORE_GAUGES:
            yield GaugeMetricFamily(name, doc, value=c[key])
        stored = c["inline_bytes"] + c["chunk_bytes"]
        yield GaugeMetricFamily(
            "vfsd_stored_bytes", "Bytes the store holds (inline + chunks).", value=stored
        )
        yield GaugeMetricFamily(
            "vfsd_dedup_ratio",
            "Logical bytes per stored byte.",
            value=c["logical_bytes"] / stored if stored else 1.0,
        )


def _copy(lat: Latency) -> Latency:
    out = Latency()
    out.count, out.errors, out.total_ns, out.buckets = (lat.count, lat.errors, lat.total_ns,
                                                        list(lat.buckets))
    return out


def _histogram(name: str, doc: str, label: str | None, series: dict) -> HistogramMetricFamily:
    """A histogram family from `Latency` objects (one series per label value)."""
    bounds = bucket_bounds()
    family = HistogramMetricFamily(name, doc, labels=[label] if label else None)
    for value, lat in sorted(series.items()):
        counts = list(lat.buckets)
        running = 0
        buckets = []
        for bound, n in zip(bounds, counts, strict=False):
            running += n
            buckets.append((f"{bound:g}", running))
        buckets.append(("+Inf", lat.count))
        family.add_metric([value] if label else [], buckets, sum_value=lat.total_ns / 1e9)
    return family


class _Conn:
    """One client: what it sent so far, what is left to send, its deadline."""

    __slots__ = ("sock", "opened", "deadline", "inbuf", "out")

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.opened = now
        self.deadline = now + REQUEST_TIMEOUT_S
        self.inbuf = bytearray()
        self.out: memoryview | None = None


class Endpoint:
    """HTTP/1.0 GET /metrics from one thread, with bounded connections and time."""

    def __init__(self, registry: CollectorRegistry, port: int) -> None:
        self.registry = registry
        self.listener = socket.create_server((METRICS_ADDR, port), backlog=64)
        self.listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = False
        self.conns: dict[int, _Conn] = {}
        self.dropped = 0  # connections closed for room, time or size
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._serve, name="vfsd-metrics", daemon=True)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def _serve(self) -> None:
        while not self._stop:
            for key, events in self.sel.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    continue
                elif events & selectors.EVENT_READ:
                    self._read(key.data)
                else:
                    self._write(key.data)
            now = time.monotonic()
            for conn in [c for c in self.conns.values() if c.deadline < now]:
                self._drop(conn)
        for conn in list(self.conns.values()):
            self._close(conn)

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):  # then back to the others: no accept flood holds them
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the next turn tries again
                log.warning("metrics_accept_failed", error=str(exc))
                return
            if len(self.conns) >= MAX_CONNECTIONS:
                self._drop(min(self.conns.values(), key=lambda c: c.opened))
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic())
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        end = conn.inbuf.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.inbuf) > MAX_REQUEST_BYTES:
                self._drop(conn)
            return
        conn.out = memoryview(self._answer(bytes(conn.inbuf[:end])))
        self.sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _answer(self, head: bytes) -> bytes:
        parts = head.split(b"\r\n", 1)[0].split()
        method, path = (parts[0], parts[1].split(b"?")[0]) if len(parts) >= 2 else (b"", b"")
        if method not in (b"GET", b"HEAD"):
            status, body, ctype = b"405 Method Not Allowed", b"GET only\n", b"text/plain"
        elif path not in (b"/metrics", b"/"):
            status, body, ctype = b"404 Not Found", b"see /metrics\n", b"text/plain"
        else:
            try:
                body = generate_latest(self.registry)
                status, ctype = b"200 OK", CONTENT_TYPE_LATEST.encode()
            except Exception:  # noqa: BLE001 - a closing daemon, say: an error, not a dead thread
                log.exception("metrics_scrape_failed")
                status, body, ctype = b"500 Internal Server Error", b"", b"text/plain"
        head_out = (b"HTTP/1.0 " + status + b"\r\nContent-Type: " + ctype
                    + b"\r\nContent-Length: " + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n")
        return head_out + (body if method != b"HEAD" else b"")

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._close(conn)

    def _drop(self, conn: _Conn) -> None:
        self.dropped += 1
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        self.conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self.thread.join(timeout=5)
        self.sel.close()
        for sock in (self.listener, self._wake_r, self._wake_w):
            sock.close()


class MetricsServer:
    """A running endpoint; close() stops it."""

    def __init__(self, collector: DaemonCollector, endpoint: Endpoint) -> None:
        self.collector = collector
        self.endpoint = endpoint

    @property
    def port(self) -> int:
        return self.endpoint.port

    def close(self) -> None:
        """Stop serving and stop reading the daemon (before its store closes)."""
        self.collector.close()
        self.endpoint.close()


def start_metrics_server(daemon, port: int | None) -> MetricsServer | None:
    """Serve `daemon`'s metrics on 127.0.0.1:`port`; None (no server) if `port` is None.

    `daemon` needs `store`, `ops` and `evictor` set up. Raises
    StartupError if the port cannot be bound.
    """
    if port is None:
        return None
    collector = DaemonCollector(daemon)
    daemon.ops.tracer.always = True  # the histograms need every request
    daemon.ops.tracer.update()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)  # memory, CPU, open descriptors of the daemon
    try:
        endpoint = Endpoint(registry, port)
    except (OSError, OverflowError) as exc:
        raise StartupError(f"cannot serve metrics on {METRICS_ADDR}:{port}: {exc}") from None
    endpoint.start()
    server = MetricsServer(collector, endpoint)
    log.info("metrics_serving", addr=METRICS_ADDR, port=server.port)
    return server
