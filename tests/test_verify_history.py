"""`mount_tool.verify_history`: what a user can check when time travel looks wrong.

Real graphs on real mounts: a Deep Agents agent on a Runs (its state tracks
every file), tests/ckpt_graph.py on one Mount; then checkpoints whose
snapshot is gone, whose files were never bound, and one that names another
checkpoint's snapshot (what the bug of issue 26 left behind).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("deepagents")

from ckpt_graph import AFTER_V2, MOUNT_OPTIONS, at_step, build  # noqa: E402
from conftest import unmount_quietly  # noqa: E402
from history_agent import effects_of, make_agent, plan_message  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from test_checkpoint_boundary import ServerLikeAdapter, bare_graph  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer, verify_history  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240)]

PLAN = [("write", "work/a.txt", "alpha\n"),
        ("sh", [("put", "work/b.txt", "bee\n"), ("mkdir", "work/d"),
                ("put", "work/d/c.txt", "sea\n")]),
        ("edit", "work/a.txt", "alpha", "ALPHA"),
        ("sh", [("rm", "work/b.txt")])]


@pytest.fixture
def mnt(tmp_path: Path):
    m = mount_tool.mount(tmp_path / "run", **MOUNT_OPTIONS)
    try:
        yield m
    finally:
        unmount_quietly(m)


def test_a_deep_agent_thread_checks_out(tmp_path):
    with mount_tool.runs(tmp_path / "runs") as runs:
        saver = VfsdCheckpointer(InMemorySaver(), runs)
        agent = make_agent(runs, checkpointer=saver)
        config = {"configurable": {"thread_id": "checked"}}
        agent.invoke({"messages": [{"role": "user", "content": plan_message("p", PLAN)}]},
                     config)
        assert effects_of("p", PLAN)  # (the plan ran: 4 tool calls)
        report = verify_history(saver, config, strict=True)
        assert report.ok, str(report)
        assert len(report.checkpoints) == len(list(agent.get_state_history(config)))
        assert {c.status for c in report.checkpoints} == {"ok"}
        assert not any(c.untracked for c in report.checkpoints)
        text = str(report)
        assert text.startswith("thread 'checked': ") and "0 with a problem" in text
        # The lazy top-level name is the same function.
        assert mount_tool.verify_history is verify_history


def test_gone_mismatched_and_untracked(mnt):
    saver = VfsdCheckpointer(InMemorySaver(), mnt)
    app = build(mnt).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "c1"}}
    app.invoke({"i": 0}, config)
    report = verify_history(saver, config)
    assert report.ok, str(report)
    # ckpt_graph's nodes only write through write_artifact: every file has a ref,
    # but for c.txt after its eviction (the step node prunes the ref, the
    # snapshot of that step no longer holds it): nothing untracked anywhere.
    assert verify_history(saver, config, strict=True).ok

    # A checkpoint that names the newest snapshot instead of its own (as the
    # late binding of issue 26 left them): a.txt differs, b.txt is extra.
    past = at_step(app, config, AFTER_V2)
    newest = app.get_state(config)
    tup = saver.saver.get_tuple(past.config)
    wrong = {**tup.metadata, "vfsd": dict(newest.metadata["vfsd"])}
    checkpoint = {**tup.checkpoint, "id": str(uuid6(clock_seq=AFTER_V2))}
    saver.saver.put(newest.config, checkpoint, wrong, {})
    report = verify_history(saver, config)
    bad = [c for c in report.checkpoints if c.checkpoint_id == checkpoint["id"]]
    assert [c.status for c in bad] == ["mismatch"]
    assert bad[0].changed == ["a.txt"] and bad[0].untracked == ["b.txt"]
    assert not report.ok and report.problems == bad
    assert "changed: a.txt" in str(report)

    # A snapshot deleted by hand: its checkpoints cannot bring their files back.
    gone = past.metadata["vfsd"]["snapshot"]
    mnt.delete_snapshot(gone)
    report = verify_history(saver, config)
    assert {c.status for c in report.checkpoints if c.snapshot == gone} == {"gone"}


def test_unbound_checkpoints_are_reported(mnt):
    saver = VfsdCheckpointer(InMemorySaver(), mnt)
    app = bare_graph(mnt).compile(checkpointer=ServerLikeAdapter(saver))
    config = {"configurable": {"thread_id": "bare"}}
    asyncio.run(app.ainvoke({"log": []}, config))
    report = verify_history(saver, config)
    assert [c.status for c in report.checkpoints] == ["unbound"] * 4 + ["ok"]
    assert "boundary channel" in report.checkpoints[0].reason
    assert not report.ok


def test_verify_history_refuses_a_bare_saver():
    with pytest.raises(TypeError, match="VfsdCheckpointer"):
        verify_history(InMemorySaver(), {"configurable": {"thread_id": "x"}})
