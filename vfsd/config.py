"""Daemon configuration: defaults, TOML file, command-line overrides, validation."""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

from . import DEFAULT_CHUNK_SIZE, DEFAULT_INLINE_MAX

DURABILITY_MODES = ("fsync", "sync")
LOG_LEVELS = ("debug", "info", "warning", "error")
ADDRESSING_STYLES = ("auto", "path", "virtual")
#: what a file's age counts from: its last write or open ("use"), or its last write
AGE_FROM = ("use", "written")
_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,49}")
_PROFILE = re.compile(r"[A-Za-z0-9_.+=@-]{1,64}")


class ConfigError(ValueError):
    """A configuration file or option is wrong; the message says how."""


#: options that are byte counts: they take a number or a size with a unit
SIZE_OPTIONS = ("inline_max", "chunk_size", "quota_bytes", "remote_cache_bytes",
                "snapshot_keep_bytes")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtpe]?)(i?)(b?)\s*", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


def parse_size(value, name: str = "size") -> int:
    """Bytes from an int or text such as `65536`, `10G`, `256MiB`, `1.5 GB`.

    Units are binary whatever their spelling (`K`, `KB`, `KiB` are all 1024),
    as in `du -h` and `vfsd status`: a size read back is the size given.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a size such as 65536, 10G or 256MiB, got {value!r}")
    if isinstance(value, int):
        return value
    m = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if m is None or (m[3] and not m[2]):
        raise ConfigError(f"{name} must be a size such as 65536, 10G or 256MiB, got {value!r}")
    number = float(m[1]) * 1024 ** _SIZE_POWERS[m[2].lower()]
    if number != int(number):
        raise ConfigError(f"{name} {value!r} is not a whole number of bytes")
    return int(number)


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
    #: "use": age counts from the last step a file was written or opened;
    #: "written": from its last write only
    age_from: str = "use"
    #: ordered rules by path, the first match wins (`vfsd.evictrules`)
    eviction_rules: list = field(default_factory=list)
    #: the built-in rules after them: records agent frameworks keep
    #: (`vfsd.evictrules.BUILTIN_RULES`) are pinned; false drops them
    builtin_eviction_rules: bool = True
    durability: str = "fsync"
    log_level: str = "info"
    allow_other: bool = False
    entry_timeout: float = 3600.0
    #: seconds the write transactions of FUSE requests share one LMDB commit
    #: (`vfsd.store.groupcommit`); 0: each request commits its own
    commit_window: float = 0.005
    max_tasks: int = 16
    metrics_port: int | None = None
    #: snapshots kept: the last N, and any younger than M steps (0: no age rule);
    #: pinned ones always
    snapshot_keep_last: int = 32
    snapshot_keep_steps: int = 20
    #: the file bytes retained snapshots may record; beyond, the oldest unpinned
    #: ones go (never the newest). None: no bound
    snapshot_keep_bytes: int | None = None
    xattr_reads: bool = False
    # The object store tier (`vfsd.remote.objstore`). Endpoint and credentials come
    # from the standard AWS chain (AWS_* environment variables, ~/.aws/config
    # and credentials) unless these name them; secrets never sit in this file.
    #: s3://BUCKET/PREFIX: the run's chunks and published snapshots go there
    remote_url: str | None = None
    remote_endpoint_url: str | None = None
    remote_region: str | None = None
    remote_profile: str | None = None
    remote_credentials_file: str | None = None
    remote_addressing_style: str = "auto"
    remote_connect_timeout: float = 5.0
    remote_read_timeout: float = 30.0
    remote_max_attempts: int = 5
    remote_retry_base_delay: float = 0.1
    remote_retry_max_delay: float = 10.0
    remote_workers: int = 8
    remote_upload_queue: int = 4096
    remote_fetch_timeout: float = 30.0
    remote_readahead_chunks: int = 4
    remote_cache_bytes: int | None = None
    remote_lease_ttl: float = 30.0
    control_idle_timeout: float = 300.0
    #: seconds `vfsd mount` waits for another worker's lease to lapse (None: ttl + 5)
    remote_lease_wait: float | None = None
    #: a full manifest every N publications (deltas in between)
    remote_full_every: int = 16
    #: chunks younger than this are never deleted by `vfsd gc --remote`
    remote_gc_grace: float = 3600.0

    def validate(self) -> Config:
        def positive(name: str, value, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")

        for name in ("inline_max", "chunk_size", "done_retention_steps", "max_age_steps",
                     "max_tasks", "snapshot_keep_last", "snapshot_keep_steps"):
            positive(name, getattr(self, name))
        for name in ("quota_bytes", "max_files", "metrics_port", "snapshot_keep_bytes"):
            positive(name, getattr(self, name), allow_none=True)
        if not 4096 <= self.chunk_size <= 64 << 20:
            raise ConfigError(f"chunk_size must be between 4 KiB and 64 MiB, got {self.chunk_size}")
        if self.inline_max > self.chunk_size:
            raise ConfigError("inline_max must not exceed chunk_size")
        if self.age_from not in AGE_FROM:
            raise ConfigError(f"age_from must be one of {AGE_FROM}, got {self.age_from!r}")
        from .evictrules import RuleError, parse_rules

        try:
            parse_rules(self.eviction_rules)
        except RuleError as exc:
            raise ConfigError(str(exc)) from None
        self.eviction_rules = list(self.eviction_rules or [])
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability must be one of {DURABILITY_MODES}, got {self.durability!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if not isinstance(self.allow_other, bool):
            raise ConfigError("allow_other must be true or false")
        if not isinstance(self.xattr_reads, bool):
            raise ConfigError("xattr_reads must be true or false")
        if not isinstance(self.builtin_eviction_rules, bool):
            raise ConfigError("builtin_eviction_rules must be true or false")
        if isinstance(self.entry_timeout, bool) or \
                not isinstance(self.entry_timeout, int | float) or self.entry_timeout < 0:
            raise ConfigError("entry_timeout must be a non-negative number of seconds")
        if isinstance(self.commit_window, bool) or \
                not isinstance(self.commit_window, int | float) or \
                not 0 <= self.commit_window <= 1:
            raise ConfigError("commit_window must be 0 to 1 second")
        if isinstance(self.control_idle_timeout, bool) or \
                not isinstance(self.control_idle_timeout, int | float) or \
                not 0 < self.control_idle_timeout <= 86400:
            raise ConfigError("control_idle_timeout must be a number of seconds, "
                              "above 0 and at most 86400")
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be between 1 and 65535, got {self.metrics_port}")
        if self.max_tasks < 1:
            raise ConfigError("max_tasks must be at least 1")
        self._validate_remote()
        return self

    def _validate_remote(self) -> None:
        def number(name: str, low: float, high: float) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not low <= value <= high:
                raise ConfigError(f"{name} must be a number of seconds from {low} to {high}, "
                                  f"got {value!r}")

        def integer(name: str, low: int, high: int, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name} must be an integer from {low} to {high}, got {value!r}")

        def text(name: str, pattern: re.Pattern, what: str) -> None:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not pattern.fullmatch(value)):
                raise ConfigError(f"{name} must be {what}, got {value!r}")

        if self.remote_url is not None:
            from vfsd.remote.objstore import BadRemoteURL, RemoteURL

            try:
                RemoteURL.parse(self.remote_url)
            except BadRemoteURL as exc:
                raise ConfigError(f"remote_url: {exc}") from None
        if self.remote_endpoint_url is not None:
            check_endpoint_url(self.remote_endpoint_url)
        text("remote_region", _REGION, "an AWS-style region name such as us-east-1")
        text("remote_profile", _PROFILE, "a profile name from ~/.aws/config (letters, digits, _.+=@-)")
        path = self.remote_credentials_file
        if path is not None and (not isinstance(path, str) or not path or "\0" in path):
            raise ConfigError(f"remote_credentials_file must be a file path, got {path!r}")
        if self.remote_addressing_style not in ADDRESSING_STYLES:
            raise ConfigError(f"remote_addressing_style must be one of {ADDRESSING_STYLES}, "
                              f"got {self.remote_addressing_style!r}")
        number("remote_connect_timeout", 0.1, 300)
        number("remote_read_timeout", 0.1, 3600)
        integer("remote_max_attempts", 1, 100)
        number("remote_retry_base_delay", 0.001, 60)
        number("remote_retry_max_delay", 0.001, 3600)
        if self.remote_retry_max_delay < self.remote_retry_base_delay:
            raise ConfigError("remote_retry_max_delay must not be below remote_retry_base_delay")
        integer("remote_workers", 1, 256)
        integer("remote_upload_queue", 1, 1_000_000)
        number("remote_fetch_timeout", 0.1, 3600)
        integer("remote_readahead_chunks", 0, 256)
        integer("remote_cache_bytes", 0, 1 << 60, allow_none=True)
        if self.remote_cache_bytes is not None and self.remote_cache_bytes < 4 * self.chunk_size:
            raise ConfigError(f"remote_cache_bytes must hold at least 4 chunks "
                              f"({4 * self.chunk_size} bytes), got {self.remote_cache_bytes}")
        number("remote_lease_ttl", 5, 3600)
        if self.remote_lease_wait is not None:
            number("remote_lease_wait", 0, 86400)
        integer("remote_full_every", 1, 100_000)
        number("remote_gc_grace", 1, 365 * 86400)

    @property
    def lease_wait(self) -> float:
        """How long a mount waits for another worker's lease to lapse."""
        if self.remote_lease_wait is not None:
            return float(self.remote_lease_wait)
        return self.remote_lease_ttl + 5.0

    def as_dict(self) -> dict:
        return asdict(self)


def check_endpoint_url(url) -> str:
    """`url` if it is a plain http(s)://HOST[:PORT][/PATH] endpoint, else ConfigError."""
    name = "remote_endpoint_url"
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise ConfigError(f"{name} must be an http:// or https:// URL, got {url!r}")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ConfigError(f"{name} must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{name} {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{name} must start with http:// or https://, got {url!r}")
    if not parts.hostname:
        raise ConfigError(f"{name} {url!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{name} must not carry credentials (user:password@); use the AWS "
                          "environment variables, a profile or remote_credentials_file")
    if parts.query or parts.fragment:
        raise ConfigError(f"{name} must not have a query or fragment, got {url!r}")
    if port == 0:
        raise ConfigError(f"{name} has port 0")
    return url


def option_names() -> list[str]:
    return [f.name for f in fields(Config)]


#: the table of a config file only a Runs (mount_tool.runs) reads; `vfsd mount` skips it
RUNS_TABLE = "runs"
#: keys of that table, with what each takes
RUNS_OPTIONS = {"shards": "the number of shard daemons new threads spread over (1 to 4096)"}
#: Runs options of the earlier layout, which no config file sets any more
_RUNS_RETIRED = {
    "max_mounted": "a Runs mounts a few shards, not a run dir per thread: nothing to bound",
    "idle_timeout": "a Runs mounts a few shards, not a run dir per thread: nothing to unmount",
}


def read_config_file(path: Path) -> dict:
    """The TOML document of a config file; ConfigError naming the file when it
    cannot be read or parsed."""
    import tomllib  # only here: a daemon gets its config as JSON

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:  # unreadable, a directory, a loop of symlinks...
        raise ConfigError(f"config file {path} cannot be read: "
                          f"{exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def file_options(path: Path, data: dict | None = None) -> dict:
    """The daemon options a config file sets, sizes in bytes (not validated
    together: `load_config` does that). Its `[vfsd]` table, else its top level
    but the `[runs]` table."""
    if data is None:
        data = read_config_file(path)
    section = data["vfsd"] if "vfsd" in data else \
        {k: v for k, v in data.items() if k != RUNS_TABLE}
    if not isinstance(section, dict):
        raise ConfigError(f"[vfsd] in {path} must be a table of options")
    known = set(option_names())
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"unknown option(s) in {path}: "
                          + "; ".join(_unknown_key(k, known) for k in unknown))
    values = dict(section)
    for name in SIZE_OPTIONS:
        if values.get(name) is not None:
            values[name] = parse_size(values[name], name)
    return values


def runs_options(path: Path, data: dict | None = None) -> dict:
    """The `[runs]` table of a config file, checked: what only a Runs reads
    (`shards`). {} when the file has none."""
    if data is None:
        data = read_config_file(path)
    table = data.get(RUNS_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{RUNS_TABLE} in {path} must be a table ([{RUNS_TABLE}]), "
                          f"got {table!r}")
    for key in sorted(table):
        if key in _RUNS_RETIRED:
            raise ConfigError(f"[{RUNS_TABLE}] {key} in {path} is no longer used: "
                              f"{_RUNS_RETIRED[key]}; remove it")
        if key not in RUNS_OPTIONS:
            hint = _unknown_key(key, set(RUNS_OPTIONS)).replace(
                "(see systemd/vfsd.toml.example for every option)",
                f"(the [{RUNS_TABLE}] table takes {', '.join(sorted(RUNS_OPTIONS))}; daemon "
                "options go at the top level)")
            raise ConfigError(f"unknown option in [{RUNS_TABLE}] of {path}: {hint}")
    shards = table.get("shards")
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                               or not 1 <= shards <= 4096):
        raise ConfigError(f"[{RUNS_TABLE}] shards must be an integer from 1 to 4096, "
                          f"got {shards!r}")
    return dict(table)


def load_config(path: Path | None, overrides: dict) -> Config:
    """Defaults, then the TOML file, then command-line `overrides` (None = unset)."""
    values: dict = {}
    if path is not None:
        values.update(file_options(path))
    values.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(values.get("eviction_rules"), str):  # from the command line: JSON
        import json

        try:
            values["eviction_rules"] = json.loads(values["eviction_rules"])
        except ValueError as exc:
            raise ConfigError(f"eviction_rules is not valid JSON ({exc}): give a list such as "
                              '[{"path": "tool_outputs/**", "max_age_steps": 5}]') from None
    for name in SIZE_OPTIONS:
        if values.get(name) is not None:
            values[name] = parse_size(values[name], name)
    return Config(**values).validate()


def _unknown_key(key: str, known: set[str]) -> str:
    """`key`, with the known option it most likely meant."""
    close = difflib.get_close_matches(key.replace("-", "_"), sorted(known), n=1, cutoff=0.6)
    return f"{key!r} (did you mean {close[0]!r}?)" if close else \
        f"{key!r} (see systemd/vfsd.toml.example for every option)"
