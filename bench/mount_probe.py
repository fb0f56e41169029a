"""Mount and unmount run dirs the ways a program can, timing each; one JSON line out.

Run by `startup_bench.py` in a fresh interpreter with one source tree first on
sys.path (`python bench/mount_probe.py SRC BASE ROUNDS`), so the tree being
replaced and the current one are measured by the same code in the same run.
Every figure runs from the caller's call to a mount that answers (statvfs,
which the kernel never answers from its caches).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time


def memory(pid: int) -> dict[str, int]:
    """KiB: RssAnon (every anonymous page mapped, shared ones too), Pss_Anon
    (shared pages divided among their users) and Private_Dirty."""
    status = open(f"/proc/{pid}/status").read()
    out = {"RssAnon": int(re.search(r"RssAnon:\s+(\d+)", status).group(1))}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        key, _, rest = line.partition(":")
        if key in ("Pss_Anon", "Private_Dirty"):
            out[key] = int(rest.split()[0])
    return out


def pid_of(run_dir: str) -> int:
    return int(open(os.path.join(run_dir, ".vfsd", "vfsd.pid")).read())


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def daemon_start(src: str, run_dir: str) -> float:
    """The daemon alone: `python -m vfsd.serve` started, until it says READY."""
    os.makedirs(os.path.join(run_dir, ".vfsd"), exist_ok=True)
    config = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from vfsd.config import Config; "
         "print(json.dumps(Config().validate().as_dict()))"],
        capture_output=True, text=True, check=True).stdout)
    rfd, wfd = os.pipe()
    store = os.path.join(run_dir, ".vfsd")
    if "SPEC_JSON" in open(os.path.join(src, "vfsd", "serve.py")).read():
        spec = {"run_dir": run_dir, "store": store, "volume": "default", "config": config,
                "ready_fd": wfd, "resume_from": None}
        args = [json.dumps(spec)]
    else:  # the flags of the version before
        args = ["--run-dir", run_dir, "--store", store, "--volume", "default",
                "--config-json", json.dumps(config), "--ready-fd", str(wfd)]
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "vfsd.serve", *args], pass_fds=(wfd,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        said = r.readline()
    os.statvfs(os.path.join(run_dir, "fs"))
    took = time.perf_counter() - start
    if not said.startswith(b"READY"):
        raise RuntimeError(f"the daemon said {said!r}")
    for _attempt in range(50):  # busy while something else on the machine walks it
        if subprocess.run(["fusermount3", "-u", os.path.join(run_dir, "fs")],
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        subprocess.run(["fusermount3", "-u", "-z", os.path.join(run_dir, "fs")], check=True)
    proc.wait(timeout=60)
    return took


def main() -> None:
    src, base, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t0 = time.perf_counter()
    import mount_tool

    out: dict = {"import_mount_tool": time.perf_counter() - t0, "helper": None}
    for key in ("mount_tool", "mount_tool_umount", "cli", "cli_umount", "daemon",
                "imports", "mem_mount_tool", "mem_cli"):
        out[key] = []
    vfsd = [sys.executable, "-m", "vfsd.cli"]
    for i in range(rounds + 1):
        # mount_tool.mount(): with the helper where this version has one. The
        # first call starts the helper; it is reported apart.
        rd = os.path.join(base, f"mt{i}")
        m = None

        def do_mount(rd=rd):
            nonlocal m
            m = mount_tool.mount(rd)
            os.statvfs(m.root)

        took = timed(do_mount)
        if i == 0:
            out["mount_tool_first"] = took
        else:
            out["mount_tool"].append(took)
        time.sleep(1.0)  # idle
        out["mem_mount_tool"].append(memory(pid_of(rd)))
        spawn = getattr(mount_tool, "spawn", None)
        if spawn is not None and spawn._helper is not None and out["helper"] is None:
            out["helper"] = memory(spawn._helper.proc.pid)
        out["mount_tool_umount"].append(timed(m.close))
        if i == 0:
            continue
        # `vfsd mount` as a shell runs it.
        rd = os.path.join(base, f"cli{i}")
        out["cli"].append(timed(lambda rd=rd: (
            subprocess.run([*vfsd, "mount", rd], check=True, capture_output=True),
            os.statvfs(os.path.join(rd, "fs")))))
        time.sleep(1.0)
        out["mem_cli"].append(memory(pid_of(rd)))
        out["cli_umount"].append(timed(lambda rd=rd: subprocess.run(
            [*vfsd, "umount", rd], check=True, capture_output=True)))
        # The daemon's own start, and the interpreter with its imports alone.
        out["daemon"].append(daemon_start(src, os.path.join(base, f"d{i}")))
        out["imports"].append(timed(lambda: subprocess.run(
            [sys.executable, "-c", "import vfsd.serve, vfsd.control.server"], check=True)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
