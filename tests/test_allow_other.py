"""--allow-other with a second local user, against a Runs' per-thread run dirs.

A Runs mounts every thread with `allow_other=True` (so that users other than the
daemon's may reach the files, as a service's sandbox user would). A second
local user, created here, then tries everything through the kernel, with
plain system calls: it gets exactly what each file's POSIX permissions allow
(a 0644 file reads, a 0600 file and a 0700 directory do not, nothing is
writable by it), the same in retained snapshots (`.vfsd/snapshots/`) and in the
attribute mirror (`.vfsd/attr/`), nothing of the daemon's own records
(`.vfsd/status.json`, `evicted.ndjson`, `accesslog`: they name files of private
directories too), no control socket (so no restore, no snapshot deletion), no
store and no thread record. The owner's files and snapshots are unchanged.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import tree

import mount_tool

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

OTHER = "vfsd-other"
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def other_user():
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    created = False
    try:
        pwd.getpwnam(OTHER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", OTHER], check=True, capture_output=True)
        created = True
    try:
        yield pwd.getpwnam(OTHER)
    finally:
        if created:
            subprocess.run(["userdel", OTHER], capture_output=True)


PROBE = textwrap.dedent('''
    import errno, json, os, socket, sys
    checks = json.loads(sys.argv[1])
    out = {}
    for name, (kind, path) in checks.items():
        try:
            if kind == "read":
                with open(path, "rb") as f:
                    out[name] = "read:" + f.read(64).decode(errors="replace")
            elif kind == "open":  # open only: a stream would block a read
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
                out[name] = "opened"
            elif kind == "list":
                out[name] = "list:" + ",".join(sorted(os.listdir(path)))
            elif kind == "write":
                with open(path, "wb") as f:
                    f.write(b"x")
                out[name] = "wrote"
            elif kind == "unlink":
                os.unlink(path)
                out[name] = "unlinked"
            elif kind == "chmod":
                os.chmod(path, 0o777)
                out[name] = "chmodded"
            elif kind == "connect":
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                s.sendall(b'{"op": "restore", "snapshot": "s1"}\\n')
                out[name] = "answered:" + s.recv(200).decode(errors="replace")
        except OSError as exc:
            out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    print(json.dumps(out))
''')


def as_other(user, checks: dict[str, tuple[str, Path]]) -> dict[str, str]:
    """Run the checks as `user`, with plain system calls; name -> outcome."""
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-c", PROBE, json.dumps({k: [kind, str(p)] for k, (kind, p)
                                                 in checks.items()})],
        user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/"}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_second_user_gets_what_posix_permissions_allow(other_user):
    base = Path(tempfile.mkdtemp(prefix="vfsd-allow-other-", dir="/tmp"))
    os.chmod(base, 0o755)  # reachable by the other user, as a service's root would be
    try:
        with mount_tool.runs(base / "runs", allow_other=True) as runs:
            with runs.use("alice") as m:
                (m.root / "public.txt").write_text("hello")
                (m.root / "secret.txt").write_text("s3cret")
                os.chmod(m.root / "secret.txt", 0o600)
                (m.root / "private").mkdir(mode=0o700)
                (m.root / "private" / "inner.txt").write_text("inside")
                snap = m.snapshot(label="before the visit")["id"]
                before = tree(m.root)
            runs.get("bob")
            run, shard = runs.run_dir("alice"), m.shard.run_dir
            fs, snaps, attr = run / "fs", run / "fs/.vfsd/snapshots" / snap, run / "fs/.vfsd/attr"
            got = as_other(other_user, {
                "public": ("read", fs / "public.txt"),
                "secret": ("read", fs / "secret.txt"),
                "private dir": ("list", fs / "private"),
                "private file": ("read", fs / "private/inner.txt"),
                "create": ("write", fs / "new.txt"),
                "overwrite": ("write", fs / "public.txt"),
                "unlink": ("unlink", fs / "public.txt"),
                "chmod": ("chmod", fs / "secret.txt"),
                "snapshot public": ("read", snaps / "public.txt"),
                "snapshot secret": ("read", snaps / "secret.txt"),
                "snapshot private": ("list", snaps / "private"),
                "attr public": ("read", attr / "public.txt"),
                "attr secret": ("read", attr / "secret.txt"),
                "attr private": ("list", attr / "private"),
                "status": ("open", fs / ".vfsd/status.json"),
                "evicted log": ("open", fs / ".vfsd/evicted.ndjson"),
                "access log": ("open", fs / ".vfsd/accesslog"),
                "control socket": ("connect", shard / ".vfsd/vfsd.sock"),
                "state dir": ("list", run / ".vfsd"),
                "shard's state dir": ("list", shard / ".vfsd"),
                "store": ("list", shard / ".vfsd/lmdb"),
                "thread record": ("read", run / "thread.json"),
                "other thread": ("read", runs.run_dir("bob") / "thread.json"),
            })
            assert got == {
                "public": "read:hello",  # 0644: POSIX lets anyone read it
                "secret": "EACCES",
                "private dir": "EACCES",
                "private file": "EACCES",
                "create": "EACCES",
                "overwrite": "EACCES",
                "unlink": "EACCES",
                "chmod": "EPERM",
                "snapshot public": "read:hello",
                "snapshot secret": "EACCES",
                "snapshot private": "EACCES",
                "attr public": got["attr public"],  # its JSON document, checked below
                "attr secret": "EACCES",
                "attr private": "EACCES",
                "status": "EACCES",
                "evicted log": "EACCES",
                "access log": "EACCES",
                "control socket": "EACCES",
                "state dir": "EACCES",
                "shard's state dir": "EACCES",
                "store": "EACCES",
                "thread record": "EACCES",
                "other thread": "EACCES",
            }
            assert got["attr public"].startswith("read:{")
            with runs.use("alice") as m:
                assert tree(m.root) == before
                assert [s["id"] for s in m.snapshots()] == [snap]
                assert m.snapshot_state()["base"] == snap and not m.snapshot_state()["changed"]
    finally:
        shutil.rmtree(base, ignore_errors=True)
