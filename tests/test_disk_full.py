"""A full disk is visible and clears (issue 28, "also").

On a full disk writes got ENOSPC while `vfsd status` showed `enospc 0`,
`vfsd status --check` exited 0 (healthy) and metrics counted nothing; the
only trace was a warning in `vfsd.log`. Now every refusal is counted (status
and metrics), `--check` says unhealthy while the store refuses writes for
lack of space, and the first write after space is freed succeeds.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from conftest import vfsd_cli
from prometheus_client.parser import text_string_to_metric_families
from test_hostile import fill_disk, write_errno

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]

MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 32 MB tmpfs made for the test (needs CAP_SYS_ADMIN)."""
    path = tmp_path / "small-disk"
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def enospc_metric(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples}["vfsd_enospc_total"]


def check(run) -> subprocess.CompletedProcess:
    return vfsd_cli("status", run.run_dir, "--check", check=False)


def test_a_full_disk_is_counted_reported_unhealthy_and_clears(run_factory, small_disk):
    port = free_port()
    run = run_factory("full", "--store", str(small_disk), "--metrics-port", str(port))
    run.expect_errors = True  # the daemon logs what it refused
    assert check(run).returncode == 0
    filler = fill_disk(small_disk)
    try:
        refused = [write_errno(run.root / f"f{i}", os.urandom(2 * MiB)) for i in range(3)]
        assert set(refused) == {errno.ENOSPC}, refused
        doc = json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)
        assert doc["counters"]["enospc"] >= 3, doc["counters"]
        assert doc["disk_full"] is True
        assert enospc_metric(port) >= 3
        sick = check(run)
        assert sick.returncode != 0 and "space" in sick.stderr, sick.stderr
    finally:
        filler.unlink()
    # The first write after space came back goes through, and the store is healthy.
    data = os.urandom(2 * MiB)
    assert write_errno(run.root / "after", data) is None
    assert (run.root / "after").read_bytes() == data
    assert check(run).returncode == 0, check(run).stderr
    assert json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)["disk_full"] is False


def test_room_freed_through_the_mount_is_there_for_the_next_write(run_factory, small_disk):
    """Deleting a large file in the mount gives its room back at once: the next
    write does not wait for a sync to delete the chunk files."""
    run = run_factory("full", "--store", str(small_disk))
    run.expect_errors = True
    filler = fill_disk(small_disk, leave=14 * MiB)
    big = os.urandom(8 * MiB)
    assert write_errno(run.root / "big", big) is None
    assert write_errno(run.root / "refused", os.urandom(6 * MiB)) == errno.ENOSPC
    os.unlink(run.root / "big")
    data = os.urandom(6 * MiB)
    assert write_errno(run.root / "after", data) is None
    assert (run.root / "after").read_bytes() == data
    filler.unlink()
