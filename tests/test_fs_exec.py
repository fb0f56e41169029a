"""Executing files from a vfsd mount, mmap, and permission checks.

Scripts and a copied ELF binary run straight from the mount (the kernel mmaps
binaries, so this also needs a working page cache path); mmap reads and writes
from Python must reach the store and survive a remount; `default_permissions`
must make the kernel refuse what the mode bits refuse, for other uids too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from pagecache import drop_page_cache

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB
INLINE_MAX = 64 * KiB
CHUNK = 1 * MiB
NOBODY = 65534


def sh(cmd: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, timeout=timeout)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()




def sha256sum(path: Path) -> str:
    """Digest computed by another process (sha256sum) from bytes the daemon serves."""
    drop_page_cache(path)
    out = subprocess.run(["sha256sum", "--", str(path)], capture_output=True, check=True)
    return out.stdout.split()[0].decode()


def write_executable(path: Path, text: str, mode: int = 0o755) -> None:
    path.write_text(text)
    path.chmod(mode)


def test_chmod_x_then_run_shell_script(run):
    root = run.root
    (root / "scripts").mkdir()
    (root / "scripts/hello.sh").write_text('#!/bin/sh\necho "hello $1"\necho made > made.txt\n')
    assert sh("./scripts/hello.sh x", root).returncode == 126  # not executable yet
    assert sh("chmod +x scripts/hello.sh", root).returncode == 0
    proc = sh("./scripts/hello.sh world", root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"hello world\n"
    assert (root / "made.txt").read_text() == "made\n"
    # Absolute path and PATH lookup work too.
    proc = sh(f"PATH='{root}/scripts':$PATH hello.sh path", Path("/"))
    assert proc.stdout == b"hello path\n", proc.stderr


def test_run_python_script_from_mount(run):
    script = run.root / "tool.py"
    write_executable(
        script,
        f"#!{sys.executable}\n"
        "import sys, pathlib\n"
        "total = sum(int(a) for a in sys.argv[1:])\n"
        "pathlib.Path('result.txt').write_text(str(total))\n"
        "print(total)\n",
    )
    proc = subprocess.run(
        ["./tool.py", "1", "2", "39"], cwd=run.root, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"42\n"
    assert (run.root / "result.txt").read_text() == "42"
    # A module imported from the mount (read by Python, not exec'd).
    (run.root / "helper_mod.py").write_text("VALUE = 'from mount'\n")
    proc = subprocess.run(
        [sys.executable, "-c", "import helper_mod; print(helper_mod.VALUE)"],
        cwd=run.root,
        capture_output=True,
        timeout=60,
    )
    assert proc.stdout == b"from mount\n", proc.stderr


@pytest.mark.parametrize("binary", ["/bin/ls", "/usr/bin/bash"])
def test_run_copied_elf_binary(run, binary):
    """ls fits in one chunk; bash (> 1 MiB) spans two, so its mmap crosses a chunk edge."""
    src = Path(binary).resolve()
    name = src.name
    proc = sh(f"cp {src} ./{name}", run.root)
    assert proc.returncode == 0, proc.stderr
    assert sha256sum(run.root / name) == sha256_file(src)
    assert os.access(run.root / name, os.X_OK)
    # Page the binary in from the daemon, not from what cp left in the cache.
    drop_page_cache(run.root / name)
    version = subprocess.run([str(src), "--version"], capture_output=True).stdout
    proc = subprocess.run([f"./{name}", "--version"], cwd=run.root, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == version
    if name == "ls":
        (run.root / "sub").mkdir()
        (run.root / "sub/a").write_text("a")
        proc = subprocess.run(["./ls", "sub"], cwd=run.root, capture_output=True, timeout=60)
        assert proc.stdout == b"a\n"
    else:
        proc = subprocess.run(
            ["./bash", "-c", "echo $((6*7))"], cwd=run.root, capture_output=True, timeout=60
        )
        assert proc.stdout == b"42\n"


def test_non_executable_file_gives_eacces(run):
    root = run.root
    (root / "plain.sh").write_text("#!/bin/sh\necho no\n")
    os.chmod(root / "plain.sh", 0o644)
    with pytest.raises(PermissionError) as exc:
        subprocess.run([str(root / "plain.sh")], capture_output=True)
    assert exc.value.errno == errno.EACCES
    # Taking the bit away again is honoured at once (no stale cached mode).
    os.chmod(root / "plain.sh", 0o755)
    assert subprocess.run([str(root / "plain.sh")], capture_output=True).stdout == b"no\n"
    os.chmod(root / "plain.sh", 0o644)
    with pytest.raises(PermissionError):
        subprocess.run([str(root / "plain.sh")], capture_output=True)


def test_mmap_reads_and_writes_persist_after_close_and_remount(run):
    root = run.root
    big = bytearray(random.Random(21).randbytes(3 * CHUNK + 100))
    small = bytearray(random.Random(22).randbytes(5000))
    (root / "big.bin").write_bytes(big)
    (root / "small.bin").write_bytes(small)

    with open(root / "big.bin", "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        assert hashlib.sha256(mm[:]).digest() == hashlib.sha256(big).digest()
        assert mm[CHUNK - 5 : CHUNK + 5] == big[CHUNK - 5 : CHUNK + 5]
        for off in [0, INLINE_MAX - 4, CHUNK - 4, 2 * CHUNK + 10, len(big) - 8]:
            mm[off : off + 8] = b"MMAPMMAP"
            big[off : off + 8] = b"MMAPMMAP"
        mm.flush()  # msync
    # Written through a shared mapping and never msync'd: munmap + close must do.
    with open(root / "small.bin", "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[100:110] = b"0123456789"
        small[100:110] = b"0123456789"
        mm[-1:] = b"!"
        small[-1:] = b"!"

    assert sha256sum(root / "big.bin") == hashlib.sha256(big).hexdigest()
    assert sha256sum(root / "small.bin") == hashlib.sha256(small).hexdigest()
    run.remount()
    assert sha256sum(root / "big.bin") == hashlib.sha256(big).hexdigest()
    assert sha256sum(root / "small.bin") == hashlib.sha256(small).hexdigest()

    # A read-only private mapping after remount sees the persisted bytes.
    with open(root / "big.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert mm[2 * CHUNK + 10 : 2 * CHUNK + 18] == b"MMAPMMAP"


def test_mmap_sees_writes_made_through_write(run):
    path = run.root / "shared.bin"
    path.write_bytes(bytes(2 * CHUNK))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        with open(path, "r+b") as g:
            g.seek(CHUNK - 2)
            g.write(b"abcd")
        assert mm[CHUNK - 2 : CHUNK + 2] == b"abcd"


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody uid")
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs /usr/bin/python3 (the venv's python may not be readable by nobody)")


# Runs as nobody in the mount root; reports each attempt's errno name (or "ok").
PROBE = r"""
import errno, json, os, sys
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def write(path):
    with open(path, "w") as f:
        f.write("mine\n")
def read(path):
    with open(path) as f:
        return f.read()
print(json.dumps({
    "read_public": attempt(lambda: read("public")),
    "read_secret": attempt(lambda: read("secret")),
    "write_public": attempt(lambda: write("public")),
    "create_in_root": attempt(lambda: write("newfile")),
    "list_closed": attempt(lambda: os.listdir("closed")),
    "read_in_closed": attempt(lambda: read("closed/inner")),
    "create_in_open": attempt(lambda: write("open/mine")),
    "chmod_public": attempt(lambda: os.chmod("public", 0o777)),
    "chown_own": attempt(lambda: os.chown("open/mine", 0, 0)),
    "unlink_public": attempt(lambda: os.unlink("public")),
    "may_exec_tool": os.access("tool.sh", os.X_OK),
    "may_exec_rootonly": os.access("rootonly.sh", os.X_OK),
}))
"""


def as_nobody(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run `argv` as uid/gid nobody with no supplementary groups.

    Not `setpriv --reuid`: it keeps root's effective capabilities until the
    execve itself, so CAP_DAC_OVERRIDE lets it exec files nobody may not.
    subprocess drops the ids (and with them every capability) before execve.
    """
    return subprocess.run(
        argv,
        cwd=cwd,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        timeout=60,
    )


def run_as_nobody_refused(argv: list[str], cwd: Path) -> bool:
    """True if `argv` cannot be run as nobody because exec is refused."""
    try:
        proc = as_nobody(argv, cwd)
    except PermissionError:
        return True
    return proc.returncode != 0 and b"Permission denied" in proc.stderr


def test_default_permissions_for_another_uid(run_factory):
    _need_root()
    shared = run_factory("shared", "--allow-other")
    root = shared.root
    os.chmod(root, 0o755)
    (root / "public").write_text("pub\n")
    os.chmod(root / "public", 0o644)
    (root / "secret").write_text("top\n")
    os.chmod(root / "secret", 0o600)
    (root / "closed").mkdir(mode=0o700)
    (root / "closed/inner").write_text("inner\n")
    os.chmod(root / "closed/inner", 0o644)
    (root / "open").mkdir()
    os.chmod(root / "open", 0o777)
    write_executable(root / "tool.sh", "#!/bin/sh\necho tool $(id -u)\n", 0o755)
    write_executable(root / "rootonly.sh", "#!/bin/sh\necho root\n", 0o744)

    proc = as_nobody(["/usr/bin/python3", "-c", PROBE], root)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == {
        "read_public": "ok",
        "read_secret": "EACCES",
        "write_public": "EACCES",
        "create_in_root": "EACCES",
        "list_closed": "EACCES",
        "read_in_closed": "EACCES",
        "create_in_open": "ok",
        "chmod_public": "EPERM",
        "chown_own": "EPERM",
        "unlink_public": "EACCES",
        "may_exec_tool": True,
        "may_exec_rootonly": False,
    }
    # A file belongs to the uid/gid of the process that created it.
    st = os.stat(root / "open/mine")
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
    assert (root / "open/mine").read_text() == "mine\n"

    assert as_nobody(["./tool.sh"], root).stdout == f"tool {NOBODY}\n".encode()
    assert run_as_nobody_refused(["./rootonly.sh"], root)
    proc = as_nobody(["cat", "secret"], root)
    assert proc.returncode != 0 and b"Permission denied" in proc.stderr
    assert (root / "secret").read_text() == "top\n"  # root still reads it


def test_other_uid_shut_out_without_allow_other(run):
    _need_root()
    (run.root / "f").write_text("x")
    os.chmod(run.root, 0o755)
    os.chmod(run.root / "f", 0o644)
    proc = as_nobody(["/usr/bin/python3", "-c", "import os; os.stat('f')"], run.root)
    assert proc.returncode != 0
    assert b"PermissionError" in proc.stderr or b"Permission denied" in proc.stderr
