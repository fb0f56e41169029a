"""`make demo`: mount a run dir and use it the way an agent's shell tools would.

Creates ./demo-run, mounts vfsd on demo-run/fs, writes tool outputs and a
script with ordinary shell commands, greps and executes them, advances the
agent step so eviction runs, prints each step and what it showed, and leaves
the run dir mounted for exploring (it says how to unmount).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

VFSD = [sys.executable, "-m", "vfsd.cli"]


def sh(cmd: str, cwd: Path) -> str:
    print(f"  $ {cmd}")
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).rstrip()
    for line in out.splitlines()[:12]:
        print(f"    {line}")
    if proc.returncode != 0:
        raise SystemExit(f"demo: command failed ({proc.returncode}): {cmd}")
    return out


def vfsd(*args: str) -> str:
    proc = subprocess.run([*VFSD, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo: vfsd {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def main() -> None:
    run = Path(os.environ.get("VFSD_DEMO_DIR", "demo-run")).absolute()
    fs = run / "fs"
    if fs.is_mount() or (run / ".vfsd" / "vfsd.pid").exists():
        subprocess.run([*VFSD, "umount", str(run)], capture_output=True)
    shutil.rmtree(run, ignore_errors=True)

    print(f"1. mount a run dir: {run}")
    print("  " + vfsd("mount", str(run), "--done-retention-steps", "2", "--max-age-steps", "5").strip())

    print("\n2. a tool writes its output (step 0); the shell sees it at once")
    sh("mkdir -p tool_outputs && seq 1 200000 | sed 's/^/line /' > tool_outputs/seq.txt", fs)
    sh("printf 'INFO start\\nWARN disk 91%%\\nERROR job 42 failed\\nINFO done\\n' > tool_outputs/build.log", fs)
    sh("ls -l tool_outputs && wc -c tool_outputs/*", fs)
    sh("grep -rn ERROR tool_outputs", fs)

    print("\n3. the agent writes a script into the mount and runs it")
    sh("printf '#!/bin/sh\\necho \"lines: $(wc -l < tool_outputs/seq.txt)\"\\n' > count.sh "
       "&& chmod +x count.sh && ./count.sh", fs)

    print("\n4. per-file metadata as xattrs; mark the log done, pin the script")
    sh("setfattr -n user.vfsd.status -v done tool_outputs/build.log", fs)
    sh("setfattr -n user.vfsd.pin -v 1 count.sh", fs)
    sh("getfattr -d -m user.vfsd tool_outputs/seq.txt", fs)

    print("\n5. a reference is all graph state needs to keep")
    ref = json.loads(vfsd("ref", str(run), "tool_outputs/seq.txt"))
    print(f"    {json.dumps(ref)}  ({len(json.dumps(ref))} bytes for a "
          f"{ref['size']:,}-byte file)")

    print("\n6. a copy of the big output is deduplicated")
    sh("cp tool_outputs/seq.txt tool_outputs/seq-copy.txt", fs)
    st = json.loads(vfsd("status", str(run), "--json"))
    print(f"    logical {st['logical_bytes']:,} B, stored {st['stored_bytes']:,} B, "
          f"dedup {st['dedup_ratio']}x")

    print("\n7. the agent's steps advance; eviction follows the policy")
    for step in (3, 6):
        print("    " + vfsd("step", str(run), str(step)).strip().replace("\n", "\n    "))
    sh("ls -R", fs)

    print("\n8. what eviction removed")
    print("    " + vfsd("evicted", str(run)).strip().replace("\n", "\n    "))

    print(f"\nThe run dir stays mounted at {fs}; explore it, then unmount with:\n"
          f"  .venv/bin/vfsd umount {run}")


if __name__ == "__main__":
    main()
