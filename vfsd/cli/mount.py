"""`vfsd mount` and `vfsd umount`: start a daemon on a run dir, stop it."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from vfsd.config import Config, ConfigError, load_config
from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import (
    RunDir,
    mount_state,
    pid_alive,
    remove_stale_mount,
    syncfs,
    utf8_problem,
)

from .common import (
    EXIT_UNPUBLISHED,
    cli,
    emit,
    fail,
    human,
    json_option,
    phase_progress,
    warn,
)
from .options import OPTION_KEYS, config_options

#: seconds `vfsd mount` waits for the daemon, beyond the waits it announces
MOUNT_TIMEOUT_S = 60.0
#: seconds between the daemon's READY and the mount answering a stat
ANSWER_TIMEOUT_S = 10.0
#: a wait the daemon announces is said on stderr once it has lasted this long
SAY_WAIT_AFTER_S = 1.0


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--store", type=click.Path(file_okay=False, path_type=Path),
              help="Store directory (shared stores dedup across run dirs) [RUN_DIR/.vfsd].")
@click.option("--shard", is_flag=True,
              help="Serve every volume of the store, each as a directory of RUN_DIR/fs "
                   "(volumes are made through the control socket; see vfsd.shard).")
@click.option("--foreground", "-f", is_flag=True, help="Run the daemon in this process.")
@click.option("--log-stderr", is_flag=True, help="Log to stderr instead of RUN_DIR/.vfsd/vfsd.log.")
@click.option("--from", "--resume-from", "resume_from", metavar="RUN_ID[@SNAPSHOT]",
              help="Start from a snapshot published in the --remote bucket (an empty run "
                   "dir; files are fetched on first read); RUN_ID alone: its latest.")
@click.option("--timeout", "mount_timeout", type=click.FloatRange(min=1), default=MOUNT_TIMEOUT_S,
              show_default=True,
              help="Seconds to wait for the mount, beyond the waits the daemon announces "
                   "(the object store, another worker's lease); then the daemon is stopped "
                   "and nothing is left mounted.")
@json_option
@config_options
def mount(run_dir: Path, store: Path | None, shard: bool, foreground: bool, log_stderr: bool,
          resume_from: str | None, mount_timeout: float, as_json: bool,
          config_path: Path | None, **opts) -> None:
    """Mount RUN_DIR/fs, with the store in RUN_DIR/.vfsd unless --store says otherwise.

    Returns once the mount answers, exit 0, also when the mount is read-only
    (another worker holds the run's lease) or its remote tier is degraded
    (the object store is unreachable: writes stay local): stderr says which,
    at once. Any failure (exit 1, or 2 for bad options) leaves nothing
    mounted. A remote whose errors cannot heal (no such bucket, access
    denied, no credentials, never reached) fails the mount.
    """
    try:
        config = load_config(config_path, {k: opts.get(k) for k in OPTION_KEYS})
    except (ConfigError, TypeError) as exc:
        fail(str(exc), 2)
    if resume_from is not None:
        from vfsd.remote.layout import BadResumeSpec, parse_resume_spec

        try:
            parse_resume_spec(resume_from)
        except BadResumeSpec as exc:
            fail(str(exc), 2)
        if config.remote_url is None:
            fail("--from needs --remote s3://BUCKET/PREFIX (where the run was published)", 2)
    run = RunDir(run_dir)
    if run.path.exists() and not run.path.is_dir():
        fail(f"{run.path} exists and is not a directory", 2)
    try:
        store_dir, volume = run.store_location(store)
    except ValueError as exc:
        fail(str(exc), 2)
    problem = utf8_problem(store_dir)
    if problem is not None:
        fail(problem, 2)
    try:
        if not run.state.exists():
            run.state.mkdir(parents=True, mode=0o700)
            os.chmod(run.state, 0o700)  # mkdir's mode is cut by the umask
    except OSError as exc:
        fail(f"cannot create {run.state}: {exc}", 2)
    if shard and resume_from is not None:
        fail("--shard starts from its store as it is (no --from)", 2)
    if shard and config.metrics_port is not None:
        fail("a shard serves no metrics endpoint (--metrics-port): `vfsd status --json` "
             "and `vfsd threads --json` give its numbers", 2)
    if shard:
        store_dir = Path(os.path.abspath(store)) if store is not None else run.state
    if foreground:
        from vfsd.serve import run_daemon  # without the console extras (see serve)

        if shard:
            from vfsd.shard import run_shard

            sys.exit(run_shard(run, config, store_dir, log_to_stderr=log_stderr))
        sys.exit(run_daemon(run, config, store_dir, volume, log_to_stderr=log_stderr,
                            resume_from=resume_from))
    info = spawn_daemon(run, config, store_dir, volume, resume_from, mount_timeout,
                        progress=not as_json, shard=shard)
    doc = {"mountpoint": str(run.mountpoint), "store": str(store_dir), "volume": volume,
           **info}
    emit(doc, as_json, lambda d: f"vfsd: mounted {d['mountpoint']} (store {d['store']})")
    say_degraded(info)


def say_degraded(info: dict) -> None:
    """A mount that is up but read-only, or whose remote tier is degraded: say why."""
    if info.get("read_only"):
        warn(f"mounted read-only (writes fail with EROFS): {info.get('reason')}. Unmount "
             "the worker that holds the run first, or resume it in another run dir with "
             "--from once it has published")
    elif info.get("state") not in (None, "held"):
        warn(f"remote tier degraded ({info.get('state')}): {info.get('reason')}; "
             "`vfsd status` shows when it recovers")


#: Set by `vfsd.cli.spawner`, whose process has the daemon's modules loaded: the
#: daemon is then forked from this process instead of started as a new one.
FORK_DAEMON = False


class ForkedDaemon:
    """The daemon as a forked child, with the little of Popen's interface
    `spawn_daemon` uses. The child is what `python -m vfsd.serve` would be:
    its own session, stdin from /dev/null, stdout and stderr to the log, no
    other descriptor than the readiness pipe."""

    def __init__(self, spec: dict, log_fd: int) -> None:
        self.returncode: int | None = None
        sys.stdout.flush()  # nothing buffered here may reach the daemon's log
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                keep = spec["ready_fd"]
                os.closerange(3, keep)
                os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
                from vfsd.serve import serve

                code = serve(spec)
            except BaseException:  # noqa: BLE001 - to the log, as a crashed process would
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["vfsd.serve"], timeout)
            time.sleep(0.005)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def spawn_daemon(run: RunDir, config: Config, store_dir: Path, volume: str,
                 resume_from: str | None = None, timeout: float = MOUNT_TIMEOUT_S,
                 progress: bool = True, shard: bool = False) -> dict:
    """Start the daemon and return once its mount answers; its ready info.

    The daemon writes lines on a pipe: `WAIT SECONDS TEXT` (it is about to wait
    up to SECONDS, for TEXT: said on stderr if it lasts), then one of `READY
    JSON` (mounted; JSON says read-only or not, and why) or `ERROR MESSAGE`;
    `PROGRESS PHASE DONE [TOTAL]` lines in between feed a progress bar (on a
    terminal, with `progress`).
    The answer is bounded: `timeout` plus the waits announced. Past it the
    daemon is stopped and its mount removed: a failure leaves nothing mounted.
    """
    rfd, wfd = os.pipe()
    spec = {"run_dir": str(run.path), "store": str(store_dir), "volume": volume,
            "config": config.as_dict(), "ready_fd": wfd, "resume_from": resume_from,
            "shard": shard}
    log_fd = os.open(run.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if FORK_DAEMON:
        proc: subprocess.Popen | ForkedDaemon = ForkedDaemon(spec, log_fd)
    else:
        args = [sys.executable, "-m", "vfsd.serve", json.dumps(spec)]
        proc = subprocess.Popen(args, pass_fds=(wfd,), stdin=subprocess.DEVNULL,
                                stdout=log_fd, stderr=log_fd, start_new_session=True)
    os.close(log_fd)
    os.close(wfd)
    started = time.monotonic()
    deadline = started + timeout
    waiting: tuple[float, str] | None = None  # (since, text) of a wait not said yet
    last_wait = ""
    buf = b""
    info: dict | None = None
    bars = contextlib.ExitStack()
    tell = bars.enter_context(phase_progress(enabled=progress))
    try:
        while info is None:
            now = time.monotonic()
            if now >= deadline:
                _give_up(proc, run, f"the daemon did not finish starting within "
                                    f"{now - started:.0f} s"
                                    + (f" (it was {last_wait})" if last_wait else ""))
            if waiting is not None and now - waiting[0] >= SAY_WAIT_AFTER_S:
                warn(waiting[1])
                waiting = None
            wake = min(deadline, waiting[0] + SAY_WAIT_AFTER_S if waiting else deadline)
            readable, _, _ = select.select([rfd], [], [], max(0.01, min(wake - now, 1.0)))
            if not readable:
                continue
            chunk = os.read(rfd, 65536)
            if not chunk:
                code = _reap(proc)
                _give_up(proc, run, f"the daemon exited (code {code}) before the mount was "
                                    "ready")
            buf += chunk
            while b"\n" in buf and info is None:
                line, buf = buf.split(b"\n", 1)
                kind, _, rest = line.decode(errors="replace").partition(" ")
                if kind == "WAIT":
                    secs, _, text = rest.partition(" ")
                    try:
                        extra = min(float(secs), 86400.0)
                    except ValueError:
                        extra = 0.0
                    deadline = max(deadline, time.monotonic() + extra + timeout)
                    waiting, last_wait = (time.monotonic(), text), text
                elif kind == "PROGRESS":
                    phase, _, counts = rest.partition(" ")
                    done, _, total = counts.partition(" ")
                    with contextlib.suppress(ValueError):
                        tell(phase, int(done), int(total) if total else None)
                elif kind == "ERROR":
                    _reap(proc)
                    fail(rest)
                elif kind == "READY":
                    try:
                        info = json.loads(rest) if rest else {}
                    except ValueError:
                        info = {}
    finally:
        bars.close()
        os.close(rfd)
    # The FUSE loop is running; wait until the mount answers a stat.
    answer_by = time.monotonic() + ANSWER_TIMEOUT_S
    while mount_state(run.mountpoint) != "live":
        if proc.poll() is not None:
            _give_up(proc, run, f"the daemon exited (code {proc.returncode}) once mounted")
        if time.monotonic() >= answer_by:
            _give_up(proc, run, f"the mount did not answer within {ANSWER_TIMEOUT_S:.0f} s "
                                "of being made")
        time.sleep(0.005)
    return info


def _reap(proc: subprocess.Popen) -> int | None:
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


def _give_up(proc: subprocess.Popen, run: RunDir, why: str) -> None:
    """Stop a daemon that did not get ready, leave nothing mounted, and say so."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    left = "nothing is mounted"
    if mount_state(run.mountpoint) != "none" and not remove_stale_mount(run.mountpoint):
        left = f"its mount on {run.mountpoint} could not be removed (fusermount3 -u -z)"
    fail(f"{why}; the daemon was stopped and {left}; see {run.log}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the run's snapshots to be published (a remote run) "
                   "and for the daemon to commit and exit.")
@click.option("--force", is_flag=True,
              help="Do not wait for publication: unmount now (what is unpublished stays in "
                   "the local store, and exit code 3 says so).")
@json_option
def umount(run_dir: Path, timeout: float, force: bool, as_json: bool) -> None:
    """Unmount RUN_DIR/fs once its snapshots are published (remote runs), then wait for the daemon to exit.

    Like umount.s3ql: a remote run's last snapshot is published first (bounded
    by --timeout; --force skips the wait). Work left unpublished (snapshots,
    chunks) is said on stderr and in the log, and the exit code is 3; it stays
    in the local store and the next `vfsd mount` publishes it.
    """
    run = RunDir(run_dir)
    pid = run.read_pid()
    state = mount_state(run.mountpoint)
    if state == "none" and not pid_alive(pid):
        if pid is not None:  # a daemon killed after its mount was removed
            _forget_dead_daemon(run)
        fail(f"{run.mountpoint} is not mounted")
    if state == "stale":
        if not remove_stale_mount(run.mountpoint):
            fail(f"cannot remove the stale mount on {run.mountpoint} (its daemon is gone): "
                  f"fusermount3 -u -z failed; try it by hand")
        _forget_dead_daemon(run)
        emit({"unmounted": str(run.mountpoint), "stale": True, "unpublished": []}, as_json,
             lambda d: f"vfsd: removed the stale mount on {d['unmounted']}")
        return
    deadline = time.monotonic() + timeout
    left = None
    if state == "live":
        left = _publish_first(run, deadline, force)
        # Everything programs wrote reaches the daemon now: should another mount
        # namespace hold the mount, unmounting here writes nothing back.
        with contextlib.suppress(OSError):  # best effort: the unmount writes back too
            syncfs(run.mountpoint)
        proc = subprocess.run(["fusermount3", "-u", "--", str(run.mountpoint)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"cannot unmount {run.mountpoint}: {proc.stderr.strip()} "
                  "(files still open? see `fuser -vm` on it)")
    exit_by = max(deadline, time.monotonic() + 10.0)  # committing takes a moment
    held_at = time.monotonic() + min(HELD_ELSEWHERE_AFTER, timeout)
    while pid_alive(pid) and time.monotonic() < exit_by:
        if held_at is not None and time.monotonic() > held_at:
            held_at = None
            _stop_held_elsewhere(run)
        time.sleep(0.02)
    if pid_alive(pid):
        fail(f"the daemon (pid {pid}) did not exit within {timeout:.0f} s")
    doc = {"unmounted": str(run.mountpoint), "unpublished": (left or {}).get("snapshots", []),
           "backlog": (left or {}).get("backlog")}
    emit(doc, as_json, lambda d: f"vfsd: unmounted {d['unmounted']}")
    if left and left["snapshots"]:
        ids = left["snapshots"]
        backlog = left.get("backlog") or {}
        warn(f"left unpublished in {left['remote']}: {len(ids)} snapshot(s) "
             f"({', '.join(ids[-5:])}), {backlog.get('upload_chunks', 0)} chunk(s) "
             f"({human(backlog.get('upload_bytes', 0))}) still to upload"
             + (f"; {left['why']}" if left.get("why") else "")
             + f". They are kept in {run.path}'s local store; the next `vfsd mount "
               f"{run.path}` publishes them")
        sys.exit(EXIT_UNPUBLISHED)


#: seconds after the unmount before a daemon still serving is taken to be held
#: by another mount namespace (it commits and exits well within this otherwise)
HELD_ELSEWHERE_AFTER = 3.0


def _stop_held_elsewhere(run: RunDir) -> None:
    """The mount is gone here but the daemon still serves: another mount
    namespace holds a copy of the mount (`unshare -m`, a container or service
    with private mounts started while it was up), and the kernel keeps the
    session alive for it. Ask the daemon to end it (it refuses while the mount
    is still here), and say so."""
    try:
        with ControlClient(run.sock, timeout=10.0) as c:
            c.call("stop")
    except (ControlError, DaemonUnreachable, OSError):
        return  # stopping already, or it will say why in its log
    warn(f"{run.mountpoint} was unmounted here, but another mount namespace still held "
         "the mount (a process started with a private copy of the mount table); the "
         "daemon ended the session, which ends the mount there too")


def _forget_dead_daemon(run: RunDir) -> None:
    """A daemon that died without cleaning up leaves its pid file and socket."""
    for path in (run.pidfile, run.sock):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _publish_first(run: RunDir, deadline: float, force: bool) -> dict | None:
    """Wait (until `deadline`, unless `force`) for a remote run's latest snapshot to be
    published. None for a run without a remote; else what is left unpublished."""
    def ask(op: str) -> dict | None:
        try:
            with ControlClient(run.sock, timeout=30.0) as c:
                return c.call(op)
        except ControlError as exc:
            if exc.code in ("no_remote", "unknown_op"):
                return None
            raise
    try:
        if ask("shard") is not None:
            return None  # a shard: each run publishes what it made before it ends
        status = ask("publish_status")
        if status is None:
            return None
        why = None
        pending = [s["id"] for s in status["snapshots"] if not s["published"]]
        if pending and status["state"] != "lost" and not force:
            wait = deadline - time.monotonic()
            if wait > 0:
                warn(f"waiting up to {wait:.0f} s for {pending[-1]} to be published to "
                     f"{status['remote']} (--force skips this)")
                try:
                    with ControlClient(run.sock, timeout=wait + 30) as c:
                        c.call("sync", snapshot=pending[-1], timeout=max(0.1, wait))
                except ControlError as exc:
                    why = exc.message
            status = ask("publish_status") or status
        elif pending and status["state"] == "lost":
            # Another worker holds the run: nothing here will ever be published,
            # and waiting cannot change that. Said, not counted as left.
            warn(f"{len(pending)} snapshot(s) of this read-only mount ({', '.join(pending[-5:])}) "
                 f"will never be published from here: {status['reason']}")
            return {"remote": status["remote"], "snapshots": [], "backlog": status["backlog"],
                    "why": None}
        elif pending and force:
            why = "--force: not waited for"
        latest_published = {s["id"] for s in status["snapshots"] if s["published"]}
        # A snapshot older than a published one is covered by it: only those
        # after the last published one are work another worker cannot resume.
        seqs = [int(s["id"][1:]) for s in status["snapshots"] if s["id"] in latest_published]
        top = max(seqs) if seqs else 0
        left = [s["id"] for s in status["snapshots"]
                if not s["published"] and int(s["id"][1:]) > top]
        return {"remote": status["remote"], "snapshots": left, "backlog": status["backlog"],
                "why": why}
    except (DaemonUnreachable, ControlError, OSError, ValueError) as exc:
        warn(f"cannot ask the daemon what is unpublished ({exc}); unmounting")
        return None
