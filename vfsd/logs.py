"""Structured logging: one JSON event per line, to a file or to stderr (journald)."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def setup_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send structlog events and stdlib logging (pyfuse3) to `stream` as JSON lines."""
    stream = stream or sys.stderr
    lvl = getattr(logging, level.upper())
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=structlog.processors.JSONRenderer(),
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name,
                           structlog.processors.format_exc_info],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
