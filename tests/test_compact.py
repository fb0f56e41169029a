"""`vfsd gc --compact`: the store's LMDB file gives back what deleted files held.

LMDB reuses freed pages but never shrinks its file: after a workload that
created and deleted 150 MB of small files, data.mdb stayed at 174 MB with no
files left (issue 9, item 9). Compaction rewrites it without free pages
(`vfsd.store.compact`). It needs the store to itself: it refuses while any daemon
(of any run dir on the store) has it open, and nobody can open the store while
it runs. A crash at any point leaves a store that the next opener recovers.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import MountedRun, is_mounted, vfsd_cli

from vfsd.store import compact

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]

KiB = 1024
MiB = 1024 * KiB
#: the workload of the issue; docs/troubleshooting.md quotes the sizes it gives
WORKLOAD_BYTES = 150 * MiB
FILE_SIZE = 48 * KiB  # inline: every byte of it lives in LMDB


def make_and_delete(root: Path, total: int) -> dict[str, str]:
    """Write `total` bytes of small files, delete them, keep 20 others; {path: sha256}."""
    rng = random.Random(total)
    kept = {}
    for i in range(20):
        data = rng.randbytes(rng.choice([100, 5 * KiB, 40 * KiB, 3 * MiB]))
        (root / f"keep-{i}").write_bytes(data)
        kept[f"keep-{i}"] = hashlib.sha256(data).hexdigest()
    n = total // FILE_SIZE
    for d in range(-(-n // 500)):
        (root / f"tmp{d}").mkdir()

    def write(i: int) -> None:
        (root / f"tmp{i // 500}" / f"f{i}").write_bytes(rng.randbytes(FILE_SIZE))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(n)))
    for d in range(-(-n // 500)):
        for f in (root / f"tmp{d}").iterdir():
            f.unlink()
        (root / f"tmp{d}").rmdir()
    return kept


def check_files(root: Path, kept: dict[str, str]) -> None:
    assert sorted(os.listdir(root)) == sorted(kept)
    for name, digest in kept.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name


def assert_fsck_clean(run_dir: Path) -> None:
    proc = vfsd_cli("fsck", run_dir, "--verify", "--json", check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["clean"], report


def data_mdb(run: MountedRun) -> int:
    return (run.state_dir / "lmdb" / "data.mdb").stat().st_size


def test_compaction_gives_space_back(run):
    kept = make_and_delete(run.root, WORKLOAD_BYTES)
    # Refused while mounted, and nothing changes.
    proc = vfsd_cli("gc", "--compact", run.run_dir, check=False)
    assert proc.returncode == 1 and "unmount it to compact" in proc.stderr, proc
    run.umount()
    before = data_mdb(run)
    result = json.loads(vfsd_cli("gc", "--compact", "--json", run.run_dir).stdout)
    after = data_mdb(run)
    print(f"\ndata.mdb after {WORKLOAD_BYTES // MiB} MiB of small files created and deleted: "
          f"{before / MiB:.1f} MiB, compacted: {after / MiB:.1f} MiB")
    assert result["before_bytes"] == before and result["after_bytes"] == after
    assert before > WORKLOAD_BYTES // 2, "the workload did not grow the file"
    assert after < before // 10
    assert not (run.state_dir / "lmdb.compact").exists()
    assert not (run.state_dir / "lmdb.old").exists()
    assert_fsck_clean(run.run_dir)
    run.mount()
    check_files(run.root, kept)
    (run.root / "after").write_bytes(b"the compacted store takes writes")
    run.umount()
    assert_fsck_clean(run.run_dir)


def test_compaction_refused_while_any_run_dir_uses_the_store(run_factory, tmp_path):
    store = str(tmp_path / "store")
    a = run_factory("a", "--store", store)
    (a.root / "f").write_bytes(b"a")
    a.umount()
    b = run_factory("b", "--store", store)
    proc = vfsd_cli("gc", "--compact", a.run_dir, check=False)
    assert proc.returncode == 1 and "in use" in proc.stderr, proc
    assert "Traceback" not in proc.stderr
    b.umount()
    # A store being compacted cannot be opened: a run dir new to the store
    # would otherwise write to the file that compaction is about to replace.
    fd = os.open(tmp_path / "store" / "locks" / compact.LOCK_NAME, os.O_RDWR)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running compaction holds
        c = run_factory("c", "--store", store, mount=False)
        proc = vfsd_cli("mount", c.run_dir, "--store", store, check=False)
        assert proc.returncode != 0 and "being compacted" in proc.stderr, proc
        assert not is_mounted(c.root)
    finally:
        os.close(fd)
    json.loads(vfsd_cli("gc", "--compact", "--json", a.run_dir).stdout)
    a.mount()
    assert (a.root / "f").read_bytes() == b"a"


class Crash(Exception):
    """Stands for the process dying at that point."""


@pytest.mark.parametrize("when", ["before_swap", "between_renames", "after_swap"])
def test_compaction_cut_short_recovers_on_next_open(run, monkeypatch, when: str):
    kept = make_and_delete(run.root, 4 * MiB)
    run.umount()
    before = data_mdb(run)
    real_rename, real_fsync_dir = os.rename, compact._fsync_dir
    renames = []

    def rename(src, dst):
        renames.append(dst)
        if when == "before_swap" or (when == "between_renames" and len(renames) == 2):
            raise Crash
        real_rename(src, dst)

    def fsync_dir(path):
        if when == "after_swap" and len(renames) == 2:
            raise Crash  # both renames done, the old file not yet removed
        real_fsync_dir(path)

    monkeypatch.setattr(compact.os, "rename", rename)
    monkeypatch.setattr(compact, "_fsync_dir", fsync_dir)
    with pytest.raises(Crash):
        compact.compact(run.state_dir)
    monkeypatch.undo()
    leftovers = {p.name for p in run.state_dir.iterdir() if p.name.startswith("lmdb")}
    assert leftovers == {"before_swap": {"lmdb", "lmdb.compact"},
                         "between_renames": {"lmdb.old", "lmdb.compact"},
                         "after_swap": {"lmdb", "lmdb.old"}}[when]
    run.mount()
    check_files(run.root, kept)
    leftovers = {p.name for p in run.state_dir.iterdir() if p.name.startswith("lmdb")}
    assert leftovers == {"lmdb"}
    # The new file won once it was complete; before that, the old one stays.
    assert (data_mdb(run) == before) == (when == "before_swap")
    run.umount()
    assert_fsck_clean(run.run_dir)
