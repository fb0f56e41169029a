"""Tool-output offloading: large tool results go to the mount, the message keeps a preview.

The preview describes the content rather than only showing its first lines:
JSON gets its shape (keys, array lengths, one sample element), logs get head,
tail and the error/warning lines with line numbers, other text head and tail
with line numbers. Every message says where the full output is, its size, and
how to read more (grep, sed, read_file with an offset).

Offloaded files are ordinary files in the mount: they are stamped with the
current step and evicted by the daemon's age rules like any other artifact.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import xxhash
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from ..daemon import toolcalls
from ..errors import MountToolError
from ..mount import Mount
from ..refs import FileRef
from ..runs import Runs, lease
from .nospace import explained

CHARS_PER_TOKEN = 4
DEFAULT_THRESHOLD_TOKENS = 20_000
DEFAULT_DIR = "large_tool_results"
HEAD_LINES = 10
TAIL_LINES = 10
FLAGGED_LINES = 30
PREVIEW_LINE_CHARS = 200
SAMPLE_CHARS = 800
SHAPE_KEYS = 12
SHAPE_DEPTH = 4
SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]+")

# A line "looks like a log line" when it starts with a timestamp or carries a level.
_TIMESTAMP = re.compile(
    r"^\s*[\[(]?(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}|\d{2}:\d{2}:\d{2}|"
    r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}|\d{10}(\.\d+)?\b)"
)
_LEVEL = re.compile(
    r"(\b(TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|FATAL|CRITICAL|SEVERE)\b"
    r"|\blevel=\w+|\[(trace|debug|info|warn|warning|error|fatal)\])"
)
_FLAGGED = re.compile(
    r"\b(error|errors|err|warn|warning|warnings|fatal|critical|exception|traceback|"
    r"failed|failure|panic|denied|refused|timeout|timed out)\b",
    re.IGNORECASE,
)


def estimate_tokens(text: str) -> int:
    """Rough token count: about 4 characters per token."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def max_input_tokens_of(model: Any) -> int | None:
    """The context window from a chat model's profile (`profile["max_input_tokens"]`)."""
    profile = getattr(model, "profile", None) if model is not None else None
    if isinstance(profile, Mapping):
        window = profile.get("max_input_tokens")
        if isinstance(window, int) and window > 0:
            return window
    return None


def resolve_threshold(threshold_tokens: int | float, model: Any = None) -> int:
    """Threshold in tokens: an int as is, a float in (0, 1] as a fraction of the window.

    A fraction needs a model whose profile gives `max_input_tokens`; without one
    the default of 20,000 tokens applies.
    """
    if isinstance(threshold_tokens, float) and 0 < threshold_tokens <= 1:
        window = max_input_tokens_of(model)
        return max(1, int(window * threshold_tokens)) if window else DEFAULT_THRESHOLD_TOKENS
    if threshold_tokens <= 0:
        raise ValueError(f"threshold_tokens must be positive, not {threshold_tokens!r}")
    return int(threshold_tokens)


def safe_file_stem(tool_call_id: str) -> str:
    """A short file name for a tool call id: the id itself when short and safe,
    else its safe characters (at most 32) plus a hash of the whole id."""
    if SAFE_ID.fullmatch(tool_call_id):
        return tool_call_id
    cleaned = UNSAFE_CHARS.sub("_", tool_call_id).strip("_")[:32] or "call"
    return f"{cleaned}-{xxhash.xxh3_64(tool_call_id.encode()).hexdigest()}"


# -- content kinds -------------------------------------------------------------


def detect_kind(text: str) -> tuple[str, Any]:
    """("json", value), ("jsonl", records sample), ("log", None) or ("text", None)."""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            return "json", json.loads(text)
        except ValueError:
            pass
    lines = [ln for ln in text.splitlines()[:500] if ln.strip()]
    if stripped[:1] == "{" and len(lines) >= 2:
        records = []
        for ln in lines[:50]:
            try:
                records.append(json.loads(ln))
            except ValueError:
                continue
        if len(records) >= 0.9 * min(len(lines), 50):
            return "jsonl", records
    if lines:
        loggy = sum(1 for ln in lines if _TIMESTAMP.search(ln) or _LEVEL.search(ln))
        if loggy >= 0.3 * len(lines):
            return "log", None
    return "text", None


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _clip(line: str, limit: int = PREVIEW_LINE_CHARS) -> str:
    return line if len(line) <= limit else f"{line[:limit]}… (+{len(line) - limit} chars)"


def _numbered(lines: list[str], first_number: int) -> list[str]:
    return [f"{first_number + i:>6}\t{_clip(ln)}" for i, ln in enumerate(lines)]


def _head_and_tail(lines: list[str]) -> list[str]:
    if len(lines) <= HEAD_LINES + TAIL_LINES:
        return [f"All {len(lines)} lines:", *_numbered(lines, 1)]
    skipped = len(lines) - HEAD_LINES - TAIL_LINES
    return [
        f"First {HEAD_LINES} lines:",
        *_numbered(lines[:HEAD_LINES], 1),
        f"  ... {skipped:,} lines not shown ...",
        f"Last {TAIL_LINES} lines:",
        *_numbered(lines[-TAIL_LINES:], len(lines) - TAIL_LINES + 1),
    ]


def _flagged_lines(lines: list[str]) -> list[str]:
    hits = [(i + 1, ln) for i, ln in enumerate(lines) if _FLAGGED.search(ln)]
    if not hits:
        return []
    if len(hits) <= FLAGGED_LINES:
        shown, note = hits, ""
    else:
        half = FLAGGED_LINES // 2
        shown = hits[:half] + hits[-half:]
        note = f" (first {half} and last {half} shown)"
    out = [f"Error/warning lines: {len(hits):,} in all{note}:"]
    for k, (number, ln) in enumerate(shown):
        if note and k == FLAGGED_LINES // 2:
            out.append(f"  ... {len(hits) - FLAGGED_LINES:,} more ...")
        out.append(f"{number:>6}\t{_clip(ln)}")
    return out


def _char_head_tail(text: str) -> list[str]:
    """For text with few, very long lines (minified output): characters, not lines."""
    head, tail = text[:1000], text[-500:]
    return [
        f"First 1000 characters: {head!r}",
        f"Last 500 characters: {tail!r}",
    ]


# -- JSON shape ----------------------------------------------------------------


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return {int: "int", float: "float", str: "str"}.get(type(value), type(value).__name__)


def describe_shape(value: Any, depth: int = 0) -> str:
    """A one-line shape of a JSON value: object{"k": type, ...}, array[n] of shape."""
    if isinstance(value, dict):
        if depth >= SHAPE_DEPTH:
            return f"object({len(value)} keys)"
        items = [
            f"{json.dumps(k)}: {describe_shape(v, depth + 1)}"
            for k, v in list(value.items())[:SHAPE_KEYS]
        ]
        more = len(value) - SHAPE_KEYS
        if more > 0:
            items.append(f"... +{more} keys")
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        if not value:
            return "array[0]"
        kinds: dict[str, int] = {}
        for element in value[:200]:
            kinds[_type_name(element)] = kinds.get(_type_name(element), 0) + 1
        if len(kinds) > 1:
            mix = ", ".join(f"{k}×{n}" for k, n in kinds.items())
            return f"array[{len(value)}] of mixed ({mix} in the first {min(len(value), 200)})"
        return f"array[{len(value)}] of {describe_shape(value[0], depth + 1)}"
    if isinstance(value, str) and len(value) > 80:
        return f"str({len(value)} chars)"
    return _type_name(value)


def _largest_array(value: Any, path: str = "", depth: int = 0) -> tuple[str, list] | None:
    best: tuple[str, list] | None = None
    if isinstance(value, list):
        best = (path or ".", value)
        children = [(f"{path}[0]", value[0])] if value else []
    elif isinstance(value, dict):
        children = [
            (f"{path}.{k}" if re.fullmatch(r"\w+", k) else f"{path}[{json.dumps(k)}]", v)
            for k, v in value.items()
        ]
    else:
        return None
    if depth < SHAPE_DEPTH:
        for child_path, child in children:
            found = _largest_array(child, child_path, depth + 1)
            if found and (best is None or len(found[1]) > len(best[1])):
                best = found
    return best


def _sample(value: Any) -> str:
    dumped = json.dumps(value, ensure_ascii=False, default=str)
    return _clip(dumped, SAMPLE_CHARS)


def _json_preview(value: Any) -> list[str]:
    out: list[str] = []
    if isinstance(value, dict):
        out.append(f"JSON object with {len(value):,} keys:")
        for key, item in list(value.items())[:40]:
            shape = describe_shape(item, 1)
            if isinstance(item, (bool, int, float, str)):
                shape += f" = {_clip(json.dumps(item, ensure_ascii=False), 80)}"
            out.append(f"  {json.dumps(key)}: {_clip(shape, 300)}")
        if len(value) > 40:
            out.append(f"  ... +{len(value) - 40} more keys")
    elif isinstance(value, list):
        out.append(f"JSON array of {len(value):,} elements: {_clip(describe_shape(value), 400)}")
    else:
        out.append(f"JSON {_type_name(value)}: {_clip(json.dumps(value), 400)}")
    found = _largest_array(value)
    if found and found[1]:
        path, array = found
        out.append(f"Largest array: {path} with {len(array):,} elements. Sample element {path}[0]:")
        out.append(f"  {_sample(array[0])}")
    return out


def _jsonl_preview(records: list[Any], lines: list[str]) -> list[str]:
    keys: dict[str, None] = {}
    for record in records:
        if isinstance(record, dict):
            keys.update(dict.fromkeys(record))
    out = [f"JSON Lines: {len(lines):,} lines, one JSON value per line."]
    if keys:
        out.append(f"Keys seen in the first {len(records)} records: {', '.join(list(keys)[:30])}")
    out.append(f"Shape of line 1: {_clip(describe_shape(records[0]), 400)}")
    out.append(f"Sample (line 1): {_sample(records[0])}")
    out += _flagged_lines(lines)
    return out


# -- the message ---------------------------------------------------------------


def describe_content(text: str) -> tuple[str, str]:
    """(kind, preview body) for `text`: kind is json, jsonl, log or text."""
    kind, parsed = detect_kind(text)
    lines = text.splitlines()
    if kind == "json":
        body = _json_preview(parsed)
    elif kind == "jsonl":
        body = _jsonl_preview(parsed, lines)
    elif kind == "log":
        body = [
            f"Log output, {_plural(len(lines), 'line')}.",
            *_head_and_tail(lines),
            *_flagged_lines(lines),
        ]
    else:
        body = [f"Text, {_plural(len(lines), 'line')}."]
        few_long_lines = len(lines) < HEAD_LINES + TAIL_LINES and len(
            text
        ) > 4 * PREVIEW_LINE_CHARS * (len(lines) or 1)
        body += _char_head_tail(text) if few_long_lines else _head_and_tail(lines)
        # Error lines help in compiler or test output that carries no log format.
        body += _flagged_lines(lines)[: FLAGGED_LINES // 2 + 1]
    return kind, "\n".join(body)


def _how_to_read(kind: str, relative: str, absolute: str) -> str:
    hints = [
        f"  grep -n 'PATTERN' {absolute}",
        f"  sed -n '100,200p' {absolute}   (lines 100-200)",
        f"  read_file('/{relative}', offset=100, limit=100)",
    ]
    if kind == "json":
        hints.insert(
            1, f"  jq '<path>' {absolute}   (jq, if installed; the shape above gives the paths)"
        )
    return "To read more of it:\n" + "\n".join(hints)


def offload_content(
    files: Mount | Runs,
    content: str,
    tool_call_id: str,
    *,
    threshold_tokens: int | float = DEFAULT_THRESHOLD_TOKENS,
    dir: str = DEFAULT_DIR,
    model: Any = None,
    root_shown: str | None = None,
) -> tuple[str, FileRef | None]:
    """Like `offload_tool_output`, also returning the FileRef of the written file
    (None when the content was under the threshold and left as is)."""
    if estimate_tokens(content) <= resolve_threshold(threshold_tokens, model):
        return content, None
    kind, preview = describe_content(content)
    extension = {"json": ".json", "jsonl": ".jsonl", "log": ".log"}.get(kind, ".txt")
    relative = f"{dir.strip('/')}/{safe_file_stem(tool_call_id)}{extension}"
    with lease(files) as mount:
        try:
            ref = mount.write(relative, content)
        except OSError as exc:
            told = explained(exc, mount)  # an ENOSPC says what held the room
            if told is exc:
                raise
            raise told from exc
        host_path = str(mount.resolve_path(ref["path"]))
    if root_shown is None:
        absolute = host_path
    else:  # the sandbox's view: the host path is neither there nor to be shown
        absolute = posixpath.join(root_shown, ref["path"])
    lines = content.count("\n") + (0 if content.endswith("\n") else 1)
    header = (
        f"Tool output too large for the context ({len(content):,} characters, "
        f"{ref['size']:,} bytes, ~{estimate_tokens(content):,} tokens, {lines:,} lines). "
        f"Saved in full to {ref['path']} in the run's mount (absolute path: {absolute})."
    )
    message = "\n\n".join([header, preview, _how_to_read(kind, ref["path"], absolute)])
    return message, ref


def cut_unsaved(
    content: str,
    exc: BaseException,
    *,
    threshold_tokens: int | float = DEFAULT_THRESHOLD_TOKENS,
    dir: str = DEFAULT_DIR,
    model: Any = None,
) -> str:
    """`content` cut to the offload threshold, with a note on why it could not
    be saved (`exc`): what a failed offload gives instead of raising, so the
    tool's result still reaches the agent."""
    try:
        keep = resolve_threshold(threshold_tokens, model) * CHARS_PER_TOKEN
    except (TypeError, ValueError):
        keep = DEFAULT_THRESHOLD_TOKENS * CHARS_PER_TOKEN
    if len(content) <= keep:
        return content
    if isinstance(exc, OSError) and exc.strerror:
        why = exc.strerror
    else:
        why = str(exc) or type(exc).__name__
    return (
        f"{content[:keep]}\n... Output truncated: {keep:,} of {len(content):,} characters "
        f"kept. The full output could not be saved to /{dir.strip('/')}/ in the mount ({why})."
    )


def offload_tool_output(
    files: Mount | Runs,
    content: str,
    tool_call_id: str,
    *,
    threshold_tokens: int | float = DEFAULT_THRESHOLD_TOKENS,
    dir: str = DEFAULT_DIR,
    model: Any = None,
    root_shown: str | None = None,
) -> str:
    """Return `content` if it is small, else save it in the mount and return a preview.

    `threshold_tokens` is in tokens (about 4 characters each), or a float in
    (0, 1] meaning that fraction of `model.profile["max_input_tokens"]`. The
    file goes to `dir/<safe name from tool_call_id>.<json|jsonl|log|txt>`.
    `root_shown` is the mount root as the reader's commands see it ("/" in a
    bwrap sandbox); by default the message gives host paths. With a Runs, the
    file goes to the running call's thread.
    """
    message, _ = offload_content(
        files, content, tool_call_id, threshold_tokens=threshold_tokens, dir=dir, model=model,
        root_shown=root_shown,
    )
    return message


# -- LangChain agent middleware -------------------------------------------------


def _text_of(content: Any) -> str | None:
    """The text of a message content; None when it holds non-text blocks (images...)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                return None
        return "".join(parts)
    return None


class OffloadMiddleware(AgentMiddleware):
    """Agent middleware that offloads large ToolMessage results to the mount
    (`files`: a Runs, for the running thread's, or one Mount).

    `threshold_tokens` as in `offload_tool_output`. With a fractional
    threshold the context window comes from `model`, or else from the model
    the agent calls (learned on its first model call). Tools named in
    `exclude_tools` are left alone. `root_shown` as in `offload_tool_output`
    ("/" when the agent's commands run in VfsdBackend's bwrap sandbox). A
    result that cannot be saved (a file where the directory should be, a full
    quota) comes back cut to the threshold with a note saying why.
    """

    def __init__(
        self,
        files: Mount | Runs,
        threshold_tokens: int | float = DEFAULT_THRESHOLD_TOKENS,
        *,
        dir: str = DEFAULT_DIR,
        model: Any = None,
        exclude_tools: Collection[str] = (),
        root_shown: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(files, Mount | Runs):
            raise TypeError(f"files must be a mount_tool Mount or Runs, not {type(files)!r}")
        self.files = files
        self.threshold_tokens = threshold_tokens
        self.dir = dir
        self.model = model
        self.exclude_tools = frozenset(exclude_tools)
        self.root_shown = root_shown

    def _offload_message(self, message: Any) -> Any:
        if not isinstance(message, ToolMessage):
            return message
        text = _text_of(message.content)
        if text is None:
            return message
        try:
            new_text = offload_tool_output(
                self.files,
                text,
                message.tool_call_id or "call",
                threshold_tokens=self.threshold_tokens,
                dir=self.dir,
                model=self.model,
                root_shown=self.root_shown,
            )
        except (OSError, ValueError, MountToolError) as exc:
            # The tool ran: its result reaches the agent, cut if need be.
            new_text = cut_unsaved(text, exc, threshold_tokens=self.threshold_tokens,
                                   dir=self.dir, model=self.model)
        if new_text is text:
            return message
        return message.model_copy(update={"content": new_text})

    def _offload_result(self, result: Any, tool_name: str | None) -> Any:
        if tool_name in self.exclude_tools:
            return result
        if isinstance(result, ToolMessage):
            return self._offload_message(result)
        if isinstance(result, Command) and isinstance(result.update, Mapping):
            messages = result.update.get("messages")
            if isinstance(messages, list):
                update = {**result.update, "messages": [self._offload_message(m) for m in messages]}
                return Command(
                    graph=result.graph, update=update, resume=result.resume, goto=result.goto
                )
        return result

    def _learn_model(self, request: Any) -> None:
        if self.model is None and isinstance(self.threshold_tokens, float):
            self.model = getattr(request, "model", None)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self._learn_model(request)
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        self._learn_model(request)
        return await handler(request)

    @property
    def mount(self) -> Mount:
        """The Mount of the one-mount form (AttributeError with a Runs)."""
        if not isinstance(self.files, Mount):
            raise AttributeError("this OffloadMiddleware serves a Runs: runs.get(thread_id)")
        return self.files

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        # The saved output is the tool call's own file (provenance).
        with toolcalls.for_request(request):
            return self._offload_result(handler(request), request.tool_call.get("name"))

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        with toolcalls.for_request(request):
            result = await handler(request)
            # Writing to the mount blocks: keep it off the event loop.
            return await asyncio.to_thread(self._offload_result, result,
                                           request.tool_call.get("name"))
