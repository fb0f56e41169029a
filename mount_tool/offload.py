"""A documented import path: re-exports `mount_tool.deepagents.offload`.

`from mount_tool.offload import OffloadMiddleware, offload_tool_output` keeps
working; offloading lives with the rest of the agents' middleware.
"""

from .deepagents.offload import (
    CHARS_PER_TOKEN,
    DEFAULT_DIR,
    DEFAULT_THRESHOLD_TOKENS,
    FLAGGED_LINES,
    HEAD_LINES,
    PREVIEW_LINE_CHARS,
    SAFE_ID,
    SAMPLE_CHARS,
    SHAPE_DEPTH,
    SHAPE_KEYS,
    TAIL_LINES,
    UNSAFE_CHARS,
    OffloadMiddleware,
    cut_unsaved,
    describe_content,
    describe_shape,
    detect_kind,
    estimate_tokens,
    max_input_tokens_of,
    offload_content,
    offload_tool_output,
    resolve_threshold,
    safe_file_stem,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_DIR",
    "DEFAULT_THRESHOLD_TOKENS",
    "FLAGGED_LINES",
    "HEAD_LINES",
    "PREVIEW_LINE_CHARS",
    "SAFE_ID",
    "SAMPLE_CHARS",
    "SHAPE_DEPTH",
    "SHAPE_KEYS",
    "TAIL_LINES",
    "UNSAFE_CHARS",
    "OffloadMiddleware",
    "cut_unsaved",
    "describe_content",
    "describe_shape",
    "detect_kind",
    "estimate_tokens",
    "max_input_tokens_of",
    "offload_content",
    "offload_tool_output",
    "resolve_threshold",
    "safe_file_stem",
]
