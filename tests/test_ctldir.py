"""`.vfsd/` files on a real mount: right content, bounded memory per open handle.

evicted.ndjson used to be rendered whole for every open and every stat (about
1 MB and 140 ms of the FUSE loop at 5,000 records), and kept per handle: 300
open handles cost 260 MB of the daemon's memory. It is now paged: handles
hold two offsets, reads render only what they cover.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from ctl import call

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

RECORDS = 5_000


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def evicted_run(run_factory):
    """A mount whose eviction log holds RECORDS records (names of every length)."""
    run = run_factory("log", "--max-age-steps", "1")
    for i in range(RECORDS):
        name = f"f{i:05d}-" + "x" * (i % 200)
        fd = os.open(run.root / name, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"%d" % i)
        os.close(fd)
    report = call(run.run_dir, "set_step", step=5)
    assert report["files"] == RECORDS
    return run


def expected_log(run) -> bytes:
    records = call(run.run_dir, "evicted", limit=100_000)["records"]
    assert len(records) == RECORDS
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_evicted_log_content_size_and_offsets(evicted_run):
    run = evicted_run
    log = run.root / ".vfsd" / "evicted.ndjson"
    want = expected_log(run)
    assert os.stat(log).st_size == 0  # like /proc files: the content changes all the time
    assert log.read_bytes() == want
    fd = os.open(log, os.O_RDONLY)
    try:
        # Reads at any offset and of any size, across record boundaries.
        for off, size in ((0, 1), (1, 4095), (len(want) // 2 - 7, 100_000), (len(want) - 3, 10),
                          (len(want), 10), (len(want) + 5000, 10), (12_345, 1 << 20)):
            assert os.pread(fd, size, off) == want[off:off + size], (off, size)
        # A handle keeps the log as it was at its open; a new one sees what came after.
        (run.root / "later").write_bytes(b"later")
        call(run.run_dir, "set_step", step=10)
        assert os.pread(fd, 1 << 22, 0) == want
    finally:
        os.close(fd)
    grown = log.read_bytes()
    assert grown.startswith(want) and grown.count(b"\n") == RECORDS + 1
    assert json.loads(grown.splitlines()[-1])["path"] == "later"
    # Shell tools read to the end of a file that says its size is 0.
    tail = subprocess.run(["tail", "-n", "2", log], capture_output=True, check=True).stdout
    assert tail == b"".join(grown.splitlines(keepends=True)[-2:])
    wc = subprocess.run(["wc", "-c", log], capture_output=True, check=True, text=True).stdout
    assert int(wc.split()[0]) == len(grown)


def test_open_handles_cost_no_memory_per_handle(evicted_run):
    run = evicted_run
    pid = int((run.state_dir / "vfsd.pid").read_text())
    log = run.root / ".vfsd" / "evicted.ndjson"
    log.read_bytes()  # index built once
    before = rss_bytes(pid)
    fds = [os.open(log, os.O_RDONLY) for _ in range(300)]
    try:
        for fd in fds[::30]:
            assert os.pread(fd, 100, 0).startswith(b'{"')
        grew = rss_bytes(pid) - before
    finally:
        for fd in fds:
            os.close(fd)
    # Rendered per handle, 300 handles held ~300 MB; paged, they hold offsets.
    assert grew < 32 << 20, f"300 open handles grew the daemon by {grew >> 20} MiB"
    status = json.loads((run.root / ".vfsd" / "status.json").read_bytes())
    assert status["files"] == 0 and status["running"] is True
