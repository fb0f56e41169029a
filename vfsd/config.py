"""Daemon configuration: defaults, TOML file, command-line overrides, validation."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from . import DEFAULT_CHUNK_SIZE, DEFAULT_INLINE_MAX

DURABILITY_MODES = ("fsync", "sync")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A configuration file or option is wrong; the message says how."""


@dataclass
class Config:
    """Every daemon option, with its default.

    durability: "fsync" (default) makes data durable when a program calls
    fsync(), as on any local filesystem, and keeps close() fast; "sync" also
    makes every file durable when its last handle closes, at the cost of an
    fsync per written file.
    """

    inline_max: int = DEFAULT_INLINE_MAX
    chunk_size: int = DEFAULT_CHUNK_SIZE
    done_retention_steps: int = 3
    max_age_steps: int = 20
    quota_bytes: int | None = None
    max_files: int | None = None
    durability: str = "fsync"
    log_level: str = "info"
    allow_other: bool = False
    entry_timeout: float = 3600.0
    max_tasks: int = 16
    metrics_port: int | None = None
    control_idle_timeout: float = 300.0

    def validate(self) -> Config:
        def positive(name: str, value, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")

        for name in ("inline_max", "chunk_size", "done_retention_steps", "max_age_steps",
                     "max_tasks"):
            positive(name, getattr(self, name))
        for name in ("quota_bytes", "max_files", "metrics_port"):
            positive(name, getattr(self, name), allow_none=True)
        if not 4096 <= self.chunk_size <= 64 << 20:
            raise ConfigError(f"chunk_size must be between 4 KiB and 64 MiB, got {self.chunk_size}")
        if self.inline_max > self.chunk_size:
            raise ConfigError("inline_max must not exceed chunk_size")
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability must be one of {DURABILITY_MODES}, got {self.durability!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if not isinstance(self.allow_other, bool):
            raise ConfigError("allow_other must be true or false")
        if isinstance(self.entry_timeout, bool) or \
                not isinstance(self.entry_timeout, int | float) or self.entry_timeout < 0:
            raise ConfigError("entry_timeout must be a non-negative number of seconds")
        if isinstance(self.control_idle_timeout, bool) or \
                not isinstance(self.control_idle_timeout, int | float) or \
                not 0 < self.control_idle_timeout <= 86400:
            raise ConfigError("control_idle_timeout must be a number of seconds, "
                              "above 0 and at most 86400")
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be between 1 and 65535, got {self.metrics_port}")
        if self.max_tasks < 1:
            raise ConfigError("max_tasks must be at least 1")
        return self

    def as_dict(self) -> dict:
        return asdict(self)


def option_names() -> list[str]:
    return [f.name for f in fields(Config)]


def load_config(path: Path | None, overrides: dict) -> Config:
    """Defaults, then the TOML file, then command-line `overrides` (None = unset)."""
    values: dict = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        section = data.get("vfsd", data)
        known = set(option_names())
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(
                f"unknown option(s) in {path}: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        values.update(section)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Config(**values).validate()
