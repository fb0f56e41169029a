"""Any replica runs any thread: two shard daemons, two stores, one bucket prefix.

Real `vfsd mount --shard --remote` daemons against a real SeaweedFS, driven
through the control socket as a checkpointer drives them (`remote_begin`,
files written in the mount, `snapshot`, `remote_end`), with the bucket looked
at behind vfsd's back. Every run must see exactly the files of the run before
it, wherever that ran.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import wait_for
from remote_run import Bucket, use_server
from replica_helpers import Replica, tkey
from s3server import s3_server  # noqa: F401 - fixture

pytestmark = pytest.mark.fuse


@pytest.fixture(scope="module")
def pair(s3_server, tmp_path_factory):  # noqa: F811
    """Two replicas on one bucket prefix, for the module."""
    mp = pytest.MonkeyPatch()
    use_server(s3_server, mp)
    url = s3_server.unique_url("replicas")
    root = tmp_path_factory.mktemp("replicas")
    a = Replica(root / "a", url)
    b = Replica(root / "b", url)
    try:
        a.start()
        b.start()
        yield a, b, Bucket(s3_server, url)
    finally:
        for r in (a, b):
            r.stop()
        mp.undo()
    for r in (a, b):
        assert not r.log_errors(), "\n".join(r.log_errors()[:20])


def write(replica: Replica, thread: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = replica.path(thread, rel)
        if text is None:
            p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def expect(files: dict[str, str]) -> dict:
    """What `tree` shows for these files (their directories included)."""
    out = {}
    for rel, text in files.items():
        parts = rel.split("/")
        for i in range(1, len(parts)):
            out["/".join(parts[:i]) + "/"] = "dir"
        out[rel] = text.encode()
    return out


def test_a_thread_alternates_replicas_with_exact_files(pair):
    a, b, bucket = pair
    t = "alternating"
    want: dict[str, str] = {}
    seen = []
    for i in range(6):
        r = (a, b)[i % 2]
        got = r.begin(t)
        assert r.files(t) == expect(want), f"run {i} on {'ab'[i % 2]}"
        assert got["snapshots"] == seen
        change = {f"notes/run{i}.md": f"run {i}\n" * (i + 1), "shared.txt": f"last: {i}\n"}
        if i >= 2:
            change[f"notes/run{i - 2}.md"] = None  # a file of the run before last goes
        write(r, t, change)
        for rel, text in change.items():
            if text is None:
                want.pop(rel)
            else:
                want[rel] = text
        seen.append(r.snapshot(t))
        end = r.end(t)
        assert end["ended"] and end["released"] and end["published"] == seen[-1]
    # Both replicas now hold the same history; files outside a run are read-only.
    b.begin(t)
    assert b.snapshots(t) == seen and b.files(t) == expect(want)
    b.end(t)
    with pytest.raises(OSError) as exc:
        b.path(t, "late.txt").write_text("no run")
    assert exc.value.errno == errno.EROFS
    err = b.error("snapshot", volume=tkey(t))
    assert err["code"] == "read_only" and "remote_begin" in err["message"]
    head = bucket.head(got["run"])
    assert [f"s{s['seq']}" for s in head["snapshots"]] == seen
    assert head["thread"] == tkey(t)


def test_time_travel_to_a_snapshot_made_on_the_other_replica(pair):
    a, b, _ = pair
    t = "time-travel"
    a.begin(t)
    write(a, t, {"plan.md": "v1\n"})
    s1 = a.snapshot(t)
    write(a, t, {"plan.md": "v2\n", "extra.bin": "x" * 300_000})
    s2 = a.snapshot(t)
    a.end(t)
    got = b.begin(t)
    assert got["imported"] == [s1, s2] and got["restored"] == s2
    assert b.files(t) == expect({"plan.md": "v2\n", "extra.bin": "x" * 300_000})
    # The checkpointer restores the checkpoint the run starts from: one made on A.
    b.call("restore", volume=tkey(t), snapshot=s1)
    assert b.files(t) == expect({"plan.md": "v1\n"})
    write(b, t, {"plan.md": "v1 then b\n"})
    s3 = b.snapshot(t)
    b.end(t)
    # Back on A: its history gains B's snapshot, and every one is exact.
    got = a.begin(t)
    assert got["imported"] == [s3] and a.snapshots(t) == [s1, s2, s3]
    assert a.files(t) == expect({"plan.md": "v1 then b\n"})
    for snap, files in ((s1, {"plan.md": "v1\n"}),
                        (s2, {"plan.md": "v2\n", "extra.bin": "x" * 300_000})):
        a.call("restore", volume=tkey(t), snapshot=snap)
        assert a.files(t) == expect(files)
    a.end(t)


def test_a_second_begin_waits_then_fails_clearly_or_gets_the_thread(pair):
    a, b, _ = pair
    t = "simultaneous"
    a.begin(t)
    write(a, t, {"a.txt": "a's\n"})
    err = b.error("remote_begin", volume=tkey(t), thread=t, wait=1)
    assert err["code"] == "lease_held"
    assert f"pid {a.pid()}" in err["message"] and "lapses" in err["message"]
    # On the same replica a second run waits too, and is told who holds it.
    err = a.error("remote_begin", volume=tkey(t), thread=t, wait=0.5)
    assert err["code"] == "lease_held" and "this replica" in err["message"]
    got: dict = {}

    def begin_on_b() -> None:
        got.update(b.begin(t, wait=60))

    waiter = threading.Thread(target=begin_on_b)
    waiter.start()
    time.sleep(1.0)
    assert not got, "B got the thread while A held it"
    s1 = a.snapshot(t)
    a.end(t)
    waiter.join(60)
    assert got.get("latest") == s1
    assert b.files(t) == expect({"a.txt": "a's\n"})
    write(b, t, {"b.txt": "b's\n"})
    b.snapshot(t)
    b.end(t)
    a.begin(t)
    assert a.files(t) == expect({"a.txt": "a's\n", "b.txt": "b's\n"})
    a.end(t)


def test_a_retried_begin_with_the_same_token_is_the_same_run(pair):
    a, _, _ = pair
    t = "retried"
    first = a.begin(t, token="run-1")
    again = a.begin(t, token="run-1", wait=0)
    assert again["again"] and again["generation"] == first["generation"]
    err = a.error("remote_end", volume=tkey(t), token="run-2")
    assert err["code"] == "lease_held"
    assert a.end(t, token="run-1")["ended"]
    assert not a.end(t)["ended"]  # idempotent


def test_delete_on_one_replica_then_the_id_starts_empty_on_the_other(pair):
    a, b, bucket = pair
    t = "deleted"
    a.begin(t)
    write(a, t, {"secret.md": "old thread\n"})
    a.snapshot(t)
    a.end(t)
    run = b.begin(t)["run"]
    assert b.files(t) == expect({"secret.md": "old thread\n"})
    b.end(t)
    gone = a.call("remote_delete", volume=tkey(t), thread=t)
    assert gone["deleted"] and gone["run"] == run and gone["dropped"]
    assert not bucket.keys(f"runs/{run}/")  # its objects went (GC finishes what is left)
    record = json.loads(bucket.get(f"threads/{tkey(t)}"))
    assert record["state"] == "deleted" and run in record["old_runs"]
    # B still has the old files cached; the id used again starts empty there.
    assert b.files(t) == expect({"secret.md": "old thread\n"})
    assert b.begin(t.upper())  # another thread: the prune leaves it alone
    b.end(t.upper())
    # A replica can drop its copies of deleted threads before their next run.
    pruned = b.call("remote_prune")
    assert tkey(t) in pruned["dropped"] and tkey(t.upper()) not in pruned["dropped"]
    got = b.begin(t)
    assert got["run"] != run and got["snapshots"] == []
    assert b.files(t) == {}
    write(b, t, {"new.md": "new thread\n"})
    b.snapshot(t)
    b.end(t)
    got = a.begin(t)
    assert a.files(t) == expect({"new.md": "new thread\n"})
    a.end(t)


def test_copy_on_one_replica_used_on_the_other_leaves_the_source_alone(pair):
    a, b, bucket = pair
    src, dst = "copy-source", "copy-target"
    run = a.begin(src)["run"]
    write(a, src, {"doc.md": "one\n"})
    s1 = a.snapshot(src)
    write(a, src, {"doc.md": "two\n", "big.bin": "y" * 600_000})
    s2 = a.snapshot(src)
    a.end(src)
    lease_before = bucket.get(f"runs/{run}/lease")
    head_before = bucket.get(f"runs/{run}/head")
    chunks_before = bucket.chunks()
    done = b.call("remote_copy", volume=tkey(src), thread=src, target=tkey(dst),
                  target_thread=dst)
    assert done["snapshots"] == [s1, s2] and done["copied_from"] == {"run": run, "upto": 2}
    assert bucket.get(f"runs/{run}/lease") == lease_before
    assert bucket.get(f"runs/{run}/head") == head_before
    assert bucket.chunks() == chunks_before  # content shared: no chunk copied
    got = a.begin(dst)
    assert got["run"] == done["run"] and got["snapshots"] == [s1, s2]
    assert a.files(dst) == expect({"doc.md": "two\n", "big.bin": "y" * 600_000})
    a.call("restore", volume=tkey(dst), snapshot=s1)
    assert a.files(dst) == expect({"doc.md": "one\n"})
    write(a, dst, {"doc.md": "copy's own\n"})
    a.snapshot(dst)
    a.end(dst)
    assert bucket.get(f"runs/{run}/head") == head_before
    b.begin(src)
    assert b.files(src) == expect({"doc.md": "two\n", "big.bin": "y" * 600_000})
    assert b.snapshots(src) == [s1, s2]
    b.end(src)
    err = b.error("remote_copy", volume=tkey(src), thread=src, target=tkey(dst),
                  target_thread=dst)
    assert err["code"] == "exists"


def test_a_run_whose_process_exits_without_ending_frees_the_thread(pair):
    a, b, _ = pair
    t = "orphaned"
    script = textwrap.dedent(f"""
        import json, socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.connect({str(a.dir / '.vfsd' / 'vfsd.sock')!r})
        s.sendall(json.dumps({{"op": "remote_begin", "volume": {tkey(t)!r},
                               "thread": {t!r}, "wait": 30}}).encode() + b"\\n")
        reply = json.loads(s.makefile().readline())
        assert reply["ok"], reply
        open({str(a.path(t, 'left.txt'))!r}, "w").write("by a run that died\\n")
        s.sendall(json.dumps({{"op": "snapshot", "volume": {tkey(t)!r}}}).encode() + b"\\n")
        assert json.loads(s.makefile().readline())["ok"]
        # exits without remote_end
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    # A ends the run itself, publishing what it had snapshotted, and releases
    # the lease (it does not leave it to lapse): B then takes it without waiting.
    # (The pair serves the whole module: only this thread's events count.)
    wait_for(lambda: any(e.get("volume") == tkey(t) and e.get("released")
                         for e in a.log_events("run_ended")),
             "A to end the orphaned run and release its lease")
    assert any(e.get("volume") == tkey(t) for e in a.log_events("run_owner_gone"))
    b.begin(t, wait=0)
    assert b.files(t) == expect({"left.txt": "by a run that died\n"})
    b.end(t)


def test_outside_a_run_a_volume_is_read_only(pair):
    a, _, _ = pair
    t = "read-only"
    a.begin(t)
    write(a, t, {"f": "x"})
    a.snapshot(t)
    a.end(t)
    assert a.path(t, "f").read_text() == "x"  # reads go on
    for attempt in (lambda: a.path(t, "g").write_text("y"),
                    lambda: a.path(t, "f").unlink(),
                    lambda: a.path(t, "d").mkdir()):
        with pytest.raises(OSError) as exc:
            attempt()
        assert exc.value.errno == errno.EROFS
    for op, args in (("snapshot", {}), ("restore", {"snapshot": "s1"}),
                     ("set_step", {"step": 9})):
        assert a.error(op, volume=tkey(t), **args)["code"] == "read_only"
    assert a.call("sync", volume=tkey(t))["published"] == "s1"
    err = a.error("volume_copy", volume=tkey(t), target="tcopy")
    assert "remote_copy" in err["message"]


def test_sigkill_mid_run_the_other_replica_continues_from_what_was_published(
        s3_server, tmp_path, monkeypatch):  # noqa: F811
    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("kill")
    a = Replica(tmp_path / "a", url).start()
    b = Replica(tmp_path / "b", url).start()
    try:
        t = "killed"
        a.begin(t)
        write(a, t, {"kept.md": "published\n"})
        s1 = a.snapshot(t)
        a.call("sync", volume=tkey(t), snapshot=s1)
        with s3_server.paused_for_a_while():
            # A snapshot the bucket never gets (a checkpoint may name it already),
            # and a file never snapshotted: the tail a crash loses.
            write(a, t, {"lost.md": "never published\n"})
            lost = a.snapshot(t)
            write(a, t, {"lost2.md": "never snapshotted\n"})
            a.kill()
        err = b.error("remote_begin", volume=tkey(t), thread=t, wait=0)
        assert err["code"] == "lease_held"
        got = b.begin(t, wait=30)  # after the lapse: 5 s TTL + 1 s (held just above)
        assert got["latest"] == s1 and got["generation"] == 2
        assert b.files(t) == expect({"kept.md": "published\n"})
        write(b, t, {"b.md": "after the crash\n"})
        s2 = b.snapshot(t)
        # The lost snapshot's id is never given to other files.
        assert int(s2[1:]) > int(lost[1:])
        b.end(t)
        # A, restarted, drops what it never published and takes B's work.
        a.start()
        got = a.begin(t)
        assert got["dropped"] == [lost] and got["imported"] == [s2] and got["restored"] == s2
        assert a.files(t) == expect({"kept.md": "published\n", "b.md": "after the crash\n"})
        assert a.snapshots(t) == [s1, s2]
        assert a.error("restore", volume=tkey(t), snapshot=lost)["code"] == "not_found"
        a.end(t)
    finally:
        a.stop()
        b.stop()
    assert not b.log_errors(), b.log_errors()


def test_two_begins_at_once_one_wins_and_the_files_never_mix(pair):
    a, b, _ = pair
    t = "race"
    results: dict[str, dict] = {}

    def begin(name: str, r: Replica) -> None:
        results[name] = r.request("remote_begin", volume=tkey(t), thread=t, wait=1.5)

    threads = [threading.Thread(target=begin, args=(n, r)) for n, r in (("a", a), ("b", b))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    won = [n for n, reply in results.items() if reply["ok"]]
    lost = [n for n, reply in results.items() if not reply["ok"]]
    assert len(won) == 1 and len(lost) == 1, results
    assert results[lost[0]]["error"]["code"] == "lease_held"
    winner, loser = (a, b) if won == ["a"] else (b, a)
    write(winner, t, {"w.txt": "winner's\n"})
    winner.snapshot(t)
    winner.end(t)
    loser.begin(t, wait=5)
    assert loser.files(t) == expect({"w.txt": "winner's\n"})
    loser.end(t)


def test_a_replica_that_lost_its_lease_never_overwrites_the_new_holder(
        s3_server, tmp_path, monkeypatch):  # noqa: F811
    from freeze import freeze

    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("fenced")
    a = Replica(tmp_path / "a", url).start()
    b = Replica(tmp_path / "b", url).start()
    try:
        t = "fenced"
        a.begin(t)
        write(a, t, {"a.md": "a's\n"})
        s1 = a.snapshot(t)
        a.call("sync", volume=tkey(t), snapshot=s1)
        # A pauses (a long GC pause, a stopped VM) past its lease; B takes the thread.
        freeze(a.pid())
        try:
            got = b.begin(t, wait=30)
            assert got["latest"] == s1
            write(b, t, {"b.md": "b's\n"})
            s2 = b.snapshot(t)
            b.end(t)
        finally:
            os.kill(a.pid(), signal.SIGCONT)
        # A wakes up: it finds the run gone and writes nothing more to it.
        deadline = time.monotonic() + 30
        while a.call("remote_runs")["runs"][0]["state"] != "lost":
            assert time.monotonic() < deadline, a.call("remote_runs")
            time.sleep(0.2)
        with pytest.raises(OSError) as exc:
            a.path(t, "late.md").write_text("after the pause")
        assert exc.value.errno == errno.EROFS
        assert a.error("snapshot", volume=tkey(t))["code"] == "read_only"
        assert a.error("remote_end", volume=tkey(t))["code"] == "not_publishable"
        got = a.begin(t)
        assert got["imported"] == [s2]
        assert a.files(t) == expect({"a.md": "a's\n", "b.md": "b's\n"})
        a.end(t)
    finally:
        a.stop()
        b.stop()


def test_a_stopped_replica_gives_its_threads_back_at_once(  # noqa: F811
        s3_server, tmp_path, monkeypatch):  # noqa: F811
    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("stopped")
    a = Replica(tmp_path / "a", url).start()
    b = Replica(tmp_path / "b", url).start()
    try:
        t = "stopped"
        a.begin(t)
        write(a, t, {"x.md": "x\n"})
        a.call("sync", volume=tkey(t), snapshot=a.snapshot(t))
        a.stop()
        got = b.begin(t, wait=0)  # no lapse to wait for: A released its lease
        assert b.files(t) == expect({"x.md": "x\n"}) and got["generation"] == 2
        b.end(t)
    finally:
        a.stop()
        b.stop()


def test_snapshots_deleted_in_a_run_go_on_every_replica(pair):
    """A prune (`aprune`, `adelete_for_runs`) inside a run: the run's end makes the
    head follow, and every replica drops those snapshots at its next run."""
    a, b, _ = pair
    t = "pruned"
    a.begin(t)
    ids = []
    for i in range(3):
        write(a, t, {"f.md": f"v{i}\n"})
        ids.append(a.snapshot(t))
    a.end(t)
    b.begin(t)
    assert b.snapshots(t) == ids
    b.call("snapshot_delete", volume=tkey(t), snapshot=ids[0])
    assert b.end(t)["unlisted"] == [ids[0]]
    got = a.begin(t)
    assert got["retired"] == [ids[0]] and a.snapshots(t) == ids[1:]
    assert a.error("restore", volume=tkey(t), snapshot=ids[0])["code"] == "not_found"
    a.call("restore", volume=tkey(t), snapshot=ids[1])
    assert a.files(t) == expect({"f.md": "v1\n"})
    a.end(t)
    assert b.begin(t)["imported"] == [] and b.snapshots(t) == ids[1:]
    b.end(t)
