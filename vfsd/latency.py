"""Latency histograms cheap enough to feed from every FUSE request.

A `Latency` counts calls, failures and total time, and sorts each duration
into a power-of-two bucket of microseconds (bucket i holds durations under
2**i us; the last one holds everything longer): one integer division and a
`bit_length()` per observation, no lock (the FUSE loop is one thread; the
other users observe from one thread each or accept a lost increment).
Prometheus histograms and `vfsd stats` are built from these at read time.
"""

from __future__ import annotations

import time

#: buckets per histogram: 2**0 .. 2**26 us (67 s), then everything longer
BUCKETS = 28


def bucket_bounds() -> list[float]:
    """Upper bound of each bucket but the last, in seconds."""
    return [(1 << i) / 1e6 for i in range(BUCKETS - 1)]


class Latency:
    """Counts, failures, total time and a log2 histogram of one kind of operation."""

    __slots__ = ("count", "errors", "total_ns", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.total_ns = 0
        self.buckets = [0] * BUCKETS

    def observe_ns(self, ns: int, failed: bool = False) -> None:
        """Record one operation that took `ns` nanoseconds."""
        self.count += 1
        self.total_ns += ns
        if failed:
            self.errors += 1
        i = (ns // 1000).bit_length()
        self.buckets[i if i < BUCKETS else BUCKETS - 1] += 1

    def observe(self, seconds: float, failed: bool = False) -> None:
        """Record one operation that took `seconds`."""
        self.observe_ns(max(int(seconds * 1e9), 0), failed)

    def timed(self) -> _Timer:
        """`with latency.timed():` records the block's duration (a failure if it raises)."""
        return _Timer(self)

    def quantile(self, q: float) -> float:
        """An upper bound of the q-quantile, in seconds (0.0 with no data)."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for i, n in enumerate(self.buckets):
            seen += n
            if seen >= rank:
                return (1 << i) / 1e6
        return (1 << (BUCKETS - 1)) / 1e6

    def as_dict(self) -> dict:
        """Plain numbers, for the control protocol (`buckets` trimmed of trailing zeros)."""
        buckets = list(self.buckets)
        while buckets and not buckets[-1]:
            buckets.pop()
        return {"count": self.count, "errors": self.errors, "total_ns": self.total_ns,
                "buckets": buckets}


class _Timer:
    __slots__ = ("latency", "t0")

    def __init__(self, latency: Latency) -> None:
        self.latency = latency

    def __enter__(self) -> _Timer:
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.latency.observe_ns(time.perf_counter_ns() - self.t0, exc_type is not None)
        return False


class Latencies(dict):
    """name -> Latency, made on first use."""

    def __missing__(self, name: str) -> Latency:
        lat = self[name] = Latency()
        return lat

    def as_dict(self) -> dict:
        return {name: lat.as_dict() for name, lat in sorted(self.items())}
