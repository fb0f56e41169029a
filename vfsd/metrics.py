"""Optional Prometheus endpoint: the daemon's counters on 127.0.0.1:PORT/metrics.

Nothing is counted twice: a custom collector reads the daemon's own state at
scrape time (the store's counters in one read-only LMDB transaction, the
operation and eviction counters as plain integers, the latency histograms of
`vfsd.latency`), and prometheus_client's threaded HTTP server serves it from
its own threads. A scrape never opens a write transaction, so it cannot stall
or block FUSE requests. While the endpoint serves, every FUSE request is
timed (`fuse.tracer`), which costs a clock read and a bucket increment.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
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
            "vfsd_enospc", "Writes refused because a quota was full.", value=d.evictor.enospc_total
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


class MetricsServer:
    """A running endpoint; close() stops it."""

    def __init__(self, collector: DaemonCollector, httpd, thread: threading.Thread) -> None:
        self.collector = collector
        self.httpd = httpd
        self.thread = thread

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def close(self) -> None:
        """Stop serving and stop reading the daemon (before its store closes)."""
        self.collector.close()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


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
        httpd, thread = start_http_server(port, addr=METRICS_ADDR, registry=registry)
    except (OSError, OverflowError) as exc:
        raise StartupError(f"cannot serve metrics on {METRICS_ADDR}:{port}: {exc}") from None
    server = MetricsServer(collector, httpd, thread)
    log.info("metrics_serving", addr=METRICS_ADDR, port=server.port)
    return server
