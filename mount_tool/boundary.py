"""A documented import path: re-exports `mount_tool.langgraph.boundary`.

`mount_tool.boundary.wait_for_capture()` keeps working; step boundaries live
with the rest of the LangGraph integration.
"""

from .langgraph.boundary import (
    BOUNDARY_MARK,
    CAPTURE_WORKERS,
    CAPTURES,
    RUN_SCOPE,
    RUNS_KEPT,
    BoundaryChannel,
    Capture,
    RunScope,
    RunState,
    SerialCaptures,
    adopt,
    at_boundary,
    await_capture,
    run_of_context,
    run_started,
    running,
    wait_for_capture,
)

__all__ = [
    "BOUNDARY_MARK",
    "CAPTURES",
    "CAPTURE_WORKERS",
    "RUNS_KEPT",
    "RUN_SCOPE",
    "BoundaryChannel",
    "Capture",
    "RunScope",
    "RunState",
    "SerialCaptures",
    "adopt",
    "at_boundary",
    "await_capture",
    "run_of_context",
    "run_started",
    "running",
    "wait_for_capture",
]
