"""The `files` channel: graph state's map of FileRefs, and its merge.

    class State(TypedDict):
        files: FilesChannel

`files_reducer` merges two maps (a None value deletes its key);
`FilesAggregate`, the channel behind `FilesChannel`, is also where
`VfsdCheckpointer` captures each checkpoint's files (`boundary`), whoever
compiles the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from langgraph.channels.binop import BinaryOperatorAggregate

from ..refs import FileRef
from .boundary import MISSING, RunState, adopt, at_boundary


def files_reducer(
    left: Mapping[str, FileRef | None] | None, right: Mapping[str, FileRef | None] | None
) -> dict[str, FileRef]:
    """Merge two `files` maps: keys in `right` win, and a None value deletes the key."""
    merged: dict[str, Any] = {k: v for k, v in (left or {}).items() if v is not None}
    for key, value in (right or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


class FilesAggregate(BinaryOperatorAggregate):
    """`FilesChannel`'s channel: a map of FileRefs merged by `files_reducer`,
    whose `checkpoint()` is also the moment the wrapper captures the
    checkpoint's files (see `mount_tool.langgraph.boundary`). It takes a version at a
    thread's first superstep even when nothing writes it, so every checkpoint
    from then on calls it."""

    __slots__ = ("run", "versioned")

    def __init__(self, typ: Any, operator: Callable[[Any, Any], Any] = files_reducer) -> None:
        super().__init__(typ, operator)
        self.versioned = False
        self.run: RunState | None = None

    def copy(self) -> FilesAggregate:
        other = super().copy()
        other.versioned, other.run = self.versioned, self.run
        return other

    def from_checkpoint(self, checkpoint: Any) -> FilesAggregate:
        other = super().from_checkpoint(checkpoint)
        other.versioned = checkpoint is not MISSING
        other.run = adopt()
        return other

    def update(self, values: Sequence[Any]) -> bool:
        if values:
            self.versioned = True
            return super().update(values)
        if self.versioned:
            return False
        self.versioned = True
        return True

    def checkpoint(self) -> Any:
        at_boundary(self.run)
        return super().checkpoint()


FilesChannel = Annotated[dict[str, FileRef], FilesAggregate]
"""State annotation for a `files` map of FileRefs, merged by `files_reducer`
(its channel, `FilesAggregate`, is also where `VfsdCheckpointer` captures
each checkpoint's files, whoever compiles the graph)."""
