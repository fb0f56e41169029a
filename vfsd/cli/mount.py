"""`vfsd mount` and `vfsd umount`: start a daemon on a run dir, stop it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click

from vfsd.config import Config, ConfigError, load_config
from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir, mount_state, pid_alive, remove_stale_mount, utf8_problem

from .common import cli, fail
from .options import OPTION_KEYS, config_options

MOUNT_TIMEOUT_S = 30.0


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--store", type=click.Path(file_okay=False, path_type=Path),
              help="Store directory (shared stores dedup across run dirs) [RUN_DIR/.vfsd].")
@click.option("--foreground", "-f", is_flag=True, help="Run the daemon in this process.")
@click.option("--log-stderr", is_flag=True, help="Log to stderr instead of RUN_DIR/.vfsd/vfsd.log.")
@click.option("--from", "--resume-from", "resume_from", metavar="RUN_ID@SNAPSHOT",
              help="Start from a snapshot published in the --remote bucket (an empty run "
                   "dir; files are fetched on first read).")
@config_options
def mount(run_dir: Path, store: Path | None, foreground: bool, log_stderr: bool,
          resume_from: str | None, config_path: Path | None, **opts) -> None:
    """Mount RUN_DIR/fs, with the store in RUN_DIR/.vfsd unless --store says otherwise.

    Returns once the mount answers. With --remote, the run's chunks and
    snapshots go to an S3 bucket; with --from RUN_ID@SNAPSHOT, an empty run
    dir resumes a run published there by another worker.
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
    if foreground:
        from vfsd.daemon import run_daemon

        sys.exit(run_daemon(run, config, store_dir, volume, log_to_stderr=log_stderr,
                            resume_from=resume_from))
    spawn_daemon(run, config, store_dir, volume, resume_from)
    click.echo(f"vfsd: mounted {run.mountpoint} (store {store_dir})")
    _say_if_read_only(run)


def _say_if_read_only(run: RunDir) -> None:
    """A remote run dir mounted read-only (another worker holds the run): say so."""
    try:
        with ControlClient(run.sock, timeout=10) as c:
            remote = c.call("stats").get("remote")
    except (DaemonUnreachable, ControlError, OSError, ValueError):
        return
    if remote and remote.get("read_only"):
        click.echo(f"vfsd: read-only: {remote.get('reason')}", err=True)
    elif remote and remote.get("state") != "held":
        click.echo(f"vfsd: {remote.get('reason')}", err=True)


def spawn_daemon(run: RunDir, config: Config, store_dir: Path, volume: str,
                  resume_from: str | None = None) -> None:
    rfd, wfd = os.pipe()
    args = [sys.executable, "-m", "vfsd.serve", "--run-dir", str(run.path),
            "--store", str(store_dir), "--volume", volume,
            "--config-json", json.dumps(config.as_dict()), "--ready-fd", str(wfd)]
    if resume_from is not None:
        args += ["--resume-from", resume_from]
    log_fd = os.open(run.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(log_fd, "ab") as logf:
        proc = subprocess.Popen(args, pass_fds=(wfd,), stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=logf, start_new_session=True)
    os.close(wfd)
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    msg = b""
    with os.fdopen(rfd, "rb") as r:
        msg = r.readline().strip()
    if msg.startswith(b"ERROR"):
        proc.wait(timeout=10)
        fail(msg[6:].decode(errors="replace"))
    if msg != b"READY":
        code = proc.poll()
        fail(f"the daemon exited (code {code}) before the mount was ready; see {run.log}")
    # The FUSE loop is running; wait until the mount answers a stat.
    while time.monotonic() < deadline:
        if mount_state(run.mountpoint) == "live":
            return
        if proc.poll() is not None:
            fail(f"the daemon exited (code {proc.returncode}); see {run.log}")
        time.sleep(0.02)
    fail(f"the mount did not answer within {MOUNT_TIMEOUT_S:.0f} s; see {run.log}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the daemon.")
def umount(run_dir: Path, timeout: float) -> None:
    """Unmount RUN_DIR/fs and wait for the daemon to commit and exit."""
    run = RunDir(run_dir)
    pid = run.read_pid()
    state = mount_state(run.mountpoint)
    if state == "none" and not pid_alive(pid):
        fail(f"{run.mountpoint} is not mounted")
    if state == "stale":
        if not remove_stale_mount(run.mountpoint):
            fail(f"cannot remove the stale mount on {run.mountpoint} (its daemon is gone): "
                  f"fusermount3 -u -z failed; try it by hand")
        click.echo(f"vfsd: removed the stale mount on {run.mountpoint}")
        return
    if state == "live":
        proc = subprocess.run(["fusermount3", "-u", "--", str(run.mountpoint)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"cannot unmount {run.mountpoint}: {proc.stderr.strip()} "
                  "(files still open? see `fuser -vm` on it)")
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid_alive(pid):
        fail(f"the daemon (pid {pid}) did not exit within {timeout:.0f} s")
    click.echo(f"vfsd: unmounted {run.mountpoint}")
