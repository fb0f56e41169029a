"""Run dirs with any name the kernel accepts, and the command line when the daemon fails.

Names with spaces, tabs, newlines, backslashes (which /proc/self/mountinfo
writes as octal escapes), quotes, `$` and command substitutions (which a shell
would run), and non-ASCII text all mount, answer, and unmount through `vfsd`
and mount_tool, including when a stale mount of a killed daemon is cleaned up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import VFSD, MountedRun, is_mounted, vfsd_cli
from freeze import freeze

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]

NAMES = {
    "space": "run 1",
    "tab": "tab\there",
    "newline": "new\nline",
    "backslash": "back\\slash \\040",
    "quotes": "it's \"quoted\"",
    "dollar": "$HOME ${PATH} `id`",
    "substitution": "x'$(touch PWNED)'",
    "unicode": "ünïcødé ☃ 実行",
}


def daemon_pid(run: MountedRun) -> int:
    return int((run.state_dir / "vfsd.pid").read_text())


def wait_dead(pid: int, limit_s: float = 15) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} still runs")


def cli_in(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*VFSD, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_odd_run_dir_names_mount_and_unmount(tmp_path: Path, name: str):
    import mount_tool

    work = tmp_path / "cwd"
    work.mkdir()
    run = MountedRun(tmp_path / name)
    try:
        cli_in(work, "mount", run.run_dir)
        assert is_mounted(run.root)
        (run.root / "note.txt").write_bytes(b"hello")
        status = json.loads(cli_in(work, "status", run.run_dir, "--json").stdout)
        assert status["running"] is True and status["files"] == 1
        ref = json.loads(cli_in(work, "ref", run.run_dir, "note.txt").stdout)
        assert ref["size"] == 5
        m = mount_tool.Mount.attach(run.run_dir)
        assert m.read(m.write("sub/b.txt", b"via mount_tool")) == b"via mount_tool"
        m.detach()
        # A killed daemon leaves a dead mount; mounting again cleans it up.
        pid = daemon_pid(run)
        os.kill(pid, signal.SIGKILL)
        wait_dead(pid)
        cli_in(work, "mount", run.run_dir)
        assert (run.root / "note.txt").read_bytes() == b"hello"
        with mount_tool.mount(run.run_dir) as again:  # attaches: the daemon is running
            assert not again.started
        cli_in(work, "umount", run.run_dir)
        assert not is_mounted(run.root)
        # The stale-mount path of `vfsd umount` too.
        cli_in(work, "mount", run.run_dir)
        pid = daemon_pid(run)
        os.kill(pid, signal.SIGKILL)
        wait_dead(pid)
        proc = cli_in(work, "umount", run.run_dir)
        assert "stale" in proc.stdout and not is_mounted(run.root)
        # mount_tool starts and stops the daemon itself.
        with mount_tool.mount(run.run_dir) as m:
            assert m.started and m.read_text(m.ref("note.txt")) == "hello"
        assert not is_mounted(run.root)
    finally:
        run.cleanup()
    # Nothing in any name ran as a shell command.
    assert os.listdir(work) == [] and not (tmp_path / "PWNED").exists()


def test_stale_mount_cleanup_runs_no_shell(tmp_path: Path):
    """Both quote styles that a repr-quoted shell line would mishandle."""
    work = tmp_path / "cwd"
    work.mkdir()
    for name in ("a'$(touch PWNED_A)", "b'\"$(touch PWNED_B)\"`touch PWNED_C`"):
        run = MountedRun(tmp_path / name)
        try:
            cli_in(work, "mount", run.run_dir)
            pid = daemon_pid(run)
            os.kill(pid, signal.SIGKILL)
            wait_dead(pid)
            cli_in(work, "mount", run.run_dir)  # cleans up the dead mount first
            assert is_mounted(run.root)
            cli_in(work, "umount", run.run_dir)
        finally:
            run.cleanup()
    assert os.listdir(work) == [], "a run dir name was run as a shell command"


def test_non_utf8_run_dir(tmp_path: Path):
    """LMDB takes UTF-8 paths only: the store must be elsewhere, and saying so is clear."""
    run_dir = os.path.join(os.fsencode(tmp_path), b"caf\xe9 run")
    run = MountedRun(Path(os.fsdecode(run_dir)))

    def cli(*args) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*VFSD, *map(str, args)], capture_output=True, timeout=60,
            text=True, errors="surrogateescape",
        )

    proc = cli("mount", run.run_dir)
    assert proc.returncode == 2 and "UTF-8" in proc.stderr and "--store" in proc.stderr
    assert "Traceback" not in proc.stderr
    try:
        assert cli("mount", run.run_dir, "--store", tmp_path / "store").returncode == 0
        with open(os.path.join(run_dir, b"fs", b"x"), "wb") as f:
            f.write(b"x")
        assert json.loads(cli("ref", run.run_dir, "x").stdout)["size"] == 1
        assert cli("umount", run.run_dir).returncode == 0
        assert not is_mounted(run.root)
    finally:
        run.cleanup()


# ----------------------------------------------------- the CLI when the daemon fails


def test_cli_says_what_happened_when_the_daemon_dies_mid_request(run):
    """`vfsd step` waiting for a reply when the daemon is killed: a message, no traceback."""
    run.expect_errors = True
    pid = daemon_pid(run)
    os.kill(pid, signal.SIGSTOP)  # the request waits in the socket, unanswered
    try:
        step = subprocess.Popen(
            [*VFSD, "step", str(run.run_dir), "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # not measured: lets the CLI connect and send before the kill
    finally:
        os.kill(pid, signal.SIGKILL)
    out, err = step.communicate(timeout=60)
    assert step.returncode == 1, (out, err)
    assert "Traceback" not in err
    assert err.startswith("vfsd: ") and f"pid {pid}" in err and "exited" in err, err
    # Every command that talks to the daemon says the same kind of thing.
    for args in (("step", "4"), ("evict",), ("evicted",), ("ref", "x")):
        proc = vfsd_cli(args[0], run.run_dir, *args[1:], check=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.stderr.startswith("vfsd: "), (args, proc.stderr)
    # These work without the daemon, on the store itself; status says the
    # daemon is dead and how to clean up, and exits 4 (EXIT_DEAD).
    proc = vfsd_cli("status", run.run_dir, check=False)
    assert proc.returncode == 4 and "DEAD" in proc.stdout, proc
    assert "is dead" in proc.stderr and f"vfsd umount {run.run_dir}" in proc.stderr, proc.stderr
    assert json.loads(vfsd_cli("status", run.run_dir, "--json", check=False).stdout)[
        "daemon"]["state"] == "dead"
    assert "chunks_removed" in vfsd_cli("gc", run.run_dir, "--json").stdout
    assert "chunk files removed" in vfsd_cli("gc", run.run_dir).stdout
    vfsd_cli("umount", run.run_dir)
    proc = vfsd_cli("status", run.run_dir)
    assert "not running (unmounted)" in proc.stdout and proc.stderr == ""
    assert vfsd_cli("status", run.run_dir, "--check", check=False).returncode == 1


def test_umount_says_when_the_stale_mount_stays(tmp_path: Path):
    """fusermount3 failing on a dead daemon's mount: `vfsd umount` says so and
    exits non-zero instead of reporting it removed."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "fusermount3").write_text("#!/bin/sh\necho 'fusermount3: refused' >&2\nexit 1\n")
    (fake / "fusermount3").chmod(0o755)
    run = MountedRun(tmp_path / "run")
    try:
        run.mount()
        pid = daemon_pid(run)
        os.kill(pid, signal.SIGKILL)
        wait_dead(pid)
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
        proc = subprocess.run([*VFSD, "umount", str(run.run_dir)], capture_output=True,
                              text=True, timeout=60, env=env)
        assert proc.returncode != 0, proc.stdout
        assert "cannot remove the stale mount" in proc.stderr and "Traceback" not in proc.stderr
        assert is_mounted(run.root)
        proc = cli_in(tmp_path, "umount", run.run_dir)  # the real fusermount3
        assert "stale" in proc.stdout and not is_mounted(run.root)
    finally:
        run.cleanup()


def test_a_stopped_daemon_gives_a_clear_timeout(tmp_path: Path, monkeypatch):
    """A daemon that does not answer (here stopped): `Mount.sync` and the
    shared client's calls fail after their timeout, saying so, and work
    again once it answers."""
    import mount_tool

    run = MountedRun(tmp_path / "run")
    try:
        run.mount()
        m = mount_tool.Mount.attach(run.run_dir)
        m.client.timeout = 2
        # The sync's own timeout plus this grace bounds the wait for its reply.
        monkeypatch.setattr(sys.modules["mount_tool.mount"], "SYNC_GRACE_SECONDS", 1.0)
        pid = daemon_pid(run)
        freeze(pid)
        try:
            with pytest.raises(mount_tool.ControlError) as exc:
                m.sync(timeout=0.5)
            assert "did not answer 'sync'" in exc.value.message, exc.value.message
            with pytest.raises(mount_tool.ControlError) as exc:
                m.stats()
            assert "did not answer 'stats' within 2 s" in exc.value.message, exc.value.message
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "files" in m.stats()  # a fresh connection, not the late reply
        assert m.client.call("get_step")["step"] == 0
        m.detach()
    finally:
        run.cleanup()
