"""What the execute sandbox costs per call: isolated against unisolated, same run.

A vfsd run dir is mounted through the real CLI; the same commands then run through
`VfsdBackend.execute` three ways, interleaved call by call so load on the machine
hits all three alike:

- `plain`: `bash -c CMD` in the mount root with subprocess.run and the sandbox's
  PATH, nothing else (about what `execute` did before it was sandboxed);
- `none`: `VfsdBackend(isolation="none")`: no namespaces, but the per-call cgroup,
  rlimits, environment allowlist and output capture;
- `bwrap`: `VfsdBackend()`, the default: all of the above inside bubblewrap.

Each figure is the median wall time of one `execute` call, seen by the caller.
The ratios are bwrap / none (what the namespaces add) and bwrap / plain (what the
whole sandbox adds).

    .venv/bin/python bench/execute_bench.py [--calls 40] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    VfsdMount,
    add_run_options,
    machine_info,
    print_machine,
    rmtree_quiet,
    summary,
    wait_for_quiet,
)

import mount_tool  # noqa: E402
from mount_tool.deepagents import VfsdBackend  # noqa: E402
from mount_tool.sandbox import SANDBOX_PATH  # noqa: E402

COMMANDS = {
    "true": "true",
    "echo + ls": "echo hello && ls data | head -3",
    "python3 -c pass": "python3 -c pass",
    "wc -l 4 MiB file": "wc -l data/big.txt",
}


# The sandbox's PATH for all three: the host's may put slower shims first (pyenv).
PLAIN_ENV = {"PATH": SANDBOX_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}


def plain_call(root: Path, command: str) -> None:
    proc = subprocess.run(
        ["bash", "-c", command], cwd=root, env=PLAIN_ENV, capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{command!r}: {proc.stderr!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_options(ap)
    ap.add_argument("--calls", type=int, default=40, help="calls per command and mode")
    args = ap.parse_args()
    if args.wait_quiet:
        wait_for_quiet(args.wait_quiet, 1800)
    base = Path(tempfile.mkdtemp(prefix="vfsd-execbench-", dir=args.base_dir))
    run = VfsdMount(base / "run", tuple(args.vfsd_opt))
    info = machine_info(base)
    results: dict = {"machine": info, "calls": args.calls, "figures": {}}
    try:
        run.mount()
        mnt = mount_tool.Mount.attach(run.run_dir)
        (run.root / "data").mkdir()
        (run.root / "data" / "big.txt").write_text("a line of tool output\n" * 190_000)
        for i in range(20):
            (run.root / "data" / f"f{i:02d}.txt").write_text("x\n")
        isolated = VfsdBackend(mnt)
        unisolated = VfsdBackend(mnt, isolation="none")
        results["sandbox"] = isolated.sandbox_info()
        modes = {
            "plain": lambda cmd: plain_call(run.root, cmd),
            "none": lambda cmd: _check(unisolated.execute(cmd), cmd),
            "bwrap": lambda cmd: _check(isolated.execute(cmd), cmd),
        }
        for name, command in COMMANDS.items():
            samples: dict[str, list[float]] = {mode: [] for mode in modes}
            for call in modes.values():  # warm-up: caches, first cgroup
                call(command)
            for i in range(args.calls):
                order = list(modes.items())
                if i % 2:
                    order.reverse()
                for mode, call in order:
                    start = time.perf_counter()
                    call(command)
                    samples[mode].append(time.perf_counter() - start)
            results["figures"][name] = {mode: summary(s) for mode, s in samples.items()}
            print(f"{name}: done", file=sys.stderr)
        mnt.detach()
    finally:
        try:
            run.umount()
        except Exception:  # noqa: BLE001 - best effort after a failure
            run.force_cleanup()
        if not args.keep:
            rmtree_quiet(base)
    results["loadavg_at_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    if args.json:
        text = json.dumps(results, indent=2)
        if args.json == "-":
            print(text)
            return 0
        Path(args.json).write_text(text)
    print_machine(info)
    limits = results["sandbox"]["limits"]
    print(
        "sandbox: "
        + ", ".join(f"{k} by {v['enforced_by']}" for k, v in limits.items())
        + f"; load average at end {results['loadavg_at_end']}"
    )
    print()
    print(f"| command (median of {args.calls} calls) | plain | none | bwrap | bwrap / none "
          "| bwrap / plain |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, fig in results["figures"].items():
        p, n, b = (fig[m]["median"] * 1000 for m in ("plain", "none", "bwrap"))
        print(f"| `{name}` | {p:.1f} ms | {n:.1f} ms | {b:.1f} ms | {b / n:.2f}x | {b / p:.2f}x |")
    return 0


def _check(response, command: str) -> None:
    if response.exit_code != 0:
        raise RuntimeError(f"{command!r} exited {response.exit_code}: {response.output[:500]}")


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("note: not root; cgroup limits may be unavailable", file=sys.stderr)
    sys.exit(main())
