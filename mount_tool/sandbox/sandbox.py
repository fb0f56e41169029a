"""The execute sandbox: one shell command, isolated from the host and bounded.

`Sandbox(root)` runs the commands of `VfsdBackend.execute`. With
`isolation="bwrap"` (the default) each command runs under bubblewrap in fresh
namespaces, where:

- `/` is the run's mount root, read-write: the file tools and the shell share
  one path space (`/app/main.py` is `RUN_DIR/fs/app/main.py` for both), and
  commands start in `/`;
- /usr, /bin, /sbin, /lib* and /etc are the host's, read-only, with the
  secrets /etc holds masked; /run is a private tmpfs, fresh for each call;
  /proc shows the sandbox's own processes, /dev a minimal set of devices.
  The daemon serves those mount points as hidden virtual directories
  (vfsd/fuse/ctldir.py) once the sandbox claims them before its first
  command, so the user's tree never gains entries for them, and a mount
  whose user never runs a command keeps every name ordinary;
- /tmp is the run's own `tmp` directory (`tmp="run"`, the default): kept from
  one call to the next, as models expect, and the same files for the file
  tools (`/tmp/x` is `RUN_DIR/fs/tmp/x`); VfsdBackend marks what commands
  leave there `done`, so the daemon evicts it like any finished file.
  `tmp="call"` gives each call a fresh private tmpfs instead;
- the command's PID namespace ends with the call: every process it started,
  detached ones included, is gone when `run` returns;
- there is no network unless asked for (a network namespace with only
  loopback), all capabilities are dropped, no_new_privs is set, and the
  command runs in a new session with an allowlisted environment;
- limits: wall time, CPU time of all processes together, memory, number of
  processes, output size and /tmp size. cgroups enforce them where the machine
  offers them (mount_tool/sandbox/cgroups.py); rlimits otherwise. `info()` says which.

`isolation="none"` opts out of the namespaces, by name: commands then run on
the host in the mount root, as this process's user, with the same environment
allowlist and whatever limits the machine offers without namespaces.

Without bubblewrap (or without the kernel features it needs), `run` refuses
with `SandboxUnavailable`, whose message names what to install.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MountToolError
from ..reserved import SANDBOX_DIRS, TMP_DIR
from . import cgroups

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("bwrap", "none")
#: "run": /tmp is the run's `tmp` directory, kept across calls; "call": a fresh tmpfs per call.
TMP_MODES = ("run", "call")
#: Set on the mount root: the daemon serves SANDBOX_DIRS from then on.
CLAIM_XATTR = "user.vfsd.sandbox"
#: Host directories bound read-only when the host has them.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
#: Files and directories under /etc that hold secrets: hidden from commands.
MASKED_PATHS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssl/private", "/etc/security/opasswd", "/etc/ssh/ssh_host_*key",
)
#: Host variables a command inherits by default (`env_allowlist`).
DEFAULT_ENV_ALLOWLIST = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TERM")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOSTNAME = "vfsd-sandbox"
INSTALL_HINT = (
    "Install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora: "
    "`dnf install bubblewrap`), or create the backend with isolation=\"none\" to run "
    "commands on the host without isolation."
)
# How often the CPU time of all processes is checked against its limit.
CPU_POLL_SECONDS = 0.1
# How long output pipes may stay open after the command exited (isolation="none").
DRAIN_GRACE_SECONDS = 2.0
# Written to stdout by the sandbox's shell before it becomes the command (and
# taken off the output): without it, the command never ran.
START_MARK = b"+"
# A sandbox whose set-up failed (a masked file replaced by `useradd` while bwrap
# mounted over it) is tried again this many times in all, the command not having run.
SETUP_ATTEMPTS = 5
SETUP_RETRY_PAUSE = 0.02


class SandboxUnavailable(MountToolError):
    """Commands cannot run with the isolation that was asked for; says why and what to do."""


@dataclass(frozen=True)
class ExecLimits:
    """Limits on one `execute` call.

    `timeout` is the default wall time in seconds (a call may pass its own; 0
    means none); `cpu_seconds` bounds the CPU time of all the command's
    processes together (and of each one); `memory_bytes` their memory;
    `processes` how many may exist at once; `output_bytes` how much output is
    kept; `tmp_bytes` the size of the private /tmp (with `tmp="call"`).
    """

    timeout: float = 120
    cpu_seconds: float = 600
    memory_bytes: int = 2 << 30
    processes: int = 256
    output_bytes: int = 4 << 20
    tmp_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for name in ("timeout", "cpu_seconds", "memory_bytes", "processes", "output_bytes",
                     "tmp_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass
class RunResult:
    """What one command did: its merged output (stderr lines marked), exit code, limits hit."""

    output: str
    exit_code: int
    produced: int  # bytes the command wrote to stdout and stderr
    truncated: bool  # output over `output_bytes` was dropped
    stopped: str | None = None  # "timeout" or "cpu" when the sandbox stopped it
    notes: list[str] = field(default_factory=list)  # limits that bit, in words


class Sandbox:
    """Runs shell commands for one run's files; see the module docstring."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        isolation: str = "bwrap",
        network: bool = False,
        limits: ExecLimits | None = None,
        env: dict[str, str] | None = None,
        env_allowlist: tuple[str, ...] | list[str] = DEFAULT_ENV_ALLOWLIST,
        bwrap: str = "bwrap",
        use_cgroups: bool = True,
        tmp: str = "run",
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise ValueError(
                f"isolation must be one of {', '.join(map(repr, ISOLATION_MODES))}, "
                f"got {isolation!r}"
            )
        if tmp not in TMP_MODES:
            raise ValueError(f"tmp must be one of {', '.join(map(repr, TMP_MODES))}, got {tmp!r}")
        self.tmp = tmp
        self.root = Path(os.path.realpath(root))
        self.isolation = isolation
        self.network = bool(network)
        self.limits = limits or ExecLimits()
        self.extra_env = dict(env or {})
        self.env_allowlist = tuple(env_allowlist)
        self.bwrap = bwrap
        self.use_cgroups = use_cgroups
        self._problem: str | None = None
        self._checked = False

    # -- what is in force ---------------------------------------------------

    def unavailable_reason(self) -> str | None:
        """Why commands cannot run with the isolation asked for; None when they can."""
        if self.isolation == "none":
            return None
        if not self._checked:
            self._problem = self._find_problem()
            self._checked = self._problem is None  # a problem may be fixed later
        return self._problem

    def check(self) -> None:
        """Raise SandboxUnavailable when commands cannot run as configured."""
        reason = self.unavailable_reason()
        if reason:
            raise SandboxUnavailable(reason)

    def missing_binary(self) -> str | None:
        """`unavailable_reason` without the probe (which claims the mount's
        sandbox names): says only whether bubblewrap is there at all."""
        if self.isolation == "none" or self._bwrap_path() is not None:
            return None
        return f"execute is not available: bubblewrap ({self.bwrap!r}) was not found. {INSTALL_HINT}"

    def _bwrap_path(self) -> str | None:
        if os.sep in self.bwrap:
            return self.bwrap if os.access(self.bwrap, os.X_OK) else None
        return shutil.which(self.bwrap)

    def _find_problem(self) -> str | None:
        binary = self._bwrap_path()
        if binary is None:
            return f"execute is not available: bubblewrap ({self.bwrap!r}) was not found. {INSTALL_HINT}"
        self._claim()
        for name in SANDBOX_DIRS:
            # bwrap would create a missing mount point as a real directory in the
            # user's tree: only a daemon that serves them virtually will do.
            if not os.path.isdir(self.root / name) or os.path.islink(self.root / name):
                return (
                    f"execute is not available: the run's files have no /{name} mount point. "
                    f"Either an entry named {name!r} that is not a directory sits at the root "
                    "(made before the sandbox first ran here: rename it), or the vfsd daemon "
                    "serving this mount predates the sandbox's mount points (remount the run "
                    "dir with this version of vfsd)."
                )
        problem = self._prepare_tmp()
        if problem:
            return problem
        # The options of a real run, so an old bwrap or a missing kernel feature
        # shows here, once, with bwrap's own words.
        probe = [binary, *self._bwrap_options(), "--", "/bin/true"]
        try:
            proc = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"execute is not available: bubblewrap could not be run: {exc}. {INSTALL_HINT}"
        if "Unknown option" in proc.stderr:
            return (
                f"execute is not available: this bubblewrap ({binary}) is too old for the "
                f"sandbox ({proc.stderr.strip()}); it needs bubblewrap 0.7 or later. "
                f"{INSTALL_HINT}"
            )
        if proc.returncode != 0:
            return (
                "execute is not available: bubblewrap cannot create the sandbox's namespaces "
                f"here ({proc.stderr.strip() or f'exit {proc.returncode}'}). It needs root or "
                "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0; in a container: --privileged or a seccomp "
                "profile that allows them). Or create the backend with isolation=\"none\"."
            )
        return None

    def _claim(self) -> None:
        """Have the daemon serve the mount points from now on (a plain directory
        keeps no such attribute and fails the mount-point check, as it should).
        Every call claims again: a daemon restarted under this Sandbox serves
        nothing until claimed, and bwrap would make real directories instead."""
        if self.isolation == "bwrap":
            with contextlib.suppress(OSError):
                os.setxattr(self.root, CLAIM_XATTR, b"1")

    def _prepare_tmp(self) -> str | None:
        """Make sure the root's `tmp` directory exists (the sandbox's /tmp, or with
        tmp="call" the mount point of its tmpfs); why not, if it cannot be."""
        if self.isolation != "bwrap":
            return None
        path = self.root / TMP_DIR
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"execute is not available: it could not make /{TMP_DIR}: {exc}"
        if path.is_symlink() or not path.is_dir():
            return (
                f"execute is not available: /{TMP_DIR} at the root of the run's files is not a "
                "directory; the sandbox's /tmp is that directory: rename or remove it."
            )
        return None

    def info(self) -> dict[str, Any]:
        """What isolation and which limits are in force, and by what means."""
        reason = self.unavailable_reason()
        chosen = cgroups.available() if self.use_cgroups else {}
        root_user = os.geteuid() == 0
        lim = self.limits

        def how(resource_name: str, fallback: str) -> str:
            if resource_name in chosen:
                return chosen[resource_name].describe(resource_name)
            return fallback

        cpu = how("cpu", "")
        report: dict[str, Any] = {
            "isolation": "unavailable" if reason else self.isolation,
            "reason": reason,
            "network": self.network if self.isolation == "bwrap" else True,
            "environment": sorted(self._environment()),
            "limits": {
                "wall_seconds": {"value": lim.timeout, "enforced_by": "timer, then SIGKILL"},
                "cpu_seconds": {
                    "value": lim.cpu_seconds,
                    "enforced_by": (f"{cpu} (all processes) and " if cpu else "")
                    + "RLIMIT_CPU (each process)",
                },
                "memory_bytes": {
                    "value": lim.memory_bytes,
                    "enforced_by": how("memory", "RLIMIT_AS (each process's address space)"),
                },
                "processes": {
                    "value": lim.processes,
                    "enforced_by": how(
                        "pids",
                        "not enforced (no pids cgroup, and RLIMIT_NPROC does not bind root)"
                        if root_user else "RLIMIT_NPROC (counts all processes of this user)",
                    ),
                },
                "output_bytes": {"value": lim.output_bytes, "enforced_by": "capture"},
            },
        }
        if self.isolation == "bwrap":
            binary = self._bwrap_path()
            report["bwrap"] = binary
            report["namespaces"] = ["mount", "pid", "ipc", "uts", "cgroup"] + (
                [] if self.network else ["net"])
            report["filesystem"] = {
                "/": f"the run's files ({self.root}), read-write",
                **{f"/{d}": "host, read-only" for d in SYSTEM_DIRS if os.path.exists(f"/{d}")},
                "/tmp": (f"private tmpfs, fresh per call, {lim.tmp_bytes} bytes"
                         if self.tmp == "call" else
                         f"the run's own /{TMP_DIR} directory ({self.root / TMP_DIR}), kept "
                         "across calls; VfsdBackend marks what commands leave there done"),
                "/run": "private tmpfs, fresh per call",
                "/proc": "the sandbox's own processes",
                "/dev": "null, zero, full, random, urandom, tty, shm, pts",
                "masked": self._masked_paths(),
            }
            report["capabilities"] = "all dropped; no_new_privs"
            if self.tmp == "call":
                report["limits"]["tmp_bytes"] = {"value": lim.tmp_bytes,
                                                 "enforced_by": "tmpfs size"}
            report["cleanup"] = "PID namespace: every process ends with the call"
        else:
            report["filesystem"] = {"/": "the host's, as this process's user"}
            report["cleanup"] = (
                f"{chosen['cpu'].describe('cpu')} kill: every process ends with the call"
                if "cpu" in chosen else
                "process group kill: processes that leave it (setsid) may survive the call"
            )
        return report

    def prompt_note(self, routed: Iterable[str] = ()) -> str:
        """What the model must know about paths and limits, for its system prompt.

        `routed`: path prefixes the file tools send elsewhere (a deepagents
        `CompositeBackend`'s routes, "/memories/"): the note names them as the
        exception, since the shell never sees what lives there.
        """
        lim = self.limits
        prefixes = sorted({"/" + p.strip("/") + "/" for p in routed if p.strip("/")})
        elsewhere = ""
        if prefixes:
            names = _join_words([f"`{p}`" for p in prefixes])
            elsewhere = (
                f" Except under {names}: the file tools keep those paths in a separate "
                "store, not in your files, so execute does not see them (a command that "
                "reads or writes there finds other files, or none); use the file tools "
                "for them."
            )
        limits = (
            f"Each command may run {_seconds(lim.timeout)} (the execute timeout argument "
            f"changes that), use {_seconds(lim.cpu_seconds)} of CPU, "
            f"{lim.memory_bytes >> 20} MiB of memory and {lim.processes} processes; "
            f"output beyond {lim.output_bytes >> 10} KiB is cut."
        )
        if self.isolation == "none":
            return (
                "## Files and the shell\n\n"
                "The file tools (ls, read_file, write_file, edit_file, glob, grep) see your "
                "files with `/` as their root. The execute tool runs commands on the host in "
                "that same directory, but there an absolute path is a host path: refer to your "
                "files with paths relative to the working directory (after "
                "write_file('/app/main.py'), run `python3 app/main.py`)."
                + elsewhere + " " + limits
            )
        network = "The network is available." if self.network else "There is no network."
        if self.tmp == "call":
            tmp_note = "/tmp and /run are private to each command and emptied when it ends; "
        else:
            tmp_note = (
                "/run is private to each command. /tmp is yours and is kept from one command "
                "to the next (the file tools see it too); what is left there is removed a few "
                "steps after it was last written. "
            )
        return (
            "## Files and the shell\n\n"
            "The file tools (ls, read_file, write_file, edit_file, glob, grep) and the execute "
            "tool share one filesystem: a path means the same file in both (after "
            f"write_file('/app/main.py'), run `python3 /app/main.py`).{elsewhere} "
            "Commands start in `/`, which is the root of your files. Inside execute, /usr, "
            f"/bin, /lib, /sbin and /etc are the system's, read-only; {tmp_note}/proc and /dev "
            "are the sandbox's own. The file tools cannot use those paths: keep your files "
            "elsewhere (for example under /work). "
            f"Background processes end when the command returns. {network} {limits}"
        )

    # -- running --------------------------------------------------------------

    def run(self, command: str, timeout: float | None = None, *,
            on_confined: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
        """Run `command` with the shell; raises SandboxUnavailable if it cannot run.

        `timeout` in seconds overrides `limits.timeout` (0: no wall-time limit;
        the CPU-time limit still holds). `on_confined(where)` is called once the
        command's first process is confined and before it runs anything, with
        what holds every process it will start: `{"cgroup": name}` (its cgroup
        directory), else `{"pidns": "pid:[N]"}` (the bwrap sandbox's pid
        namespace) or `{"session": sid}` (the host shell's session); the
        daemon attributes their requests to the running tool call by it.
        """
        self.check()
        self._claim()
        problem = self._prepare_tmp()  # it may have been removed since the last call
        if problem:
            raise SandboxUnavailable(problem)
        wall = self.limits.timeout if timeout is None else timeout
        if wall < 0:
            raise ValueError(f"timeout must be non-negative, got {wall}")
        for attempt in range(SETUP_ATTEMPTS):
            group = self._make_group()
            try:
                if self.isolation == "bwrap":
                    return self._run_bwrap(command, wall, group, on_confined)
                return self._run_on_host(command, wall, group, on_confined)
            except _NotStarted as exc:
                failure = exc
                logger.warning("execute: the sandbox could not be set up (%s); attempt %d of %d",
                               exc, attempt + 1, SETUP_ATTEMPTS)
            finally:
                group.kill()
                group.remove()
            time.sleep(SETUP_RETRY_PAUSE * (attempt + 1))
        raise SandboxUnavailable(f"execute could not set up its sandbox ({failure}); the "
                                 f"command did not run ({SETUP_ATTEMPTS} attempts)")

    def _make_group(self) -> cgroups.CallGroup:
        if not self.use_cgroups:
            return cgroups.CallGroup()
        try:
            return cgroups.CallGroup.create(
                processes=self.limits.processes, memory_bytes=self.limits.memory_bytes
            )
        except OSError as exc:
            raise SandboxUnavailable(
                f"execute could not set up its control group for the limits: {exc}"
            ) from exc

    def _environment(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in self.env_allowlist if k in os.environ}
        env.setdefault("LANG", "C.UTF-8")
        env["PATH"] = SANDBOX_PATH
        env["HOME"] = "/tmp"
        env["VFSD_ROOT"] = "/" if self.isolation == "bwrap" else str(self.root)
        env.update(self.extra_env)
        return env

    def _namespace_args(self) -> list[str]:
        args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--hostname", HOSTNAME]
        if not self.network:
            args.append("--unshare-net")
        return args

    def _masked_paths(self) -> list[str]:
        found = []
        for pattern in MASKED_PATHS:
            for path in sorted(glob.glob(pattern)):
                if not os.path.islink(path):
                    found.append(path)
        return found

    def _bwrap_options(self, info_fd: int | None = None, block_fd: int | None = None) -> list[str]:
        """bwrap's options; they reach it through --args, so the sandbox's
        /proc/1/cmdline does not show host paths."""
        argv = ["--die-with-parent", "--new-session", *self._namespace_args(),
                "--cap-drop", "ALL", "--bind", str(self.root), "/"]
        for name in SYSTEM_DIRS:
            if os.path.exists(f"/{name}"):  # follows /bin -> usr/bin: binds the target
                argv += ["--ro-bind", f"/{name}", f"/{name}"]
        for path in self._masked_paths():
            if os.path.isdir(path):
                argv += ["--tmpfs", path, "--remount-ro", path]
            else:
                argv += ["--ro-bind", "/dev/null", path]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        if self.tmp == "call":  # else /tmp is the root's own tmp directory, bound with it
            argv += ["--size", str(self.limits.tmp_bytes), "--tmpfs", "/tmp"]
        argv += ["--size", str(16 << 20), "--tmpfs", "/run"]
        if self.network and os.path.islink("/etc/resolv.conf"):
            # systemd-resolved and friends keep the real file under /run.
            target = os.path.realpath("/etc/resolv.conf")
            if target.startswith("/run/"):
                argv += ["--ro-bind-try", target, target]
        argv += ["--chdir", "/"]
        if info_fd is not None and block_fd is not None:
            argv += ["--info-fd", str(info_fd), "--block-fd", str(block_fd)]
        return argv

    def _run_bwrap(self, command: str, wall: float, group: cgroups.CallGroup,
                   on_confined=None) -> RunResult:
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        args_r, args_w = os.pipe()
        options = self._bwrap_options(info_w, block_r)
        # A few KiB at most: fits the pipe, so writing before bwrap reads cannot block.
        os.write(args_w, b"".join(os.fsencode(a) + b"\0" for a in options))
        os.close(args_w)
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        # The shell inside first says it is there (START_MARK), then becomes the command.
        argv = [self._bwrap_path() or self.bwrap, "--args", str(args_r), "--", shell, "-c",
                'printf %s "$2" && exec "$0" -c "$1"', shell, command, START_MARK.decode()]
        # With a cgroup, bwrap itself joins it before it starts (a shell holds
        # it back, as for isolation="none"): the child it clones is in the group
        # from birth, so the group's kill ends it even if bwrap dies before
        # saying which child it made.
        gated = bool(group.dirs)
        if gated:
            argv = ["/bin/sh", "-c", 'read -r _ && exec "$0" "$@" </dev/null', *argv]
        try:
            proc = subprocess.Popen(  # noqa: S603 - running the agent's command is the point
                argv,
                stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._environment(),
                cwd="/",
                pass_fds=(info_w, block_r, args_r),
                start_new_session=True,
            )
        except OSError as exc:
            for fd in (info_r, info_w, block_r, block_w, args_r):
                os.close(fd)
            raise SandboxUnavailable(f"execute could not start bubblewrap: {exc}") from exc
        os.close(info_w)
        os.close(block_r)
        os.close(args_r)
        started = time.monotonic()
        sandbox_init = None
        stopped = None
        try:
            # Until bwrap has written the child's PID, the read end must stay
            # open: closed early, bwrap dies of SIGPIPE between its clone and
            # waking the child, which then waits for it for ever.
            if gated:
                assert proc.stdin is not None
                group.add(proc.pid)
                proc.stdin.write(b"\n")
                proc.stdin.close()
            child = _read_child_pid(info_r, wall)
            if child is None:
                # bwrap died before telling, or took the whole wall time: its
                # child (if cloned yet) sets no parent-death signal before it
                # forks, so it must be found and killed by hand.
                if _kill_with_children(proc):
                    stopped = "timeout"
            else:
                # bwrap's first process in the new namespaces (their PID 1) waits on
                # block_fd: it joins the cgroup and gets its rlimits before it forks
                # anything, so all it starts inherits both.
                with contextlib.suppress(ProcessLookupError):
                    sandbox_init = os.pidfd_open(child)
                    group.add(child)
                    self._set_rlimits(child, group)
                    if on_confined is not None:
                        _tell(on_confined, lambda: {"cgroup": group.name} if group.name else
                              {"pidns": os.readlink(f"/proc/{child}/ns/pid")})
        except BaseException as exc:
            _kill_pidfd(sandbox_init)
            _kill_with_children(proc)
            proc.wait()
            if sandbox_init is not None:
                os.close(sandbox_init)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            if isinstance(exc, OSError):
                raise SandboxUnavailable(f"execute could not confine the command: {exc}") from exc
            raise
        finally:
            os.close(info_r)
            with contextlib.suppress(OSError):
                os.write(block_w, b"1")
            os.close(block_w)

        def kill() -> None:
            # The namespace's PID 1 dying takes every process in it along.
            if sandbox_init is not None:
                _kill_pidfd(sandbox_init)
            else:
                proc.kill()
            group.kill()

        def exited() -> None:
            # bwrap reports the command's exit as soon as it happens; the
            # namespace is torn down (everything in it killed) when its PID 1
            # exits right after. Wait for that, so nothing outlives the call.
            if sandbox_init is not None and not _exited(sandbox_init, 5.0):
                _kill_pidfd(sandbox_init)
                _exited(sandbox_init, 5.0)
            group.kill()

        try:
            return self._supervise(proc, wall, group, kill, exited, started, stopped,
                                   start_mark=START_MARK)
        finally:
            if sandbox_init is not None:
                os.close(sandbox_init)

    def _run_on_host(self, command: str, wall: float, group: cgroups.CallGroup,
                     on_confined=None) -> RunResult:
        shell = shutil.which("bash") or "/bin/sh"
        # The shell waits for a line on stdin before it becomes the command, so
        # it can join the cgroup and get its rlimits before anything runs.
        gate = 'read -r _ ; exec "$0" -c "$1" </dev/null'
        try:
            proc = subprocess.Popen(  # noqa: S603 - running the agent's command is the point
                ["/bin/sh", "-c", gate, shell, command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._environment(),
                cwd=self.root,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxUnavailable(f"execute could not start /bin/sh: {exc}") from exc
        assert proc.stdin is not None
        try:
            group.add(proc.pid)
            self._set_rlimits(proc.pid, group)
            if on_confined is not None:
                # start_new_session: the shell leads a session of its own.
                _tell(on_confined, lambda: {"cgroup": group.name} if group.name else
                      {"session": proc.pid})
        except OSError as exc:
            proc.kill()
            proc.wait()
            raise SandboxUnavailable(f"execute could not confine the command: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.write(b"\n")
                proc.stdin.close()

        def kill() -> None:
            group.kill()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

        # Whatever it left behind goes as soon as it exits.
        return self._supervise(proc, wall, group, kill, group.kill)

    def _set_rlimits(self, pid: int, group: cgroups.CallGroup) -> None:
        lim = self.limits
        cpu = math.ceil(lim.cpu_seconds)
        # SIGXCPU at the soft limit, SIGKILL a second later.
        resource.prlimit(pid, resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))  # no core files in the run's tree
        if "memory" not in group.enforced:
            resource.prlimit(pid, resource.RLIMIT_AS, (lim.memory_bytes, lim.memory_bytes))
        if "pids" not in group.enforced and os.geteuid() != 0:
            resource.prlimit(pid, resource.RLIMIT_NPROC, (lim.processes, lim.processes))

    def _supervise(self, proc: subprocess.Popen, wall: float, group: cgroups.CallGroup,
                   kill: Callable[[], None], exited: Callable[[], None],
                   started: float | None = None, stopped: str | None = None, *,
                   start_mark: bytes | None = None) -> RunResult:
        """Collect output until the command and its pipes are done, enforcing the limits.

        `kill` stops the command and everything it started; `exited` runs once
        the command's process has exited, to end whatever it left behind.
        The wall time counts from `started` (default: now); `stopped` says
        the command was already stopped, and why. With `start_mark`, stdout
        begins with it once the command starts (it is not output); a failure
        before it raises _NotStarted, so the caller may try again.
        """
        assert proc.stdout is not None and proc.stderr is not None
        output = _Output(self.limits.output_bytes)
        streams = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err"}
        poller = select.poll()
        for fd in streams:
            poller.register(fd, select.POLLIN)
        exit_fd = os.pidfd_open(proc.pid)
        poller.register(exit_fd, select.POLLIN)
        if started is None:
            started = time.monotonic()
        deadline = started + wall if wall else None
        cpu_limit = self.limits.cpu_seconds if group.cpu_seconds() is not None else None
        exited_at: float | None = None
        before_mark = bytearray() if start_mark else None  # stdout until the mark
        try:
            while streams or exited_at is None:
                now = time.monotonic()
                waits = [CPU_POLL_SECONDS] if cpu_limit and exited_at is None else []
                if deadline is not None and exited_at is None:
                    waits.append(max(0.0, deadline - now))
                if exited_at is not None:
                    waits.append(max(0.0, exited_at + DRAIN_GRACE_SECONDS - now))
                events = poller.poll(min(waits) * 1000 if waits else None)
                for fd, _ in events:
                    if fd == exit_fd:
                        poller.unregister(exit_fd)
                        exited_at = time.monotonic()
                        exited()
                        continue
                    data = os.read(fd, 1 << 16)
                    if not data:
                        poller.unregister(fd)
                        del streams[fd]
                        continue
                    if before_mark is not None and streams[fd] == "out":
                        before_mark += data
                        if len(before_mark) < len(start_mark):
                            continue
                        data = bytes(before_mark[len(start_mark):])
                        before_mark = None
                    if data:
                        output.feed(streams[fd], data)
                now = time.monotonic()
                if exited_at is None:
                    if deadline is not None and now >= deadline:
                        stopped = "timeout"
                        kill()
                    elif cpu_limit and (group.cpu_seconds() or 0) >= cpu_limit:
                        stopped = "cpu"
                        kill()
                elif streams and now >= exited_at + DRAIN_GRACE_SECONDS:
                    kill()  # a survivor still holds the pipes: stop waiting for it
                    break
        finally:
            os.close(exit_fd)
            proc.stdout.close()
            proc.stderr.close()
            returncode = proc.wait()
        output.close()
        if before_mark is not None and stopped is None and returncode != 0:
            raise _NotStarted(output.text().strip()[:1000] or f"exit status {returncode}")
        notes = _limit_notes(group.events(), self.limits)
        exit_code = 128 - returncode if returncode < 0 else returncode
        if stopped == "timeout":
            exit_code = 124  # what `timeout(1)` and deepagents' own backends report
        return RunResult(
            output=output.text(),
            exit_code=exit_code,
            produced=output.total,
            truncated=output.dropped > 0,
            stopped=stopped,
            notes=notes,
        )


class _NotStarted(Exception):
    """The sandbox failed before the command started: nothing of it ran."""


class _Output:
    """stdout and stderr merged line by line in arrival order, stderr lines marked.

    Keeps the first `limit` bytes of the merged text and counts the rest; a
    line without a newline is held back (up to `FLUSH` bytes) so a stderr line
    never lands in the middle of a stdout line.
    """

    FLUSH = 64 << 10
    MARK = b"[stderr] "

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0
        self.dropped = 0
        self.partial = {"out": bytearray(), "err": bytearray()}
        self.last: str | None = None
        self.mid_line = False  # the last emitted text did not end a line

    def feed(self, stream: str, data: bytes) -> None:
        self.total += len(data)
        buf = self.partial[stream]
        buf += data
        cut = buf.rfind(b"\n")
        if cut >= 0:
            self._emit(stream, bytes(buf[: cut + 1]))
            del buf[: cut + 1]
        if len(buf) > self.FLUSH:
            self._emit(stream, bytes(buf))
            buf.clear()

    def close(self) -> None:
        for stream in ("out", "err"):
            if self.partial[stream]:
                tail = bytes(self.partial[stream])
                self._emit(stream, tail + b"\n" if stream == "err" else tail)
                self.partial[stream].clear()

    def _emit(self, stream: str, data: bytes) -> None:
        continuing = self.mid_line and self.last == stream
        if stream == "err":
            data = b"".join(
                line if i == 0 and continuing else self.MARK + line
                for i, line in enumerate(data.splitlines(keepends=True))
            )
        if self.mid_line and not continuing:
            data = b"\n" + data  # end the other stream's unfinished line first
        self.last = stream
        self.mid_line = not data.endswith(b"\n")
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.dropped += max(0, len(data) - max(room, 0))

    def text(self) -> str:
        return bytes(self.kept).decode("utf-8", errors="replace")


def _tell(on_confined: Callable[[dict[str, Any]], None],
          where: Callable[[], dict[str, Any]]) -> None:
    """Call the caller's hook; what it raises is logged, never the command's failure."""
    try:
        on_confined(where())
    except Exception:  # noqa: BLE001 - attribution is best effort
        logger.exception("execute: on_confined failed")


def _read_child_pid(fd: int, wait: float = 0) -> int | None:
    """The host PID of bwrap's sandbox process, from its --info-fd JSON.

    Reads until the JSON is whole (bwrap writes it in pieces) or bwrap closed
    the pipe (it died); None then, or after `wait` seconds (0: no limit). poll,
    not select: a busy server's descriptors go past select's 1024.
    """
    data = b""
    deadline = time.monotonic() + wait if wait else None
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not poller.poll(None if left is None else left * 1000):
            if deadline is not None and time.monotonic() >= deadline:
                return None
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(data)["child-pid"])


def _kill_with_children(proc: subprocess.Popen) -> bool:
    """SIGKILL bwrap and the child it cloned, when that child's PID is not known.

    bwrap is stopped first, so it cannot clone while its children are looked
    for (the processes whose parent it is). False when it had exited already.
    """
    if proc.returncode is not None:
        return False
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # not reaped yet: the PID is still bwrap's
        # Returns once it is stopped or dead; WNOWAIT leaves its exit to proc.wait.
        state = os.waitid(os.P_PID, proc.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    except (ProcessLookupError, ChildProcessError):
        return False
    if state is None or state.si_code != os.CLD_STOPPED:
        return False
    for pid in _children_of(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    return True


def _children_of(parent: int) -> list[int]:
    """PIDs of the processes whose parent is `parent`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ")".
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(name))
    return found


def _exited(pidfd: int, wait: float) -> bool:
    """True once the process behind `pidfd` has exited (waits up to `wait` s)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(wait * 1000))


def _kill_pidfd(pidfd: int | None) -> None:
    if pidfd is not None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def _limit_notes(events: dict[str, int], limits: ExecLimits) -> list[str]:
    notes = []
    if events.get("pids_max"):
        notes.append(
            f"the process limit ({limits.processes}) refused {events['pids_max']} "
            "process creation(s)"
        )
    if events.get("oom_kill"):
        notes.append(
            f"{events['oom_kill']} process(es) were killed for going over the memory limit "
            f"({limits.memory_bytes >> 20} MiB)"
        )
    return notes


def _join_words(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _seconds(value: float) -> str:
    return f"{value:g} s"
