#!/usr/bin/env python3
"""Make docs/timeline.png: `vfsd timeline --html` of a small agent-like run, in chromium.

    .venv/bin/python scripts/timeline_picture.py [OUT.png]

Mounts a run dir in a temporary directory, plays twelve steps of tool calls
(write_file, edit_file, execute writing build output and logs, a large output
offloaded, notes marked done and evicted, snapshots as checkpoints, one
restore), writes the timeline page and takes a headless chromium screenshot
of it. Needs root (FUSE), bubblewrap is not needed.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import mount_tool  # noqa: E402
from mount_tool.daemon import toolcalls  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=5000"]


def vfsd(*args: str) -> str:
    return subprocess.run([str(REPO / ".venv" / "bin" / "vfsd"), *args], check=True,
                          capture_output=True, text=True).stdout


def play(run: Path) -> None:
    rng = random.Random(7)
    m = mount_tool.Mount.attach(run)
    try:
        for step in range(1, 13):
            with toolcalls.running("write_file", f"call_w{step}", "thread-1"):
                m.write(f"notes/step{step:02d}.md", "note\n" * rng.randint(200, 2000))
            if step % 2 == 0:
                with toolcalls.running("edit_file", f"call_e{step}", "thread-1"):
                    m.write(f"notes/step{step - 1:02d}.md", "edited\n" * 300)
            with toolcalls.running("execute", f"call_x{step}", "thread-1"):
                for i in range(rng.randint(2, 6)):
                    m.write(f"build/obj{step}_{i}.o", os.urandom(rng.randint(50, 400) << 10))
                m.write(f"logs/run{step:02d}.log", ("line\n" * rng.randint(1000, 20000)))
            if step in (4, 9):
                with toolcalls.running("execute", f"call_big{step}", "thread-1"):
                    m.write(f"large_tool_results/call_big{step}.txt", os.urandom(3 << 20).hex())
            if step >= 3:
                os.setxattr(m.root / f"logs/run{step - 2:02d}.log", "user.vfsd.status", b"done")
            if step % 3 == 0:
                m.client.call("snapshot", label=f"thread-1 ckpt {step}")
            m.client.call("set_step", step=step)
        first = m.client.call("snapshots")["snapshots"][2]["id"]
        m.client.call("restore", snapshot=first)
        for step in range(first_step(m, first) + 1, first_step(m, first) + 3):
            with toolcalls.running("write_file", f"call_r{step}", "thread-1"):
                m.write(f"notes/retry{step:02d}.md", "retry\n" * 500)
            m.client.call("set_step", step=step)
    finally:
        m.detach()


def first_step(m, ident: str) -> int:
    return next(s["step"] for s in m.client.call("snapshots")["snapshots"] if s["id"] == ident)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "docs" / "timeline.png").resolve()
    base = Path(tempfile.mkdtemp(prefix="vfsd-timeline-"))
    run = base / "runs" / "r1"
    try:
        vfsd("mount", str(run))
        try:
            play(run)
            page = base / "timeline.html"
            vfsd("timeline", str(run), "--html", str(page))
        finally:
            vfsd("umount", str(run))
        profile = base / "profile"
        subprocess.run([shutil.which("chromium") or "chromium", *FLAGS,
                        f"--user-data-dir={profile}", "--window-size=1040,1000",
                        f"--screenshot={out}", page.as_uri()],
                       check=True, capture_output=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
