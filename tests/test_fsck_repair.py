"""`vfsd fsck --repair` against random damage to the snapshot and content tables.

A store with versions of a few files (sharing blocks, so content objects are
named by live files and by several snapshot entries at once) and some
snapshots is damaged in one place: a snapshot record, a change-list record,
a change mark or an entry removed, or a content count nudged. After
`--repair` the store must check clean with `--verify`, every live file must
read as before, and it must stay clean through deleting every file and
taking more snapshots (a count left wrong shows up there, when the content
goes).
"""

from __future__ import annotations

import os
import random
import stat

import pytest

from vfsd.fsck import fsck
from vfsd.fuse.openfiles import OpenFiles
from vfsd.snapshots.snapshots import Snapshots
from vfsd.store.content import pack_record, unpack_record
from vfsd.store.store import ROOT_INO, Store

CS = 64
FILES = 4
SEEDS = 3000 if os.environ.get("VFSD_LONG") == "1" else 300
DAMAGE = ["snapshot record", "change list", "change mark", "entry", "count up", "count down"]



@pytest.fixture(autouse=True)
def small_reserve(monkeypatch):
    """Hundreds of stores per run: the 8 MiB disk-full reserve each would make
    is not what these tests are about."""
    monkeypatch.setattr(Store, "RESERVE_BYTES", 64 << 10)

def build(store: Store, files: OpenFiles, rnd: random.Random) -> dict[int, bytes]:
    """Six rounds of rewriting two files from a pool of four blocks, each
    followed by a snapshot (three retained); the live files' bytes."""
    snaps = Snapshots(store, keep_last=3, keep_steps=0)
    pool = [rnd.randbytes(CS) for _ in range(4)]
    inos = [store.create(ROOT_INO, b"f%d" % i, stat.S_IFREG | 0o644, 0, 0).ino
            for i in range(FILES)]
    for _ in range(6):
        for ino in rnd.sample(inos, 2):
            of = files.acquire(ino)
            files.truncate(of, 0)
            files.write(of, 0, b"".join(rnd.choice(pool) for _ in range(rnd.randint(1, 3))))
            files.release(of)
        snaps.create()
    return {ino: read(files, ino) for ino in inos}


def read(files: OpenFiles, ino: int) -> bytes:
    of = files.acquire(ino)
    try:
        return files.read(of, 0, of.inode.size)
    finally:
        files.release(of)


def damage(store: Store, kind: str, rnd: random.Random) -> None:
    with store.txn(write=True) as txn:
        if kind.startswith("count"):
            records = [(bytes(k), unpack_record(v))
                       for k, v in txn.cursor(db=store.db["content"])]
            digest, (count, size, loc) = rnd.choice(records)
            count = count + 1 if kind == "count up" else max(1, count - 1)
            txn.put(digest, pack_record(count, size, loc), db=store.db["content"])
            return
        table = {"snapshot record": "snap", "change list": "sgen", "change mark": "sdirty",
                 "entry": "sver"}[kind]
        keys = [bytes(k) for k in txn.cursor(db=store.db[table]).iternext(values=False)]
        if table == "snap":
            keys = keys[:-1]  # the newest snapshot's record is what the next one diffs against
        if keys:
            txn.delete(rnd.choice(keys), db=store.db[table])


@pytest.mark.parametrize("seed", range(SEEDS))
def test_repair_leaves_a_store_that_stays_clean(tmp_path, seed):
    rnd = random.Random(seed)
    kind = DAMAGE[seed % len(DAMAGE)]
    store = Store(tmp_path / "store", chunk_size=CS)
    files = OpenFiles(store, chunk_size=CS, inline_max=16)
    try:
        live = build(store, files, rnd)
        damage(store, kind, rnd)
        fsck(store, repair=True)
        rep = fsck(store, verify=True)
        assert rep.clean, (kind, rep.problems)
        assert {ino: read(files, ino) for ino in live} == live, kind
        for i in range(len(live)):
            store.free_inode(store.unlink(ROOT_INO, b"f%d" % i).ino)
        snaps = Snapshots(store, keep_last=3, keep_steps=0)
        for _ in range(4):  # the old snapshots age out and free their content
            snaps.create()
        rep = fsck(store, verify=True)
        assert rep.clean, (kind, rep.problems)
    finally:
        store.close()


def _status_9(store, txn, f, d):
    inode = store._get_inode(txn, f)
    inode.status = 9
    store._put_inode(txn, inode)


def _huge(store, txn, f, d):
    inode = store._get_inode(txn, f)
    inode.size = (1 << 63) - 1
    store._put_inode(txn, inode)


def _two_names(store, txn, f, d):
    store._add_entry(txn, ROOT_INO, b"again", d)


def _inside_itself(store, txn, f, d):
    store._del_entry(txn, ROOT_INO, b"d")
    store._add_entry(txn, d, b"loop", d)


def _big_xattr(store, txn, f, d):
    txn.put(store._key(f) + b"user.x", bytes(1 << 20), db=store.db["xattr"])


@pytest.mark.parametrize("damage, why", [
    (_status_9, "status 9"), (_huge, "largest file"), (_two_names, "has 2 names"),
    (_inside_itself, "reached from the root"), (_big_xattr, "xattr value"),
])
def test_fsck_checks_the_invariants_an_import_checks(tmp_path, damage, why):
    # One definition (vfsd/store/invariants.py) for fsck and `mount --from`.
    store = Store(tmp_path / "s")
    try:
        f = store.create(ROOT_INO, b"f", stat.S_IFREG | 0o644, 0, 0).ino
        d = store.create(ROOT_INO, b"d", stat.S_IFDIR | 0o755, 0, 0).ino
        assert fsck(store).clean
        with store.txn(write=True) as txn:
            damage(store, txn, f, d)
        problems = fsck(store).problems
        assert any(why in p for p in problems), problems
    finally:
        store.close()


@pytest.mark.fuse
def test_repair_quarantines_damaged_files_into_lost_and_found(run):
    """`vfsd fsck --repair --quarantine`: a file whose chunk was altered moves to
    lost+found/INO-NAME with that block dropped (zeros), the rest of its bytes
    and every other file intact, and the store checks clean with --verify."""
    import json
    import subprocess

    from conftest import vfsd_cli

    from vfsd.store.chunks import chunk_hash

    mib = 1 << 20
    data = os.urandom(3 * mib)
    (run.root / "sub").mkdir()
    (run.root / "sub" / "big.bin").write_bytes(data)
    (run.root / "sub" / "more").mkdir()  # every name goes, the first to lost+found
    os.link(run.root / "sub" / "big.bin", run.root / "sub" / "more" / "big-link.bin")
    (run.root / "good.bin").write_bytes(os.urandom(2 * mib))
    good = (run.root / "good.bin").read_bytes()
    ino = os.stat(run.root / "sub" / "big.bin").st_ino
    run.umount()
    chunk = next(p for p in run.state_dir.rglob(chunk_hash(data[mib:2 * mib]).hex()))
    chunk.write_bytes(b"not what it was" + chunk.read_bytes()[15:])
    plain = vfsd_cli("fsck", run.run_dir, "--repair", "--verify", "--json", check=False)
    assert plain.returncode == 1 and not json.loads(plain.stdout)["clean_after_repair"]
    assert vfsd_cli("fsck", run.run_dir, "--quarantine", check=False).returncode == 2
    proc = vfsd_cli("fsck", run.run_dir, "--repair", "--verify", "--quarantine", check=False)
    assert proc.returncode == 0 and f"as lost+found/{ino}-big.bin" in proc.stdout, proc
    assert "its other name(s) removed: sub/more/big-link.bin" in proc.stdout, proc.stdout
    assert vfsd_cli("fsck", run.run_dir, "--verify").returncode == 0
    run.mount()
    moved = run.root / "lost+found" / f"{ino}-big.bin"
    assert not (run.root / "sub" / "big.bin").exists()
    assert not (run.root / "sub" / "more" / "big-link.bin").exists()
    assert os.stat(moved).st_nlink == 1
    assert oct(os.stat(run.root / "lost+found").st_mode & 0o777) == "0o700"
    got = subprocess.run(["cat", str(moved)], capture_output=True, check=True).stdout
    assert got == data[:mib] + bytes(mib) + data[2 * mib:]
    assert (run.root / "good.bin").read_bytes() == good
