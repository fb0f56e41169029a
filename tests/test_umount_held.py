"""`vfsd umount` when another mount namespace holds a copy of the mount.

A process that copies the mount table (`unshare -m`, a container or a service
with private mounts started while the run was mounted) keeps the kernel's FUSE
session alive after the unmount here: the daemon never learns it is unmounted.
`vfsd umount` waited out its timeout, failed, and left the daemon serving.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from conftest import MountedRun, is_mounted, vfsd_cli

from vfsd.rundir import RunDir, pid_alive

pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")]


def test_umount_ends_a_mount_another_namespace_holds(tmp_path):
    run = MountedRun(tmp_path / "run")
    run.mount()
    (run.root / "a.txt").write_text("before\n")
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "120"])
    try:
        time.sleep(0.3)  # the copy of the mount table is made
        with open(run.root / "a.txt", "a") as f:  # dirty pages the unmount must not lose
            f.write("after the copy\n")
        pid = RunDir(run.run_dir).read_pid()
        proc = vfsd_cli("umount", run.run_dir, "--timeout", "30", check=False, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "another mount namespace" in proc.stderr
        assert not pid_alive(pid)
        assert not is_mounted(run.root)
        # The holder's copy ended with the session.
        probe = subprocess.run(["nsenter", "-t", str(holder.pid), "-m", "ls", str(run.root)],
                               capture_output=True, text=True)
        assert probe.returncode != 0 or probe.stdout == ""
    finally:
        holder.kill()
        holder.wait()
    run.mount()
    try:
        assert (run.root / "a.txt").read_text() == "before\nafter the copy\n"
    finally:
        vfsd_cli("umount", run.run_dir)


def test_stop_is_refused_while_mounted(run):
    from mount_tool.daemon.client import ControlClient, ControlError

    with ControlClient(RunDir(run.run_dir).sock) as c:
        with pytest.raises(ControlError) as err:
            c.call("stop")
    assert err.value.code == "mounted"
    assert is_mounted(run.root)
    (run.root / "still.txt").write_text("serving\n")
