"""`vfsd config check`: validate a config file (and flags) as `vfsd mount` would."""

from __future__ import annotations

from pathlib import Path

import click

from vfsd.config import (
    RUNS_TABLE,
    ConfigError,
    file_options,
    load_config,
    read_config_file,
    runs_options,
)

from .common import EXIT_USAGE, cli, emit, fail, json_option, rows
from .options import OPTION_KEYS, config_options


@cli.group("config")
def config_group() -> None:
    """Check daemon configuration without mounting anything."""


@config_group.command("check")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@json_option
@config_options
def check(file: Path | None, as_json: bool, config_path: Path | None, **opts) -> None:
    """Validate a TOML config file and flags as `vfsd mount` does; exit 2 naming a bad key.

    FILE (or --config FILE) is read as `vfsd mount --config` reads it, with
    the flags on top; its `[runs]` table, which only a Runs
    (`mount_tool.runs(ROOT, config=FILE)`) reads, is checked too. Prints the
    options the file sets, the `[runs]` table and the resulting daemon
    configuration (`--json`: keys `file`, `options`, `runs`, `config`).
    """
    if file is not None and config_path is not None and file != config_path:
        fail("give the file once: as FILE or as --config FILE", EXIT_USAGE)
    path = file if file is not None else config_path
    try:
        data = read_config_file(path) if path is not None else {}
        options = file_options(path, data) if path is not None else {}
        runs = runs_options(path, data) if path is not None else {}
        config = load_config(path, {k: opts.get(k) for k in OPTION_KEYS})
    except (ConfigError, TypeError) as exc:
        fail(str(exc), EXIT_USAGE)
    doc = {"file": str(path) if path is not None else None, "options": options,
           "runs": runs, "config": config.as_dict()}

    def text(d: dict) -> list[str]:
        lines = [f"{d['file'] or 'no file'}: valid"]
        if d["options"]:
            lines += ["options it sets:", rows([(k, repr(v)) for k, v in
                                                   sorted(d["options"].items())])]
        if d["runs"]:
            lines += [f"[{RUNS_TABLE}] (read by a Runs only):",
                      rows([(k, repr(v)) for k, v in sorted(d["runs"].items())])]
        return lines

    emit(doc, as_json, text)
