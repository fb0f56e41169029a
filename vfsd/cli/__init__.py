"""The `vfsd` command line: one module per verb (or family of verbs).

`common` holds the click group and what every verb shares; importing a verb
module registers its commands on the group. `spawner` runs verbs (and the
daemons `mount` starts) by forking one warm process, for mount_tool.

Conventions (every verb follows them; tests/test_cli.py checks the first four
for every command):

- **A one-line summary.** The docstring's first sentence is the verb's line in
  `vfsd --help`, shown whole (never cut): say what it does in one sentence.
- **Help on every option**, with the default in brackets (`[60]`) or
  `show_default=True`. `-h` and `--help` both work, on the group and every verb.
- **Text by default, `--json` on every verb.** Text is for people: aligned
  `key  value` rows or one line per item, sizes through `human()` (binary
  units: KiB, MiB), times as local dates or "N s". `--json` (`json_option`)
  prints one JSON document with the same facts and stable keys instead; print
  through `emit(doc, as_json, text)` so both stay one code path. A verb whose
  answer is itself a JSON document (`vfsd ref`) prints it compact as text and
  indented with `--json`.
- **Errors on stderr, never on stdout:** `fail(message, code)` prints
  `vfsd: message` and exits. Exit codes (`EXIT_*` below): 0 done, 1 failed,
  2 bad input (click's usage errors too), and the verb-specific ones listed
  there (each documented in the command table of docs/operations.md and tested). A warning
  that does not change the outcome goes to stderr too (`warn`).
- **Inputs as a tired user types them:** sizes take units (`SIZE`, `10G`,
  `256MiB`); paths inside the mount may be relative to its root or absolute.
- **Progress bars** (`progress`, `phase_progress` for work in phases) only
  when stderr is a terminal and `--json` is off, so scripts and logs never see
  them; a daemon's start-up tells its progress on the ready pipe (`PROGRESS`).
- **Light imports:** verb modules import `vfsd.control.client`, `rundir`,
  `config` and `common`; the store, snapshots, remote and daemon layers are
  imported inside the function that needs them, so `vfsd --help` and the verbs
  that only talk to a daemon start fast (tests/test_layers.py checks it).
"""

from __future__ import annotations

from . import (  # noqa: F401  (registers the verbs)
    configcheck,
    eviction,
    fsck,
    gc,
    info,
    lifecycle,
    mount,
    profile,
    ref,
    remote,
    snapshots,
    stats,
    status,
    sync,
    threads,
    timeline,
    unevict,
    warmup,
)
from .common import cli


def main() -> None:
    cli(prog_name="vfsd")
