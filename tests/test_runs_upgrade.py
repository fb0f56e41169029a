"""A Runs root of the earlier layout, served by this version as it is.

The earlier Runs kept a daemon and a mount per thread: the store every thread
shared in ROOT/store (one volume per thread, named by the absolute path of
its run dir), and per thread a run dir ROOT/threads/t<hex>/ with thread.json
(version 1), fs/ (its mountpoint) and .vfsd/ (store.json, the daemon's log,
VfsdCheckpointer's records). The test makes such a root the way that Runs did
(`vfsd mount RUN --store ROOT/store` for each thread, a thread.json written
first, the checkpointer's records written by VfsdCheckpointer on that mount;
a copied thread made by the run dir `copy` op), runs real graphs with real
checkpoints on it, unmounts everything, then opens it with this version's
Runs: every thread's files, snapshots and checkpoints' files are there, a
replay from an old checkpoint brings its files back, and new threads go to
the ordinary shards.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

from ckpt_graph import AFTER_V2, MOUNT_OPTIONS, at_step, build, observe  # noqa: E402
from conftest import daemons_under, mounts_under, tree  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.langgraph.checkpointer import VfsdCheckpointer, _copy_args, _writes_by_task  # noqa: E402
from mount_tool.runs import thread_dir_name  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

ORIGINAL = ["0:a=;ls=", "1:a=v1;ls=a.txt,c.txt", "2:a=v2;ls=a.txt,c.txt", "3:a=v3;ls=a.txt"]
#: the earlier Runs' daemon options (its defaults, and the graph's)
EARLIER_OPTIONS = {"snapshot_keep_last": 0, "snapshot_keep_steps": 0,
                   "snapshot_keep_bytes": 1 << 30, **MOUNT_OPTIONS}


def config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def earlier_run_dir(root: Path, thread: str) -> Path:
    """A thread's run dir as the earlier Runs made it (its record first)."""
    run_dir = root / "threads" / thread_dir_name(thread)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / "thread.json", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"version": 1, "thread_id": thread}))
    return run_dir


def make_earlier_root(root: Path, inner: InMemorySaver, threads: list[str]) -> dict:
    """Threads run on the earlier layout, then a copy of the first: what each
    thread's files and snapshots were."""
    seen = {}
    for thread in threads:
        run_dir = earlier_run_dir(root, thread)
        m = mount_tool.mount(run_dir, store=root / "store", **EARLIER_OPTIONS)
        try:
            app = build(m).compile(checkpointer=VfsdCheckpointer(inner, m))
            assert app.invoke({"i": 0}, config(thread))["seen"] == ORIGINAL
            seen[thread] = (tree(m.root), [s["id"] for s in m.snapshots()],
                            m.snapshot_state()["run"])
        finally:
            m.unmount()
    # A copy, as the earlier Runs.copy and copy_thread made it.
    source, copy = threads[0], "the copy"
    target = root / "threads" / thread_dir_name(copy)
    m = mount_tool.mount(root / "threads" / thread_dir_name(source), store=root / "store",
                         **EARLIER_OPTIONS)
    try:
        m.client.call("copy", run_dir=str(target))  # then its record, as that Runs did
    finally:
        m.unmount()
    earlier_run_dir(root, copy)
    record = json.loads((m.state_dir / "langgraph.json").read_text())
    (target / ".vfsd" / "langgraph.json").write_text(json.dumps({**record, "thread": copy}))
    for tup in sorted(inner.list(config(source)), key=lambda t: t.checkpoint["id"]):
        stored = inner.put(*_copy_args(tup, copy))
        for task_id, writes in _writes_by_task(tup):
            inner.put_writes(stored, writes, task_id)
    m = mount_tool.mount(target, store=root / "store", **EARLIER_OPTIONS)
    try:
        seen[copy] = (tree(m.root), [s["id"] for s in m.snapshots()],
                      m.snapshot_state()["run"])
    finally:
        m.unmount()
    return seen


def test_a_root_of_the_earlier_layout_is_served_as_it_is(tmp_path):
    root = tmp_path / "runs"
    inner = InMemorySaver()
    threads = ["alice", "../bob", "x" * 300]
    seen = make_earlier_root(root, inner, threads)
    assert sorted(os.listdir(root)) == ["store", "threads"]
    assert mounts_under(root) == [] and daemons_under(root) == []

    # While a daemon of the earlier layout still serves one of its run dirs,
    # the store is not opened under it.
    busy = root / "threads" / thread_dir_name("alice")
    held = mount_tool.mount(busy, store=root / "store")
    try:
        with mount_tool.runs(root, **MOUNT_OPTIONS) as runs, \
                pytest.raises(mount_tool.MountToolError, match="still mounted"):
            runs.get("alice")
    finally:
        held.unmount()

    with mount_tool.runs(root, shards=2, **MOUNT_OPTIONS) as runs:
        saver = VfsdCheckpointer(inner, runs)
        app = build(runs).compile(checkpointer=saver)
        assert sorted(runs.threads()) == sorted([*threads, "the copy"])
        for thread, (files, snapshots, run) in seen.items():
            with runs.use(thread) as m:
                assert m.shard.name == "legacy"
                assert tree(m.root) == files, thread
                assert [s["id"] for s in m.snapshots()] == snapshots, thread
                assert m.snapshot_state()["run"] == run, thread
            run_dir = runs.run_dir(thread)
            record = json.loads((run_dir / "thread.json").read_text())
            assert record == {"version": 2, "thread_id": thread, "shard": "legacy"}
            assert os.readlink(run_dir / "fs") == \
                f"../../shards/legacy/fs/{thread_dir_name(thread)}"
            assert tree(run_dir / "fs") == files
            assert (run_dir / ".vfsd" / "store.json.adopted").exists()
        # The checkpoints' files: a replay from the past restores them, in each thread.
        for thread in seen:
            assert observe(runs.get(thread)) == "a=v3;ls=a.txt,b.txt"
            past = at_step(app, config(thread), AFTER_V2)
            assert app.invoke(None, past.config)["seen"][2] == "2:a=v2;ls=a.txt,c.txt", thread
            assert observe(runs.get(thread)) == "a=v3;ls=a.txt,b.txt"
        # The copy keeps its own files; new threads go to the ordinary shards;
        # copies of earlier threads stay on the legacy shard; deletes work.
        saver.copy_thread("alice", "alice again")
        assert runs.get("alice again").shard.name == "legacy"
        assert app.invoke({"i": 0}, config("new"))["seen"] == ORIGINAL
        assert runs.get("new").shard.name in ("0", "1")
        saver.delete_thread("../bob")
        assert not runs.run_dir("../bob").exists() and "../bob" not in runs.threads()
        assert observe(runs.get("alice")) == "a=v3;ls=a.txt,b.txt"
        legacy = runs.root / "shards" / "legacy"
        assert subprocess.run(["ls", str(legacy / "fs")], capture_output=True,
                              text=True).stdout.split() == sorted(
            thread_dir_name(t) for t in ("alice", "x" * 300, "the copy", "alice again"))
    assert mounts_under(root) == [] and daemons_under(root) == []

    # Opened again, nothing is adopted twice.
    with mount_tool.runs(root, shards=2, **MOUNT_OPTIONS) as runs:
        for thread in ("alice", "x" * 300, "the copy"):
            assert observe(runs.get(thread)) == "a=v3;ls=a.txt,b.txt"
