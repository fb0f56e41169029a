"""A store damaged behind the daemon's back: LMDB pages, and inline content.

Damaged LMDB pages (issue 9, item 4): the daemon used to mount such a store
and die of SIGBUS at the first unlucky read, and `vfsd fsck` died with
`lmdb.CorruptedError`. Now a child process reads every page first
(`vfsd.store.lmdbcheck`): `vfsd mount` refuses with a message that names fsck, and
`vfsd fsck` reports and exits 1, whether LMDB noticed the damage (an error)
or reading it killed the reader (SIGBUS, an assertion's SIGABRT).

The damage is seeded and lands on pages of known kinds in a compacted copy of
a real store (every page of a compacted file is live), so each case meets the
same failure every time; the expected failure is part of each case.

Tampered inline content (item 6): the bytes of a small file, altered in
LMDB, used to be served as the file's content and accepted by `fsck
--verify`, `vfsd ref` and `Mount.read`. Small files are now content objects
(`blob` table, keyed by their xxh3-128) verified on every read like chunks.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
import xxhash
from conftest import MountedRun, is_mounted, vfsd_cli
from ctl import call

import mount_tool

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

PAGE = 4096
#: LMDB page header: pgno u64 at 0, flags u16 at 10, lower u16 at 12.
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04


def the_files() -> dict[str, bytes]:
    """1,500 files in 10 directories, inline (LMDB overflow pages) and chunked."""
    rng = random.Random(1)
    files = {}
    for d in range(10):
        for i in range(150):
            size = rng.choice([100, 1000, 5000, 20000])
            files[f"d{d}/file-{i:04d}.txt"] = rng.randbytes(size)
    return files


def make_files(root: Path) -> None:
    for rel, data in the_files().items():
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_bytes(data)


def compact_in_place(lmdb_dir: Path) -> None:
    """Rewrite the LMDB file without free pages (LMDB's own compacting copy)."""
    new = lmdb_dir.with_name("lmdb.new")
    new.mkdir()
    env = lmdb.open(str(lmdb_dir), readonly=True, max_dbs=64)
    env.copy(str(new), compact=True)
    env.close()
    shutil.rmtree(lmdb_dir)
    new.rename(lmdb_dir)


def pages_by_kind(data: bytes) -> dict[str, list[int]]:
    """Page numbers of branch, leaf and overflow pages (not the meta pages)."""
    kinds: dict[str, list[int]] = {"branch": [], "leaf": [], "overflow": []}
    for pgno in range(2, len(data) // PAGE):
        if struct.unpack_from("<Q", data, pgno * PAGE)[0] != pgno:
            continue  # the rest of an overflow value
        flags = struct.unpack_from("<H", data, pgno * PAGE + 10)[0]
        for bit, kind in ((P_BRANCH, "branch"), (P_LEAF, "leaf"), (P_OVERFLOW, "overflow")):
            if flags & bit:
                kinds[kind].append(pgno)
    return kinds


def damage_pages(path: Path, how: str, seed: int) -> None:
    """Seeded damage of one kind to the LMDB file at `path`.

    pages:  three whole pages anywhere overwritten with random bytes;
    branch: the body of a branch page (its child page numbers) randomized;
    sizes:  the data sizes of every record of a leaf page randomized, so
            values claim to run past the end of the file.
    """
    rng = random.Random(seed)
    data = bytearray(path.read_bytes())
    kinds = pages_by_kind(bytes(data))
    if how == "pages":
        for _ in range(3):
            pgno = rng.randrange(2, len(data) // PAGE)
            data[pgno * PAGE : (pgno + 1) * PAGE] = rng.randbytes(PAGE)
    elif how == "branch":
        base = rng.choice(kinds["branch"]) * PAGE
        data[base + 16 : base + PAGE] = rng.randbytes(PAGE - 16)
    elif how == "sizes":
        base = rng.choice(kinds["leaf"]) * PAGE
        lower = struct.unpack_from("<H", data, base + 12)[0]
        for i in range((lower - 16) // 2):
            node = base + struct.unpack_from("<H", data, base + 16 + 2 * i)[0]
            data[node : node + 4] = rng.randbytes(4)  # mn_lo, mn_hi: the data size
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """An unmounted run dir with 1,500 files, its LMDB file compacted."""
    run = MountedRun(tmp_path_factory.mktemp("pristine") / "run")
    try:
        run.mount()
        make_files(run.root)
        run.umount()
    finally:
        run.cleanup()
    compact_in_place(run.state_dir / "lmdb")
    return run.run_dir


@pytest.mark.parametrize(
    ("how", "seed", "failure"),
    [
        ("pages", 0, "MDB_CORRUPTED"),
        ("pages", 1, "MDB_CORRUPTED"),
        ("branch", 0, "MDB_PAGE_NOTFOUND"),
        ("branch", 8, "SIGABRT"),  # LMDB's own assertion aborts the reader
        ("sizes", 3, "SIGBUS"),
        ("sizes", 7, "SIGBUS"),
    ],
)
def test_damaged_pages_refused_and_reported(pristine: Path, tmp_path: Path, how: str,
                                            seed: int, failure: str):
    run = MountedRun(tmp_path / "run")
    shutil.copytree(pristine, run.run_dir)
    damage_pages(run.state_dir / "lmdb" / "data.mdb", how, seed)
    try:
        proc = vfsd_cli("mount", run.run_dir, check=False, timeout=60)
        assert proc.returncode != 0, "mounted a store whose pages do not read"
        assert not is_mounted(run.root)
        assert failure in proc.stderr, proc.stderr
        assert f"vfsd fsck {run.state_dir}" in proc.stderr, proc.stderr
        log = run.log_text()
        assert "startup_failed" in log
        assert "Traceback" not in proc.stderr + log

        proc = vfsd_cli("fsck", run.run_dir, "--json", check=False, timeout=60)
        assert proc.returncode == 1, proc
        report = json.loads(proc.stdout)
        assert not report["clean"] and not report["clean_after_repair"]
        assert any(failure in p for p in report["problems"]), report
        assert "Traceback" not in proc.stderr

        proc = vfsd_cli("fsck", run.run_dir, "--repair", check=False, timeout=60)
        assert proc.returncode == 1, proc
        assert "problem:" in proc.stdout and "fsck: NOT clean" in proc.stdout, proc.stdout
        assert "Traceback" not in proc.stderr
    finally:
        run.cleanup()


LONG = os.environ.get("VFSD_LONG") == "1"


@pytest.mark.skipif(not LONG, reason="VFSD_LONG=1: 30 more seeds of random page damage")
@pytest.mark.parametrize("seed", range(100, 130))
def test_random_page_damage_refuses_or_serves_only_true_bytes(pristine: Path, tmp_path: Path,
                                                              seed: int):
    """Three random pages overwritten: either the mount is refused (as above),
    or every file reads as written or fails with EIO, and the daemon lives."""
    run = MountedRun(tmp_path / "run")
    shutil.copytree(pristine, run.run_dir)
    damage_pages(run.state_dir / "lmdb" / "data.mdb", "pages", seed)
    try:
        proc = vfsd_cli("mount", run.run_dir, check=False, timeout=60)
        if proc.returncode != 0:
            assert "vfsd fsck" in proc.stderr and "Traceback" not in proc.stderr, proc
            proc = vfsd_cli("fsck", run.run_dir, "--json", check=False, timeout=60)
            assert proc.returncode == 1 and not json.loads(proc.stdout)["clean"], proc
            return
        failed = []
        for rel, data in the_files().items():
            try:
                got = (run.root / rel).read_bytes()
            except OSError as exc:
                assert exc.errno == errno.EIO, (rel, exc)
                failed.append(rel)
                continue
            assert got == data, f"{rel}: wrong bytes served"
        assert json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)["running"]
        run.umount()
        proc = vfsd_cli("fsck", run.run_dir, "--verify", "--json", check=False, timeout=60)
        report = json.loads(proc.stdout)
        assert sorted(report["damaged_files"]) == sorted(failed), report
    finally:
        run.cleanup()


def tamper_blob(state_dir: Path, content: bytes) -> None:
    """Change one byte of the inline object holding `content`, keeping its key."""
    env = lmdb.open(str(state_dir / "lmdb"), max_dbs=64)
    try:
        blob = env.open_db(b"blob", create=False)
        with env.begin(write=True, db=blob) as txn:
            key = xxhash.xxh3_128_digest(content)
            value = bytearray(txn.get(key))
            assert value == content
            value[7] ^= 0x20
            txn.put(key, bytes(value))
    finally:
        env.close()


def test_tampered_inline_content_is_never_served(run):
    content = b"the plan: " + random.randbytes(16).hex().encode() + b"\n" * 40
    other = random.randbytes(5000)
    big = random.randbytes(2 * 2**20 + 3)
    with mount_tool.Mount.attach(run.run_dir) as m:
        ref = m.write("notes/plan.md", content)
        m.write("notes/other.bin", other)
        m.write("big.bin", big)
    assert ref["size"] == len(content)
    run.umount()
    tamper_blob(run.state_dir, content)
    run.mount()
    run.expect_errors = True

    cat = subprocess.run(["cat", run.root / "notes" / "plan.md"], capture_output=True)
    assert cat.returncode == 1 and b"Input/output error" in cat.stderr, cat
    assert cat.stdout == b"", "served bytes that fail their hash"
    assert "store_damaged" in run.log_text()
    # The daemon is up: other files read, the control socket answers.
    assert (run.root / "notes" / "other.bin").read_bytes() == other
    assert (run.root / "big.bin").read_bytes() == big
    assert call(run.run_dir, "ping")["pong"]
    # The reference comes from the stored digests, never from the content.
    recorded = json.loads(vfsd_cli("ref", run.run_dir, "notes/plan.md").stdout)
    assert recorded["hash"] == ref["hash"]
    with mount_tool.Mount.attach(run.run_dir) as m:
        with pytest.raises(mount_tool.Damaged) as exc:
            m.read(ref)
        assert "notes/plan.md" in str(exc.value) and "fsck" in str(exc.value)
        assert m.read(m.ref("notes/other.bin")) == other
    # The command line says so too, with its own exit code, not a traceback.
    proc = subprocess.run([sys.executable, "-m", "mount_tool.cli", "read", str(run.run_dir),
                           json.dumps(ref)], capture_output=True, text=True)
    assert proc.returncode == 6, proc.stderr
    assert "damaged" in proc.stderr and "Traceback" not in proc.stderr

    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--verify", "--json", check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["damaged_files"] == ["notes/plan.md"], report


def cut_inode_record(state_dir: Path, ino: int) -> None:
    """Cut the inode record of `ino` (any volume) to 3 bytes: it no longer decodes."""
    env = lmdb.open(str(state_dir / "lmdb"), max_dbs=64)
    try:
        table = env.open_db(b"inode", create=False)
        with env.begin(write=True, db=table) as txn:
            keys = [k for k, _ in txn.cursor() if len(k) == 12 and k[4:] == struct.pack(">Q", ino)]
            assert len(keys) == 1, keys
            txn.put(keys[0], b"\x00\x01\x02")
    finally:
        env.close()


def test_damaged_inode_record_is_reported_as_damaged(run):
    """A record that does not decode is the store's damage, not a bad request:
    the control reply says `damaged` and `Mount.read` raises Damaged."""
    with mount_tool.Mount.attach(run.run_dir) as m:
        ref = m.write("notes/plan.md", "the plan\n")
        other = m.write("notes/other.md", "other\n")
    run.umount()
    cut_inode_record(run.state_dir, ref["ino"])
    run.mount()
    run.expect_errors = True
    with mount_tool.Mount.attach(run.run_dir) as m:
        with pytest.raises(mount_tool.Damaged) as exc:
            m.read(ref)
        assert exc.value.errno == errno.EIO and "does not decode" in str(exc.value)
        assert m.read(other) == b"other\n"
        with pytest.raises(mount_tool.ControlError) as ctl:
            m.ref("notes/plan.md")
        assert ctl.value.code == "damaged" and "fsck" in ctl.value.message
    proc = subprocess.run([sys.executable, "-m", "mount_tool.cli", "read", str(run.run_dir),
                           json.dumps(ref)], capture_output=True, text=True)
    assert proc.returncode == 6 and "Traceback" not in proc.stderr, proc.stderr
