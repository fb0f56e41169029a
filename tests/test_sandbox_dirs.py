"""The execute sandbox's mount points in the mount root (vfsd/fuse/ctldir.py).

`execute` runs commands with the mount root as `/` and mounts the system's
directories, /run, /proc and /dev on top of it. Once a sandbox claims them
(the `user.vfsd.sandbox` xattr on the root), the daemon serves those mount
points as empty, read-only, virtual directories: they answer lookups (so the
sandbox can mount on them) but never appear in listings and cannot become
real entries, so the user's tree stays exactly what was written. Until then
they are ordinary names.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess

import pytest

from vfsd.fuse import ctldir

pytestmark = pytest.mark.fuse

SANDBOX_NAMES = sorted(name.decode() for name in ctldir.SANDBOX_DIRS)


def errno_of(fn, *args) -> int:
    with pytest.raises(OSError) as info:
        fn(*args)
    return info.value.errno


def claim(root) -> None:
    """What the sandbox does before its first command."""
    os.setxattr(root, "user.vfsd.sandbox", b"1")


def test_names_are_ordinary_until_a_sandbox_claims_them(run):
    """A user who never runs `execute` sees a plain filesystem: `mkdir etc`,
    `touch run` and `usr/` trees just work (they used to say "File exists" and
    "Read-only file system" for names `ls` did not show)."""
    root = run.root
    for name in SANDBOX_NAMES:
        assert not os.path.lexists(root / name), name
    (root / "etc").mkdir()
    (root / "etc" / "app.conf").write_text("x=1\n")
    (root / "run").touch()
    (root / "usr" / "local").mkdir(parents=True)
    os.symlink("etc", root / "lib")
    assert sorted(os.listdir(root)) == ["etc", "lib", "run", "usr"]
    os.rename(root / "etc", root / "bin")
    os.unlink(root / "run")
    assert sorted(os.listdir(root)) == ["bin", "lib", "usr"]
    # The claim: from now on the absent names are the sandbox's mount points.
    claim(root)
    assert stat.S_IMODE(os.stat(root / "run").st_mode) == 0o555
    assert errno_of(os.mkdir, root / "etc") == errno.EEXIST
    # Real entries made before the claim win, and keep their contents.
    assert (root / "bin" / "app.conf").read_text() == "x=1\n"
    assert os.path.islink(root / "lib")
    assert sorted(os.listdir(root)) == ["bin", "lib", "usr"]
    assert errno_of(os.setxattr, root / "usr", "user.vfsd.sandbox", b"1") == errno.EINVAL


def test_mount_write_explains_a_claimed_mount_point(run):
    """Mount.write gives the reason the Deep Agents file tools give, not a bare
    "Read-only file system"; before the claim the same write just works."""
    import mount_tool

    m = mount_tool.Mount.attach(run.run_dir)
    try:
        m.write("etc/app.conf", "x=1\n")
        assert (run.root / "etc" / "app.conf").read_text() == "x=1\n"
        claim(run.root)
        m.write("etc/more.conf", "still the user's own etc\n")  # a real entry wins
        with pytest.raises(ValueError, match="/usr is a read-only system directory in the "
                           "execute sandbox, not part of the run's files"):
            m.write("usr/local/bin/tool", "x")
        with pytest.raises(ValueError, match="/run is private to each execute call"):
            m.write("run/pid", "1")
        assert sorted(os.listdir(run.root)) == ["etc"]
    finally:
        m.detach()


def test_mount_points_answer_lookups_but_stay_out_of_listings(run):
    root = run.root
    claim(root)
    (root / "notes.txt").write_text("mine\n")
    for name in SANDBOX_NAMES:
        st = os.stat(root / name)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o555, name
        assert os.listdir(root / name) == []
    assert os.listdir(root) == ["notes.txt"]
    found = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True, check=True)
    assert found.stdout.split() == [".", "./notes.txt"]


def test_mount_points_cannot_be_created_changed_or_removed(run):
    root = run.root
    claim(root)
    (root / "other").mkdir()
    assert errno_of(os.mkdir, root / "run") == errno.EEXIST
    assert errno_of(os.rename, root / "other", root / "usr") == errno.EEXIST
    assert errno_of(os.symlink, "/etc", root / "lib") == errno.EEXIST
    assert errno_of(os.rmdir, root / "etc") == errno.EPERM
    assert errno_of(os.rename, root / "run", root / "mine") == errno.EPERM
    assert errno_of(open, root / "run" / "x", "w") == errno.EROFS
    assert errno_of(os.mkdir, root / "usr" / "local") == errno.EROFS
    assert errno_of(os.chmod, root / "bin", 0o777) == errno.EROFS
    assert errno_of(open, root / "dev", "r") == errno.EISDIR
    # Only the root is reserved: the same names deeper down are ordinary.
    (root / "other" / "tmp").mkdir()
    (root / "other" / "tmp" / "x").write_text("ok")
    assert sorted(os.listdir(root)) == ["other"]


def test_an_existing_entry_with_a_reserved_name_wins(run):
    """Entries made before the names were reserved stay visible and usable."""
    from vfsd.store.store import Store

    run.umount()
    store = Store(run.state_dir)
    try:
        lib = store.create(store.root_ino, b"lib", stat.S_IFDIR | 0o755, 0, 0)
        store.create(lib.ino, b"kept.txt", stat.S_IFREG | 0o644, 0, 0)
    finally:
        store.close()
    run.mount()
    root = run.root
    claim(root)
    assert os.listdir(root) == ["lib"]
    assert os.listdir(root / "lib") == ["kept.txt"]
    (root / "lib" / "more.txt").write_text("still writable")
    os.rename(root / "lib", root / "lib.old")
    # Once it is gone, the name is the sandbox's again.
    assert os.listdir(root / "lib") == []
    assert errno_of(os.mkdir, root / "lib") == errno.EEXIST
    assert sorted(os.listdir(root / "lib.old")) == ["kept.txt", "more.txt"]
