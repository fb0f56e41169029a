"""Measuring what graph state costs in checkpoints."""

from __future__ import annotations

import threading
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer


class CountingSerializer(JsonPlusSerializer):
    """LangGraph's checkpoint serializer, counting the bytes it produces.

    Pass it as `serde=` to a checkpointer; `.bytes` is then what the run wrote.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self._lock = threading.Lock()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, data = super().dumps_typed(obj)
        with self._lock:
            self.bytes += len(data)
        return kind, data
