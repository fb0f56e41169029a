"""vfsd installs outside the checkout: the wheel into a fresh venv, then a mount
made with the installed commands; `make install-units` puts the units in place.

The fresh venv installs offline from the wheels `make setup` keeps in
.venv/wheelhouse (the runtime dependencies), so the test costs a venv and a few
seconds, not a download. With VFSD_LONG=1, `pipx install .` too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WHEELHOUSE = Path(sys.executable).parent.parent / "wheelhouse"

pytestmark = pytest.mark.fuse


def run(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc


def clean_env(venv: Path | None = None, **extra) -> dict:
    """The environment without this venv (`venv`'s bin first on PATH, if given),
    and pip offline: only the wheels `make setup` keeps."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = (f"{venv / 'bin'}:" if venv else "") + "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}, **extra)
    return env


def readme_install_commands() -> list[str]:
    """The install section's commands (docs/operations.md, "Install for production")."""
    from test_readme import install_commands

    return install_commands()


# ~75 s on a loaded 2-core machine (a build in isolation, then every dependency
# installed): past the default suite's budget, so with the long variants.
@pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1",
                    reason="VFSD_LONG=1: pip install . into a fresh venv (~75 s)")
def test_pip_install_dot_in_a_fresh_venv_mounts(tmp_path):
    """The install section's `pip install .`, as written, in a fresh venv; then a real mount
    made and used with the installed commands, from outside the checkout."""
    if not any(WHEELHOUSE.glob("pyfuse3-*.whl")):
        pytest.fail(f"{WHEELHOUSE} holds no wheels: run `make setup` (scripts/setup.sh makes it)")
    assert readme_install_commands()[0] == "pip install ."
    venv = tmp_path / "venv"
    run("/usr/bin/python3", "-m", "venv", venv)
    env = clean_env(venv)
    run("bash", "-c", "pip install -q .", cwd=REPO, env=env, timeout=600)
    vfsd, mount_tool = venv / "bin/vfsd", venv / "bin/mount-tool"
    # The installed package, not the checkout (run from elsewhere, nothing on the path).
    where = run(venv / "bin/python", "-c", "import vfsd, mount_tool; print(vfsd.__file__)",
                cwd=tmp_path, env=env).stdout
    assert where.startswith(str(venv)), where
    assert "0.1.0" in run(vfsd, "--version", cwd=tmp_path, env=env).stdout
    run_dir = tmp_path / "r"
    run(vfsd, "mount", run_dir, cwd=tmp_path, env=env)
    try:
        (run_dir / "fs" / "notes.md").write_text("installed\n")
        ref = json.loads(run(mount_tool, "ref", run_dir, "notes.md", cwd=tmp_path,
                             env=env).stdout)
        assert ref["path"] == "notes.md" and ref["size"] == len("installed\n")
        st = json.loads(run(vfsd, "status", run_dir, "--json", cwd=tmp_path, env=env).stdout)
        assert st["files"] == 1 and st["daemon"]["state"] == "running"
        # The daemon runs from the installed venv too (its command line is its
        # title: the libraries it mapped say where it came from), named for `ps`.
        pid = st["pid"]
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert f"{venv}/lib/" in maps and "/pyfuse3" in maps, maps[:2000]
        assert Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0") == \
            f"vfsd daemon of {run_dir}".encode()
    finally:
        subprocess.run([vfsd, "umount", run_dir], capture_output=True, env=env, timeout=120)
    assert not os.path.ismount(run_dir / "fs")


def test_make_install_units_puts_the_units_in_place(tmp_path):
    dest = tmp_path / "root"
    run("make", "-s", "install-units", f"DESTDIR={dest}", "BINDIR=/opt/vfsd/bin", cwd=REPO)
    unit = (dest / "etc/systemd/system/vfsd@.service").read_text()
    assert "ExecStart=/opt/vfsd/bin/vfsd mount %f" in unit and "/usr/local/bin" not in unit
    assert (dest / "etc/systemd/system/vfsd-gc@.timer").exists()
    user = (dest / "etc/systemd/user/vfsd@.service").read_text()
    assert "ExecStart=/opt/vfsd/bin/vfsd mount %f" in user
    assert (dest / "etc/vfsd/vfsd.toml.example").exists()
    if shutil.which("systemd-analyze"):
        # Units whose binary exists verify (a stand-in where BINDIR points).
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "vfsd").symlink_to(Path(sys.executable).parent / "vfsd")
        run("make", "-s", "install-units", f"DESTDIR={tmp_path / 'v'}", f"BINDIR={bindir}",
            cwd=REPO)
        inst = tmp_path / "v/etc/systemd/system"
        escaped = run("systemd-escape", "--path", tmp_path / "run").stdout.strip()
        for name in ("vfsd@.service", "vfsd-gc@.service"):
            shutil.copy(inst / name, inst / name.replace("@.", f"@{escaped}."))
        proc = subprocess.run(["systemd-analyze", "verify",
                               *[str(p) for p in inst.glob(f"*@{escaped}.service")]],
                              capture_output=True, text=True)
        assert "is not executable" not in proc.stderr and "Command " not in proc.stderr, \
            proc.stderr


@pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1",
                    reason="VFSD_LONG=1: pipx install, make dist, make install")
def test_pipx_make_dist_and_make_install(tmp_path):
    """The install section's other install lines: `pipx install .`, `make dist`, `make install`
    (staged with DESTDIR; as root, so without sudo)."""
    assert readme_install_commands()[1:] == ["pipx install .", "make dist", "sudo make install"]
    env = clean_env(PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(tmp_path / "bin"),
                    PIPX_MAN_DIR=str(tmp_path / "man"))
    run(sys.executable, "-m", "pipx", "install", ".", cwd=REPO, env=env, timeout=900)
    for cmd in ("vfsd", "mount-tool"):
        assert run(tmp_path / "bin" / cmd, "-h", env=env).stdout.startswith("Usage: ")
    run("make", "-s", "dist", cwd=REPO, env={**env, "PATH": os.environ["PATH"]}, timeout=900)
    assert list((REPO / "dist").glob("vfsd-0.1.0-py3-none-any.whl"))
    dest = tmp_path / "root"
    run("make", "-s", "install", f"DESTDIR={dest}", cwd=REPO,
        env={**env, "PATH": os.environ["PATH"]}, timeout=900)
    vfsd = dest / "usr/local/lib/vfsd/bin/vfsd"
    assert run(vfsd, "--version", env=env).stdout.startswith("vfsd")
    assert (dest / "usr/local/bin/vfsd").is_symlink()
    assert (dest / "etc/systemd/system/vfsd@.service").exists()
