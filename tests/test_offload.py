"""Tool-output offloading: previews (pure) and offloading to a real vfsd mount."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import unmount_quietly
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

import mount_tool
from mount_tool.deepagents.offload import (
    OffloadMiddleware,
    describe_content,
    estimate_tokens,
    offload_content,
    offload_tool_output,
    resolve_threshold,
    safe_file_stem,
)


def search_results_json(n: int = 2000) -> str:
    return json.dumps(
        {
            "query": "vfsd eviction",
            "total": n,
            "results": [
                {"id": i, "title": f"result {i}", "tags": ["fuse", "lmdb"], "score": i / n}
                for i in range(n)
            ],
        }
    )


def service_log(lines: int = 4000) -> str:
    out = []
    for i in range(lines):
        level = "ERROR" if i % 997 == 5 else "WARNING" if i % 613 == 7 else "INFO"
        out.append(f"2025-03-01T10:{i // 60 % 60:02d}:{i % 60:02d} {level} api: request {i} done")
    return "\n".join(out) + "\n"


def plain_text(lines: int = 3000) -> str:
    return "".join(
        f"paragraph {i}: the quick brown fox jumps over the lazy dog\n" for i in range(lines)
    )


# -- pure previews -------------------------------------------------------------------


def test_json_preview_gives_shape_and_sample() -> None:
    kind, preview = describe_content(search_results_json())
    assert kind == "json"
    assert "JSON object with 3 keys" in preview
    assert '"total": int = 2000' in preview
    assert '"results": array[2000] of {"id": int, "title": str, "tags": array[2] of str' in preview
    assert "Largest array: .results with 2,000 elements" in preview
    assert '{"id": 0, "title": "result 0"' in preview
    top_array = json.dumps([{"a": 1}, {"a": 2}, "odd"])
    assert "array[3] of mixed (object×2, str×1" in describe_content(top_array)[1]


def test_log_preview_gives_head_tail_and_error_lines() -> None:
    kind, preview = describe_content(service_log())
    assert kind == "log"
    assert re.search(r"^\s+1\t2025-03-01T10:00:00 INFO api: request 0 done$", preview, re.M)
    assert re.search(r"^\s+4000\t.*request 3999 done$", preview, re.M)
    # Error lines carry their 1-based line numbers: request i is on line i + 1.
    assert re.search(r"^\s+6\t.*ERROR api: request 5 done$", preview, re.M)
    assert re.search(r"^\s+2000\t.*ERROR api: request 1999 done$", preview, re.M)
    assert re.search(r"^\s+8\t.*WARNING api: request 7 done$", preview, re.M)
    flagged = [i for i in range(4000) if i % 997 == 5 or i % 613 == 7]
    assert f"Error/warning lines: {len(flagged)} in all" in preview


def test_text_preview_gives_head_and_tail_with_line_numbers() -> None:
    kind, preview = describe_content(plain_text())
    assert kind == "text"
    assert "Text, 3,000 lines." in preview
    assert re.search(r"^\s+1\tparagraph 0:", preview, re.M)
    assert re.search(r"^\s+10\tparagraph 9:", preview, re.M)
    assert re.search(r"^\s+3000\tparagraph 2999:", preview, re.M)
    assert "paragraph 500:" not in preview
    assert "2,980 lines not shown" in preview
    # One huge line (minified output) is previewed by characters.
    kind, preview = describe_content("x" * 50_000)
    assert kind == "text" and "First 1000 characters" in preview and len(preview) < 3000


def test_jsonl_preview() -> None:
    text = "\n".join(json.dumps({"event": "tick", "n": i}) for i in range(500))
    kind, preview = describe_content(text)
    assert kind == "jsonl"
    assert "500 lines" in preview and "event, n" in preview


def test_safe_file_stems() -> None:
    assert safe_file_stem("call_abc123") == "call_abc123"
    long_id = "toolu_" + "x" * 300
    stem = safe_file_stem(long_id)
    assert len(stem) <= 64 and re.fullmatch(r"[A-Za-z0-9_.-]+", stem)
    assert stem != safe_file_stem(long_id + "y"), "distinct ids give distinct names"
    for unsafe in ["../../etc/passwd", "a b/c", ".hidden", "", "id\0nul", "ünïcode"]:
        name = safe_file_stem(unsafe)
        assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", name), name
        assert "/" not in name and ".." not in name


def test_thresholds() -> None:
    assert estimate_tokens("a" * 80_000) == 20_000
    assert resolve_threshold(20_000) == 20_000
    model = GenericFakeChatModel(messages=iter([]), profile={"max_input_tokens": 200_000})
    assert resolve_threshold(0.1, model) == 20_000
    assert resolve_threshold(0.5, model) == 100_000
    assert resolve_threshold(0.5, None) == 20_000  # no profile: the default
    with pytest.raises(ValueError):
        resolve_threshold(0)


# -- real mount ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnt(tmp_path_factory: pytest.TempPathFactory):
    """One mount for this module's tests (each uses its own tool-call ids or dir)."""
    pytest.importorskip("vfsd.cli")
    m = mount_tool.mount(tmp_path_factory.mktemp("offload") / "run")
    try:
        yield m
    finally:
        unmount_quietly(m)


def test_small_output_is_left_alone(mnt: mount_tool.Mount) -> None:
    text = "small output"
    assert offload_tool_output(mnt, text, "call_1", dir="small_outputs") is text
    assert not (mnt.root / "small_outputs").exists()


def test_offloaded_log_is_greppable(mnt: mount_tool.Mount) -> None:
    log = service_log(40_000)  # ~2 MB, well over 20,000 tokens
    message, ref = offload_content(mnt, log, "call_log_1")
    assert ref is not None and ref["path"] == "large_tool_results/call_log_1.log"
    path = mnt.root / ref["path"]
    assert path.read_text() == log
    assert mnt.read_text(ref) == log
    assert ref["path"] in message and str(path) in message
    assert f"{len(log):,} characters" in message and "grep -n" in message
    assert "read_file(" in message and "offset=" in message
    assert len(message) < 8000
    grep = subprocess.run(
        ["grep", "-n", "ERROR", ref["path"]], cwd=mnt.root, capture_output=True, text=True
    )
    assert grep.returncode == 0
    hits = grep.stdout.splitlines()
    assert len(hits) == len([i for i in range(40_000) if i % 997 == 5])
    assert hits[0] == "6:2025-03-01T10:00:05 ERROR api: request 5 done"
    # The preview's first error line number agrees with grep.
    assert re.search(r"^\s+6\t.*ERROR api: request 5 done$", message, re.M)


def test_offloaded_json_and_unsafe_ids(mnt: mount_tool.Mount) -> None:
    body = search_results_json(20_000)
    message = offload_tool_output(
        mnt, body, "../../" + "z" * 200, threshold_tokens=1000, dir="json_results"
    )
    files = list((mnt.root / "json_results").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json" and len(files[0].name) <= 70
    assert json.loads(files[0].read_text()) == json.loads(body)
    assert "array[20000]" in message
    assert not list(mnt.run_dir.glob("*.json")), "nothing written outside the mount"


class ScriptedChatModel(GenericFakeChatModel):
    """A fake chat model that replays fixed messages and accepts bound tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self


def test_middleware_offloads_tool_messages(mnt: mount_tool.Mount) -> None:
    big = service_log(20_000)

    @tool
    def fetch_logs(service: str) -> str:
        """Return the service's logs."""
        return big

    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    model = ScriptedChatModel(
        messages=iter(
            [
                AIMessage(
                    "",
                    tool_calls=[
                        {"name": "fetch_logs", "args": {"service": "api"}, "id": "call_A"},
                        {"name": "ping", "args": {}, "id": "call_B"},
                    ],
                ),
                AIMessage("done"),
            ]
        )
    )
    agent = create_agent(model, [fetch_logs, ping], middleware=[OffloadMiddleware(mnt)])
    out = agent.invoke({"messages": [HumanMessage("check the api logs")]})
    tool_messages = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert tool_messages["call_B"].content == "pong"
    offloaded = tool_messages["call_A"].content
    assert "large_tool_results/call_A.log" in offloaded and len(offloaded) < 8000
    assert (mnt.root / "large_tool_results" / "call_A.log").read_text() == big


def test_middleware_async_with_context_fraction(mnt: mount_tool.Mount) -> None:
    """awrap_tool_call path, with the threshold learned from the model's profile."""
    medium = plain_text(600)  # ~37,000 chars: over 5% of 100k tokens, under 20,000 tokens

    @tool
    def read_report() -> str:
        """Return the report."""
        return medium

    model = ScriptedChatModel(
        messages=iter(
            [
                AIMessage("", tool_calls=[{"name": "read_report", "args": {}, "id": "call_frac"}]),
                AIMessage("done"),
            ]
        ),
        profile={"max_input_tokens": 100_000},
    )
    assert estimate_tokens(medium) < 20_000
    middleware = OffloadMiddleware(mnt, 0.05, dir="fraction_results")
    agent = create_agent(model, [read_report], middleware=[middleware])
    out = asyncio.run(agent.ainvoke({"messages": [HumanMessage("read it")]}))
    message = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert "fraction_results/call_frac.txt" in message.content
    assert re.search(r"^\s+600\tparagraph 599:", message.content, re.M)
    assert (mnt.root / "fraction_results" / "call_frac.txt").read_text() == medium


def test_mount_tool_does_not_import_vfsd() -> None:
    source_dir = Path(mount_tool.__file__).parent
    for source in source_dir.rglob("*.py"):
        text = source.read_text()
        assert not re.search(r"^\s*(import vfsd|from vfsd)", text, re.M), source.name


def test_middleware_result_survives_a_failed_offload(mnt: mount_tool.Mount, tmp_path: Path) -> None:
    """The offload directory is a symlink to the outside: nothing is written
    there, and the agent gets the result cut, with a note, not an exception.
    With `root_shown="/"` the hints name sandbox paths."""
    big = service_log(20_000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (mnt.root / "escape_results").symlink_to(outside)

    @tool
    def fetch_logs(service: str) -> str:
        """Return the service's logs."""
        return big

    def run(middleware: OffloadMiddleware, call_id: str) -> str:
        model = ScriptedChatModel(messages=iter([
            AIMessage("", tool_calls=[{"name": "fetch_logs", "args": {"service": "api"},
                                       "id": call_id}]),
            AIMessage("done"),
        ]))
        agent = create_agent(model, [fetch_logs], middleware=[middleware])
        out = agent.invoke({"messages": [HumanMessage("check the api logs")]})
        return next(m for m in out["messages"] if isinstance(m, ToolMessage)).content

    cut = run(OffloadMiddleware(mnt, dir="escape_results"), "call_X")
    assert list(outside.iterdir()) == []
    assert cut.startswith(big[:1000]) and len(cut) < len(big)
    assert "could not be saved to /escape_results/" in cut
    shown = run(OffloadMiddleware(mnt, dir="shown_results", root_shown="/"), "call_Y")
    assert str(mnt.root) not in shown
    assert "grep -n 'PATTERN' /shown_results/call_Y.log" in shown
    assert (mnt.root / "shown_results" / "call_Y.log").read_text() == big
