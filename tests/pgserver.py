"""A private PostgreSQL server for tests and benchmarks.

`PgServer` runs `initdb` into a fresh temporary directory and starts `postgres` on
a free port on 127.0.0.1 (and a Unix socket in the same directory), with trust
authentication: nothing outside this process tree ever talks to it. PostgreSQL
refuses to run as root, so under root the server runs as the `postgres` system
user (or a `vfsd-pg` user created for the purpose).

Binaries are looked up in `$PG_BIN`, then Debian's `/usr/lib/postgresql/*/bin`,
then `PATH`. `pg_server` is a pytest fixture that skips, saying why, when they
are absent.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

FALLBACK_USER = "vfsd-pg"


def find_pg_bin() -> Path | None:
    """Return the directory holding `initdb` and `postgres`, or None."""
    candidates: list[str] = []
    if os.environ.get("PG_BIN"):
        candidates.append(os.environ["PG_BIN"])
    # Newest Debian cluster version first.
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    debian.sort(key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    candidates.extend(reversed(debian))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for directory in candidates:
        d = Path(directory)
        if (d / "initdb").is_file() and (d / "postgres").is_file():
            return d
    return None


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", FALLBACK_USER):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", FALLBACK_USER],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(FALLBACK_USER)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One throwaway PostgreSQL cluster; use as a context manager or call start/stop.

    `durable=False` (tests) turns off fsync and synchronous commit so a test
    suite does not wait on the disk; benchmarks keep PostgreSQL's defaults.
    """

    def __init__(self, bin_dir: Path | None = None, *, durable: bool = False) -> None:
        found = bin_dir or find_pg_bin()
        if found is None:
            raise FileNotFoundError("PostgreSQL binaries (initdb, postgres) not found")
        self.bin_dir = found
        self.durable = durable
        self.port = 0
        self.base: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._user = _server_user()

    @property
    def dsn(self) -> str:
        """A libpq connection string for the `postgres` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable"

    def start(self, timeout: float = 60.0) -> PgServer:
        """initdb and start the server; return once it accepts connections."""
        # mkdtemp under /tmp: the server's user must be able to reach its data dir,
        # which pytest's per-user 0700 tmp_path would not allow.
        self.base = Path(tempfile.mkdtemp(prefix="vfsd-pg-"))
        data = self.base / "data"
        data.mkdir()
        if self._user is not None:
            for path in (self.base, data):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            timeout=timeout,
        )
        last_error = ""
        for _attempt in range(3):  # the free port may be taken between probe and bind
            self.port = _free_port()
            self.proc = self._popen(self._server_args(data))
            error = self._wait_ready(timeout)
            if error is None:
                return self
            last_error = error
            self._terminate()
        self.stop()
        raise RuntimeError(f"PostgreSQL did not start: {last_error}")

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory."""
        self._terminate()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------

    def _server_args(self, data: Path) -> list[str]:
        assert self.base is not None
        args = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(self.port),
            "-k",
            str(self.base),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=50",
            "-c",
            "shared_buffers=64MB",
            "-c",
            f"log_directory={self.base}",
            "-c",
            "logging_collector=off",
        ]
        if not self.durable:
            args += [
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]
        return args

    def _popen(self, args: list[str]) -> subprocess.Popen:
        assert self.base is not None
        log = open(self.base / "server.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **self._as_user(),
            )
        finally:
            log.close()

    def _run(self, args: list[str], timeout: float) -> None:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, **self._as_user()
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({proc.returncode}): {proc.stderr or proc.stdout}"
            )

    def _as_user(self) -> dict:
        if self._user is None:
            return {}
        return {
            "user": self._user.pw_uid,
            "group": self._user.pw_gid,
            "extra_groups": [],
            "env": {**os.environ, "HOME": str(self.base), "USER": self._user.pw_name},
            "cwd": str(self.base),
        }

    def _wait_ready(self, timeout: float) -> str | None:
        """None once the server accepts a query, else why it did not."""
        import psycopg

        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"postgres exited with {self.proc.returncode}: {self._log_tail()}"
            try:
                with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                    conn.execute("select 1")
                return None
            except psycopg.OperationalError:
                time.sleep(0.1)
        return f"not ready after {timeout}s: {self._log_tail()}"

    def _log_tail(self) -> str:
        assert self.base is not None
        log = self.base / "server.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def _terminate(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


def pg_server_or_skip(durable: bool = False) -> PgServer:
    """A started PgServer, or pytest.skip with the reason PostgreSQL is unavailable."""
    import pytest

    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL server binaries not found (apt-get install postgresql, or set PG_BIN)"
        )
    return PgServer(bin_dir, durable=durable).start()


try:
    import pytest

    @pytest.fixture(scope="module")
    def pg_server():
        """A private PostgreSQL server for the test module; stopped in teardown."""
        server = pg_server_or_skip()
        try:
            yield server
        finally:
            server.stop()

except ImportError:  # the benchmark imports this module without pytest
    pass
