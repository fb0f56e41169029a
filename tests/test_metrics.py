"""The Prometheus endpoint (`--metrics-port`): scraped over HTTP while real
programs write, read, delete and the agent advances steps; its numbers follow.
"""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request

import pytest
from pagecache import drop_page_cache
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.fuse

KiB = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """Every sample on the endpoint, by name (labels dropped; ours have none)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}




@pytest.fixture
def metered(run_factory):
    port = free_port()
    run = run_factory("metered", "--metrics-port", str(port))
    return run, port


def test_metrics_follow_the_mount(metered):
    run, port = metered
    before = scrape(port)
    assert before["vfsd_files"] == 0
    assert before["vfsd_written_bytes_total"] == 0

    small = os.urandom(3 * KiB)
    large = os.urandom(300 * KiB)  # past inline_max: chunked
    (run.root / "small.txt").write_bytes(small)
    (run.root / "large.bin").write_bytes(large)
    (run.root / "large-copy.bin").write_bytes(large)  # same chunks: deduplicated
    with open(run.root / "large.bin", "rb+") as f:
        os.fsync(f.fileno())
    drop_page_cache(run.root / "large.bin")
    assert (run.root / "large.bin").read_bytes() == large

    after = scrape(port)
    assert after["vfsd_files"] == 3
    assert after["vfsd_logical_bytes"] == len(small) + 2 * len(large)
    assert after["vfsd_inline_bytes"] == len(small)
    assert after["vfsd_chunk_bytes"] == len(large)
    assert after["vfsd_chunks"] >= 1
    assert after["vfsd_dedup_ratio"] > 1.5
    assert after["vfsd_written_bytes_total"] >= len(small) + 2 * len(large)
    assert after["vfsd_writes_total"] > before["vfsd_writes_total"]
    assert after["vfsd_creates_total"] == before["vfsd_creates_total"] + 3
    assert after["vfsd_lookups_total"] > before["vfsd_lookups_total"]
    assert after["vfsd_read_bytes_total"] >= len(large)
    assert after["vfsd_reads_total"] > before["vfsd_reads_total"]
    assert after["vfsd_dirty_bytes"] == 0  # everything closed is committed

    # The numbers agree with `vfsd status`, which reads the same state.
    status = run.status()
    assert after["vfsd_files"] == status["files"]
    assert after["vfsd_chunk_bytes"] == status["chunk_bytes"]

    (run.root / "large-copy.bin").unlink()
    os.setxattr(run.root / "small.txt", "user.vfsd.status", b"done")
    run.cli("step", run.run_dir, "10")  # past done_retention_steps (3)

    last = scrape(port)
    assert last["vfsd_unlinks_total"] == after["vfsd_unlinks_total"] + 1
    assert last["vfsd_evicted_files_total"] == after["vfsd_evicted_files_total"] + 1
    assert last["vfsd_files"] == 1
    assert last["vfsd_step"] == 10
    assert last["vfsd_logical_bytes"] == len(large)
    assert last["vfsd_daemon_info"] == 1
    assert last["process_resident_memory_bytes"] > 0


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on `port` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                local, state = line.split()[1], line.split()[3]
                addr, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(addr)
    return found


def test_metrics_listen_on_localhost_only(metered):
    run, port = metered
    assert scrape(port)["vfsd_files"] == 0
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, little-endian hex


def test_endpoint_closes_with_the_daemon(metered):
    run, port = metered
    assert scrape(port)["vfsd_files"] == 0
    run.umount()
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_busy_port_is_a_startup_error(run_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = run_factory("busy", "--metrics-port", str(port), mount=False)
        proc = run.cli("mount", run.run_dir, "--metrics-port", str(port), check=False)
        assert proc.returncode != 0
        assert str(port) in proc.stderr
    assert not run.root.exists() or not os.path.ismount(run.root)


def scrape_labelled(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_latency_histograms(metered):
    """Every FUSE request is timed while the endpoint serves, and so are
    snapshots, restores and eviction passes; the snapshot count follows."""
    run, port = metered
    for i in range(20):
        (run.root / f"f{i}.txt").write_bytes(os.urandom(2 * KiB))
    sid = run.cli("snapshot", run.run_dir).stdout.strip()
    (run.root / "f0.txt").unlink()
    run.cli("restore", run.run_dir, sid)
    run.cli("step", run.run_dir, "2")
    m = scrape_labelled(port)
    ops = run.status()["requests"]
    # Each request the daemon counted was timed (the scrape's own status call aside).
    for op in ("create", "write", "unlink", "lookup"):
        assert m[("vfsd_fuse_request_seconds_count", (("op", op),))] == ops[op]
        assert m[("vfsd_fuse_request_seconds_sum", (("op", op),))] > 0
        inf = m[("vfsd_fuse_request_seconds_bucket", (("le", "+Inf"), ("op", op)))]
        assert inf == ops[op]
        # Buckets are cumulative.
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in m.items()
                         if k[0] == "vfsd_fuse_request_seconds_bucket"
                         and dict(k[1])["op"] == op)
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert m[("vfsd_snapshot_seconds_count", (("op", "snapshot"),))] == 1
    assert m[("vfsd_snapshot_seconds_count", (("op", "restore"),))] == 1
    assert m[("vfsd_eviction_seconds_count", ())] >= 1  # the step advance's pass
    assert m[("vfsd_snapshots", ())] == 1


#: as another user: opens ARGV[1] connections to the endpoint, each sending
#: half a request, says "ready" and holds them until its stdin closes
HALF_OPEN = r"""
import socket, sys
held = []
for _ in range(int(sys.argv[1])):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the blank line
    held.append(s)
print("ready", flush=True)
sys.stdin.read()
"""


def daemon_threads(run) -> int:
    pid = int((run.state_dir / "vfsd.pid").read_text())
    status = open(f"/proc/{pid}/status").read()
    return int(status.split("Threads:")[1].split()[0])


@pytest.mark.skipif(os.getuid() != 0, reason="runs the client as another uid (nobody)")
def test_many_half_open_connections_neither_pile_up_nor_hold_the_mount(metered):
    """Issue 28, item 3: one thread per connection, no limit, no timeout: as
    uid nobody, 2,000 half-open requests left 2,003 daemon threads, and
    closing 15,000 at once held a lookup in the mount for 153 s."""
    import subprocess

    run, port = metered
    (run.root / "before").write_text("x")
    scrape(port)
    threads_before = daemon_threads(run)
    holder = subprocess.Popen(["/usr/bin/python3", "-c", HALF_OPEN, "600", str(port)],
                              user="nobody", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        # The daemon's threads stay bounded, whatever the number of connections.
        assert daemon_threads(run) <= threads_before + 2
        # The mount answers lookups, creates and reads meanwhile.
        for i in range(50):
            (run.root / f"during{i}").write_text(str(i))
            assert os.stat(run.root / "before").st_size == 1
        assert (run.root / "during49").read_text() == "49"
        # A scrape still gets its answer.
        assert scrape(port)["vfsd_files"] == 51
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    # Closed all at once: the mount and the endpoint go on.
    assert os.stat(run.root / "during0").st_size == 1
    assert scrape(port)["vfsd_files"] == 51
    assert daemon_threads(run) <= threads_before + 2
