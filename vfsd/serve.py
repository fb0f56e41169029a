"""Entry point of the background daemon process started by `vfsd mount`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import Config
from .daemon import run_daemon
from .rundir import RunDir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vfsd-serve", description=__doc__)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--store", required=True, type=Path)
    p.add_argument("--volume", required=True)
    p.add_argument("--config-json", required=True)
    p.add_argument("--ready-fd", type=int)
    p.add_argument("--resume-from")
    args = p.parse_args(argv)
    config = Config(**json.loads(args.config_json)).validate()
    return run_daemon(RunDir(args.run_dir), config, args.store, args.volume,
                      ready_fd=args.ready_fd, resume_from=args.resume_from)


if __name__ == "__main__":
    sys.exit(main())
