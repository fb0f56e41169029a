"""The `vfsd` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click

from .client import ControlClient, ControlError, DaemonUnreachable
from .config import Config, ConfigError, load_config
from .rundir import RunDir, mount_state, pid_alive, remove_stale_mount, utf8_problem

MOUNT_TIMEOUT_S = 30.0


def _fail(msg: str, code: int = 1):
    click.echo(f"vfsd: {msg}", err=True)
    sys.exit(code)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vfsd")
def cli() -> None:
    """vfsd: a FUSE filesystem for LLM agent artifacts."""


def _config_options(fn):
    opts = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
                     help="TOML file with daemon options (command-line flags win)."),
        click.option("--inline-max", type=int, help="Bytes up to which content is kept inline in LMDB [65536]."),
        click.option("--chunk-size", type=int, help="Chunk size in bytes for larger files [1048576]."),
        click.option("--done-retention-steps", type=int, help="Steps a done file is kept [3]."),
        click.option("--max-age-steps", type=int, help="Steps any unpinned file is kept [20]."),
        click.option("--quota-bytes", type=int, help="Byte quota; oldest unpinned files go first."),
        click.option("--max-files", type=int, help="File-count limit; oldest unpinned files go first."),
        click.option("--durability", type=click.Choice(["fsync", "sync"]),
                     help="fsync: durable on fsync() [default]; sync: also on close."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"])),
        click.option("--allow-other/--no-allow-other", default=None,
                     help="Let other users reach the mount (needs user_allow_other)."),
        click.option("--entry-timeout", type=float, help="Kernel entry/attribute cache seconds [3600]."),
        click.option("--max-tasks", type=int, help="FUSE requests handled concurrently [16]."),
        click.option("--metrics-port", type=int, help="Serve Prometheus metrics on 127.0.0.1:PORT."),
        click.option("--snapshot-keep-last", type=int, help="Snapshots kept, newest first [32]."),
        click.option("--snapshot-keep-steps", type=int,
                     help="Also keep snapshots younger than this many steps (0: off) [20]."),
        click.option("--xattr-reads/--no-xattr-reads", default=None,
                     help="Answer getxattr (costs a round trip per write(); off: read "
                          "attributes from .vfsd/attr/PATH) [off]."),
        click.option("--remote", "--remote-url", "remote_url", metavar="s3://BUCKET/PREFIX",
                     help="Keep the run's chunks and published snapshots in this bucket "
                          "prefix (remembered by the store)."),
        click.option("--remote-endpoint-url", help="S3 endpoint URL [AWS_ENDPOINT_URL, else AWS]."),
        click.option("--remote-region", help="S3 region [AWS_REGION, the profile's, else us-east-1]."),
        click.option("--remote-profile", help="AWS profile for the object store [AWS_PROFILE]."),
        click.option("--remote-credentials-file",
                     help="AWS-format credentials file [~/.aws/credentials]."),
        click.option("--remote-addressing-style", type=click.Choice(["auto", "path", "virtual"]),
                     help="Bucket in the path or in the host name [auto]."),
        click.option("--remote-connect-timeout", type=float,
                     help="Seconds to connect to the object store [5]."),
        click.option("--remote-read-timeout", type=float,
                     help="Seconds to wait for object store data [30]."),
        click.option("--remote-max-attempts", type=int,
                     help="Tries per object store request, transient errors only [5]."),
        click.option("--remote-retry-base-delay", type=float,
                     help="First retry delay in seconds; doubles, with jitter [0.1]."),
        click.option("--remote-retry-max-delay", type=float, help="Longest retry delay [10]."),
        click.option("--remote-workers", type=int, help="Object store requests in flight [8]."),
        click.option("--remote-upload-queue", type=int,
                     help="Chunks queued for upload in memory; the rest wait on disk [4096]."),
        click.option("--remote-fetch-timeout", type=float,
                     help="Seconds a read waits for a chunk from the object store [30]."),
        click.option("--remote-readahead-chunks", type=int,
                     help="Chunks fetched ahead of a sequential read [4]."),
        click.option("--remote-cache-bytes", type=int,
                     help="Bound of the local chunk cache of a remote run."),
        click.option("--remote-lease-ttl", type=float,
                     help="Seconds a run's writer lease lives without renewal [30]."),
        click.option("--remote-lease-wait", type=float,
                     help="Seconds a mount waits for another worker's lease to lapse "
                          "[lease TTL + 5]."),
        click.option("--remote-full-every", type=int,
                     help="Publish a full manifest every N publications [16]."),
        click.option("--remote-gc-grace", type=float,
                     help="Bucket GC never deletes chunks younger than this [3600]."),
        click.option("--control-idle-timeout", type=float,
                     help="Seconds a control connection may stay idle [300]."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


_OPTION_KEYS = ("inline_max", "chunk_size", "done_retention_steps", "max_age_steps",
                "quota_bytes", "max_files", "durability", "log_level", "allow_other",
                "entry_timeout", "max_tasks", "metrics_port", "snapshot_keep_last",
                "snapshot_keep_steps", "xattr_reads",
                "remote_url", "remote_endpoint_url", "remote_region", "remote_profile",
                "remote_credentials_file", "remote_addressing_style", "remote_connect_timeout",
                "remote_read_timeout", "remote_max_attempts", "remote_retry_base_delay",
                "remote_retry_max_delay", "remote_workers", "remote_upload_queue",
                "remote_fetch_timeout", "remote_readahead_chunks", "remote_cache_bytes",
                "remote_lease_ttl", "remote_lease_wait", "remote_full_every", "remote_gc_grace",
                "control_idle_timeout")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--store", type=click.Path(file_okay=False, path_type=Path),
              help="Store directory (shared stores dedup across run dirs) [RUN_DIR/.vfsd].")
@click.option("--foreground", "-f", is_flag=True, help="Run the daemon in this process.")
@click.option("--log-stderr", is_flag=True, help="Log to stderr instead of RUN_DIR/.vfsd/vfsd.log.")
@click.option("--from", "--resume-from", "resume_from", metavar="RUN_ID@SNAPSHOT",
              help="Start from a snapshot published in the --remote bucket (an empty run "
                   "dir; files are fetched on first read).")
@_config_options
def mount(run_dir: Path, store: Path | None, foreground: bool, log_stderr: bool,
          resume_from: str | None, config_path: Path | None, **opts) -> None:
    """Mount RUN_DIR/fs, with the store in RUN_DIR/.vfsd unless --store says otherwise.

    Returns once the mount answers. With --remote, the run's chunks and
    snapshots go to an S3 bucket; with --from RUN_ID@SNAPSHOT, an empty run
    dir resumes a run published there by another worker.
    """
    try:
        config = load_config(config_path, {k: opts.get(k) for k in _OPTION_KEYS})
    except (ConfigError, TypeError) as exc:
        _fail(str(exc), 2)
    if resume_from is not None:
        from .remote import BadResumeSpec, parse_resume_spec

        try:
            parse_resume_spec(resume_from)
        except BadResumeSpec as exc:
            _fail(str(exc), 2)
        if config.remote_url is None:
            _fail("--from needs --remote s3://BUCKET/PREFIX (where the run was published)", 2)
    run = RunDir(run_dir)
    if run.path.exists() and not run.path.is_dir():
        _fail(f"{run.path} exists and is not a directory", 2)
    try:
        store_dir, volume = run.store_location(store)
    except ValueError as exc:
        _fail(str(exc), 2)
    problem = utf8_problem(store_dir)
    if problem is not None:
        _fail(problem, 2)
    try:
        if not run.state.exists():
            run.state.mkdir(parents=True, mode=0o700)
            os.chmod(run.state, 0o700)  # mkdir's mode is cut by the umask
    except OSError as exc:
        _fail(f"cannot create {run.state}: {exc}", 2)
    if foreground:
        from .daemon import run_daemon

        sys.exit(run_daemon(run, config, store_dir, volume, log_to_stderr=log_stderr,
                            resume_from=resume_from))
    _spawn_daemon(run, config, store_dir, volume, resume_from)
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


def _spawn_daemon(run: RunDir, config: Config, store_dir: Path, volume: str,
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
        _fail(msg[6:].decode(errors="replace"))
    if msg != b"READY":
        code = proc.poll()
        _fail(f"the daemon exited (code {code}) before the mount was ready; see {run.log}")
    # The FUSE loop is running; wait until the mount answers a stat.
    while time.monotonic() < deadline:
        if mount_state(run.mountpoint) == "live":
            return
        if proc.poll() is not None:
            _fail(f"the daemon exited (code {proc.returncode}); see {run.log}")
        time.sleep(0.02)
    _fail(f"the mount did not answer within {MOUNT_TIMEOUT_S:.0f} s; see {run.log}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the daemon.")
def umount(run_dir: Path, timeout: float) -> None:
    """Unmount RUN_DIR/fs and wait for the daemon to commit and exit."""
    run = RunDir(run_dir)
    pid = run.read_pid()
    state = mount_state(run.mountpoint)
    if state == "none" and not pid_alive(pid):
        _fail(f"{run.mountpoint} is not mounted")
    if state == "stale":
        if not remove_stale_mount(run.mountpoint):
            _fail(f"cannot remove the stale mount on {run.mountpoint} (its daemon is gone): "
                  f"fusermount3 -u -z failed; try it by hand")
        click.echo(f"vfsd: removed the stale mount on {run.mountpoint}")
        return
    if state == "live":
        proc = subprocess.run(["fusermount3", "-u", "--", str(run.mountpoint)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            _fail(f"cannot unmount {run.mountpoint}: {proc.stderr.strip()} "
                  "(files still open? see `fuser -vm` on it)")
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid_alive(pid):
        _fail(f"the daemon (pid {pid}) did not exit within {timeout:.0f} s")
    click.echo(f"vfsd: unmounted {run.mountpoint}")


def _unreachable(run: RunDir, exc: DaemonUnreachable) -> str:
    """What to tell the user when the daemon did not answer."""
    pid = run.read_pid()
    # A killed process closes its sockets a moment before it is gone.
    deadline = time.monotonic() + 2.0
    while pid is not None and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid is not None and not pid_alive(pid):
        return (f"{exc}: the daemon (pid {pid}) has exited; see {run.log}. "
                f"`vfsd mount {run.path}` removes the dead mount and mounts again")
    if pid is None:
        return f"{exc}; is {run.path} mounted?"
    return f"{exc}; see {run.log}"


def _control_failure(run: RunDir, exc: ControlError) -> str:
    if exc.code == "not_found":
        return f"not found: {exc.message}"
    if exc.code == "busy":
        return (f"the daemon of {run.path} is saturated ({exc.message}); "
                "retry in a moment")
    return exc.message


def _call(run_path: Path, op: str, /, client_timeout: float = 60.0, **args) -> dict:
    """One control request; any failure ends the command with a clear message."""
    run = RunDir(run_path)
    try:
        with ControlClient(run.sock, timeout=client_timeout) as c:
            return c.call(op, **args)
    except DaemonUnreachable as exc:
        _fail(_unreachable(run, exc))
    except ControlError as exc:
        _fail(_control_failure(run, exc))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(run_dir: Path, as_json: bool) -> None:
    """Files, bytes per tier, chunks, dedup ratio and live counters."""
    run = RunDir(run_dir)
    try:
        with ControlClient(run.sock, timeout=30) as c:
            doc = c.call("stats")
    except ControlError as exc:
        _fail(_control_failure(run, exc))
    except DaemonUnreachable:
        from .status import store_status
        from .store import Store

        try:
            store_dir, volume = run.store_location()
            st = Store(store_dir, volume, readonly=True, create=False)
        except Exception as exc:
            _fail(f"no vfsd store for {run.path}: {exc}")
        doc = {**store_status(st), "running": False}
        st.close()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    rows = [
        ("running", "yes" if doc.get("running") else "no"),
        ("store", doc["store"]),
        ("step", doc["step"]),
        ("files", doc["files"]),
        ("logical bytes", _human(doc["logical_bytes"])),
        ("  inline (LMDB)", _human(doc["inline_bytes"])),
        ("  chunked", _human(doc["chunked_bytes"])),
        ("chunks", f"{doc['chunk_count']} ({_human(doc['chunk_bytes'])})"),
        ("stored bytes", _human(doc["stored_bytes"])),
        ("dedup ratio", f"{doc['dedup_ratio']:.2f}x"),
        ("xattrs", _human(doc["xattr_bytes"])),
    ]
    remote = doc.get("remote")
    if remote:
        backlog = remote.get("backlog", {})
        age = remote.get("oldest_unpublished_change_age_s")
        rows += [
            ("remote", remote.get("url")),
            ("  run", remote.get("run")),
            ("  lease", remote.get("state") + (f" ({remote['reason']})"
                                               if remote.get("reason") else "")),
            ("  upload backlog", f"{backlog.get('chunks', 0)} chunk(s), "
                                 f"{_human(backlog.get('bytes', 0))}"),
            ("  uploaded, unpublished", f"{backlog.get('unpublished_chunks', 0)} chunk(s)"),
            ("  published", (remote.get("publisher") or {}).get("published") or "none"),
            ("  oldest unpublished change", "none" if age is None else f"{age:.1f} s ago"),
            ("  last error", remote.get("last_error") or "none"),
        ]
        cache = remote.get("cache") or {}
        if cache:
            limit = cache.get("limit")
            rows.append(("  local chunk cache", f"{_human(cache.get('bytes', 0))}"
                         + (f" of {_human(limit)}" if limit else " (no bound)")))
    if "quota_used_bytes" in doc:
        limit = f" of {_human(doc['quota_bytes'])}" if doc.get("quota_bytes") else ""
        rows.append(("quota used", f"{_human(doc['quota_used_bytes'])}{limit}"))
    for key, value in doc.get("counters", {}).items():
        rows.append((key.replace("_", " "), value))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("step", type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True)
def step(run_dir: Path, step: int, as_json: bool) -> None:
    """Advance the agent step to STEP and apply eviction."""
    report = _call(run_dir, "set_step", step=step)
    _print_report(report, as_json)


def _print_report(report: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    verb = "would evict" if report["dry_run"] else "evicted"
    click.echo(f"step {report['step']}: {verb} {report['files']} file(s), "
               f"{_human(report['bytes'])}")
    for r in report["evicted"]:
        click.echo(f"  {r['reason']:<9} {r['path']}  ({_human(r['size'])}, written at step {r['step']})")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Report what would go, remove nothing.")
@click.option("--json", "as_json", is_flag=True)
def evict(run_dir: Path, dry_run: bool, as_json: bool) -> None:
    """Apply the eviction policy now."""
    _print_report(_call(run_dir, "evict", dry_run=dry_run), as_json)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def evicted(run_dir: Path, limit: int, as_json: bool) -> None:
    """The eviction log, oldest first."""
    records = _call(run_dir, "evicted", limit=limit)["records"]
    if as_json:
        click.echo(json.dumps(records, indent=2))
        return
    for r in records:
        click.echo(f"step {r['evicted_step']:>5}  {r['reason']:<9} {r['path']}  "
                   f"ino={r['ino']} size={r['size']} hash={r['hash']}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--snapshot", "snapshot_id", help="Wait for this snapshot instead of the latest.")
@click.option("--take", is_flag=True, help="Take a snapshot first, then wait for it.")
@click.option("--timeout", default=60.0, show_default=True,
              help="Seconds to wait before giving up (the publication goes on).")
@click.option("--json", "as_json", is_flag=True)
def sync(run_dir: Path, snapshot_id: str | None, take: bool, timeout: float,
         as_json: bool) -> None:
    """Wait until the latest snapshot of RUN_DIR is published to its bucket."""
    if take:
        snapshot_id = _call(run_dir, "snapshot")["id"]
    args = {"timeout": timeout}
    if snapshot_id:
        args["snapshot"] = snapshot_id
    res = _call(run_dir, "sync", client_timeout=timeout + 30, **args)
    if as_json:
        click.echo(json.dumps(res, indent=2))
    elif res.get("published") is None:
        click.echo(f"vfsd: {res.get('message', 'nothing to publish')}")
    else:
        click.echo(f"vfsd: {res['published']} of run {res['run']} is published in "
                   f"{res['remote']}")


@cli.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--remote", "remote_url", metavar="s3://BUCKET/PREFIX",
              help="Sweep this bucket prefix (chunks no manifest of any run names).")
@click.option("--bucket", is_flag=True,
              help="Ask RUN_DIR's daemon to sweep its bucket instead of its local store.")
@click.option("--grace", type=float, help="Keep chunks younger than this many seconds "
                                          "[remote_gc_grace, 3600].")
@click.option("--dry-run", is_flag=True, help="Report what would go; delete nothing.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file with the remote_* options (endpoint, credentials...).")
@click.option("--compact", "do_compact", is_flag=True,
              help="Also shrink the LMDB file to what it holds (no daemon may use the store).")
def gc(run_dir: Path | None, remote_url: str | None, bucket: bool, grace: float | None,
       dry_run: bool, config_path: Path | None, do_compact: bool) -> None:
    """Remove unreferenced chunks: from RUN_DIR's store, or from a bucket.

    `vfsd gc RUN_DIR` cleans the local store; `vfsd gc --remote s3://B/P`
    (or `vfsd gc RUN_DIR --bucket`) marks the chunks every run's manifests
    name and deletes the others older than the grace period.
    """
    if remote_url is not None:
        _gc_bucket(remote_url, grace, dry_run, config_path)
        return
    if run_dir is None:
        _fail("give RUN_DIR (local store) or --remote s3://BUCKET/PREFIX", 2)
    run = RunDir(run_dir)
    if bucket:
        args = {"remote": True, "dry_run": dry_run}
        if grace is not None:
            args["grace"] = grace
        click.echo(json.dumps(_call(run_dir, "gc", client_timeout=3600, **args)))
        return
    if pid_alive(run.read_pid()):
        if do_compact:
            _fail(f"{run.path} is mounted: unmount it to compact its store")
        result = _call(run_dir, "gc")
    else:
        result = _gc_offline(run, do_compact)
    click.echo(json.dumps(result))


def _gc_offline(run: RunDir, do_compact: bool) -> dict:
    """gc (and compaction) of an unmounted run dir's store, in this process."""
    from . import compact
    from .errors import StoreLocked, StoreVersionError
    from .fsck import lock_all
    from .lmdbcheck import check_readable
    from .store import Store

    store_dir, volume = run.store_location()
    if not compact.exists(store_dir):
        _fail(f"no vfsd store at {store_dir}")
    locks: list[int] = []
    try:
        try:
            hold = compact.hold(store_dir)
        except StoreLocked as exc:
            _fail(str(exc))
        try:
            # Never write to (or copy) a store whose pages do not all read.
            damage = (check_readable(store_dir)
                      if (store_dir / "lmdb" / "data.mdb").exists() else None)
            if damage is not None:
                _fail(f"{damage}; run `vfsd fsck {store_dir}` for a report")
            try:
                st = Store(store_dir, volume, create=False)
            except StoreVersionError as exc:
                _fail(str(exc))
            try:
                locks = lock_all(st) if do_compact else []
                result = st.gc_chunks(min_temp_age_s=0)
            except StoreLocked as exc:
                _fail(f"{exc}; unmount it to compact the store")
            finally:
                st.close()
        finally:
            os.close(hold)
        if do_compact:
            try:
                result.update(compact.compact(store_dir))
            except StoreLocked as exc:
                _fail(str(exc))
    finally:
        for fd in locks:
            os.close(fd)
    return result


def _remote_store(url_text: str, config_path: Path | None):
    """An ObjectStore for a command-line tool (settings from --config and AWS_*)."""
    from .logs import setup_logging
    from .objstore import BadRemoteURL, ObjectStore, RemoteError, RemoteSettings, RemoteURL

    setup_logging("warning", sys.stderr)  # stdout is the command's answer
    try:
        config = load_config(config_path, {})
        url = RemoteURL.parse(url_text)
        return ObjectStore(url, RemoteSettings.from_config(config)), config
    except (ConfigError, BadRemoteURL) as exc:
        _fail(str(exc), 2)
    except RemoteError as exc:
        _fail(str(exc))


def _gc_bucket(url_text: str, grace: float | None, dry_run: bool,
               config_path: Path | None) -> None:
    from .bucketgc import GcError, sweep
    from .objstore import RemoteError

    store, config = _remote_store(url_text, config_path)
    try:
        report = sweep(store, grace=grace if grace is not None else config.remote_gc_grace,
                       dry_run=dry_run)
    except (GcError, RemoteError) as exc:
        _fail(str(exc))
    finally:
        store.close()
    click.echo(json.dumps(report.as_dict()))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("path")
def ref(run_dir: Path, path: str) -> None:
    """Print the reference (JSON) of PATH, relative to the mount root or absolute inside it."""
    run = RunDir(run_dir)
    p = Path(path)
    if p.is_absolute():
        try:
            path = str(Path(os.path.abspath(p)).relative_to(run.mountpoint))
        except ValueError:
            _fail(f"{path} is not inside {run.mountpoint}", 2)
    click.echo(json.dumps(_call(run_dir, "ref", path=path)))


# ------------------------------------------------------------------ snapshots


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--pin", is_flag=True, help="Keep it whatever the retention policy says.")
@click.option("--label", default="", help="A note stored with the snapshot.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with at least `id`).")
def snapshot(run_dir: Path, pin: bool, label: str, as_json: bool) -> None:
    """Snapshot the files of RUN_DIR now; prints the snapshot's id."""
    rec = _call(run_dir, "snapshot", pin=pin, label=label)
    click.echo(json.dumps(rec, indent=2) if as_json else rec["id"])


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def snapshots(run_dir: Path, as_json: bool) -> None:
    """List the retained snapshots of RUN_DIR, oldest first."""
    doc = _call(run_dir, "snapshots")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for s in doc["snapshots"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["created_ns"] / 1e9))
        flags = " pinned" if s["pinned"] else ""
        label = f"  {s['label']}" if s["label"] else ""
        click.echo(f"{s['id']:>8}  step {s['step']:<6} {when}{flags}{label}")
    state = "unchanged since" if not doc["changed"] else "changed since"
    if doc["base"]:
        click.echo(f"live files: {state} {doc['base']}")


@cli.command("snapshot-delete")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
def snapshot_delete(run_dir: Path, snapshot_id: str) -> None:
    """Delete a snapshot (content only it kept is freed)."""
    rec = _call(run_dir, "snapshot_delete", snapshot=snapshot_id)
    click.echo(f"vfsd: deleted {rec['id']}")


@cli.command("snapshot-pin")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.option("--unpin", is_flag=True, help="Let retention delete it again.")
def snapshot_pin(run_dir: Path, snapshot_id: str, unpin: bool) -> None:
    """Pin a snapshot (retention never deletes it) or unpin it."""
    rec = _call(run_dir, "snapshot_pin", snapshot=snapshot_id, pin=not unpin)
    click.echo(f"vfsd: {rec['id']} {'pinned' if rec['pinned'] else 'unpinned'}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.option("--json", "as_json", is_flag=True)
def restore(run_dir: Path, snapshot_id: str, as_json: bool) -> None:
    """Make the files of RUN_DIR exactly what SNAPSHOT_ID holds.

    Files made since disappear, changed files revert, evicted ones return;
    the step goes back to the snapshot's.
    """
    res = _call(run_dir, "restore", snapshot=snapshot_id)
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        click.echo(f"vfsd: restored {res['id']} ({res['changed']} change(s) undone, "
                   f"step {res['step']})")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("snapshot_id")
@click.argument("new_run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--no-mount", is_flag=True, help="Only create it; mount it later with `vfsd mount`.")
@click.option("--json", "as_json", is_flag=True)
def fork(run_dir: Path, snapshot_id: str, new_run_dir: Path, no_mount: bool,
         as_json: bool) -> None:
    """Start NEW_RUN_DIR from SNAPSHOT_ID of RUN_DIR (sharing its store; no content copied)."""
    new = RunDir(new_run_dir)
    res = _call(run_dir, "fork", snapshot=snapshot_id, run_dir=str(new.path))
    if not no_mount:
        config = load_config(None, {})
        _spawn_daemon(new, config, Path(res["store"]), res["volume"])
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        click.echo(f"vfsd: {new.path} starts from {snapshot_id} of {RunDir(run_dir).path} "
                   f"({res['files']} files)" + ("" if no_mount else f"; mounted {new.mountpoint}"))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("a")
@click.argument("b", required=False, default="live")
@click.option("--json", "as_json", is_flag=True)
def diff(run_dir: Path, a: str, b: str, as_json: bool) -> None:
    """What changed from snapshot A to snapshot B (default: the live files)."""
    res = _call(run_dir, "diff", a=a, b=b)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    marks = {"added": "A", "removed": "D", "modified": "M", "renamed": "R", "attributes": "T"}
    for c in res["changes"]:
        where = f"{c['old_path']} -> {c['path']}" if c.get("old_path") else c["path"]
        click.echo(f"{marks.get(c['change'], '?')}  {where}")


@cli.command()
@click.argument("target", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--repair", is_flag=True, help="Fix what can be fixed.")
@click.option("--verify", is_flag=True, help="Also read and hash every chunk.")
@click.option("--remote", "check_remote", is_flag=True,
              help="Look up chunks missing locally in the store's bucket (with --verify: "
                   "download and hash them).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file with the remote_* options, for --remote.")
@click.option("--json", "as_json", is_flag=True)
def fsck(target: Path, repair: bool, verify: bool, check_remote: bool,
         config_path: Path | None, as_json: bool) -> None:
    """Check a store (RUN_DIR or a --store directory) with no daemon on it.

    In a store with a remote, chunks absent locally but uploaded are
    "remote-only", not damage; --remote checks that the bucket has them.
    """
    from . import compact
    from .errors import StoreLocked

    if compact.exists(target):
        store_dir, volume = target, None
    else:
        store_dir, volume = RunDir(target).store_location()
    try:
        # Finishes a compaction cut short (as every writer does first) and
        # keeps a new one off until fsck is done.
        hold = compact.hold(store_dir) if compact.exists(store_dir) else None
    except StoreLocked as exc:
        _fail(str(exc))
    try:
        _fsck(store_dir, volume, repair, verify, as_json, check_remote, config_path)
    finally:
        if hold is not None:
            os.close(hold)


def _fsck(store_dir: Path, volume: str | None, repair: bool, verify: bool,
          as_json: bool, check_remote: bool = False, config_path: Path | None = None) -> None:
    from .errors import StoreLocked, StoreVersionError
    from .fsck import fsck as run_fsck
    from .fsck import lock_all, readable
    from .store import Store

    # Damaged pages can crash whoever reads them (SIGBUS): a child process
    # reads them all first, and damage found there is the whole report.
    if (store_dir / "lmdb" / "data.mdb").exists():
        damage = readable(store_dir)
        if damage is not None:
            _print_fsck(damage, damage, as_json)
            sys.exit(1)
    try:
        st = Store(store_dir, volume, create=False)
    except StoreVersionError as exc:
        _fail(str(exc))
    try:
        locks = lock_all(st)
    except StoreLocked as exc:
        st.close()
        _fail(f"{exc}; unmount it first")
    remote = None
    if check_remote:
        from . import remotestate

        url = remotestate.remote_url(st) if st.db.get("upload") is not None else None
        if url is None:
            st.close()
            for fd in locks:
                os.close(fd)
            _fail(f"{store_dir} has no remote (it was never mounted with --remote)", 2)
        remote, _ = _remote_store(url, config_path)
    try:
        report = run_fsck(st, repair=repair, verify=verify,
                          progress=sys.stderr.isatty() and not as_json, remote=remote)
        after = run_fsck(st, verify=verify, remote=remote) \
            if repair and not report.clean else report
    finally:
        st.close()
        for fd in locks:
            os.close(fd)
        if remote is not None:
            remote.close()
    _print_fsck(report, after, as_json)
    sys.exit(0 if after.clean else 1)


def _print_fsck(report, after, as_json: bool) -> None:
    """An fsck report (and whether a repair left the store clean), as text or JSON."""
    doc = report.as_dict()
    doc["clean_after_repair"] = after.clean
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for p in report.problems:
        click.echo(f"problem: {p}")
    for n in report.notes:
        click.echo(f"note: {n}")
    for r in report.repaired:
        click.echo(f"repaired: {r}")
    for f in report.damaged_files:
        click.echo(f"damaged (content lost, reads fail with EIO): {f}")
    state = "clean" if report.clean else ("repaired" if after.clean else "NOT clean")
    remote_only = report.stats.get("remote_only", 0)
    counts = (f" ({report.stats['inodes']} inodes, {report.stats.get('chunk_files', 0)} "
              "chunk files" + (f", {remote_only} remote-only chunks" if remote_only else "")
              + ")" if "inodes" in report.stats else "")
    click.echo(f"fsck: {state}{counts}")


def main() -> None:
    cli(prog_name="vfsd")


if __name__ == "__main__":
    main()
