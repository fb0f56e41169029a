"""A Runs' configuration file: the TOML `vfsd mount --config` reads, checked by vfsd itself.

    runs = mount_tool.runs(ROOT, config="vfsd.toml")   # or VFSD_CONFIG=vfsd.toml

The file's daemon options (eviction, rules, retention, quotas, ...: every key
of `vfsd mount --config`) apply to every shard, hence to every thread; its
`[runs]` table holds what only a Runs reads (`shards`). mount_tool imports
nothing of vfsd, so the file is read and validated by `vfsd config check
--json`, the daemon's own code: a bad key or value fails the Runs where it is made,
naming the key and the file, before any thread runs. The values it returns
become the shards' flags, so every shard (and a shard started again after it
died) runs with what was checked, whatever happens to the file later.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..daemon.spawn import mount_flags, vfsd_command
from ..errors import MountToolError

#: the environment variable a Runs reads its config file from when `config=` is not given
CONFIG_ENV = "VFSD_CONFIG"
#: seconds `vfsd config check` may take
CHECK_TIMEOUT = 120.0


class RunsConfigError(MountToolError, ValueError):
    """A Runs' config file (or an option given with it) that vfsd refuses."""


@dataclass(frozen=True)
class RunsConfig:
    """What a config file sets: `options` (daemon options, sizes in bytes) and
    `runs` (its `[runs]` table)."""

    path: Path
    options: dict[str, Any] = field(default_factory=dict)
    runs: dict[str, Any] = field(default_factory=dict)


def config_path(config: str | os.PathLike[str] | None) -> Path | None:
    """The config file a Runs reads: `config`, else $VFSD_CONFIG, else none
    (absolute: the working directory may change)."""
    if config is None:
        config = os.environ.get(CONFIG_ENV) or None
    if config is None:
        return None
    if isinstance(config, str | os.PathLike) and os.fspath(config):
        return Path(os.path.abspath(config))
    raise RunsConfigError(f"config must be the path of a TOML file, not {config!r}")


def load(path: Path, options: Mapping[str, Any]) -> RunsConfig:
    """The file at `path`, checked with `options` (the Runs' own keyword
    options) on top, as `vfsd mount --config path` with those flags would.
    RunsConfigError with vfsd's message (it names the key) otherwise."""
    proc = vfsd_command("config", "check", str(path), "--json", *mount_flags(options),
                        timeout=CHECK_TIMEOUT)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        # click's usage errors (a keyword option it refuses) come with lines for a terminal.
        usage = any(line.startswith("Usage: ") for line in lines)
        message = " ".join(line.removeprefix("vfsd: ").removeprefix("Error: ").strip()
                           for line in lines if line.strip() and
                           not line.startswith(("Usage: ", "Try '")))
        where = f"the options given with config file {path}: " if usage else \
            "" if str(path) in message else f"config file {path}: "
        raise RunsConfigError(f"{where}{message}")
    try:
        doc = json.loads(proc.stdout)
        return RunsConfig(path, dict(doc["options"]), dict(doc["runs"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise RunsConfigError(f"vfsd config check {path} answered nonsense: {exc}") from None
