"""The model is told: an evicted path is answered with what happened to it.

On a real mount: the deepagents file tools (read_file, edit_file, ls, glob,
grep), `Mount.read_bytes` and `.vfsd/evicted/PATH` say when and why a file
went and which retained snapshot holds it, while the shell keeps ENOENT; a
deep agent over a Runs gets one note on the model call after the step that
evicted a file it had written, and no more after that.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytest.importorskip("deepagents")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from test_deepagents import RecordingModel, tool_call, turn  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.deepagents import VfsdBackend, create_vfsd_deep_agent  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

TOLD = "evicted at step 5 (max_age, written at step 0); snapshot s1 holds it"


@pytest.fixture
def evicted(run_factory):
    """A mount where out/report.txt and data/a.csv were evicted at step 5,
    with snapshot s1 holding both; keep.txt, pinned, stays."""
    run = run_factory("told", "--max-age-steps", "2")
    m = mount_tool.Mount.attach(run.run_dir)
    m.write("out/report.txt", "the report\n")
    m.write("data/a.csv", "a,b\n1,2\n")
    m.pin(m.write("keep.txt", "kept\n"))
    assert m.snapshot()["id"] == "s1"
    gone = {r["path"] for r in m.set_step(5)["evicted"]}
    assert gone == {"out/report.txt", "data/a.csv"}
    yield m
    m.detach()


def test_file_tools_say_what_eviction_did(evicted):
    m = evicted
    b = VfsdBackend(m, isolation="none")
    read = b.read("/out/report.txt").error
    assert read.startswith("File '/out/report.txt' not found: it was " + TOLD), read
    assert "`vfsd unevict RUN out/report.txt` (Mount.unevict)" in read
    edit = b.edit("/out/report.txt", "report", "memo").error
    assert "not found: it was " + TOLD in edit
    grep = b.grep("report", "/out/report.txt").error
    assert "not found: it was " + TOLD in grep
    glob = b.glob("**/*.csv").error
    assert "eviction removed 1 that did: /data/a.csv (" + TOLD in glob
    # A directory whose files all went: ls says so once the directory is gone too.
    m.remove("data", directory=True)
    listed = b.ls("/data").error
    assert "path_not_found: 1 file(s) below it were evicted (the newest at step 5" in listed
    # Found files and plain misses are answered as before.
    assert b.read("/keep.txt").file_data["content"] == "kept"
    assert b.read("/never.txt").error == "File '/never.txt' not found"
    assert b.glob("*.md").matches == [] and b.glob("*.md").error is None
    with pytest.raises(mount_tool.EvictedPath) as info:
        m.read_bytes("out/report.txt")
    assert isinstance(info.value, FileNotFoundError)
    assert str(info.value) == f"out/report.txt was {TOLD}: `vfsd unevict RUN out/report.txt` " \
                              "(Mount.unevict) brings it back"
    assert info.value.snapshot == "s1" and info.value.record["reason"] == "max_age"
    with pytest.raises(FileNotFoundError) as plain:
        m.read_bytes("never.txt")
    assert not isinstance(plain.value, mount_tool.EvictedPath)


def test_shell_keeps_enoent_and_vfsd_evicted_explains(evicted):
    root = evicted.root
    cat = subprocess.run(["cat", "out/report.txt"], cwd=root, capture_output=True, text=True)
    assert cat.returncode == 1 and "No such file or directory" in cat.stderr
    view = root / ".vfsd" / "evicted"
    assert sorted(os.listdir(view)) == ["data", "out"]
    assert os.listdir(view / "out") == ["report.txt"]
    assert "evicted" in os.listdir(root / ".vfsd")
    first, record = (view / "out" / "report.txt").read_text().splitlines()
    assert first.startswith(f"out/report.txt was {TOLD}")
    rec = json.loads(record)
    assert (rec["reason"], rec["evicted_step"], rec["snapshot"]) == ("max_age", 5, "s1")
    with pytest.raises(OSError):
        open(view / "out" / "report.txt", "w")
    assert not (view / "keep.txt").exists()
    assert not (view / "out" / "nothing.txt").exists()
    # Made again at that path: no longer evicted, so gone from the view.
    evicted.write("out/report.txt", "a new report\n")
    assert not (view / "out" / "report.txt").exists()
    assert os.listdir(view / "out") == []
    # Back by a whole-tree restore, then deleted: deleted, not evicted.
    evicted.restore("s1")
    evicted.remove("data/a.csv")
    assert not (view / "data").exists()
    assert evicted.eviction("data/a.csv")["evicted"] is None


def test_the_model_is_told_once_per_thread(tmp_path):
    """Thread a writes notes.md at step 1; max_age 2 evicts it at the model call
    that starts step 4: that call (and no other) carries the note. Thread b, on the same
    graph, never wrote it and is never told."""
    script = [
        turn(tool_call("write_file", "w1", file_path="/notes.md", content="my notes\n")),
        turn(tool_call("ls", "l1", path="/")),
        turn(tool_call("ls", "l2", path="/")),
        turn(tool_call("read_file", "r1", file_path="/notes.md")),
        turn(tool_call("ls", "l3", path="/")),
        AIMessage(content="done"),
    ]
    rec = RecordingModel(script * 2)
    with mount_tool.runs(tmp_path / "runs", max_age_steps=2) as runs:
        agent = create_vfsd_deep_agent(runs, rec.model, checkpointer=InMemorySaver())
        state = agent.invoke({"messages": [HumanMessage("go")]},
                             {"configurable": {"thread_id": "a"}})
        read = next(msg for msg in state["messages"] if getattr(msg, "tool_call_id", "") == "r1")
        assert "not found: it was evicted at step 4 (max_age, written at step 1)" in read.content
        notes = [i for i, call in enumerate(rec.calls) if "[vfsd] Eviction removed" in
                 str(call[0].content)]
        assert notes == [3], notes
        said = str(rec.calls[3][0].content)
        assert "/notes.md (evicted at step 4 (max_age, written at step 1); snapshot s" in said
        assert "notes.md" not in state["files"] and "/notes.md" not in state["files"]
        # The other thread's own file leaves too: its note names its file, in its calls only.
        rec.calls.clear()
        agent.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "b"}})
        notes_b = [i for i, call in enumerate(rec.calls) if "[vfsd] Eviction removed" in
                   str(call[0].content)]
        assert notes_b == [3], notes_b


def test_the_model_is_told_of_a_file_it_only_read(tmp_path):
    """An input put in the mount before the run (no ref in `files`) that the
    agent reads at step 2 is evicted at step 5 (max_age 2, age from last use):
    that model call says so; an input nobody opened leaves without a note."""
    script = [
        turn(tool_call("read_file", "r1", file_path="/input.csv")),
        turn(tool_call("ls", "l1", path="/")),
        turn(tool_call("ls", "l2", path="/")),
        turn(tool_call("ls", "l3", path="/")),
        AIMessage(content="done"),
    ]
    rec = RecordingModel(script)
    with mount_tool.runs(tmp_path / "runs", max_age_steps=2) as runs:
        m = runs.get("r")
        m.write("input.csv", "a,b\n1,2\n")
        m.write("unread.csv", "c\n")
        m.set_step(1)
        agent = create_vfsd_deep_agent(runs, rec.model, checkpointer=InMemorySaver())
        state = agent.invoke({"messages": [HumanMessage("go")]},
                             {"configurable": {"thread_id": "r"}})
        read = next(msg for msg in state["messages"] if getattr(msg, "tool_call_id", "") == "r1")
        assert "a,b" in read.content
        notes = [str(call[0].content) for call in rec.calls
                 if "[vfsd] Eviction removed" in str(call[0].content)]
        assert len(notes) == 1, notes
        assert "/input.csv (evicted at step 5 (max_age" in notes[0], notes[0]
        assert "unread.csv" not in notes[0]
        assert m.eviction("unread.csv")["evicted"] is not None
