"""The Runs example as a normal user: a user this test creates runs a few threads
through create_vfsd_deep_agent with `execute` (tests/nonroot_run.py), its shard
daemons mounted through fusermount3, its commands in bubblewrap.

What the user gets is what a normal user has on a Debian machine: /dev/fuse
readable and writable by everyone (Debian's 0666). Where it is not (a
container's 0600), the test gives it that in a private mount namespace only: a
device node of its own, mode 0666, bound over /dev/fuse there. The venv's
interpreter and the checkout may sit behind a directory other users cannot
enter (/root, 0700): in the same namespace, that directory is covered by a
tmpfs holding only the paths the user needs, bound back in. Nothing changes
outside the namespace; the user, its home and every process it left are gone
at the end.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("deepagents")

from conftest import wait_for  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(900)]

CHECKOUT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "nonroot_run.py"
THREADS = 3


def needs() -> str | None:
    """Why this test cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "creates a user and a mount namespace: needs root"
    for tool in ("useradd", "userdel", "unshare", "setpriv", "mknod", "fusermount3", "bwrap"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


def blocked_dirs(paths: list[Path]) -> dict[Path, set[str]]:
    """Directories on the way to `paths` that others cannot enter, top-down,
    each with the names below it on the way to a path."""
    blocked: dict[Path, set[str]] = {}
    for path in paths:
        parts = path.parts
        for depth in range(1, len(parts)):
            here = Path(*parts[:depth])
            if not os.stat(here).st_mode & stat.S_IXOTH:
                blocked.setdefault(here, set()).add(parts[depth])
    return dict(sorted(blocked.items(), key=lambda kv: len(kv[0].parts)))


def namespace_script(scratch: Path, fuse_mode: int | None, blocked: dict[Path, set[str]],
                     user: pwd.struct_passwd, home: Path, argv: list[str],
                     env: dict[str, str]) -> str:
    """What runs as root in the private mount namespace, then `argv` as the
    user in `home` with `env`. `fuse_mode`: the mode of a /dev/fuse of the
    namespace's own (None: the machine's, as it is)."""
    q = _quote
    lines = ["set -eu", f"mount -t tmpfs -o mode=0755 vfsd-nonroot {q(scratch)}"]
    if fuse_mode is not None:
        lines += [f"mknod -m {fuse_mode:04o} {q(scratch / 'fuse')} c 10 229",
                  f"mount --bind {q(scratch / 'fuse')} /dev/fuse"]
    for n, (directory, names) in enumerate(blocked.items()):
        keep = scratch / f"keep{n}"
        for name in sorted(names):
            lines += [f"mkdir -p {q(keep / name)}",
                      f"mount --rbind {q(directory / name)} {q(keep / name)}"]
        lines.append(f"mount -t tmpfs -o mode=0755 vfsd-nonroot {q(directory)}")
        for name in sorted(names):
            lines += [f"mkdir {q(directory / name)}",
                      f"mount --move {q(keep / name)} {q(directory / name)}"]
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", **env}
    lines.append(
        f"cd {q(home)} && exec setpriv --reuid={user.pw_uid} --regid={user.pw_gid} "
        "--init-groups env -i " + " ".join(f"{k}={q(v)}" for k, v in env.items())
        + " " + " ".join(q(a) for a in argv))
    return "\n".join(lines)


def _quote(value: str | Path) -> str:
    import shlex

    return shlex.quote(str(value))


def processes_of(uid: int) -> list[int]:
    """The live processes of `uid` (a zombie has ended: init reaps it)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except FileNotFoundError:
                continue
            found.append(int(name))
    return found


def described(pids: list[int]) -> list[str]:
    """Each process as `pid: command line`, for a failure's message."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[:2]
            found.append(f"{pid} ({' '.join(state)}): {command.strip()}")
        except OSError:
            pass
    return found


@dataclass
class NormalUser:
    """A user made for one test, with a home of its own (0700)."""

    user: pwd.struct_passwd
    home: Path
    scratch: Path

    def run(self, argv: list[str], fuse_mode: int | None,
            **env: str) -> subprocess.CompletedProcess:
        """`argv` as this user in a private mount namespace (see namespace_script)."""
        needed = [Path(os.path.realpath(sys.base_prefix)), CHECKOUT.resolve(),
                  Path(os.path.realpath(sys.executable)).parent]
        script = namespace_script(self.scratch, fuse_mode, blocked_dirs(needed), self.user,
                                  self.home, argv, env)
        return subprocess.run(["unshare", "--mount", "--propagation", "private",
                               "bash", "-c", script],
                              capture_output=True, text=True, timeout=600)


@pytest.fixture
def normal_user():
    why = needs()
    if why:
        pytest.skip(why)
    name = f"vfsdt{os.getpid() % 100000}"
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                    "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    user = pwd.getpwnam(name)
    home = Path(tempfile.mkdtemp(prefix="vfsd-nonroot-home-"))
    scratch = Path(tempfile.mkdtemp(prefix="vfsd-nonroot-ns-"))
    try:
        os.chown(home, user.pw_uid, user.pw_gid)
        os.chmod(home, 0o700)
        yield NormalUser(user, home, scratch)
    finally:
        for pid in processes_of(user.pw_uid):  # only on failure: by pid, this user's only
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # userdel refuses a user with processes, zombies included (it would
        # stay on the machine): --force, once the killed ones have ended.
        try:
            wait_for(lambda: not processes_of(user.pw_uid), "the killed processes to end", 30)
        finally:
            gone = subprocess.run(["userdel", "--force", name], capture_output=True, text=True)
            assert gone.returncode == 0, f"userdel {name}: {gone.stderr}"
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_runs_example_as_a_normal_user(normal_user):
    user, home = normal_user.user, normal_user.home
    fuse_open = stat.S_IMODE(os.stat("/dev/fuse").st_mode) & 0o006 == 0o006
    proc = normal_user.run([sys.executable, str(SCRIPT), str(THREADS)],
                           None if fuse_open else 0o666,
                           VFSD_RUNS=str(home / "runs"), VFSD_SHARDS="2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["uid"] == report["euid"] == user.pw_uid != 0
    for n, thread in enumerate(report["threads"]):
        assert thread["answer"] == f"task {n}: done"
        assert thread["listing"].startswith(f"job.py\nout.txt\njob of task {n}\n")
        assert thread["files"] == ["work/job.py", "work/out.txt"]
        assert thread["owner"] == user.pw_uid  # written by its own `execute`
        assert thread["history"] > 4
    sandbox = report["sandbox"]
    assert sandbox["isolation"] == "bwrap", sandbox
    limits = sandbox["limits"]
    # What `execute` enforces without a cgroup of its own (none is
    # delegated to this user): rlimits per process.
    for key in ("memory_bytes", "processes", "cpu_seconds"):
        assert limits[key]["enforced_by"], (key, limits[key])
    if "cgroup" not in limits["processes"]["enforced_by"]:
        assert limits["processes"]["enforced_by"].startswith("RLIMIT_NPROC")
    if "cgroup" not in limits["memory_bytes"]["enforced_by"]:
        assert limits["memory_bytes"]["enforced_by"].startswith("RLIMIT_AS")
    assert report["mounted"] == 2  # its two shards, while the Runs was open
    assert report["left_mounted"] == [] and report["left_running"] == []
    # The warm spawner (mount_tool/daemon/spawn.py) exits once it reads the
    # end of its socket, which the script's exit closed: it may still be on
    # its way out.
    try:
        wait_for(lambda: not processes_of(user.pw_uid), "the user's processes to end", 60)
    except AssertionError:
        assert described(processes_of(user.pw_uid)) == []


def test_a_closed_dev_fuse_is_refused_with_the_fix(normal_user):
    """/dev/fuse that only root may open (a container's 0600): the user's
    `vfsd mount` says what to change, and mounts nothing."""
    run = normal_user.home / "run"
    proc = normal_user.run([sys.executable, "-m", "vfsd.cli", "mount", str(run)], 0o600)
    assert proc.returncode != 0
    message = proc.stderr
    assert "/dev/fuse is not readable and writable by this user" in message, message
    assert "0600" in message and "chmod 0666 /dev/fuse" in message, message
    assert "group" in message, message
    assert not os.path.ismount(run / "fs")
