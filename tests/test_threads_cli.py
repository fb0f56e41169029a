"""`vfsd threads`, `vfsd status` and `vfsd fsck` on a Runs root and its shards.

Real Runs roots made by mount_tool (real shard daemons and mounts), threads
with hostile ids (ESC and OSC sequences, a bidi override, NUL, a lone
surrogate, 2,000 characters, the empty id, one that starts with '-'), one
thread checkpointed by a real LangGraph run; every command is run as a real
process, with the shards mounted and again unmounted (their stores read).
Forged records (one naming another id, a volume recording another thread)
are reported and never shown as the thread asked for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import VFSD, mounts_under, tree, vfsd_cli, wait_for

import mount_tool
from mount_tool.runs import ThreadRecord, thread_dir_name, write_record
from vfsd.rundir import pid_alive

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

HOSTILE = ["alice", "../bob", "\x1b]52;c;cHduZWQ=\x07\x1b[2Jx", "a\u202eb", "a\x00b", "\ud800",
           "x" * 2000, "", "-rf", " spaced out "]
#: what no terminal may receive from vfsd (ESC, BEL, NUL, CSI, the bidi override)
CONTROLS = "\x1b\x07\x00\x9b\u202e"


def cli_json(*args) -> dict:
    return json.loads(vfsd_cli(*args, "--json").stdout)


def one(root: Path, thread_id: str, *more: str, check: bool = True):
    """`vfsd threads ROOT ID`: the id on the command line where one can carry
    it, else as --id-json."""
    if "\x00" in thread_id or any(0xD800 <= ord(c) <= 0xDFFF for c in thread_id):
        return vfsd_cli("threads", root, "--id-json", json.dumps(thread_id), *more, check=check)
    return vfsd_cli("threads", root, *more, "--", thread_id, check=check)


def clean(text: str) -> bool:
    return not any(c in text for c in CONTROLS)


def make_root(root: Path, runs) -> dict[str, tuple[str, bytes]]:
    """Each hostile thread writes a file of its own and snapshots; what each holds."""
    written = {}
    for i, thread in enumerate(HOSTILE):
        with runs.use(thread) as m:
            data = f"thread {i}\n".encode() * (i + 1)
            m.write(f"f{i}.txt", data)
            if i % 2 == 0:
                m.snapshot()
            written[thread] = (f"f{i}.txt", data)
    return written


def check_listing(root: Path, runs_shards: dict, written: dict, served: bool) -> None:
    doc = cli_json("threads", root)
    assert doc["problems"] == []
    by_id = {t["thread_id"]: t for t in doc["threads"]}
    assert set(by_id) >= set(written)
    for thread, (name, data) in written.items():
        t = by_id[thread]
        record = json.loads((root / "threads" / thread_dir_name(thread) / "thread.json")
                            .read_text())
        assert t["name"] == thread_dir_name(thread) and t["state"] == "ok", t
        assert t["shard"] == record["shard"]
        assert t["files_at"] == str(root / "shards" / t["shard"] / "fs" / t["name"])
        assert t["files"] == 1 and t["bytes"] == len(data), t
        assert t["served"] is served and t["shard_running"] is served
        assert t["snapshots"] == (1 if HOSTILE.index(thread) % 2 == 0 else 0), t
        if t["snapshots"]:
            assert t["last_use_from"] == "snapshot" and t["last_use_ns"] == t["last_snapshot_ns"]
        if served:  # the path given is where the thread's files are
            assert tree(Path(t["files_at"])) == {name: data}
    text = vfsd_cli("threads", root)
    assert clean(text.stdout + text.stderr), repr(text.stdout)
    assert "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2Jx" in text.stdout
    assert '"a\\xe2\\x80\\xaeb"' in text.stdout and '""' in text.stdout
    assert "last use: the later of the thread's last checkpoint" in text.stdout
    for thread in written:
        found = one(root, thread)
        assert clean(found.stdout), repr(found.stdout)
        assert thread_dir_name(thread) in found.stdout
        shown = json.loads(one(root, thread, "--json").stdout)
        assert shown["thread_id"] == thread and shown["files"] == 1
        assert shown["served"] is served


def test_threads_and_status_of_a_root_mounted_and_not(tmp_path):
    pytest.importorskip("langgraph")
    from ckpt_graph import MOUNT_OPTIONS, build
    from langgraph.checkpoint.memory import InMemorySaver

    from mount_tool.checkpointer import VfsdCheckpointer

    root = tmp_path / "runs"
    with mount_tool.runs(root, shards=2, **MOUNT_OPTIONS) as runs:
        written = make_root(root, runs)
        # A thread a real graph run checkpointed: its last use is its last checkpoint.
        app = build(runs).compile(checkpointer=VfsdCheckpointer(InMemorySaver(), runs))
        app.invoke({"i": 0}, {"configurable": {"thread_id": "graph"}})
        check_listing(root, runs.shards(), written, served=True)
        graph = json.loads(one(root, "graph", "--json").stdout)
        position = root / "threads" / thread_dir_name("graph") / ".vfsd" / "langgraph.position"
        assert graph["last_checkpoint_ns"] == os.stat(position).st_mtime_ns
        assert graph["last_use_ns"] == max(graph["last_checkpoint_ns"],
                                           graph["last_snapshot_ns"])
        assert graph["snapshots"] >= 4 and graph["step"] > 0
        assert graph["unbound_checkpoints"] == 0
        # A checkpoint its checkpointer could not bind is counted per thread.
        from ctl import connect
        with connect(root / "shards" / graph["shard"]) as c:
            c.call("note_unbound", volume=graph["name"], checkpoint="1ef-x")
        assert json.loads(one(root, "graph", "--json").stdout)["unbound_checkpoints"] == 1
        assert re.search(r"^unbound checkpoints +1 \(their checkpointer", one(root, "graph").stdout,
                         re.M)

        status = cli_json("status", root)
        assert status["kind"] == "runs_root" and status["threads"] == len(HOSTILE) + 1
        assert status["running_shards"] == 2 and status["problems"] == []
        assert status["threads_by_state"] == {"ok": len(HOSTILE) + 1}
        vfsd_cli("status", root, "--check")
        text = vfsd_cli("status", root).stdout
        assert "shard 0" in text and "running (pid" in text and clean(text)
        for shard in runs.shards():
            run_dir = root / "shards" / shard["name"]
            doc = cli_json("status", run_dir)
            assert doc["kind"] == "shard" and doc["pid"] == shard["pid"], doc
            assert {v["volume"] for v in doc["volumes"]} == set(os.listdir(run_dir / "fs"))
            assert all(v["served"] for v in doc["volumes"])
            vfsd_cli("status", run_dir, "--check")
            assert clean(vfsd_cli("status", run_dir).stdout)
            # fsck needs the shard unmounted: it says so, and touches nothing.
            refused = vfsd_cli("fsck", run_dir, check=False)
            assert refused.returncode == 1
            assert f"served by a shard daemon (pid {shard['pid']})" in refused.stderr
        volumes_mounted = {s["name"]: cli_json("status", root / "shards" / s["name"])["volumes"]
                           for s in runs.shards()}
    assert mounts_under(root) == []

    check_listing(root, {}, written, served=False)
    # A thread's directory is no run dir: status says where to look instead.
    thread_dir = root / "threads" / thread_dir_name("alice")
    told = vfsd_cli("status", thread_dir, check=False)
    assert told.returncode == 1 and f"`vfsd threads {root}`" in told.stderr
    status = cli_json("status", root)
    assert status["running_shards"] == 0 and status["threads"] == len(HOSTILE) + 1
    down = vfsd_cli("status", root, "--check", check=False)
    assert down.returncode == 1 and "no shard" in down.stderr
    for name, mounted in volumes_mounted.items():
        run_dir = root / "shards" / name
        doc = cli_json("status", run_dir)
        assert doc["daemon"]["state"] == "unmounted"
        unserved = [{**v, "served": False} for v in mounted]
        assert doc["volumes"] == unserved
        assert vfsd_cli("status", run_dir, "--check", check=False).returncode == 1
        # Every volume of the shard's store is checked (no volume 'default' wanted).
        report = json.loads(vfsd_cli("fsck", run_dir, "--json").stdout)
        assert report["clean"] and report["stats"]["volumes"] == len(mounted)


def test_a_record_or_volume_of_another_id_is_never_shown_as_this_thread(tmp_path):
    root = tmp_path / "runs"
    with mount_tool.runs(root, shards=1) as runs:
        for thread in ("alice", "carol"):
            with runs.use(thread) as m:
                m.write("mine.txt", f"{thread}'s\n")
        # alice's record edited to name another id.
        alice = root / "threads" / thread_dir_name("alice")
        write_record(alice, ThreadRecord("mallory", "0"))
        # eve's name holds a volume made for another thread.
        shard = runs.shard("0")
        shard.call("volume_create", volume=thread_dir_name("eve"), thread="not eve")
        write_record(root / "threads" / thread_dir_name("eve"), ThreadRecord("eve", "0"))
        # a volume no record names, and a stray file among the threads.
        shard.call("volume_create", volume="t" + "0" * 32, thread="ghost\x1b[2J")
        (root / "threads" / "notes\x1b[2J.txt").write_text("not a thread")

        for mounted in (True, False):
            asked = vfsd_cli("threads", root, "alice", check=False)
            assert asked.returncode == 1 and asked.stdout == ""
            assert "records another thread" in asked.stderr and '"mallory"' in asked.stderr
            nobody = vfsd_cli("threads", root, "mallory", check=False)
            assert nobody.returncode == 1 and "has no thread" in nobody.stderr
            eve = vfsd_cli("threads", root, "eve", "--json", check=False)
            assert eve.returncode == 1
            shown = json.loads(eve.stdout)
            assert shown["state"] == "broken" and shown["files"] is None
            assert any("records thread" in p and "not\\x20eve" in p for p in shown["problems"])
            carol = json.loads(vfsd_cli("threads", root, "carol", "--json").stdout)
            assert carol["state"] == "ok" and carol["served"] is mounted

            listing = vfsd_cli("threads", root)
            assert clean(listing.stdout), repr(listing.stdout)
            problems = [line for line in listing.stdout.splitlines()
                        if line.startswith("problem: ")]
            assert len(problems) == 4, problems
            assert any("not counted as that thread" in p for p in problems)
            assert any("belongs to no thread record" in p and "ghost\\x1b[2J" in p
                       for p in problems)
            assert any("no thread directory" in p for p in problems)
            checked = vfsd_cli("status", root, "--check", check=False)
            assert checked.returncode == 5 and "problem" in checked.stderr
            assert clean(checked.stderr)
            if mounted:
                runs.close()


def test_a_dead_shard_is_said_so_and_its_threads_still_listed(tmp_path):
    root = tmp_path / "runs"
    with mount_tool.runs(root, shards=1) as runs:
        with runs.use("t1") as m:
            m.write("a.txt", "one")
        pid = runs.shards()[0]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), "the killed shard daemon to be gone")
        status = vfsd_cli("status", root, check=False)
        assert status.returncode == 4 and "is dead" in status.stderr
        assert "vfsd umount" in status.stderr
        listed = json.loads(vfsd_cli("threads", root, "--json").stdout)
        t1 = next(t for t in listed["threads"] if t["thread_id"] == "t1")
        assert t1["files"] == 1 and t1["served"] is False
        assert any("is dead" in p for p in listed["problems"])
        shard = vfsd_cli("status", root / "shards" / "0", check=False)
        assert shard.returncode == 4 and "DEAD" in shard.stdout
    assert mounts_under(root) == []


def test_a_root_of_the_earlier_layout(tmp_path):
    root = tmp_path / "runs"
    run_dir = root / "threads" / thread_dir_name("old one")
    run_dir.mkdir(parents=True)
    (run_dir / "thread.json").write_text(json.dumps({"version": 1, "thread_id": "old one"}))
    m = mount_tool.mount(run_dir, store=root / "store")
    try:
        m.write("kept.txt", "from the earlier layout")
        m.snapshot()
    finally:
        m.unmount()
    t = json.loads(vfsd_cli("threads", root, "old one", "--json").stdout)
    assert (t["state"], t["shard"], t["files"], t["snapshots"]) == ("earlier", "legacy", 1, 1)
    assert t["files_at"] is None and t["served"] is False
    status = cli_json("status", root)
    assert [s["name"] for s in status["shards"]] == ["legacy"]
    assert status["threads_by_state"] == {"earlier": 1}

    with mount_tool.runs(root, shards=1) as runs:
        with runs.use("old one") as mounted:
            assert (mounted.root / "kept.txt").read_text() == "from the earlier layout"
        t = json.loads(vfsd_cli("threads", root, "old one", "--json").stdout)
        assert (t["state"], t["shard"], t["files"], t["served"]) == ("ok", "legacy", 1, True)
        assert t["files_at"] == str(root / "shards" / "legacy" / "fs" / t["name"])
        legacy = cli_json("status", root / "shards" / "legacy")
        assert legacy["store"] == str(root / "store") and legacy["served"] == 1
    report = json.loads(vfsd_cli("fsck", root / "shards" / "legacy", "--json").stdout)
    assert report["clean"] and report["stats"]["volumes"] == 1


def test_bad_input_is_refused_with_a_reason(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    refused = vfsd_cli("threads", plain, check=False)
    assert refused.returncode == 2 and "no Runs root" in refused.stderr
    (plain / "threads").mkdir()
    for args in (["--id-json", "12"], ["--id-json", "{"], ["x", "--id-json", '"x"']):
        bad = vfsd_cli("threads", plain, *args, check=False)
        assert bad.returncode == 2, (args, bad.stderr)
    huge = subprocess.run([*VFSD, "threads", str(plain), "x" * (64 * 1024 + 1)],
                          capture_output=True, text=True, timeout=60)
    assert huge.returncode == 1 and "at most" in huge.stderr
    assert vfsd_cli("threads", plain).stdout.startswith("THREAD")


def test_a_shard_outside_a_runs_root_mounted_and_not(tmp_path):
    """`vfsd status` and `vfsd fsck` on a shard's run dir: they failed ('stats'
    works on one volume; no volume 'default'), they now describe and check
    every volume."""
    from ctl import connect

    run = tmp_path / "lone"
    vfsd_cli("mount", "--shard", run)
    try:
        with connect(run) as c:
            for name, thread in (("v1", "one"), ("v2", None)):
                c.call("volume_create", volume=name, **({"thread": thread} if thread else {}))
        (run / "fs" / "v1" / "a.txt").write_text("a")
        doc = cli_json("status", run)
        assert (doc["kind"], doc["root"], doc["volume_count"], doc["served"]) == \
            ("shard", None, 2, 1)
        assert [(v["volume"], v["thread"], v["files"]) for v in doc["volumes"]] == \
            [("v1", "one", 1), ("v2", None, 0)]
        vfsd_cli("status", run, "--check")
    finally:
        vfsd_cli("umount", run)
    doc = cli_json("status", run)
    assert doc["daemon"]["state"] == "unmounted" and doc["volume_count"] == 2
    assert "v1" in vfsd_cli("status", run).stdout
    report = json.loads(vfsd_cli("fsck", run, "--json").stdout)
    assert report["clean"] and report["stats"]["volumes"] == 2
