"""The systemd units: they verify, they keep the mount visible, and the daemon
speaks the notify protocol that Type=notify relies on.

`systemd-analyze verify` checks that every ExecStart binary exists, so the
units are verified as installed copies whose vfsd path points at this venv's
`vfsd`, each under a real instance name (an escaped temporary run dir).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import VFSD, is_mounted

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "systemd"
VENV_VFSD = Path(sys.executable).parent / "vfsd"
SYSTEM_VFSD = "/usr/local/bin/vfsd"
USER_VFSD = "%h/.local/bin/vfsd"

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)

# Options that give a service its own mount namespace (systemd.exec(5)): a FUSE
# mount made inside one never reaches the host, whatever MountFlags= says.
NAMESPACE_OPTIONS = (
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "ProtectSystem",
    "ProtectHome",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "BindPaths",
    "BindReadOnlyPaths",
    "TemporaryFileSystem",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "RootDirectory",
    "RootImage",
    "MountAPIVFS",
    "PrivateUsers",
    "MountFlags",
    "StateDirectory",
    "RuntimeDirectory",
    "LogsDirectory",
    "CacheDirectory",
    "ConfigurationDirectory",
)


def escape_path(path: Path) -> str:
    return subprocess.run(
        ["systemd-escape", "--path", str(path)], check=True, capture_output=True, text=True
    ).stdout.strip()


def install_copy(src: Path, dest_dir: Path, instance: str, binary: str) -> Path:
    """Copy a template unit as INSTANCE, its vfsd path rewritten to this venv's."""
    text = src.read_text()
    assert binary in text, f"{src.name} does not run {binary}"
    name = src.name.replace("@.", f"@{instance}.")
    dest = dest_dir / name
    dest.write_text(text.replace(binary, str(VENV_VFSD)))
    return dest


def verify(*units: Path, user: bool = False, runtime_dir: Path | None = None) -> None:
    """Run systemd-analyze verify; fail on an error or on any warning about our units."""
    env = dict(os.environ)
    args = ["systemd-analyze"]
    if user:
        args.append("--user")
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)  # a user manager context needs one
    proc = subprocess.run(
        [*args, "verify", *map(str, units)], capture_output=True, text=True, env=env, timeout=60
    )
    ours = [
        ln
        for ln in proc.stderr.splitlines()
        if any(u.name in ln or str(u.parent) in ln for u in units)
    ]
    assert proc.returncode == 0 and not ours, proc.stderr


def service_options(path: Path) -> dict[str, list[str]]:
    """[Service] settings of a unit file: key -> values, in order (keys may repeat)."""
    options: dict[str, list[str]] = {}
    section = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            options.setdefault(key.strip(), []).append(value.strip())
    return options


# --------------------------------------------------------------------- verify


@needs_systemd_analyze
def test_system_unit_verifies(tmp_path: Path):
    instance = escape_path(tmp_path / "agent-run 1")
    verify(install_copy(UNITS / "vfsd@.service", tmp_path, instance, SYSTEM_VFSD))


@needs_systemd_analyze
def test_user_unit_verifies(tmp_path: Path):
    units = tmp_path / "units"
    units.mkdir()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    instance = escape_path(tmp_path / "run")
    verify(
        install_copy(UNITS / "user" / "vfsd@.service", units, instance, USER_VFSD),
        user=True,
        runtime_dir=runtime,
    )


@needs_systemd_analyze
def test_gc_timer_and_service_verify(tmp_path: Path):
    instance = escape_path(tmp_path / "run")
    service = install_copy(UNITS / "vfsd-gc@.service", tmp_path, instance, SYSTEM_VFSD)
    timer_text = (UNITS / "vfsd-gc@.timer").read_text()
    timer = tmp_path / f"vfsd-gc@{instance}.timer"
    timer.write_text(timer_text)
    verify(timer, service)


@needs_systemd_analyze
def test_instance_specifier_gives_the_unescaped_absolute_path(tmp_path: Path):
    # The units pass %f to vfsd. verify only accepts this probe if %f expands
    # to the real directory holding the binary: leading slash, "-" and " " intact.
    run_dir = tmp_path / "my-run dir"
    run_dir.mkdir()
    shutil.copy(VENV_VFSD, run_dir / "vfsd")
    probe = tmp_path / f"probe@{escape_path(run_dir)}.service"
    probe.write_text("[Service]\nType=oneshot\nExecStart=%f/vfsd mount %f\n")
    verify(probe)


# ------------------------------------------------------------ mount namespace


@pytest.mark.parametrize("unit", ["vfsd@.service", "user/vfsd@.service"])
def test_daemon_units_create_no_mount_namespace(unit: str):
    options = service_options(UNITS / unit)
    assert options["Type"] == ["notify"]
    assert any(" --foreground --log-stderr" in line for line in options["ExecStart"])
    assert options["Restart"] == ["on-failure"]
    creeping = sorted(set(options) & set(NAMESPACE_OPTIONS))
    assert not creeping, f"{unit}: {creeping} would hide the FUSE mount from the host"


def test_system_unit_allows_fuse():
    options = service_options(UNITS / "vfsd@.service")
    assert options["DeviceAllow"] == ["/dev/fuse rw"]
    assert "CAP_SYS_ADMIN" in options["CapabilityBoundingSet"][0].split()
    filters = " ".join(options["SystemCallFilter"]).split()
    assert "@mount" in filters and not any(f.startswith("~") for f in filters)


def test_user_unit_keeps_fusermount_setuid_working():
    # NoNewPrivileges= (and every option that implies it in a user manager)
    # would make the setuid fusermount3 run without privileges.
    options = service_options(UNITS / "user" / "vfsd@.service")
    implying = {
        "NoNewPrivileges",
        "SystemCallFilter",
        "SystemCallArchitectures",
        "RestrictAddressFamilies",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "MemoryDenyWriteExecute",
        "ProtectClock",
        "ProtectHostname",
        "DynamicUser",
        "SystemCallLog",
    }
    assert not set(options) & implying


# ----------------------------------------------------------- notify protocol


def _bind_notify_socket(tmp_path: Path, abstract: bool) -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"vfsd-test-notify-{os.getpid()}-{tmp_path.name}"
        sock.bind("\0" + name)
        return sock, "@" + name
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    return sock, str(path)


def _next_state(sock: socket.socket, proc: subprocess.Popen, wanted: str) -> list[str]:
    """Datagrams received until one carries `wanted` (each may hold several lines)."""
    sock.settimeout(60)  # a bound, not a measurement
    seen: list[str] = []
    while True:
        try:
            data = sock.recv(4096).decode()
        except TimeoutError:
            pytest.fail(f"no {wanted} within 60 s (got {seen}, daemon exit {proc.poll()})")
        seen.extend(data.splitlines())
        if wanted in seen:
            return seen


def _unmount_leftover(root: Path) -> None:
    if is_mounted(root):
        subprocess.run(["fusermount3", "-u", "-z", str(root)], capture_output=True)


def _stop(proc: subprocess.Popen, root: Path) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    _unmount_leftover(root)


@pytest.mark.fuse
@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notify_ready_when_mounted_and_stopping_on_sigterm(tmp_path: Path, abstract: bool):
    sock, address = _bind_notify_socket(tmp_path, abstract)
    run_dir = tmp_path / "run"
    root = run_dir / "fs"
    log = open(tmp_path / "daemon.log", "wb")
    proc = subprocess.Popen(
        [*VFSD, "mount", str(run_dir), "--foreground", "--log-stderr"],
        env={**os.environ, "NOTIFY_SOCKET": address},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _next_state(sock, proc, "READY=1")
        # Readiness means the mount answers now, not soon.
        assert is_mounted(root)
        (root / "hello.txt").write_text("ready\n")
        assert (root / "hello.txt").read_text() == "ready\n"

        proc.send_signal(signal.SIGTERM)
        _next_state(sock, proc, "STOPPING=1")
        assert proc.wait(timeout=60) == 0
        assert not is_mounted(root)
    finally:
        _stop(proc, root)
        sock.close()
        log.close()
    # What was written before SIGTERM was committed.
    subprocess.run([*VFSD, "mount", str(run_dir)], check=True, capture_output=True, timeout=60)
    try:
        assert (root / "hello.txt").read_text() == "ready\n"
    finally:
        subprocess.run([*VFSD, "umount", str(run_dir)], capture_output=True, timeout=60)
        _unmount_leftover(root)


@pytest.mark.fuse
def test_no_ready_when_the_mount_fails(tmp_path: Path):
    sock, address = _bind_notify_socket(tmp_path, abstract=False)
    run_dir = tmp_path / "run"
    (run_dir / "fs").mkdir(parents=True)
    (run_dir / "fs" / "in-the-way").write_text("x")  # a non-empty mountpoint is refused
    proc = subprocess.run(
        [*VFSD, "mount", str(run_dir), "--foreground", "--log-stderr"],
        env={**os.environ, "NOTIFY_SOCKET": address},
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        assert proc.returncode != 0
        assert "not empty" in proc.stderr
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # the daemon has exited: nothing queued
            sock.recv(4096)
    finally:
        sock.close()
        _unmount_leftover(run_dir / "fs")
