"""`vfsd mount --remote` answers in bounded time and tells the truth; `vfsd umount`
keeps a remote run's work; `--from RUN`, `vfsd remote ls` and `vfsd sync` name
what to resume.

Real daemons, real mounts, a real SeaweedFS, and for the silent endpoint a
loopback TCP listener that accepts connections and never answers (counting
them: a bounded mount sends one request before it answers, not one per retry).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
from pathlib import Path

import pytest
from conftest import is_mounted, vfsd_cli
from remote_run import FAST, snapshot, status, use_server
from s3server import s3_private_server, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.fuse

#: short timeouts so the silent endpoint costs about a second per request
SILENT = ("--remote-connect-timeout", "1", "--remote-read-timeout", "1",
          "--remote-retry-base-delay", "0.05", "--remote-retry-max-delay", "0.2")


class SilentEndpoint:
    """Accepts TCP connections on 127.0.0.1 and never answers; counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.held: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)  # kept open, never read from nor written to

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def silent(monkeypatch):
    # Credentials that sign requests; no lookup beyond loopback (instance metadata).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "vfsdtest")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "vfsdtestsecret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    endpoint = SilentEndpoint()
    yield endpoint
    endpoint.close()


@pytest.fixture
def s3(s3_server, monkeypatch):  # noqa: F811
    use_server(s3_server, monkeypatch)
    return s3_server


def nothing_left(run_dir: Path) -> None:
    """A failed mount leaves no mount and no daemon behind."""
    assert not is_mounted(run_dir / "fs")
    pid_file = run_dir / ".vfsd" / "vfsd.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        assert not Path(f"/proc/{pid}").exists(), "the daemon is still running"


# ------------------------------------------------------------ a silent endpoint


def test_silent_endpoint_on_a_first_mount_fails_at_once_and_leaves_nothing(silent, tmp_path):
    run_dir = tmp_path / "r"
    proc = vfsd_cli("mount", run_dir, "--remote", "s3://bucket/p",
                    "--remote-endpoint-url", silent.url, *SILENT, check=False)
    assert proc.returncode == 1, proc
    assert "unreachable or too slow" in proc.stderr and "goes remote only once" in proc.stderr
    nothing_left(run_dir)
    # One request, not one per retry: the mount's answer waited on one read timeout.
    assert silent.accepted == 1
    # Nothing recorded: the store did not become a remote one.
    proc = vfsd_cli("status", run_dir, "--json")
    assert json.loads(proc.stdout)["remote"] is None


def test_silent_endpoint_later_degrades_to_local_and_says_so(silent, s3, run_factory):
    run = run_factory("r", "--remote", s3.unique_url("silent"), *FAST)
    (run.root / "before").write_text("kept")
    run.umount()
    # The same store, its bucket now behind an endpoint that never answers.
    seen = silent.accepted
    proc = vfsd_cli("mount", run.run_dir, "--remote-endpoint-url", silent.url, *SILENT,
                    "--remote-max-attempts", "3")
    assert silent.accepted - seen <= 2  # the probe, and at most the keeper's first try
    assert "remote tier degraded (acquiring)" in proc.stderr, proc.stderr
    assert "unreachable or too slow" in proc.stderr
    # Up and usable, and `vfsd status` says why nothing is published.
    assert (run.root / "before").read_text() == "kept"
    (run.root / "after").write_text("local")
    st = status(run)
    assert st["remote"]["state"] == "acquiring" and "unreachable" in st["remote"]["reason"]
    check = vfsd_cli("status", run.run_dir, "--check", check=False)
    assert check.returncode == 5 and "acquiring" in check.stderr
    # Unmounting does not wait for a store that never answers (--force), and says
    # nothing was left unpublished (no snapshot was taken).
    proc = vfsd_cli("umount", run.run_dir, "--force")
    assert proc.returncode == 0, proc


# ------------------------------------------------- errors that cannot heal


def test_no_bucket_and_no_credentials_fail_the_mount(s3, tmp_path, monkeypatch):
    proc = vfsd_cli("mount", tmp_path / "nb", "--remote", "s3://no-such-bucket-vfsd/p", *FAST,
                    check=False)
    assert proc.returncode == 1 and "does not exist" in proc.stderr, proc
    assert "will not heal" in proc.stderr
    nothing_left(tmp_path / "nb")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    proc = vfsd_cli("mount", tmp_path / "ad", "--remote", s3.unique_url("ad"), *FAST,
                    check=False)
    assert proc.returncode == 1 and "access denied" in proc.stderr, proc
    nothing_left(tmp_path / "ad")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    proc = vfsd_cli("mount", tmp_path / "nc", "--remote", s3.unique_url("nc"), *FAST,
                    check=False)
    assert proc.returncode == 1 and "no usable AWS credentials" in proc.stderr, proc
    nothing_left(tmp_path / "nc")


# ------------------------------------------------ a lease held elsewhere


def test_a_lease_held_elsewhere_says_why_at_once_and_mounts_read_only(s3, run_factory):
    url = s3.unique_url("held")
    a = run_factory("a", "--remote", url, "--remote-lease-ttl", "6")
    (a.root / "report.md").write_text("from A\n")
    sid = snapshot(a)
    proc = vfsd_cli("sync", a.run_dir)
    run_id = status(a)["run"]
    assert f"--from {run_id}@{sid}" in proc.stdout, proc.stdout
    # B resumes the latest snapshot (`--from RUN`) while A still holds the run.
    b = run_factory("b", mount=False)
    proc = vfsd_cli("mount", b.run_dir, "--remote", url, "--from", run_id,
                    "--remote-lease-wait", "60", "--json")
    # Said at once (before the wait), then the outcome; exit 0: it did mount.
    assert f"run {run_id} is held by" in proc.stderr and "waiting up to" in proc.stderr
    assert "mounted read-only" in proc.stderr and "renewed it while this mount waited" \
        in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["read_only"] is True and doc["state"] == "lost"
    assert (b.root / "report.md").read_text() == "from A\n"
    with pytest.raises(OSError) as err:
        (b.root / "new").write_text("x")
    assert err.value.errno == errno.EROFS
    vfsd_cli("umount", b.run_dir)


# --------------------------------------------- an unmount that keeps work


def test_umount_waits_for_publication_and_says_what_is_left(s3_private_server, run_factory,  # noqa: F811
                                                             monkeypatch):
    use_server(s3_private_server, monkeypatch)
    url = s3_private_server.unique_url("keep")
    a = run_factory("a", "--remote", url, *FAST)
    (a.root / "one").write_bytes(os.urandom(300_000))
    first = snapshot(a)
    # Unmounted at once after the snapshot: umount waits until it is published.
    proc = vfsd_cli("umount", a.run_dir, "--json")
    assert json.loads(proc.stdout)["unpublished"] == [], proc
    listed = json.loads(vfsd_cli("remote", "ls", url, "--json").stdout)
    assert [r["latest"] for r in listed["runs"]] == [first]
    # With the store hung: the snapshot cannot be published; umount gives up after
    # --timeout, unmounts anyway, warns and exits 3.
    a.mount()
    (a.root / "two").write_bytes(os.urandom(300_000))
    s3_private_server.pause()
    try:
        second = snapshot(a)
        proc = vfsd_cli("umount", a.run_dir, "--timeout", "2", check=False)
        assert proc.returncode == 3, proc
        assert "left unpublished" in proc.stderr and second in proc.stderr, proc.stderr
        assert not is_mounted(a.root)
        assert "stopped_with_unpublished_snapshots" in a.log_text()
    finally:
        s3_private_server.resume()
    # Kept locally: the next mount publishes it.
    a.mount()
    vfsd_cli("sync", a.run_dir, "--snapshot", second)
    proc = vfsd_cli("umount", a.run_dir)
    assert proc.returncode == 0
    text = vfsd_cli("remote", "ls", url).stdout
    assert second in text and "resume with: vfsd mount NEW_RUN_DIR" in text, text
