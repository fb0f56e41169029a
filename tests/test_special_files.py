"""Device nodes, and the parsing of `user.vfsd.step`, on a real mount."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest
from conftest import vfsd_cli
from vfsdattr import attr_doc

pytestmark = pytest.mark.fuse

needs_mknod = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of devices needs CAP_MKNOD")


@needs_mknod
def test_device_nodes_are_stored_as_metadata(run):
    root = run.root
    os.mknod(root / "null", stat.S_IFCHR | 0o644, os.makedev(1, 3))
    os.mknod(root / "disk", stat.S_IFBLK | 0o600, os.makedev(8, 16))
    os.mkfifo(root / "fifo")

    def check() -> None:
        st = os.lstat(root / "null")
        assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
        st = os.lstat(root / "disk")
        assert stat.S_ISBLK(st.st_mode) and os.major(st.st_rdev) == 8
        assert os.minor(st.st_rdev) == 16
        assert stat.S_ISFIFO(os.lstat(root / "fifo").st_mode)

    check()
    # The mount is nodev: a device node in it never reaches a driver.
    options = next(
        line.split()[3] for line in open("/proc/mounts") if line.split()[1] == str(root)
    )
    assert "nodev" in options.split(",")
    for name in ("null", "disk"):
        with pytest.raises(OSError) as exc:
            os.open(root / name, os.O_RDONLY)
        assert exc.value.errno == errno.EACCES
    # They take part in the namespace like any other entry.
    os.rename(root / "disk", root / "disk2")
    os.link(root / "null", root / "null-link")
    assert os.lstat(root / "null").st_nlink == 2
    os.chmod(root / "null", 0o600)
    run.remount()
    os.rename(root / "disk2", root / "disk")
    os.unlink(root / "null-link")
    check_mode = stat.S_IMODE(os.lstat(root / "null").st_mode)
    assert check_mode == 0o600
    os.chmod(root / "null", 0o644)
    check()
    assert sorted(os.listdir(root)) == ["disk", "fifo", "null"]
    # Control requests see them as what they are: not regular files.
    proc = vfsd_cli("ref", run.run_dir, "null", check=False)
    assert proc.returncode != 0 and "regular" in proc.stderr
    assert json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)["files"] == 0
    for name in ("null", "disk", "fifo"):
        os.unlink(root / name)
    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--json", check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["clean"], proc.stdout


def test_step_xattr_takes_ascii_decimal_only(run):
    path = run.root / "f"
    path.write_bytes(b"x")
    refused = [
        "١٢".encode(),  # Arabic-Indic digits: int() takes them
        "１２".encode(),  # fullwidth digits
        b"1_000",  # int() takes underscores
        b"+5",
        b"-1",
        b"0x10",
        b"12abc",
        b"",
        b" ",
        b"1 2",
        b"9223372036854775808",  # 2^63
        b"99999999999999999999999",
        b"\xff",
    ]
    for value in refused:
        with pytest.raises(OSError) as exc:
            os.setxattr(path, "user.vfsd.step", value)
        assert exc.value.errno == errno.EINVAL, value
        assert attr_doc(path)["step"] == 0, value
    for value, step in ((b"12", 12), (b"0", 0), (b"007", 7), (b" 42\n", 42),
                        (b"9223372036854775807", 2**63 - 1)):
        os.setxattr(path, "user.vfsd.step", value)
        assert attr_doc(path)["step"] == step
