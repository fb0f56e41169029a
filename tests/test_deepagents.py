"""Deep Agents on a real vfsd mount: VfsdBackend and VfsdMiddleware with the real packages.

The agent is `create_deep_agent` driven by a scripted chat model (langchain_core's
GenericFakeChatModel replaying a fixed list of tool calls): no LLM, no network.
Every file operation lands on a real FUSE mount served by the daemon.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from conftest import open_files_under

deepagents = pytest.importorskip("deepagents")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.deepagents import (  # noqa: E402
    STAGING_DIR,
    VfsdBackend,
    create_vfsd_deep_agent,
)
from mount_tool.refs import content_hash  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

MiB = 1 << 20


# -- a scripted model and the seed trajectory (also used by bench/ and the Postgres tests) --


class ScriptedChatModel(GenericFakeChatModel):
    """A fake chat model that replays AIMessages in call order and accepts any tools.

    `bind_tools` returns the model itself, so the parent agent and its subagents
    draw from one script in the order they call the model. The profile's huge
    context window keeps deepagents' summarization from ever calling it.
    """

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self


def scripted_model(messages: Iterable[AIMessage]) -> ScriptedChatModel:
    """A ScriptedChatModel over `messages`."""
    return ScriptedChatModel(messages=iter(list(messages)), profile={"max_input_tokens": 10**9})


class RecordingModel:
    """A scripted model (`.model`) that keeps the messages of every call in `.calls`."""

    def __init__(self, script: list[AIMessage]) -> None:
        self.calls: list[list[Any]] = []
        recorder = self

        class _Recording(ScriptedChatModel):
            def _generate(self, messages, *args, **kwargs):
                recorder.calls.append(list(messages))
                return super()._generate(messages, *args, **kwargs)

        self.model = _Recording(messages=iter(script), profile={"max_input_tokens": 10**9})


def tool_call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def turn(*calls: dict[str, Any]) -> AIMessage:
    """One model turn making `calls` (in parallel when several)."""
    return AIMessage(content="", tool_calls=list(calls))


def file_body(path: str, size: int) -> str:
    """Deterministic ASCII text of exactly `size` characters, different per path."""
    line = f"{path} lorem ipsum dolor sit amet {{:07d}}\n"
    lines = []
    total = 0
    i = 0
    while total < size:
        text = line.format(i)
        lines.append(text)
        total += len(text)
        i += 1
    return "".join(lines)[:size]


def seed_files(scale: int = 1) -> list[tuple[str, int]]:
    """The seed's 45 files: five of 1 MiB and forty that share 3 MiB (8 MiB in all)."""
    big = [(f"/reports/big_{i}.md", MiB * scale) for i in range(5)]
    share, extra = divmod(3 * MiB * scale, 40)
    small = [(f"/data/part_{i:02d}.txt", share + (i < extra)) for i in range(40)]
    # Interleave so the 1 MiB files are spread over the run.
    order = []
    for i in range(40):
        order.append(small[i])
        if i % 8 == 7:
            order.append(big[i // 8])
    return order


def seed_steps(scale: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """The seed trajectory: 50 tool-call steps, 45 write_file and 5 execute."""
    files = seed_files(scale)
    shell = [
        "ls data | wc -l",
        "wc -c reports/*.md | tail -n 1",
        "grep -c 'lorem' data/part_03.txt",
        "head -c 100 reports/big_1.md",
        "du -sh . | cut -f1",
    ]
    steps: list[tuple[str, dict[str, Any]]] = []
    for i in range(50):
        if i % 10 == 9:
            steps.append(("execute", {"command": shell[i // 10]}))
        else:
            path, size = files.pop(0)
            steps.append(("write_file", {"file_path": path, "content": file_body(path, size)}))
    assert not files
    return steps


def seed_script(scale: int = 1, final: str = "done") -> list[AIMessage]:
    """AIMessages that play the seed trajectory, one tool call per turn, then `final`."""
    msgs = [
        turn(tool_call(name, f"call_{i:03d}", **args))
        for i, (name, args) in enumerate(seed_steps(scale))
    ]
    return [*msgs, AIMessage(content=final)]


def serialized_size(value: Any) -> int:
    """Bytes of `value` under LangGraph's checkpoint serializer."""
    return len(JsonPlusSerializer().dumps_typed(value)[1])


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture
def mnt(run):
    """A mount_tool.Mount attached to the `run` fixture's daemon."""
    m = mount_tool.Mount.attach(run.run_dir)
    yield m
    m.detach()


def run_agent(mount: mount_tool.Mount, script: list[AIMessage], **kwargs: Any):
    """Run a VfsdBackend deep agent over `script`; returns (agent, config, final state)."""
    agent = create_vfsd_deep_agent(
        mount,
        scripted_model(script),
        checkpointer=kwargs.pop("checkpointer", InMemorySaver()),
        **kwargs,
    )
    config = {"configurable": {"thread_id": "t1"}}
    state = agent.invoke({"messages": [HumanMessage("go")]}, config)
    return agent, config, state


def tool_result(state: dict, call_id: str) -> ToolMessage:
    for msg in state["messages"]:
        if isinstance(msg, ToolMessage) and msg.tool_call_id == call_id:
            return msg
    raise AssertionError(f"no ToolMessage for {call_id}")


# -- the backend on its own ------------------------------------------------------


def test_backend_file_operations(mnt):
    b = VfsdBackend(mnt)
    assert b.write("/notes/plan.md", "one\ntwo\nthree\n").path == "/notes/plan.md"
    assert (mnt.root / "notes/plan.md").read_text() == "one\ntwo\nthree\n"

    read = b.read("/notes/plan.md", offset=1, limit=1)
    assert read.error is None and read.file_data["content"].strip() == "two"
    assert [e["path"] for e in b.ls("/notes").entries] == ["/notes/plan.md"]
    assert [m["path"] for m in b.glob("*.md").matches] == ["/notes/plan.md"]
    matches = b.grep("three", "/").matches
    assert [(m["path"], m["line"]) for m in matches] == [("/notes/plan.md", 3)]

    edited = b.edit("/notes/plan.md", "two", "TWO")
    assert edited.error is None and edited.occurrences == 1
    assert (mnt.root / "notes/plan.md").read_text() == "one\nTWO\nthree\n"
    assert b.edit("/notes/plan.md", "absent", "x").error

    up = b.upload_files([("/data/blob.bin", b"\x00\xff" * 10), ("/../escape", b"x")])
    assert up[0].error is None and up[1].error == "invalid_path"
    down = b.download_files(["/data/blob.bin", "/missing", "/notes"])
    assert down[0].content == b"\x00\xff" * 10
    assert [d.error for d in down[1:]] == ["file_not_found", "is_directory"]

    assert b.delete("/notes").error is None
    assert not (mnt.root / "notes").exists()
    assert b.delete("/").error

    # The async twins go through the same code.
    async def twins():
        await b.awrite("/a/x.txt", "async body")
        return (await b.aread("/a/x.txt")).file_data["content"], (await b.als("/a")).entries

    content, entries = asyncio.run(twins())
    assert content == "async body" and entries[0]["path"] == "/a/x.txt"


def test_download_of_a_directory_leaves_no_open_file(mnt):
    """A leaked descriptor would keep the mount busy: `vfsd umount` refuses."""
    (mnt.root / "adir").mkdir()
    b = VfsdBackend(mnt)
    assert [d.error for d in b.download_files(["/adir", "/"])] == ["is_directory"] * 2
    assert open_files_under(mnt.root) == []


def test_backend_confines_paths(mnt, tmp_path):
    b = VfsdBackend(mnt)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink(outside, mnt.root / "link")
    assert b.write("/../outside.txt", "x").error
    assert b.read("/link").error
    assert b.write("/link", "overwrite").error
    assert outside.read_text() == "secret"
    assert b.ls("/../..").error
    assert b.grep("secret", "/link").matches == []
    # An absolute path is a path under the mount root, never the host path: the
    # same file the sandboxed shell sees under that name.
    elsewhere = Path("/home/vfsd-test-nobody/elsewhere.txt")
    assert b.write(str(elsewhere), "virtual").error is None
    assert not elsewhere.exists()
    assert (mnt.root / str(elsewhere).lstrip("/")).read_text() == "virtual"
    # Unisolated, commands print host paths: the mount's own host path is accepted.
    unisolated = VfsdBackend(mnt, isolation="none")
    assert unisolated.write(str(mnt.root / "inside.txt"), "ok").path == "/inside.txt"
    # Relative paths are refused: the protocol's paths start with '/'.
    assert "absolute" in b.write("relative.txt", "x").error


def test_execute_runs_in_mount_with_timeout_and_cap(mnt):
    b = VfsdBackend(mnt, max_output_bytes=10_000)
    (mnt.root / "in.txt").write_text("from the mount\n")
    res = b.execute("pwd; cat in.txt; echo err >&2; exit 3")
    assert res.exit_code == 3
    # The mount root is the sandbox's /; stderr lines are marked.
    assert res.output.splitlines() == ["/", "from the mount", "[stderr] err", "", "Exit code: 3"]

    slow = b.execute("sleep 30; echo never", timeout=1)
    assert slow.exit_code == 124 and "timed out" in slow.output and "never" not in slow.output

    capped = b.execute("yes abcdefghi | head -c 200000")
    assert capped.truncated and "10,000 of 200,000 bytes kept" in capped.output
    assert len(capped.output) < 12_000


def test_execute_offloads_large_output(mnt):
    b = VfsdBackend(mnt)
    res = b.execute("seq 1 200000")
    assert res.exit_code == 0 and len(res.output) < 10_000
    saved = re.search(r"(large_tool_results/\S+?\.\w+) in the run's mount", res.output)
    assert saved, res.output[:500]
    assert (mnt.root / saved.group(1)).read_text().splitlines()[-1] == "200000"


# -- the deep agent -----------------------------------------------------------------


def test_write_file_and_execute_see_the_same_files(mnt):
    script = [
        turn(
            tool_call(
                "write_file", "w1", file_path="/src/hello.py", content="print('hi from file')\n"
            )
        ),
        turn(tool_call("execute", "x1", command="python3 src/hello.py; echo made > src/out.txt")),
        turn(tool_call("read_file", "r1", file_path="/src/out.txt")),
        turn(tool_call("grep", "g1", pattern="made")),
        AIMessage(content="done"),
    ]
    _, _, state = run_agent(mnt, script)
    assert "hi from file" in tool_result(state, "x1").content
    assert "made" in tool_result(state, "r1").content
    assert "/src/out.txt" in tool_result(state, "g1").content
    files = state["files"]
    assert set(files) == {"/src/hello.py", "/src/out.txt"}
    for key, ref in files.items():
        assert ref == mnt.ref(key.lstrip("/"))
        assert ref["hash"] == content_hash((mnt.root / key.lstrip("/")).read_bytes())


def test_offloaded_output_is_greppable_from_execute(mnt):
    script = [
        turn(tool_call("execute", "x1", command="seq 1 150000 | sed 's/^/row /'")),
        turn(tool_call("execute", "x2", command="grep -rn '^row 123456$' large_tool_results/")),
        AIMessage(content="done"),
    ]
    _, _, state = run_agent(mnt, script)
    preview = tool_result(state, "x1").content
    assert "large_tool_results/" in preview and len(preview) < 10_000
    found = tool_result(state, "x2").content
    assert re.search(r"large_tool_results/\S+:123456:row 123456", found), found
    assert any(k.startswith("/large_tool_results/") for k in state["files"])


def test_large_arguments_stay_out_of_messages(mnt):
    big = file_body("/big.txt", MiB)
    old = big[1000:4000]
    new = "REPLACED " * 500
    script = [
        turn(tool_call("write_file", "w1", file_path="/big.txt", content=big)),
        turn(tool_call("edit_file", "e1", file_path="/big.txt", old_string=old, new_string=new)),
        turn(tool_call("write_file", "w2", file_path="/small.txt", content="short")),
        AIMessage(content="done"),
    ]
    agent, config, state = run_agent(mnt, script)
    expected = big.replace(old, new)
    assert (mnt.root / "big.txt").read_text() == expected
    assert state["files"]["/big.txt"]["hash"] == content_hash(expected.encode())
    assert tool_result(state, "e1").status == "success"

    calls = {
        c["id"]: c for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls
    }
    assert "/big.txt" in calls["w1"]["args"]["content"]
    assert len(calls["w1"]["args"]["content"]) < 300
    assert len(calls["e1"]["args"]["old_string"]) < 300
    assert len(calls["e1"]["args"]["new_string"]) < 300
    assert calls["w2"]["args"]["content"] == "short"
    # The staged copies are gone once the calls ran, and never entered `files`.
    assert not (mnt.root / STAGING_DIR).exists()
    assert not any(k.startswith(f"/{STAGING_DIR}") for k in state["files"])
    # Nothing in the checkpointed state carries the body.
    assert serialized_size(agent.get_state(config).values) < 20_000


def test_subagent_writes_and_deletes_are_seen_by_parent(mnt):
    script = [
        # parent
        turn(tool_call("write_file", "p1", file_path="/old.txt", content="to be deleted")),
        turn(tool_call("write_file", "p2", file_path="/keep.txt", content="kept")),
        turn(tool_call("task", "p3", description="rework files", subagent_type="general-purpose")),
        # the general-purpose subagent, on the same mount
        turn(
            tool_call("write_file", "s1", file_path="/sub/new.txt", content="from the subagent"),
            tool_call("delete", "s2", file_path="/old.txt"),
        ),
        turn(tool_call("execute", "s3", command="echo shell > sub/shell.txt")),
        AIMessage(content="subagent finished"),
        # parent again
        AIMessage(content="done"),
    ]
    _, _, state = run_agent(mnt, script)
    assert tool_result(state, "p3").content == "subagent finished"
    assert set(state["files"]) == {"/keep.txt", "/sub/new.txt", "/sub/shell.txt"}
    for key in state["files"]:
        assert state["files"][key] == mnt.ref(key.lstrip("/"))
    assert not (mnt.root / "old.txt").exists()


def test_subagent_runs_vfsd_middleware(mnt):
    """The general-purpose subagent's own large write stays out of its messages."""
    big = file_body("/sub/big.txt", 50_000)
    recording = RecordingModel([
        # parent
        turn(tool_call("task", "p1", description="write it", subagent_type="general-purpose")),
        # the subagent
        turn(tool_call("write_file", "s1", file_path="/sub/big.txt", content=big)),
        AIMessage(content="written"),
        # parent again
        AIMessage(content="done"),
    ])
    agent = create_vfsd_deep_agent(mnt, recording.model, checkpointer=InMemorySaver())
    state = agent.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t"}})
    assert (mnt.root / "sub/big.txt").read_text() == big
    assert state["files"]["/sub/big.txt"]["hash"] == content_hash(big.encode())
    assert not (mnt.root / STAGING_DIR).exists()
    # The subagent's second model call: its own history, with the write_file call compacted.
    subagent_history = recording.calls[2]
    call = next(m for m in subagent_history if isinstance(m, AIMessage) and m.tool_calls)
    assert call.tool_calls[0]["id"] == "s1"
    assert len(call.tool_calls[0]["args"]["content"]) < 300
    assert "kept in the mount" in call.tool_calls[0]["args"]["content"]
    assert all(big not in str(m.content) for m in subagent_history)
    # The subagent was told the path convention too.
    assert "share one filesystem" in subagent_history[0].text


def test_declared_subagents_get_the_middleware_unless_they_have_it(mnt):
    from mount_tool.deepagents import VfsdMiddleware
    from mount_tool.deepagents.agent import _with_vfsd_middleware

    made = []

    def make():
        made.append(VfsdMiddleware(mnt))
        return [made[-1]]

    plain = {"name": "a", "description": "d", "system_prompt": "p"}
    assert _with_vfsd_middleware(plain, make)["middleware"] == [made[0]]
    own = {**plain, "middleware": [VfsdMiddleware(mnt, prompt_note="")]}
    assert _with_vfsd_middleware(own, make) is own
    compiled = {"name": "c", "description": "d", "runnable": object()}
    assert _with_vfsd_middleware(compiled, make) is compiled
    assert len(made) == 1


def test_custom_tool_output_gets_the_vfsd_preview(mnt):
    """A custom tool's 260 KB of JSON and a log: vfsd's preview (shape, error
    lines) and a file named by its kind, not deepagents' first 1,000 characters
    in a file without an extension."""
    import json

    from langchain_core.tools import tool

    records = [{"id": i, "name": f"item {i}", "tags": ["a", "b"], "score": i / 7}
               for i in range(3200)]
    document = json.dumps({"total": len(records), "items": records})
    assert len(document) > 250_000
    log = "".join(f"2026-01-02T10:00:{i % 60:02d}Z INFO request {i} ok\n" for i in range(3000))
    log += "2026-01-02T10:01:07Z ERROR upstream timed out\n"

    @tool
    def search_items(query: str) -> str:
        """Search the catalogue."""
        return document

    @tool
    def fetch_logs(service: str) -> str:
        """Recent logs of a service."""
        return log

    script = [
        turn(tool_call("search_items", "j1", query="all"), tool_call("fetch_logs", "l1", service="api")),
        AIMessage(content="done"),
    ]
    _, _, state = run_agent(mnt, script, tools=[search_items, fetch_logs])
    preview = tool_result(state, "j1").content
    assert len(preview) < 5_000, preview[:300]
    assert "JSON object with 2 keys" in preview and "Largest array: .items with 3,200" in preview
    assert json.loads((mnt.root / "large_tool_results/j1.json").read_text()) == json.loads(document)
    assert "/large_tool_results/j1.json" in state["files"]
    log_preview = tool_result(state, "l1").content
    assert "Error/warning lines: 1 in all" in log_preview and "upstream timed out" in log_preview
    assert (mnt.root / "large_tool_results/l1.log").read_text() == log
    # deepagents' own offloading never saw them.
    assert sorted(os.listdir(mnt.root / "large_tool_results")) == ["j1.json", "l1.log"]


def test_prompt_note_names_the_routes_of_a_composite_backend(mnt):
    """/memories/ routed to a StoreBackend is not in the mount: the note says
    the shell does not see it, and the shell indeed does not."""
    from deepagents.backends import CompositeBackend, StoreBackend
    from langgraph.store.memory import InMemoryStore

    backend = CompositeBackend(
        default=VfsdBackend(mnt),
        routes={"/memories/": StoreBackend(namespace=lambda rt: ("mem",))},
    )
    recording = RecordingModel([
        turn(tool_call("write_file", "w1", file_path="/memories/prefs.md", content="tabs\n")),
        turn(tool_call("execute", "x1", command="cat /memories/prefs.md")),
        turn(tool_call("read_file", "r1", file_path="/memories/prefs.md")),
        AIMessage(content="done"),
    ])
    agent = create_vfsd_deep_agent(mnt, recording.model, backend=backend,
                                   store=InMemoryStore(), checkpointer=InMemorySaver())
    state = agent.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t"}})
    note = recording.calls[0][0].text
    assert "Except under `/memories/`" in note and "execute does not see them" in note
    assert "tabs" in tool_result(state, "r1").content
    assert "No such file" in tool_result(state, "x1").content
    assert not (mnt.root / "memories").exists()
    # Without routes the note makes no exception.
    assert "Except under" not in VfsdBackend(mnt).prompt_note()
    with pytest.raises(ValueError, match="either backend or backend_options"):
        create_vfsd_deep_agent(mnt, recording.model, backend=backend,
                               backend_options={"network": True})


# What `setfattr -n user.vfsd.status -v done FILE` does, without needing the attr package.
MARK_DONE = "python3 -c \"import os; os.setxattr('{0}', 'user.vfsd.status', b'done')\""


def test_eviction_removes_refs_from_state(run_factory):
    run = run_factory("evict", "--done-retention-steps", "1")
    mnt = mount_tool.Mount.attach(run.run_dir)
    script = [
        turn(tool_call("write_file", "w1", file_path="/scratch.txt", content="temporary")),
        turn(tool_call("write_file", "w2", file_path="/result.txt", content="keep me")),
        turn(tool_call("execute", "x1", command=MARK_DONE.format("scratch.txt"))),
        *[turn(tool_call("ls", f"l{i}", path="/")) for i in range(4)],
        AIMessage(content="done"),
    ]
    try:
        agent, config, state = run_agent(mnt, script)
        assert set(state["files"]) == {"/result.txt"}
        assert not (mnt.root / "scratch.txt").exists()
        record = next(r for r in mnt.evicted() if r["path"] == "scratch.txt")
        assert record["reason"] == "done"
        assert set(agent.get_state(config).values["files"]) == {"/result.txt"}
    finally:
        mnt.detach()


def test_fifty_steps_state_stays_small(run_factory):
    # No age eviction during the run: all 45 refs stay in state (the worst case).
    run = run_factory("seed", "--max-age-steps", "1000")
    mnt = mount_tool.Mount.attach(run.run_dir)
    script = seed_script()
    steps = seed_steps()
    agent, config, state = run_agent(mnt, script)
    written = {args["file_path"]: args["content"] for name, args in steps if name == "write_file"}
    assert len(written) == 45
    assert sum(len(c) for c in written.values()) == 8 * MiB
    assert set(state["files"]) == set(written)
    for path, body in written.items():
        assert state["files"][path]["hash"] == content_hash(body.encode())
    values = agent.get_state(config).values
    size = serialized_size(values)
    assert size < 500_000, f"state after 50 steps is {size} bytes"
    assert mnt.get_step() >= 50
    assert len([m for m in values["messages"] if isinstance(m, ToolMessage)]) == 50


def test_backend_paths_match_files_keys(mnt):
    """Keys in `files` are the agent's own paths: read_file on a key reads that file."""
    script = [
        turn(tool_call("execute", "x1", command="mkdir -p a/b && echo deep > a/b/c.txt")),
        AIMessage(content="done"),
    ]
    _, _, state = run_agent(mnt, script)
    b = VfsdBackend(mnt)
    for key in state["files"]:
        assert b.read(key).error is None
    assert Path(mnt.root, "a/b/c.txt").read_text() == "deep\n"


def test_async_agent_uses_the_async_paths(mnt):
    """ainvoke goes through the async backend twins and the middleware's async hooks."""
    big = file_body("/async/big.txt", 200_000)
    script = [
        turn(tool_call("write_file", "w1", file_path="/async/big.txt", content=big)),
        turn(tool_call("execute", "x1", command="wc -c < async/big.txt")),
        turn(tool_call("glob", "g1", pattern="**/*.txt")),
        AIMessage(content="done"),
    ]
    agent = create_vfsd_deep_agent(mnt, scripted_model(script), checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "async"}}
    state = asyncio.run(agent.ainvoke({"messages": [HumanMessage("go")]}, config))
    assert tool_result(state, "x1").content.startswith("200000")
    assert "/async/big.txt" in tool_result(state, "g1").content
    assert state["files"]["/async/big.txt"]["hash"] == content_hash(big.encode())
    call = next(m for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls)
    assert len(call.tool_calls[0]["args"]["content"]) < 300


def test_write_and_upload_to_a_fifo_return_errors(mnt):
    """A FIFO made by a command: write_file and upload_files answer with an
    error at once instead of waiting for a reader."""
    import threading

    b = VfsdBackend(mnt)
    os.mkfifo(mnt.root / "pipe")
    results: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: results.update(
        write=b.write("/pipe", "hello"), upload=b.upload_files([("/pipe", b"x")])), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        for _ in range(2):  # release the blocked opens
            os.close(os.open(mnt.root / "pipe", os.O_RDONLY | os.O_NONBLOCK))
            worker.join(2)
        pytest.fail("write_file or upload_files blocked on a FIFO")
    assert "not a regular file" in results["write"].error
    assert results["upload"][0].error == "invalid_path"
    assert b.read("/pipe").error and b.download_files(["/pipe"])[0].error
    assert b.edit("/pipe", "a", "b").error


def test_execute_output_survives_a_failed_offload(mnt):
    """/large_tool_results is a file: the output cannot be saved there, and the
    agent still gets it, cut, with a note, instead of an exception."""
    b = VfsdBackend(mnt)
    (mnt.root / "large_tool_results").write_text("in the way")
    res = b.execute("seq 1 200000")
    assert res.exit_code == 0
    assert res.output.startswith("1\n2\n3\n") and len(res.output) < 100_000
    assert "could not be saved to /large_tool_results/" in res.output
    assert str(mnt.root) not in res.output


def test_offload_hints_give_sandbox_paths(mnt):
    """In the sandbox the mount is `/`: the hints name paths that exist there,
    never the host location."""
    b = VfsdBackend(mnt)
    if b.isolation != "bwrap":
        pytest.skip(f"bwrap is not usable here ({b.isolation})")
    res = b.execute("seq 1 200000")
    assert str(mnt.root) not in res.output
    hint = re.search(r"grep -n 'PATTERN' (\S+)", res.output)
    assert hint and hint.group(1).startswith("/large_tool_results/"), res.output[-600:]
    found = b.execute(f"tail -n 1 {hint.group(1)}")
    assert found.output.strip() == "200000"


def test_edit_at_the_quota_leaves_the_file_whole(run_factory):
    """An edit that would pass the quota fails, and the file keeps its bytes
    (it used to be truncated first, then half rewritten)."""
    run = run_factory("quota", "--quota-bytes", str(MiB))
    mnt = mount_tool.Mount.attach(run.run_dir)
    try:
        original = "A" * (600 << 10) + "\nMARK\n"
        (mnt.root / "doc.txt").write_text(original)
        (mnt.root / "filler.bin").write_bytes(b"f" * (300 << 10))
        for name in ("doc.txt", "filler.bin"):  # pinned: eviction cannot make room
            os.setxattr(mnt.root / name, "user.vfsd.pin", b"1")
        b = VfsdBackend(mnt)
        result = b.edit("/doc.txt", "MARK", "M" * (300 << 10))
        assert result.error, result
        assert (mnt.root / "doc.txt").read_text() == original
        # A fitting edit still works.
        assert b.edit("/doc.txt", "MARK", "DONE").error is None
        assert (mnt.root / "doc.txt").read_text() == "A" * (600 << 10) + "\nDONE\n"
    finally:
        mnt.detach()


def test_execute_offload_never_lands_outside_the_mount(mnt, tmp_path):
    """/large_tool_results is a symlink to a host directory: the output is not
    written there (it comes back cut, with a note)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (mnt.root / "large_tool_results").symlink_to(outside)
    res = VfsdBackend(mnt).execute("seq 1 200000")
    assert res.exit_code == 0 and list(outside.iterdir()) == []
    assert res.output.startswith("1\n2\n3\n") and len(res.output) < 100_000
    assert "could not be saved to /large_tool_results/" in res.output
