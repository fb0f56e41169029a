"""VfsdCheckpointer with the remote tier: a thread checkpointed on one worker
resumes on another, its files coming from the bucket; both durability choices.

Two workers are two run dirs with their own stores, mounted with `--remote` on
one real SeaweedFS prefix; they share one InMemorySaver, as two machines share a
PostgreSQL. The graph is tests/ckpt_graph.py: what its nodes "see" is what
`cat`/`ls` print in the mount.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

from ckpt_graph import AFTER_V2, MOUNT_OPTIONS, at_step, build, observe  # noqa: E402
from conftest import unmount_quietly  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from remote_run import Bucket, use_server  # noqa: E402
from s3server import s3_private_server, s3_server  # noqa: E402, F401 - fixtures

import mount_tool  # noqa: E402
from mount_tool import SnapshotNotPublished, SnapshotUnavailable  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240)]

ORIGINAL = ["0:a=;ls=", "1:a=v1;ls=a.txt,c.txt", "2:a=v2;ls=a.txt,c.txt", "3:a=v3;ls=a.txt"]
#: remote options for short faults (see tests/remote_run.py FAST)
FAST = {"remote_lease_ttl": 5, "remote_retry_base_delay": 0.05, "remote_retry_max_delay": 0.5,
        "remote_connect_timeout": 1, "remote_read_timeout": 3, "remote_max_attempts": 2,
        "remote_fetch_timeout": 3, "remote_lease_wait": 0}


def thread() -> dict:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}


def worker(tmp_path: Path, name: str, url: str) -> mount_tool.Mount:
    return mount_tool.mount(tmp_path / name, remote=url, **MOUNT_OPTIONS, **FAST)


def head_seqs(bucket: Bucket, run: str) -> set[str]:
    return {f"s{s['seq']}" for s in bucket.head(run)["snapshots"]}


def test_wait_publishes_every_checkpoint_and_another_worker_resumes_it(
        s3_server, monkeypatch, tmp_path):  # noqa: F811
    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("ckpt")
    bucket = Bucket(s3_server, url)
    saver = InMemorySaver()
    config = thread()
    a = worker(tmp_path, "a", url)
    try:
        checkpointer = VfsdCheckpointer(saver, a)  # a remote mount: publish="wait"
        app = build(a).compile(checkpointer=checkpointer)
        assert app.invoke({"i": 0}, config)["seen"] == ORIGINAL
        run = a.stats()["run"]
        history = list(app.get_state_history(config))
        named = {s.metadata["vfsd"]["snapshot"] for s in history}
        assert all(s.metadata["vfsd"]["remote"] == url for s in history)
        # Every stored checkpoint names a snapshot the head lists: published.
        assert named <= head_seqs(bucket, run)
    finally:
        unmount_quietly(a)  # gives the run's lease back

    b = worker(tmp_path, "b", url)  # an empty run dir on "another machine"
    try:
        assert b.stats()["run"] != run
        app_b = build(b).compile(checkpointer=VfsdCheckpointer(saver, b))
        past = at_step(app_b, config, AFTER_V2)
        replay = app_b.invoke(None, past.config)
        # The first node on B saw the checkpoint's files, fetched from the bucket.
        assert replay["seen"][len(past.values["seen"])] == "2:a=v2;ls=a.txt,c.txt"
        assert replay["seen"][2:] == ORIGINAL[2:]
        assert b.stats()["run"] == run and b.remote()["state"] == "held"
        # B went on with the run: its new checkpoints are published too.
        latest = app_b.get_state(config)
        assert latest.metadata["vfsd"]["snapshot"] in head_seqs(bucket, run)
        assert observe(b) == "a=v3;ls=a.txt,b.txt"
    finally:
        unmount_quietly(b)


def test_a_used_run_dir_is_not_replaced(s3_server, monkeypatch, tmp_path):  # noqa: F811
    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("ckptused")
    saver = InMemorySaver()
    config = thread()
    a = worker(tmp_path, "a", url)
    try:
        build(a).compile(checkpointer=VfsdCheckpointer(saver, a)).invoke({"i": 0}, config)
    finally:
        unmount_quietly(a)
    c = worker(tmp_path, "c", url)
    try:
        (c.root / "mine.txt").write_text("other work")
        c.snapshot()
        app = build(c).compile(checkpointer=VfsdCheckpointer(saver, c))
        with pytest.raises(SnapshotUnavailable, match="already holds other files"):
            app.invoke(None, at_step(app, config, AFTER_V2).config)
        assert (c.root / "mine.txt").read_text() == "other work"  # nothing changed
    finally:
        unmount_quietly(c)


def test_behind_bounds_the_lag_and_flush_publishes_the_rest(
        s3_private_server, monkeypatch, tmp_path):  # noqa: F811
    """With publication stuck (the store frozen), at most `max_lag` stored
    checkpoints name unpublished snapshots: the next put waits, then fails
    without storing; once the store is back, flush() publishes them all.
    `wait` under the same fault stores nothing it cannot publish."""
    server = s3_private_server
    use_server(server, monkeypatch)
    url = server.unique_url("lag")
    bucket = Bucket(server, url)
    saver = InMemorySaver()
    # One run dir per thread; all mounted while the store answers.
    a, lagging, waiting = (worker(tmp_path, name, url) for name in ("a", "lag", "wait"))
    try:
        checkpointer = VfsdCheckpointer(saver, a, publish="behind", max_lag=2, sync_timeout=3)
        config = thread()
        app = build(a).compile(checkpointer=checkpointer)
        app.invoke({"i": 0}, config)  # the store answers: behind, then caught up
        checkpointer.flush()
        named = {s.metadata["vfsd"]["snapshot"] for s in app.get_state_history(config)}
        assert named <= head_seqs(bucket, a.stats()["run"])

        behind = VfsdCheckpointer(saver, lagging, publish="behind", max_lag=2, sync_timeout=3)
        strict = VfsdCheckpointer(saver, waiting, publish="wait", sync_timeout=2)
        stuck_config, strict_config = thread(), thread()
        server.pause()
        try:
            with pytest.raises(SnapshotNotPublished) as info:
                build(lagging).compile(checkpointer=behind).invoke({"i": 0}, stuck_config)
            assert "not published" in str(info.value)
            stored = {s.metadata["vfsd"]["snapshot"]
                      for s in saver.list(stuck_config)}
            published = {s["id"] for s in lagging.publish_status()["snapshots"]
                         if s["published"]}
            assert 1 <= len(stored - published) <= 2  # the bound held
            # publish="wait" under the same fault: nothing stored it cannot publish.
            with pytest.raises(SnapshotNotPublished):
                build(waiting).compile(checkpointer=strict).invoke({"i": 0}, strict_config)
            assert list(saver.list(strict_config)) == []
            # flush() under the fault: the checkpoints are stored, and it says so.
            with pytest.raises(SnapshotNotPublished) as info:
                behind.flush(timeout=1)
            assert "checkpoint is stored" in str(info.value), str(info.value)
            assert "not stored" not in str(info.value)
        finally:
            server.resume()
        behind.flush(timeout=120)
        assert stored <= head_seqs(bucket, lagging.stats()["run"])
        assert behind.sync_timeout == 3  # flush's timeout was for that call only
    finally:
        for m in (a, lagging, waiting):
            unmount_quietly(m)


@pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1",
                    reason="waits out a lease TTL (tests/test_remote_faults.py covers the "
                           "same wait with the CLI): VFSD_LONG=1")
def test_resume_waits_for_a_crashed_workers_lease(s3_server, monkeypatch, tmp_path):  # noqa: F811
    """The worker that held the thread is gone without releasing its lease: the
    new worker's resume waits for the lease to lapse, then runs."""
    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("ckptcrash")
    saver = InMemorySaver()
    config = thread()
    a = worker(tmp_path, "a", url)
    build(a).compile(checkpointer=VfsdCheckpointer(saver, a)).invoke({"i": 0}, config)
    pid = int((a.state_dir / "vfsd.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.02)
    subprocess.run(["fusermount3", "-u", "-z", str(a.root)], capture_output=True)
    b = mount_tool.mount(tmp_path / "b", remote=url, **MOUNT_OPTIONS,
                         **{**FAST, "remote_lease_wait": 20})
    try:
        app_b = build(b).compile(checkpointer=VfsdCheckpointer(saver, b))
        replay = app_b.invoke(None, at_step(app_b, config, AFTER_V2).config)
        assert replay["seen"][2] == "2:a=v2;ls=a.txt,c.txt"
        assert b.remote()["state"] == "held"
    finally:
        unmount_quietly(b)
