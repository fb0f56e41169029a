"""What Deep Agents keeps as its canonical record survives eviction.

deepagents' summarization writes the messages it takes out of the context
window to `/conversation_history/<session>.md`, the only copy the model can
read back. Here summarization really fires: the scripted model's profile says
a 4,000-token window, so every turn summarizes (its summary calls are
answered by the model, never from the script). On a Runs with max_age_steps
3, after many more steps and several eviction passes, `read_file` of the
record returns every message summarization took out, in this process and in
a new one that carries the thread on (a new Runs on the same root, or
another replica: a Runs on a root of its own sharing a bucket with the
first; the conversation in PostgreSQL). Also: the built-in rules in `vfsd status` and how
a user's rule overrides them; a quota that would have to evict a record
refuses the write instead, saying why; a session id and a thread id made of
hostile characters keep the record inside the thread's own tree; an evicted
tool output tells the model how to read it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pytest
from conftest import vfsd_cli

pytest.importorskip("deepagents")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from pgserver import pg_server  # noqa: E402, F401 - the fixture
from remote_run import use_server  # noqa: E402
from s3server import s3_server  # noqa: E402, F401 - the fixture
from test_deepagents import ScriptedChatModel, tool_call, turn  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.daemon.spawn import mount_flags  # noqa: E402
from mount_tool.deepagents import VfsdBackend, create_vfsd_deep_agent  # noqa: E402
from mount_tool.deepagents.evictnotes import turn_note  # noqa: E402
from mount_tool.deepagents.records import literal_name, record_path  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

TESTS = Path(__file__).parent
#: every thread's mount: files leave 3 steps after their last use
RUN_OPTIONS = {"max_age_steps": 3}
KiB = 1 << 10
#: a replica's options besides its bucket (a short lease: nothing here waits for one)
REPLICA_OPTIONS = {"remote_lease_ttl": 5, "remote_retry_base_delay": 0.05,
                   "remote_retry_max_delay": 0.5}
#: the context window of a model that reads a whole record back
READER = 200_000


class SummarizingModel(ScriptedChatModel):
    """A scripted model with a 4,000-token context window in its profile, so
    deepagents summarizes; summary requests are answered here, never from
    the script."""

    summaries: int = 0

    def _generate(self, messages, *args, **kwargs):
        if len(messages) == 1 and "<messages>" in str(messages[0].content):
            self.summaries += 1
            text = f"summary {self.summaries}"
            return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])
        return super()._generate(messages, *args, **kwargs)


def summarizing(script: list[AIMessage], window: int = 4000) -> SummarizingModel:
    """A SummarizingModel over `script` with a context window of `window` tokens
    (a reader of a whole record needs a larger one than 4,000)."""
    return SummarizingModel(messages=iter(script), profile={"max_input_tokens": window})


def write_turns(tag: str, n: int) -> list[AIMessage]:
    """`n` turns, each writing a note whose content is unique to it."""
    return [turn(tool_call("write_file", f"{tag}{i:03d}", file_path=f"/notes/{tag}{i:03d}.md",
                           content=f"{tag}-marker-{i:03d} " + "lorem ipsum " * 50))
            for i in range(n)]


def escape(text: str) -> str:
    return html_escape(text, quote=False)


def summarized(values: dict) -> list[str]:
    """What of each message summarization took out (by the state's event)
    its record must hold: contents, tool call ids and their arguments, as the
    record writes them (XML, so `<`, `>` and `&` escaped)."""
    event = values.get("_summarization_event")
    if not event:
        return []
    out = []
    for msg in values["messages"][: event["cutoff_index"]]:
        if msg.additional_kwargs.get("lc_source") == "summarization":
            continue  # earlier summaries are not offloaded again
        if isinstance(msg, AIMessage):
            for call in msg.tool_calls:
                out.append(f'<tool_call id="{call["id"]}"')
                out += [escape(v) for v in call["args"].values() if isinstance(v, str)]
        if msg.content:
            out.append(escape(str(msg.content)))
    return out


def _read_back(history: list, call_id: str) -> tuple[str, list[str]]:
    """The read_file result of `call_id`, and what had been summarized when it ran."""
    for snap in history:  # newest first
        msgs = snap.values.get("messages", [])
        if msgs and isinstance(msgs[-1], ToolMessage) and msgs[-1].tool_call_id == call_id:
            return str(msgs[-1].content), summarized(snap.values)
    raise AssertionError(f"no checkpoint ends with the result of {call_id}")


def converse(root: str, thread: str, dsn: str, mode: str, tag: str, writes: int,
             passes: int, remote: str | None = None) -> dict[str, Any]:
    """One process's share of a thread: a Runs on `root` (one replica of
    `remote`, a bucket, when given), a deep agent with a PostgreSQL saver
    (sync or async `mode`) running `writes` summarizing turns, then `passes`
    eviction passes of 2 steps each, then a turn that reads the record back.
    Returns what it saw (JSON)."""
    import psycopg
    from psycopg.rows import dict_row

    config = {"configurable": {"thread_id": thread}}
    first = [*write_turns(tag, writes), AIMessage("written")]
    read_id = f"read-{tag}"

    def read_turn(path: str) -> list[AIMessage]:
        return [turn(tool_call("read_file", read_id, file_path=path, limit=100_000)),
                AIMessage("read")]

    def after_writes(runs) -> list[str]:
        with runs.hold(thread) as m:  # outside a graph run: held as one (with a remote)
            evicted = []
            for _ in range(passes):
                evicted += [r["path"] for r in m.set_step(m.get_step() + 2)["evicted"]]
        return evicted

    replica = {"remote": remote, **REPLICA_OPTIONS} if remote else {}
    with mount_tool.runs(root, **RUN_OPTIONS, **replica) as runs:
        if mode == "sync":
            from langgraph.checkpoint.postgres import PostgresSaver

            with psycopg.connect(dsn, autocommit=True, prepare_threshold=0,
                                 row_factory=dict_row) as conn:
                saver = PostgresSaver(conn)
                saver.setup()
                model = summarizing(first)
                agent = create_vfsd_deep_agent(runs, model, checkpointer=saver)
                agent.invoke({"messages": [HumanMessage(f"start {tag}")]}, config)
                path = agent.get_state(config).values["_summarization_event"]["file_path"]
                evicted = after_writes(runs)
                reader = create_vfsd_deep_agent(runs, summarizing(read_turn(path), READER),
                                                checkpointer=saver)
                reader.invoke({"messages": [HumanMessage("read it back")]}, config)
                content, expected = _read_back(list(reader.get_state_history(config)), read_id)
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            async def run() -> tuple:
                async with await psycopg.AsyncConnection.connect(
                        dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
                    saver = AsyncPostgresSaver(conn)
                    await saver.setup()
                    model = summarizing(first)
                    agent = create_vfsd_deep_agent(runs, model, checkpointer=saver)
                    await agent.ainvoke({"messages": [HumanMessage(f"start {tag}")]}, config)
                    state = await agent.aget_state(config)
                    path = state.values["_summarization_event"]["file_path"]
                    evicted = await asyncio.to_thread(after_writes, runs)
                    reader = create_vfsd_deep_agent(runs, summarizing(read_turn(path), READER),
                                                    checkpointer=saver)
                    await reader.ainvoke({"messages": [HumanMessage("read it back")]}, config)
                    history = [s async for s in reader.aget_state_history(config)]
                    return model, path, evicted, *_read_back(history, read_id)

            model, path, evicted, content, expected = asyncio.run(run())
        with runs.hold(thread) as m:
            records_evicted = [r["path"] for r in m.evicted(10_000)
                               if r["path"].startswith("conversation_history/")]
    return {"path": path, "summaries": model.summaries, "evicted": evicted,
            "records_evicted": records_evicted, "read": content, "expected": expected}


CARRY_ON = """
import json, sys
sys.path.insert(0, {tests!r})
from test_deepagents_records import converse
print(json.dumps(converse({root!r}, {thread!r}, {dsn!r}, {mode!r}, "b", 6, 8, {remote!r})))
"""


@pytest.mark.parametrize("mode,where", [("sync", "process"), ("async", "process"),
                                        ("async", "replica")])
def test_summarized_history_survives_eviction_and_a_new_process(tmp_path, request, mode,
                                                                 where):
    """The thread's run moves to a new process: a new Runs on the same root
    ("process"), or another replica, a Runs on a root of its own sharing a
    bucket with the first ("replica": what the first wrote reaches it through
    the saver and the bucket only)."""
    dsn = request.getfixturevalue("pg_server").dsn
    root, thread = str(tmp_path / "runs"), f"summarize-{mode}-{where}"
    remote = other_root = None
    if where == "replica":
        server = request.getfixturevalue("s3_server")
        use_server(server, request.getfixturevalue("monkeypatch"))
        remote, other_root = server.unique_url("records"), str(tmp_path / "replica-b")
    here = converse(root, thread, dsn, mode, "a", 10, 10, remote)
    assert here["summaries"] >= 5, here["summaries"]  # summarization really fired
    session = Path(here["path"]).name
    assert here["path"] == f"/conversation_history/{session}" and session.startswith("session_")
    # 20 steps of eviction passes took the last notes (the run itself the first
    # ones), never the record.
    assert "notes/a009.md" in here["evicted"], here["evicted"]
    assert here["records_evicted"] == []
    assert len(here["expected"]) > 30
    missing = [text for text in here["expected"] if text not in here["read"]]
    assert not missing, missing[:3]
    assert "a-marker-000" in here["read"]

    # The thread's run moves to a new process (on the same root, or another replica's).
    proc = subprocess.run(
        [sys.executable, "-c", CARRY_ON.format(tests=str(TESTS), root=other_root or root,
                                               thread=thread, dsn=dsn, mode=mode,
                                               remote=remote)],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    there = json.loads(proc.stdout.strip().splitlines()[-1])
    assert there["path"] == here["path"]  # the same record, appended to
    assert there["summaries"] >= 3 and there["records_evicted"] == []
    assert "notes/b005.md" in there["evicted"]
    assert set(here["expected"]) < set(there["expected"])
    missing = [text for text in there["expected"] if text not in there["read"]]
    assert not missing, missing[:3]
    assert "a-marker-009" in there["read"] and "b-marker-000" in there["read"]


# -- the rules: listed, overridden, turned off ------------------------------------------


def _evict_passes(m: mount_tool.Mount, steps: int) -> set[str]:
    gone: set[str] = set()
    for _ in range(steps):
        gone |= {r["path"] for r in m.set_step(m.get_step() + 1)["evicted"]}
    return gone


def test_builtin_rules_are_listed_kept_and_overridable(tmp_path):
    record = "conversation_history/session_1.md"
    m = mount_tool.mount(tmp_path / "default", eviction_rules=[{"path": "src/**", "pin": True}],
                         **RUN_OPTIONS)
    try:
        for path in (record, "conversation_history/media/ab12.png", "blobs/" + "f" * 64,
                     "blobs/sub/x", "notes.md"):
            m.write(path, path)
        status = m.stats()["eviction_policy"]
        assert status["builtin_rules"] is True
        rules = status["rules"]
        assert [(r["index"], r["path"], r.get("builtin", False)) for r in rules] == [
            (1, "src/**", False), (2, "conversation_history/**", True), (3, "blobs/*", True)]
        assert all(r["pin"] and "Deep Agents" in r["why"] for r in rules[1:])
        text = vfsd_cli("status", m.run_dir).stdout
        assert "rule 2 (built-in)" in text and "conversation_history/**: pin true" in text
        info = vfsd_cli("info", m.run_dir, m.root / record).stdout
        assert "built-in rule 2 (conversation_history/**)" in info, info
        gone = _evict_passes(m, 10)
        assert gone == {"notes.md", "blobs/sub/x"}, gone  # blobs/* is one level only
        assert m.read_bytes(record) == record.encode()
    finally:
        m.unmount()

    # A rule of the user's comes first: it decides for the paths it matches.
    m = mount_tool.mount(tmp_path / "mine", eviction_rules=[
        {"path": "conversation_history/**", "max_age_steps": 6},
        {"path": "blobs/*", "pin": False}], **RUN_OPTIONS)
    try:
        m.write(record, "r")
        m.write("blobs/" + "f" * 64, "b")
        rules = m.stats()["eviction_policy"]["rules"]
        assert [r["path"] for r in rules] == ["conversation_history/**", "blobs/*",
                                              "conversation_history/**", "blobs/*"]
        assert rules[1]["pin"] is False and "builtin" not in rules[1]
        assert _evict_passes(m, 4) == {"blobs/" + "f" * 64}  # pin = false: the global limit
        assert _evict_passes(m, 3) == {record}
        assert m.eviction(record)["evicted"]["rule_index"] == 1
    finally:
        m.unmount()

    # builtin_eviction_rules = false: records age like any file.
    m = mount_tool.mount(tmp_path / "off", builtin_eviction_rules=False, **RUN_OPTIONS)
    try:
        m.write(record, "r")
        status = m.stats()["eviction_policy"]
        assert status["builtin_rules"] is False and status["rules"] == []
        assert "built-in rules" in vfsd_cli("status", m.run_dir).stdout
        assert _evict_passes(m, 4) == {record}
    finally:
        m.unmount()
    assert mount_flags({"builtin_eviction_rules": False}) == ["--no-builtin-eviction-rules"]


# -- a quota refuses the write rather than drop a record ----------------------------------


def test_a_quota_refuses_the_write_that_would_need_a_record(tmp_path):
    record = "conversation_history/session_q.md"
    m = mount_tool.mount(tmp_path / "quota", quota_bytes=str(1024 * KiB), **RUN_OPTIONS)
    try:
        b = VfsdBackend(m, isolation="none")
        body = "history line\n" * (600 * KiB // 13)
        assert b.write("/" + record, body).error is None
        assert b.write("/scratch.txt", "s" * (100 * KiB)).error is None
        res = b.write("/big.bin", "x" * (500 * KiB))
        # The quota took what it could (scratch.txt), not the record, then refused.
        assert res.error and "No space left on device" in res.error, res.error
        assert "quota of 1,048,576 bytes exceeded" in res.error, res.error
        assert f"1 record file(s) of {len(body):,} bytes under built-in rule 1 " \
               "(conversation_history/**)" in res.error, res.error
        assert "never drops" in res.error
        assert not (m.root / "scratch.txt").exists()
        assert (m.root / record).read_text() == body
        # Summarization's append (an edit of the record) past the quota is
        # refused, saying why, and leaves the record whole.
        edit = b.edit("/" + record, body, body + "x" * (600 * KiB))
        assert edit.error.endswith("No space left on device: quota of 1,048,576 bytes "
                                   f"exceeded ({len(body):,} in use, {600 * KiB:,} more needed): "
                                   "eviction found nothing more it may take"), edit.error
        assert (m.root / record).read_text() == body
        assert b.write("/big.bin", "x" * (500 * KiB)).error  # refused again: records
        # A new record that cannot be written whole leaves no part of it behind
        # (the next summarization would append to that part).
        res = b.write("/conversation_history/session_r.md", "r" * (600 * KiB))
        assert "under built-in rule 1" in res.error, res.error
        assert sorted(os.listdir(m.root / "conversation_history")) == ["session_q.md"]

        refusal = m.stats()["quota_refusal"]
        assert refusal["limit"] == "quota_bytes"
        assert refusal["records"] == [{"rule_index": 1, "rule_path": "conversation_history/**",
                                       "files": 1, "bytes": len(body)}]
        text = vfsd_cli("status", m.run_dir).stdout
        assert "last refusal" in text and "under built-in rule 1" in text
        log = (m.run_dir / ".vfsd" / "vfsd.log").read_text()
        said = [json.loads(line) for line in log.splitlines() if "quota_exceeded" in line]
        assert said and said[-1]["kept_records"][0]["files"] == 1, said
        # The quota's refusals, not the disk's (they were logged and counted as a full disk).
        counters = m.stats()["counters"]
        assert counters["enospc"] == 4 and counters["enospc_disk"] == 0, counters
        assert "store_disk_full" not in log
        # The next write that needs room and gets it (by evicting filler.txt)
        # ends the refusal.
        if (m.root / "big.bin").exists():  # what the refused write left
            m.remove("big.bin")
        assert b.write("/filler.txt", "y" * (300 * KiB)).error is None
        assert m.stats()["quota_refusal"] is not None
        assert b.write("/next.txt", "z" * (300 * KiB)).error is None
        assert not (m.root / "filler.txt").exists()
        assert m.stats()["quota_refusal"] is None
    finally:
        m.unmount()

    # A record under a rule of the user's that lets it age is the quota's like any file.
    m = mount_tool.mount(tmp_path / "mine", quota_bytes=str(1024 * KiB),
                         eviction_rules=[{"path": "conversation_history/**", "pin": False}])
    try:
        b = VfsdBackend(m, isolation="none")
        assert b.write("/" + record, "h" * (600 * KiB)).error is None
        assert b.write("/big.bin", "x" * (500 * KiB)).error is None
        assert m.eviction(record)["evicted"]["reason"] == "quota"
    finally:
        m.unmount()


# -- the path is input ----------------------------------------------------------------


HOSTILE_THREAD = "../../" + "\n\t\x1b[31m" + "é" * 60 + "/.."
HOSTILE_SESSION = "../../../escape\x00/..//" + "z" * 300


def test_hostile_session_and_thread_ids_keep_the_record_in_the_thread(tmp_path):
    """The session id comes from the graph's state (here set by update_state),
    the thread id from the caller: neither leads the record out of
    conversation_history/ of the thread's own tree, and it stays kept."""
    outside = sorted(p.name for p in tmp_path.iterdir())
    config = {"configurable": {"thread_id": HOSTILE_THREAD}}
    with mount_tool.runs(tmp_path / "runs", **RUN_OPTIONS) as runs:
        saver = InMemorySaver()
        agent = create_vfsd_deep_agent(runs, summarizing([*write_turns("h", 2), AIMessage("ok")]),
                                       checkpointer=saver)
        agent.invoke({"messages": [HumanMessage("first")]}, config)
        agent.update_state(config, {"_summarization_session_id": HOSTILE_SESSION})
        agent = create_vfsd_deep_agent(
            runs, summarizing([*write_turns("k", 3), AIMessage("ok")]), checkpointer=saver)
        agent.invoke({"messages": [HumanMessage("second")]}, config)
        named = agent.get_state(config).values["_summarization_event"]["file_path"]
        assert named == f"/conversation_history/{HOSTILE_SESSION}.md"
        stored = record_path(named)
        assert stored.startswith("/conversation_history/%2E%2E/%2E%2E/%2E%2E/escape%00/%2E%2E/z")
        with runs.use(HOSTILE_THREAD) as m:
            assert m.read_bytes(stored.lstrip("/")).count(b"k-marker-000") == 1
            _evict_passes(m, 12)
            assert not (m.root / "notes" / "k000.md").exists()  # eviction ran
            assert (m.root / stored.lstrip("/")).is_file()  # the record did not go
            # Nothing landed elsewhere in the thread's tree, nor in another thread's.
            top = {p.name for p in m.root.iterdir()}
            assert top <= {".vfsd", "conversation_history", "notes"}, top
        with runs.use("other") as other:
            assert not (other.root / "conversation_history").exists()
        # deepagents' read_file refuses the `..` of the name the summary gives;
        # the name `glob` lists reads the record back.
        reader = create_vfsd_deep_agent(runs, summarizing([
            turn(tool_call("read_file", "r1", file_path=named)),
            turn(tool_call("glob", "g1", pattern="**/*.md", path="/conversation_history")),
            turn(tool_call("read_file", "r2", file_path=stored, limit=100_000)),
            AIMessage("done")], READER), checkpointer=saver)
        state = reader.invoke({"messages": [HumanMessage("read")]}, config)
        said = {msg.tool_call_id: msg.content for msg in state["messages"]
                if isinstance(msg, ToolMessage)}
        assert "Path traversal not allowed" in said["r1"]
        assert stored in said["g1"]
        assert "k-marker-000" in said["r2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*outside, "runs"])


def test_record_names_are_taken_literally():
    assert record_path("/conversation_history/../x.md") == "/conversation_history/%2E%2E/x.md"
    assert record_path("/conversation_history/./a/../b") == "/conversation_history/%2E/a/%2E%2E/b"
    assert record_path("/conversation_history/a\x00b.md") == "/conversation_history/a%00b.md"
    assert record_path("/conversation_history//a/") == "/conversation_history/a"
    assert record_path("/other/../x.md") == "/other/../x.md"  # only below a record directory
    assert record_path("/conversation_history/session_1.md") == "/conversation_history/session_1.md"
    long = literal_name("s" * 400 + ".md")
    assert len(long.encode()) <= 255 and long.endswith(".md") and long != literal_name("s" * 401 + ".md")
    assert literal_name("\ud800x") == "%D800x"


# -- an evicted tool output, and the bytes of a record ------------------------------------


def test_an_evicted_tool_output_says_how_to_read_it_again(tmp_path):
    m = mount_tool.mount(tmp_path / "out", max_age_steps=2)
    try:
        kept = m.write("large_tool_results/call_1.log", "line 1\nERROR line 2\n")
        snap = m.snapshot()["id"]
        lost = m.write("large_tool_results/call_2.log", "not in any snapshot\n")
        report = m.set_step(5)
        assert {r["path"] for r in report["evicted"]} >= {kept["path"], lost["path"]}
        b = VfsdBackend(m, isolation="none")
        copy = f"/.vfsd/snapshots/{snap}/large_tool_results/call_1.log"
        said = b.read("/large_tool_results/call_1.log").error
        assert f"It was a tool's output saved in full: `read_file {copy}` reads the copy " \
               f"snapshot {snap} keeps" in said, said
        assert b.read(copy).file_data["content"] == "line 1\nERROR line 2"
        said = b.read("/large_tool_results/call_2.log").error
        assert "no retained snapshot holds it" in said and "run the tool again" in said, said
        note = turn_note(m, report["evicted"], {kept["ino"], lost["ino"]})
        assert "/large_tool_results/call_1.log (evicted at step 5" in note
        assert f"it was a tool's output saved in full: `read_file {copy}`" in note, note
        assert "run the tool again to get it back)" in note, note
    finally:
        m.unmount()


def test_appending_to_a_record_keeps_its_bytes(tmp_path):
    """Summarization appends by an edit whose old text is the whole record:
    line ends it holds (a tool's CRLF output, a progress bar's CR) stay."""
    m = mount_tool.mount(tmp_path / "bytes")
    try:
        b = VfsdBackend(m, isolation="none")
        first = "## one\r\n<message type=\"tool\">10%\r20%\r100%</message>\n"
        assert b.write("/conversation_history/s.md", first).error is None
        assert b.edit("/conversation_history/s.md", first, first + "## two\n").error is None
        assert (m.root / "conversation_history/s.md").read_bytes() == (first + "## two\n").encode()
        # An edit in "\n" terms still finds CRLF text, as before.
        assert b.edit("/conversation_history/s.md", "## one\n", "## 1\n").error is None
    finally:
        m.unmount()
