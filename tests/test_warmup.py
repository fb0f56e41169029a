"""`vfsd warmup` of a run resumed from a real SeaweedFS, and the remote metrics."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
from conftest import vfsd_cli
from prometheus_client.parser import text_string_to_metric_families
from remote_run import FAST, snapshot, status, sync, use_server
from s3server import s3_server  # noqa: F401 - fixture
from test_metrics import free_port

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

MiB = 1 << 20


@pytest.fixture
def s3(s3_server, monkeypatch):  # noqa: F811
    use_server(s3_server, monkeypatch)
    return s3_server


def published_run(s3, run_factory, name: str, files: dict[str, bytes]) -> tuple[str, str]:
    """A run on worker A with `files`, published and unmounted: (bucket url, run id)."""
    url = s3.unique_url(name)
    a = run_factory(f"{name}-a", "--remote", url, *FAST)
    for path, data in files.items():
        (a.root / path).parent.mkdir(parents=True, exist_ok=True)
        (a.root / path).write_bytes(data)
    snapshot(a)
    sync(a)
    run_id = status(a)["run"]
    vfsd_cli("umount", a.run_dir)
    return url, run_id


def warm(run, *args: str) -> dict:
    return json.loads(vfsd_cli("warmup", run.run_dir, *args, "--json").stdout)


def test_warmup_fetches_what_a_resume_left_in_the_bucket(s3, run_factory):
    files = {"data/a.bin": os.urandom(3 * MiB), "data/b.bin": os.urandom(2 * MiB),
             "notes.md": b"small\n", "other/c.bin": os.urandom(2 * MiB)}
    url, run_id = published_run(s3, run_factory, "warm", files)
    b = run_factory("warm-b", mount=False)
    vfsd_cli("mount", b.run_dir, "--remote", url, "--from", run_id, *FAST)

    check = warm(b, "--check")
    assert check["check"] is True and check["result"] is None
    p = check["plan"]
    assert p["files"] == 4 and p["missing_chunks"] == 7 and p["local_chunks"] == 0
    assert p["missing_bytes"] == 7 * MiB and p["fetch"] == 7 and p["skipped_chunks"] == 0
    info = json.loads(vfsd_cli("info", b.run_dir, "data/a.bin", "--json").stdout)
    assert info["tier"] == "remote" and info["content"]["remote_only"] == 3

    # Only what is asked: a directory, then the rest.
    done = warm(b, "data")
    assert done["plan"]["files"] == 2 and done["result"]["fetched"] == 5
    assert done["result"]["bytes"] == 5 * MiB and done["result"]["failed"] == []
    assert warm(b, "--check")["plan"]["missing_chunks"] == 2
    info = json.loads(vfsd_cli("info", b.run_dir, "data/a.bin", "--json").stdout)
    assert info["content"]["local"] == 3 and info["content"]["in_bucket"] == 3
    everything = warm(b)
    assert everything["result"]["fetched"] == 2
    assert warm(b, "--check")["plan"]["missing_chunks"] == 0
    # What was fetched reads back exactly, with no fetch left to do.
    before = status(b)["remote"]["fetcher"]["downloads"]
    for path, data in files.items():
        assert (b.root / path).read_bytes() == data
    assert status(b)["remote"]["fetcher"]["downloads"] == before
    text = vfsd_cli("warmup", b.run_dir, "--check").stdout
    assert "7 of 7 chunks" in text
    missing = vfsd_cli("warmup", b.run_dir, "nope", check=False)
    assert missing.returncode == 1 and "not found" in missing.stderr
    # The fetch request takes chunk digests of this run only.
    from vfsd.control.client import ControlClient, ControlError

    with ControlClient(b.state_dir / "vfsd.sock") as c:
        for bad in ("zz" * 16, "ab", 5, ["ab" * 16] * 300):
            with pytest.raises(ControlError) as err:
                c.call("warmup_fetch", digests=bad if isinstance(bad, list) else [bad])
            assert err.value.code == "bad_request"
        got = c.call("warmup_fetch", digests=["ab" * 16])
        assert got["fetched"] == 0 and got["failed"][0]["error"] == "not a chunk of this run"


def test_warmup_stays_within_the_cache(s3, run_factory):
    files = {f"f{i}.bin": os.urandom(MiB) for i in range(8)}
    url, run_id = published_run(s3, run_factory, "bound", files)
    b = run_factory("bound-b", mount=False)
    vfsd_cli("mount", b.run_dir, "--remote", url, "--from", run_id, *FAST,
             "--remote-cache-bytes", "4MiB")
    done = warm(b, "f7.bin", "f6.bin", ".")  # the two named first come first
    p = done["plan"]
    assert p["cache_limit"] == 4 * MiB and p["budget_bytes"] < 4 * MiB
    assert done["result"]["fetched"] == p["fetch"] == 3  # 3 MiB fit under 90% of 4 MiB
    assert p["skipped_chunks"] == 5 and p["skipped_bytes"] == 5 * MiB
    local = [name for name in files if json.loads(vfsd_cli(
        "info", b.run_dir, name, "--json").stdout)["content"]["local"]]
    assert {"f7.bin", "f6.bin"} <= set(local) and len(local) == 3
    text = vfsd_cli("warmup", b.run_dir, "--check").stdout
    assert "left in the bucket" in text and "cache bound (4.0 MiB)" in text


def test_warmup_needs_a_remote(run):
    proc = vfsd_cli("warmup", run.run_dir, check=False)
    assert proc.returncode == 1 and "no remote tier" in proc.stderr


def test_remote_latency_and_unpublished_age_metrics(s3, run_factory):
    port = free_port()
    url = s3.unique_url("metrics")
    a = run_factory("metrics-a", "--remote", url, *FAST, "--metrics-port", str(port))
    (a.root / "x.bin").write_bytes(os.urandom(2 * MiB))
    snapshot(a)
    sync(a)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    puts = samples[("vfsd_remote_request_seconds_count", (("op", "put"),))]
    assert puts >= 2  # two chunks at least (and the manifest, the head)
    assert samples[("vfsd_remote_request_seconds_sum", (("op", "put"),))] > 0
    assert samples[("vfsd_remote_oldest_unpublished_change_age_seconds", ())] == 0
    assert samples[("vfsd_snapshots", ())] == 1
