"""Entry point of the background daemon process started by `vfsd mount`.

    python -m vfsd.serve SPEC_JSON

SPEC_JSON is one JSON object, written by `vfsd mount` (never by hand):
{"run_dir", "store", "volume", "config" (a Config as a dict), "ready_fd"
(int or null: where READY or ERROR is written), "resume_from" (or null),
"shard" (true: serve every volume of the store, see `vfsd.shard`)}.
It loads only what a daemon needs: no argument parser, no click.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# structlog imports rich (and pygments) when they are installed, for console
# tracebacks a daemon never prints: ~7 MiB of memory and ~80 ms of every start.
sys.modules.setdefault("rich", None)  # type: ignore[assignment]

from .config import Config  # noqa: E402
from .daemon import run_daemon  # noqa: E402
from .rundir import RunDir  # noqa: E402


def serve(spec: dict) -> int:
    """Run the daemon `spec` describes (see the module docstring) until unmounted."""
    config = Config(**spec["config"]).validate()
    if spec.get("shard"):
        from .shard import run_shard

        return run_shard(RunDir(Path(spec["run_dir"])), config, Path(spec["store"]),
                         ready_fd=spec.get("ready_fd"))
    return run_daemon(RunDir(Path(spec["run_dir"])), config, Path(spec["store"]),
                      spec["volume"], ready_fd=spec.get("ready_fd"),
                      resume_from=spec.get("resume_from"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m vfsd.serve SPEC_JSON (started by `vfsd mount`)", file=sys.stderr)
        return 2
    return serve(json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
