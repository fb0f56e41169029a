"""The execute sandbox's mount points in the mount root (vfsd/fuse/ctldir.py).

`execute` runs commands with the mount root as `/` and mounts the system's
directories, a private /tmp, /proc and /dev on top of it. The daemon serves
those mount points as empty, read-only, virtual directories: they answer
lookups (so the sandbox can mount on them) but never appear in listings and
cannot become real entries, so the user's tree stays exactly what was written.
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


def test_mount_points_answer_lookups_but_stay_out_of_listings(run):
    root = run.root
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
    (root / "other").mkdir()
    assert errno_of(os.mkdir, root / "tmp") == errno.EEXIST
    assert errno_of(os.rename, root / "other", root / "usr") == errno.EEXIST
    assert errno_of(os.symlink, "/etc", root / "lib") == errno.EEXIST
    assert errno_of(os.rmdir, root / "etc") == errno.EPERM
    assert errno_of(os.rename, root / "tmp", root / "mine") == errno.EPERM
    assert errno_of(open, root / "tmp" / "x", "w") == errno.EROFS
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
    assert os.listdir(root) == ["lib"]
    assert os.listdir(root / "lib") == ["kept.txt"]
    (root / "lib" / "more.txt").write_text("still writable")
    os.rename(root / "lib", root / "lib.old")
    # Once it is gone, the name is the sandbox's again.
    assert os.listdir(root / "lib") == []
    assert errno_of(os.mkdir, root / "lib") == errno.EEXIST
    assert sorted(os.listdir(root / "lib.old")) == ["kept.txt", "more.txt"]
