"""Any replica runs any LangGraph thread: two agent processes, one PostgreSQL, one bucket.

Two replicas of one deployment, as separate processes on one machine (as
langgraph-api's multi-process dispatch would run them): each serves the
same compiled Deep Agents graph (tests/history_agent.py's scripted model) on
a Runs root of its own, `remote=` one bucket prefix (a real SeaweedFS,
tests/s3server.py), with one AsyncPostgresSaver (a real PostgreSQL,
tests/pgserver.py). The threads' truth is the saver and the bucket; each
root is a cache. Every run must see exactly the files the model of its
tool calls says (tests/history_check.py), wherever the runs before it ran:

- one thread alternating replicas, 3 runs each way, then runs from past
  checkpoints made on the other replica (time travel);
- a step whose finished tool call is kept while another waits at an
  interrupt, resumed on the other replica;
- the same thread started on both at once: one waits for the other, the
  history stays one line;
- 8 threads spread over both at once, alternating;
- update_state (a fork of a past checkpoint) on one, its run on the other;
- delete on one, then the same thread id on the other starts empty;
- copy on one, the copy's runs on the other see its files and history, the
  source untouched;
- a replica lost mid-run (SIGKILL of the process and its shard daemons):
  a run of the thread elsewhere fails clearly (ThreadBusy, naming the
  holder) while its lease is alive, and takes the thread once it lapsed
  (a 5 s TTL here), with everything the stored checkpoints name; the lost
  replica, started again, catches up;
- a sync StateGraph (`invoke`) on two Runs roots of one process: refused
  without the run hooks, handed over with them.

VFSD_LONG=1 runs more rounds and runs from every checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import time
import uuid
from typing import Any

import pytest

pytest.importorskip("deepagents")

from ckpt_graph import AFTER_V2, at_step, build  # noqa: E402
from ckpt_graph import MOUNT_OPTIONS as GRAPH_OPTIONS  # noqa: E402
from history_agent import VERIFY, effects_of, plan_message  # noqa: E402
from history_check import expected_files, listing_of, parse_listing  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402
from pgserver import pg_server  # noqa: E402, F401 - the fixture
from remote_run import use_server  # noqa: E402
from replica_agent import Replica, ReplicaError  # noqa: E402
from s3server import s3_server  # noqa: E402, F401 - the fixture

import mount_tool  # noqa: E402
from mount_tool import MountToolError  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer, run_hooks  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(400)]

LONG = bool(os.environ.get("VFSD_LONG"))
#: the lease lapses this long after its holder stops renewing it (+ 1 s)
LEASE_TTL = 5
#: how long a run waits for another run of its thread before ThreadBusy
LEASE_WAIT = 10
OPTIONS = {"remote_lease_ttl": LEASE_TTL, "remote_lease_wait": LEASE_WAIT, "shards": 2,
           "remote_retry_base_delay": 0.05, "remote_retry_max_delay": 0.5}


@pytest.fixture(scope="module")
def replicas(s3_server, pg_server, tmp_path_factory):  # noqa: F811
    """Replicas A and B: two processes, two roots, one bucket prefix, one PostgreSQL."""
    # The saver's tables are made once, as a deployment migrates once: two
    # replicas' setup() at once race on the migrations table.
    with PostgresSaver.from_conn_string(pg_server.dsn) as saver:
        saver.setup()
    mp = pytest.MonkeyPatch()
    use_server(s3_server, mp)
    url = s3_server.unique_url("agents")
    work = tmp_path_factory.mktemp("replicas")
    pair = [Replica(name, work / name, url, pg_server.dsn, work / f"{name}.log", **OPTIONS)
            for name in ("A", "B")]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: r.start(), pair))
        yield pair
    finally:
        for r in pair:
            r.stop()
        mp.undo()


def new_thread(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def plan(tag: str, n: int) -> list:
    """A turn of thread run `n`: a file written, one edited, the shell's effects."""
    return [
        ("write", f"work/{tag}.txt", f"{tag} says {n}\n"),
        ("sh", [("append", "work/log.txt", f"{tag};"), ("mkdir", f"work/d{n % 3}"),
                ("put", f"work/d{n % 3}/{tag}.txt", tag)]),
        ("edit", f"work/{tag}.txt", "says", "said"),
    ]


class Thread:
    """A thread's effects so far (what its files must be after any checkpoint)."""

    def __init__(self, thread_id: str) -> None:
        self.id = thread_id
        self.effects: dict[str, Any] = {}

    def turn(self, replica: Replica, tag: str, ops: list, **args: Any) -> dict[str, Any]:
        self.effects.update(effects_of(tag, ops))
        out = replica.run(self.id, plan_message(tag, ops), **args)
        if not out["interrupt"]:
            assert out["messages"][-1]["content"] == f"{tag}: done", out["messages"][-1]
        assert_tools_succeeded(out, tag)
        return out

    def verify(self, replica: Replica, checkpoint_id: str | None = None) -> None:
        """A run on `replica` (from `checkpoint_id`: a fork that stores one
        checkpoint) lists exactly the files of the checkpoint it starts from."""
        args: dict[str, Any] = {"durability": "exit"}
        if checkpoint_id:
            args["checkpoint_id"] = checkpoint_id
        out = replica.run(self.id, VERIFY, **args)
        seen = parse_listing(listing_of(out["messages"]))
        expected = expected_files(out["messages"], self.effects)
        assert seen == expected, (f"{self.id} on {replica.name} from {checkpoint_id}: "
                                  f"expected {sorted(expected.items())}, "
                                  f"saw {sorted(seen.items())}")


def assert_tools_succeeded(out: dict[str, Any], tag: str) -> None:
    """Every tool call of the turn `tag` did what its plan says (a failed
    command or file tool would leave the files short of the model's)."""
    for m in out["messages"]:
        if m["type"] == "tool" and (m["tool_call_id"] or "").startswith(f"{tag}-"):
            assert "[Command failed" not in m["content"] and \
                not m["content"].startswith("Error"), (tag, m)


def made_by(history: list[dict], tags: set[str]) -> list[dict]:
    """The checkpoints whose last message is a tool result of one of `tags`' calls."""
    out = []
    for state in history:
        last = state["messages"][-1] if state["messages"] else None
        if last and last["type"] == "tool" and last["tool_call_id"].split("-")[0] in tags:
            out.append(state)
    return out


def test_one_thread_alternates_replicas_and_travels_in_time(replicas):
    a, b = replicas
    t = Thread(new_thread("alternate"))
    order = [a, b] * (6 if LONG else 3)
    for n, replica in enumerate(order):
        if n:
            t.verify(replica)  # the files of the run before, made on the other replica
        t.turn(replica, f"r{n}", plan(f"r{n}", n))
    t.verify(a)
    # Time travel: runs from checkpoints made on the other replica.
    history = a.call("history", thread=t.id)
    on_a = {f"r{n}" for n in range(0, len(order), 2)}
    on_b = {f"r{n}" for n in range(1, len(order), 2)}
    past_a, past_b = made_by(history, on_a), made_by(history, on_b)
    assert len(past_a) == len(past_b) == 3 * len(order) // 2
    if not LONG:
        past_a, past_b = past_a[::3], past_b[1::3]
    for state in past_a:
        t.verify(b, state["checkpoint_id"])
    for state in past_b:
        t.verify(a, state["checkpoint_id"])
    for r in (a, b):
        assert r.call("runs_held") == []  # every run gave its thread back


def test_an_interrupted_step_moves_with_its_finished_tool_calls(replicas):
    """A step whose write_file finished while `ask` waits at an interrupt: the
    written file is the thread's (LangGraph keeps that call's result and does
    not redo it), and a resume on the other replica finds it."""
    a, b = replicas
    t = Thread(new_thread("interrupted"))
    t.turn(a, "i0", plan("i0", 0))
    ops = [("par", [("write", "work/kept.txt", "written before the interrupt\n"),
                    ("ask", "go on?")]),
           ("sh", [("append", "work/kept.txt", "and after\n")])]
    out = t.turn(a, "i1", ops)
    assert out["interrupt"]
    out = b.run(t.id, resume="yes")
    assert out["messages"][-1]["content"] == "i1: done", out["messages"][-1]
    t.verify(a)
    t.verify(b)


def test_the_same_thread_on_both_replicas_at_once(replicas):
    """One run waits for the other's end, then starts from its last checkpoint:
    the thread's history stays one line and its files hold both runs."""
    a, b = replicas
    t = Thread(new_thread("both"))
    t.turn(a, "s0", plan("s0", 0))
    first = [("sh", [("append", "work/both.txt", "a;")]), ("write", "work/a.txt", "a")]
    second = [("sh", [("append", "work/both.txt", "b;")]), ("write", "work/b.txt", "b")]
    t.effects.update(effects_of("sa", first))
    t.effects.update(effects_of("sb", second))
    runs = [a.send("run", thread=t.id, text=plan_message("sa", first)),
            b.send("run", thread=t.id, text=plan_message("sb", second))]
    outs = [f.result(120) for f in runs]
    for out, tag in zip(outs, ("sa", "sb"), strict=True):
        assert out["messages"][-1]["content"] == f"{tag}: done"
    # The one that ran second saw the first's whole conversation.
    later = max(outs, key=lambda o: len(o["messages"]))
    calls = {m["tool_call_id"] for m in later["messages"] if m["type"] == "tool"}
    assert {"sa-0", "sa-1", "sb-0", "sb-1"} <= calls
    t.verify(a)
    t.verify(b)
    history = b.call("history", thread=t.id)
    ids = [h["checkpoint_id"] for h in history]
    assert len(ids) == len(set(ids))
    steps = [h["step"] for h in history]
    assert steps == sorted(steps, reverse=True) and len(set(steps)) == len(steps), steps


def test_eight_threads_spread_over_both_replicas(replicas):
    a, b = replicas
    threads = [Thread(new_thread(f"many{i}")) for i in range(16 if LONG else 8)]
    rounds = 4 if LONG else 3
    for r in range(rounds):
        futures = []
        for i, t in enumerate(threads):
            replica = (a, b)[(i + r) % 2]
            tag = f"m{r}"
            ops = plan(tag, r + i)
            t.effects.update(effects_of(tag, ops))
            futures.append((t, tag, replica.send("run", thread=t.id, text=plan_message(tag, ops))))
        for t, tag, future in futures:
            out = future.result(180)
            assert out["messages"][-1]["content"] == f"{tag}: done", (t.id, out["messages"][-1])
    checks = []
    for i, t in enumerate(threads):
        replica = (a, b)[(i + rounds) % 2]
        checks.append((t, replica, replica.send("run", thread=t.id, text=VERIFY,
                                                durability="exit")))
    for t, replica, future in checks:
        out = future.result(180)
        seen = parse_listing(listing_of(out["messages"]))
        assert seen == expected_files(out["messages"], t.effects), (t.id, replica.name)


def test_delete_on_one_replica_then_the_same_id_on_the_other_starts_empty(replicas):
    a, b = replicas
    t = Thread(new_thread("deleted"))
    t.turn(a, "d0", plan("d0", 0))
    t.turn(b, "d1", plan("d1", 1))  # both replicas hold a copy of its files now
    a.call("delete", thread=t.id)
    assert a.call("history", thread=t.id) == []
    fresh = Thread(t.id)
    fresh.turn(b, "n0", [("sh", [("mkdir", "work"), ("put", "work/new.txt", "new")])])
    history = b.call("history", thread=t.id)
    assert all(not m["tool_call_id"] or m["tool_call_id"].startswith("n0")
               for h in history for m in h["messages"])
    fresh.verify(b)  # only the new conversation's file: nothing of the deleted thread
    fresh.verify(a)


def test_copy_on_one_replica_runs_on_the_other(replicas):
    a, b = replicas
    source = Thread(new_thread("source"))
    source.turn(a, "c0", plan("c0", 0))
    source.turn(b, "c1", plan("c1", 1))
    copy = Thread(new_thread("copy"))
    copy.effects = dict(source.effects)
    a.call("copy", source=source.id, target=copy.id)
    copy.verify(b)  # the copy's files, on the replica that did not copy it
    # Its history came along, and brings back its files there.
    history = b.call("history", thread=copy.id)
    past = made_by(history, {"c0", "c1"})
    assert past and all((h["vfsd"] or {}).get("run") for h in past)
    for state in past if LONG else past[::3]:
        copy.verify(b, state["checkpoint_id"])
    copy.turn(b, "c2", plan("c2", 2))
    copy.verify(a)
    # The source is untouched: its files, history and next runs are its own.
    source.verify(a)
    source.verify(b)
    source.turn(a, "c3", [("sh", [("put", "work/source-only.txt", "s")])])
    source.verify(b)
    copy.verify(b)
    runs = {(h["vfsd"] or {}).get("run") for h in b.call("history", thread=source.id)} - {None}
    copy_runs = {(h["vfsd"] or {}).get("run") for h in b.call("history", thread=copy.id)
                 if h["step"] is not None and h["step"] > 10} - {None}
    assert copy_runs and not copy_runs & runs, (copy_runs, runs)


def test_update_state_from_the_other_replica(replicas):
    """A fork made with update_state on B, of a checkpoint a run on A made,
    runs on A from B's fork with the files of its branch; the thread goes on
    on B. (No prune here: the saver's keep_latest refuses a thread with a
    DeltaChannel, which a Deep Agents graph has, and it has no
    delete_for_runs.)"""
    a, b = replicas
    t = Thread(new_thread("update"))
    t.turn(a, "u0", plan("u0", 0))
    t.turn(a, "u1", plan("u1", 1))
    past = made_by(b.call("history", thread=t.id), {"u0"})[0]
    ops = [("sh", [("append", "work/log.txt", "fork;")]), ("write", "work/fork.txt", "f")]
    t.effects.update(effects_of("uf", ops))
    fork = b.call("update", thread=t.id, text=plan_message("uf", ops), as_node="tools",
                  checkpoint_id=past["checkpoint_id"])
    out = a.run(t.id, None, checkpoint_id=fork)
    assert out["messages"][-1]["content"] == "uf: done", out["messages"][-1]
    assert_tools_succeeded(out, "uf")
    assert not any(m["tool_call_id"] and m["tool_call_id"].startswith("u1")
                   for m in out["messages"])  # the fork's branch has no u1
    t.verify(b)
    t.turn(b, "u2", plan("u2", 2))
    t.verify(a)
    for r in (a, b):
        assert r.call("runs_held") == []


def test_a_replica_lost_mid_run(replicas):
    """SIGKILL of replica A (its process and its shard daemons) in the middle of
    a run: B's run of the thread fails clearly while A's lease is alive, then
    takes the thread once it lapsed, with every file its stored checkpoints
    name and nothing of the step the crash cut short (its shell call is
    answered as cancelled: the run's unpublished tail is what a crash loses);
    A, started again, catches up."""
    a, b = replicas
    t = Thread(new_thread("lost"))
    t.turn(a, "k0", plan("k0", 0))
    ops = [("write", "work/before.txt", "stored before the crash"),
           ("sh", [("put", "work/during.txt", "never checkpointed"), ("sleep", 60)]),
           ("write", "work/never.txt", "never run")]
    t.effects.update(effects_of("k1", ops))
    running = a.send("run", thread=t.id, text=plan_message("k1", ops))
    deadline = time.monotonic() + 60
    while True:  # until the checkpoint whose next task is the long shell call is stored
        history = b.call("history", thread=t.id)
        if history and any("k1-1" in m["tool_calls"] for m in history[0]["messages"]):
            break
        assert time.monotonic() < deadline and not running.done(), "the run did not get there"
        time.sleep(0.2)
    with pytest.raises(ReplicaError) as busy:
        b.run(t.id, plan_message("k2", [("write", "work/k2.txt", "x")]))
    assert busy.value.type == "ThreadBusy", busy.value
    assert "is held by another run" in busy.value.message
    # It names the holder: a shard daemon of A (host and pid), and when its lease lapses.
    holders = [f"{os.uname().nodename} pid {pid}" for pid in a.call("pids")["shards"]]
    assert any(h in busy.value.message for h in holders), (busy.value.message, holders)
    lapse = re.search(r"if its holder has stopped renewing it \(a crash\), lapses in "
                      r"about ([0-9]+) s", busy.value.message)
    assert lapse and int(lapse.group(1)) <= LEASE_TTL + 1, busy.value.message
    a.crash()
    with pytest.raises(ReplicaError, match="exited"):
        running.result(30)
    # The shell call the crash cut short never finished: Deep Agents answers
    # it as cancelled in the next run, and its file is the lost tail's.
    del t.effects["k1-1"]
    out = b.run(t.id, VERIFY, durability="exit")  # once A's lease lapsed
    cut = [m for m in out["messages"] if m["tool_call_id"] == "k1-1"]
    assert len(cut) == 1 and "did not complete" in cut[0]["content"], cut
    t.verify(b)  # the files of the last stored checkpoint: during.txt is not among them
    history = b.call("history", thread=t.id)
    for state in made_by(history, {"k0", "k1"}):
        t.verify(b, state["checkpoint_id"])
    t.turn(b, "k3", plan("k3", 3))
    a.start()  # the lost replica again: its store holds what the crash cut short
    t.verify(a)
    t.turn(a, "k4", plan("k4", 4))
    t.verify(b)


def test_a_sync_graph_needs_the_run_hooks_and_hands_over_with_them(s3_server, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    """A StateGraph run with `invoke` (a sync run: its end is reported inline)
    on two Runs roots of one process sharing a bucket. Without the run hooks
    a run refuses at its start, saying how to add them, with nothing stored
    or held; with them, a run on A gives the thread back at its end and a
    replay on B from a checkpoint made on A sees that checkpoint's files."""
    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("sync")
    options = {**GRAPH_OPTIONS, "shards": 1, "remote": url, "remote_lease_ttl": LEASE_TTL,
               "remote_lease_wait": LEASE_WAIT}
    saver = InMemorySaver()
    with mount_tool.runs(tmp_path / "a", **options) as ra, \
            mount_tool.runs(tmp_path / "b", **options) as rb:
        config = {"configurable": {"thread_id": "sync-thread"}}
        bare = build(ra).compile(checkpointer=VfsdCheckpointer(saver, ra))
        with pytest.raises(MountToolError, match=r"run_hooks\(\).*Nothing was changed"):
            bare.invoke({"i": 0}, config)
        assert list(saver.list(config)) == []
        on_a = bare.with_config(callbacks=run_hooks())
        on_b = build(rb).compile(checkpointer=VfsdCheckpointer(saver, rb)).with_config(
            callbacks=run_hooks())
        def held() -> list:
            return [run for runs in (ra, rb) for shard in runs.shards()
                    for run in runs.shard(shard["name"]).call("remote_runs")["runs"]]

        assert held() == []
        assert on_a.invoke({"i": 0}, config)["i"] == 4
        assert held() == []
        past = at_step(on_b, config, AFTER_V2)
        replay = on_b.invoke(None, past.config)
        # v2, c.txt (evicted on A later) back, b.txt (written on A later) not there
        assert replay["seen"][len(past.values["seen"])] == "2:a=v2;ls=a.txt,c.txt"
        assert replay["seen"][-1] == "3:a=v3;ls=a.txt"
        assert held() == []
