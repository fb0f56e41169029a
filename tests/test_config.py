"""Configuration: one TOML file and command-line flags for every option, clear
errors at start, and a documented example whose defaults are the real ones.

Bad configurations are fed to the real `vfsd mount`; good ones are mounted and
read back from the running daemon (`vfsd status --json` reports its config).
"""

from __future__ import annotations

import json
import re
import socket
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import is_mounted, vfsd_cli

from vfsd.config import Config, load_config, option_names

EXAMPLE = Path(__file__).resolve().parent.parent / "systemd" / "vfsd.toml.example"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def write_toml(path: Path, options: dict, table: str | None = None) -> Path:
    lines = [f"[{table}]"] if table else []
    lines += [f"{key} = {toml_value(value)}" for key, value in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def cli_flags(options: dict) -> list[str]:
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def non_defaults(alt: bool = False) -> dict:
    """A value for every option, none of them the default (two distinct sets)."""
    values = {
        "inline_max": 4096 if alt else 8192,
        "chunk_size": 131072 if alt else 262144,
        "done_retention_steps": 7 if alt else 5,
        "max_age_steps": 60 if alt else 40,
        "quota_bytes": (2 << 30) if alt else (1 << 30),
        "max_files": 7000 if alt else 5000,
        "age_from": "written",
        "eviction_rules": [{"path": "a/**", "pin": True}] if alt else
        [{"path": "tool_outputs/**", "max_age_steps": 5}, {"path": "s/*.tmp",
                                                          "done_retention_steps": 0}],
        "builtin_eviction_rules": False,
        "durability": "sync",
        "log_level": "warning" if alt else "debug",
        "allow_other": not alt,
        "entry_timeout": 7.5 if alt else 2.5,
        "commit_window": 0.02 if alt else 0.0,
        "max_tasks": 4 if alt else 8,
        "metrics_port": free_port(),
        "xattr_reads": not alt,
        "snapshot_keep_last": 8 if alt else 16,
        "snapshot_keep_steps": 5 if alt else 10,
        "snapshot_keep_bytes": (3 << 30) if alt else (2 << 30),
        "remote_url": "s3://other-bucket/p" if alt else "s3://a-bucket/runs",
        "remote_endpoint_url": "http://127.0.0.1:9" if alt else "https://s3.example.com",
        "remote_region": "eu-west-3" if alt else "eu-central-1",
        "remote_profile": "other" if alt else "vfsd",
        "remote_credentials_file": "/nowhere/b" if alt else "/nowhere/a",
        "remote_addressing_style": "virtual" if alt else "path",
        "remote_connect_timeout": 2.5 if alt else 1.5,
        "remote_read_timeout": 12.5 if alt else 7.5,
        "remote_max_attempts": 2 if alt else 3,
        "remote_retry_base_delay": 0.25 if alt else 0.5,
        "remote_retry_max_delay": 2.0 if alt else 4.0,
        "remote_workers": 3 if alt else 2,
        "remote_upload_queue": 16 if alt else 32,
        "remote_fetch_timeout": 3.5 if alt else 4.5,
        "remote_readahead_chunks": 2 if alt else 8,
        "remote_cache_bytes": (3 << 30) if alt else (1 << 30),
        "remote_lease_ttl": 12.0 if alt else 20.0,
        "remote_lease_wait": 3.0 if alt else 7.0,
        "remote_full_every": 4 if alt else 8,
        "remote_gc_grace": 60.0 if alt else 600.0,
        "control_idle_timeout": 45.0 if alt else 30.0,
    }
    assert set(values) == set(option_names()), "a new option needs a test value here"
    defaults = Config().as_dict()
    assert not alt or all(values[k] != defaults[k] for k in values
                          if k not in ("allow_other", "xattr_reads", "age_from"))
    return values


# -------------------------------------------------------------- errors at start


def mount_fails(tmp_path: Path, *args: str):
    run_dir = tmp_path / "run"
    proc = vfsd_cli("mount", run_dir, *args, check=False)
    try:
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert not run_dir.exists(), "a rejected configuration must not touch the run dir"
    finally:
        if is_mounted(run_dir / "fs"):
            vfsd_cli("umount", run_dir, check=False)
    return proc


def test_unknown_key_is_named(tmp_path: Path):
    bad = write_toml(tmp_path / "bad.toml", {"inline_max": 4096, "chunk_sise": 65536})
    proc = mount_fails(tmp_path, "--config", bad)
    assert "chunk_sise" in proc.stderr
    assert "inline_max" not in proc.stderr.split("known:")[0]


def test_unknown_key_in_vfsd_table_is_named(tmp_path: Path):
    bad = write_toml(tmp_path / "bad.toml", {"evict_after": 3}, table="vfsd")
    assert "evict_after" in mount_fails(tmp_path, "--config", bad).stderr


@pytest.mark.parametrize(
    "key, value",
    [
        ("durability", "never"),
        ("chunk_size", "big"),
        ("chunk_size", 1024),  # below 4 KiB
        ("inline_max", -1),
        ("inline_max", 2 << 20),  # larger than chunk_size
        ("allow_other", "yes"),
        ("log_level", "loud"),
        ("entry_timeout", "soon"),
        ("commit_window", 2),
        ("commit_window", -0.001),
        ("max_tasks", 0),
        ("quota_bytes", -5),
        ("max_files", 1.5),
        ("done_retention_steps", True),
        ("max_age_steps", "20"),
        ("metrics_port", 70000),
        ("remote_endpoint_url", "ftp://example.com"),
        ("remote_endpoint_url", "http://key:secret@example.com"),
        ("remote_endpoint_url", "http://example.com/?x=1"),
        ("remote_endpoint_url", "http://"),
        ("remote_region", "Not A Region"),
        ("remote_profile", "bad profile"),
        ("remote_addressing_style", "dns"),
        ("remote_connect_timeout", 0),
        ("remote_read_timeout", "30"),
        ("remote_max_attempts", 0),
        ("remote_retry_max_delay", 0.01),  # below the base delay
        ("remote_workers", 1000),
        ("remote_upload_queue", 0),
        ("remote_fetch_timeout", -1),
        ("remote_readahead_chunks", -1),
        ("remote_cache_bytes", 4096),  # less than 4 chunks
        ("remote_lease_ttl", 1),
        ("remote_url", "http://bucket/x"),
        ("remote_url", "s3://Bad_Bucket/x"),
        ("remote_url", "s3://bucket/a/../b"),
        ("remote_lease_wait", -1),
        ("remote_full_every", 0),
        ("remote_gc_grace", 0.5),
    ],
)
def test_bad_value_is_named(tmp_path: Path, key: str, value):
    bad = write_toml(tmp_path / "bad.toml", {key: value})
    assert key in mount_fails(tmp_path, "--config", bad).stderr


def test_invalid_toml_is_reported(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("inline_max = = 3\n")
    proc = mount_fails(tmp_path, "--config", bad)
    assert "bad.toml" in proc.stderr and "TOML" in proc.stderr


def test_missing_config_file_is_reported(tmp_path: Path):
    proc = mount_fails(tmp_path, "--config", tmp_path / "nowhere.toml")
    assert "nowhere.toml" in proc.stderr


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--chunk-size", "1000"], "chunk_size"),
        (["--max-tasks", "0"], "max_tasks"),
        (["--durability", "never"], "--durability"),
        (["--inline-max", "lots"], "--inline-max"),
    ],
)
def test_bad_flag_is_named(tmp_path: Path, flags: list[str], named: str):
    assert named in mount_fails(tmp_path, *flags).stderr


# ------------------------------------------------------- every option, both ways


def without_remote(values: dict) -> dict:
    """The options minus `remote_url`: a mount with it would reach for the bucket
    (tests/test_remote_tier.py mounts with one, on a real object store)."""
    return {k: v for k, v in values.items() if k != "remote_url"}


@pytest.mark.fuse
def test_every_option_from_the_file(tmp_path: Path, run_factory):
    wanted = without_remote(non_defaults())
    config = write_toml(tmp_path / "vfsd.toml", wanted)
    run = run_factory("from-file", "--config", str(config))
    assert run.status()["config"] == {**wanted, "remote_url": None}


@pytest.mark.fuse
def test_every_option_from_flags_and_flags_win_over_the_file(tmp_path: Path, run_factory):
    wanted = without_remote(non_defaults())
    other = without_remote(non_defaults(alt=True))
    config = write_toml(tmp_path / "vfsd.toml", other)
    run = run_factory("from-flags", "--config", str(config), *cli_flags(wanted))
    assert run.status()["config"] == {**wanted, "remote_url": None}


def test_remote_url_from_the_file_and_the_flag():
    values = non_defaults()
    assert load_config(None, {"remote_url": values["remote_url"]}).remote_url == \
        "s3://a-bucket/runs"


@pytest.mark.fuse
def test_no_file_no_flags_means_defaults(run):
    assert run.status()["config"] == Config().as_dict()


# ------------------------------------------------------------ the documented example


def test_example_documents_every_option_with_its_default():
    text = EXAMPLE.read_text()
    parsed = tomllib.loads(text)
    for field in fields(Config):
        default = getattr(Config(), field.name)
        if default is None:
            # TOML has no null: an option without a default is shown commented out.
            assert field.name not in parsed, f"{field.name} has no default; comment it out"
            assert re.search(rf"^# {field.name} = \S", text, re.M), (
                f"{field.name} is not shown in the example"
            )
        else:
            assert field.name in parsed, f"{field.name} is missing from the example"
            assert parsed[field.name] == default and type(parsed[field.name]) is type(default), (
                f"{field.name}: example says {parsed[field.name]!r}, default is {default!r}"
            )
    assert set(parsed) <= set(option_names())


def test_example_loads_as_the_defaults():
    assert load_config(EXAMPLE, {}) == Config()


def test_example_commented_options_are_valid_when_uncommented(tmp_path: Path):
    text = re.sub(r"^# (\w+ = \S.*)$", r"\1", EXAMPLE.read_text(), flags=re.M)
    uncommented = tmp_path / "all.toml"
    uncommented.write_text(text)
    config = load_config(uncommented, {})
    assert all(getattr(config, name) is not None for name in option_names())


def test_fsck_of_a_directory_without_a_store_changes_nothing(tmp_path: Path):
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = vfsd_cli("fsck", plain, check=False)
    assert proc.returncode != 0 and "no vfsd store" in proc.stderr
    assert list(plain.iterdir()) == []  # no store was made on the way


def test_unreadable_config_file_is_reported(tmp_path: Path):
    """An OSError other than "not found" (here a loop of symlinks; unreadable
    or a directory alike) is a message and exit 2, not a traceback."""
    loop = tmp_path / "loop.toml"
    loop.symlink_to(loop)
    proc = mount_fails(tmp_path, "--config", loop)
    assert "loop.toml" in proc.stderr and "cannot be read" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The same for commands that only read the remote settings from it.
    proc = vfsd_cli("gc", "--remote", "s3://bucket/prefix", "--config", loop, check=False)
    assert proc.returncode == 2 and "cannot be read" in proc.stderr, proc.stderr
