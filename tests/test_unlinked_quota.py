"""Files unlinked while open count against the quota until they are freed
(issue 28, item 1).

A command that opens a file, unlinks it and keeps writing used to fill the
store's disk past the quota: with `quota_bytes` 16 MiB, 128 MiB written and
`fsync` succeeded, while `vfsd status` said "quota used 0 B" (the quota
counted files with a name only). Now a nameless file's content and xattrs
count until the daemon frees it, a write or fsync past the quota fails with
ENOSPC as for a named file, and `vfsd status` shows the bytes.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import vfsd_cli, wait_for

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]

MiB = 1 << 20
QUOTA = 16 * MiB

#: opens ARGV[1], unlinks it, writes ARGV[2] MiB then fsyncs; prints the
#: errno that stopped it (0: none) and the MiB written, then holds the file
#: open until its stdin closes
HOLDER = textwrap.dedent("""
    import os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(sys.argv[1])
    block, written, failed = os.urandom(1 << 20), 0, 0
    try:
        for _ in range(int(sys.argv[2])):
            os.write(fd, block)
            written += 1
        os.fsync(fd)
    except OSError as exc:
        failed = exc.errno
    print(failed, written, flush=True)
    sys.stdin.read()
""")


def status(run) -> dict:
    return json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)


def test_an_unlinked_open_file_counts_against_the_quota_until_freed(run_factory):
    run = run_factory("q", "--quota-bytes", str(QUOTA))
    run.expect_errors = True  # quota_exceeded warnings
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run.root / "hidden"), "64"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        failed, written = map(int, holder.stdout.readline().split())
        assert failed in (errno.ENOSPC, errno.EDQUOT), \
            f"{written} MiB written and fsync'd to an unlinked file under a 16 MiB quota"
        doc = status(run)
        assert QUOTA // 2 < doc["quota_unlinked_bytes"] <= doc["quota_used_bytes"] <= QUOTA
        assert "unlinked" in vfsd_cli("status", run.run_dir).stdout
        st = os.statvfs(run.root)
        assert st.f_bavail * st.f_frsize < QUOTA // 2  # df sees it too
        # A named file finds the room taken as well.
        with pytest.raises(OSError) as refused:
            with open(run.root / "named", "wb") as f:
                f.write(os.urandom(QUOTA // 2))
                f.flush()
                os.fsync(f.fileno())
        assert refused.value.errno in (errno.ENOSPC, errno.EDQUOT)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # Freed with its last handle: the room comes back.
    wait_for(lambda: status(run)["quota_unlinked_bytes"] == 0, "the unlinked file freed")
    data = os.urandom(QUOTA // 2)
    (run.root / "named").write_bytes(data)
    assert (run.root / "named").read_bytes() == data
    run.umount()
    report = json.loads(vfsd_cli("fsck", run.run_dir, "--json").stdout)
    assert report["clean"], report


def test_an_unlinked_files_xattrs_count_too(run_factory):
    run = run_factory("q", "--quota-bytes", str(4 * MiB))
    run.expect_errors = True
    fds, refused = [], None
    try:
        for i in range(40):  # 40 x 4 x 64 KiB = 10 MiB of attributes on nameless files
            path = run.root / f"f{i}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(fd)
            os.unlink(path)
            try:
                for k in range(4):
                    os.setxattr(fd, f"user.blob{k}", os.urandom(64 * 1024 - 64))
            except OSError as exc:
                refused = exc.errno
                break
        assert refused == errno.ENOSPC
        assert status(run)["quota_used_bytes"] <= 4 * MiB
    finally:
        for fd in fds:
            os.close(fd)
    wait_for(lambda: status(run)["quota_used_bytes"] == 0, "the unlinked files freed")


def test_execute_cannot_fill_the_disk_past_the_quota_through_an_unlinked_file(run_factory):
    pytest.importorskip("deepagents")
    import mount_tool
    from mount_tool.deepagents import VfsdBackend

    run = run_factory("q", "--quota-bytes", str(QUOTA))
    run.expect_errors = True
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        backend = VfsdBackend(m)
        script = HOLDER.replace("sys.stdin.read()", "")
        (run.root / "hold.py").write_text(script)
        got = backend.execute("python3 /hold.py /tmp/hidden 64").output
        failed, written = map(int, got.split()[:2])
        assert failed in (errno.ENOSPC, errno.EDQUOT), \
            f"{written} MiB written inside execute under a 16 MiB quota: {got}"
        wait_for(lambda: status(run)["quota_unlinked_bytes"] == 0, "the unlinked file freed")
    finally:
        m.detach()
