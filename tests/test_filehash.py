"""The file hash: one definition in vfsd and mount_tool, and a cost that follows what is stored.

A file's hash is built from its blocks' digests, holes included, so hashing
never reads content (`vfsd.store.filehash`). Hashing a huge sparse file used to
zero-fill its holes on the FUSE loop: marking a 200 GB sparse file done and
advancing the step froze every request to the mount for ~28 s (issue 9,
item 8). The mount test below fails on such code by its timeout.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading

import pytest
import xxhash
from conftest import vfsd_cli

from mount_tool.refs import content_hash
from vfsd.store.filehash import bytes_hash, file_hash, zero_digest

CS = 4096


@pytest.mark.parametrize("size", [0, 1, CS - 1, CS, CS + 1, 5 * CS + 17])
@pytest.mark.parametrize("holes", [(), (0,), (1, 2), (5,)])
def test_one_definition(size: int, holes: tuple[int, ...]):
    rng = random.Random(size * 31 + len(holes))
    data = bytearray(rng.randbytes(size))
    for idx in holes:
        data[idx * CS : (idx + 1) * CS] = bytes(len(data[idx * CS : (idx + 1) * CS]))
    # What the store has: a digest per stored block; all-zero blocks are holes.
    digests = {i: xxhash.xxh3_128_digest(data[off : off + CS])
               for i, off in enumerate(range(0, size, CS))
               if any(data[off : off + CS])}
    expected = content_hash(bytes(data), CS)
    assert file_hash(size, digests, CS).hex() == expected
    assert bytes_hash(data, CS).hex() == expected


@pytest.mark.timeout(30)  # version 1 fed a digest per hole: 2**43 of them here
def test_hash_of_holes_costs_nothing():
    # A file's hash costs its stored blocks: holes and stored zeros add nothing,
    # so a planted 2**63-byte sparse file hashes at once (issue 20, item 1).
    small = bytes(3 * CS - 5)
    assert file_hash(len(small), {}, CS).hex() == content_hash(small, CS)
    assert file_hash(5 * CS + 3, {1: zero_digest(CS), 5: zero_digest(3)}, CS) == \
        file_hash(5 * CS + 3, {}, CS)
    assert len(file_hash((1 << 63) - 1, {7: b"d" * 16}, 1 << 20)) == 16
    assert file_hash(1 << 62, {}, 4096) != file_hash((1 << 62) + 1, {}, 4096)


class Prober(threading.Thread):
    """Keeps making, stat-ing and removing files on the mount; records failures."""

    def __init__(self, root) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.done = 0
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            path = self.root / f"probe-{self.done}"
            try:
                path.write_bytes(b"x")  # lookup, create, write, release: all reach the daemon
                assert os.stat(path).st_size == 1
                path.unlink()
                self.done += 1
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(exc))
                return


@pytest.mark.fuse
@pytest.mark.timeout(40)  # hashing that zero-fills 16 TiB of holes never ends in time
def test_huge_sparse_file_never_freezes_the_mount(run):
    big = run.root / "huge.bin"
    subprocess.run(["truncate", "-s", "16T", big], check=True)
    expected = file_hash(1 << 44, {}, 1 << 20).hex()
    prober = Prober(run.root)
    prober.start()
    try:
        os.setxattr(big, "user.vfsd.status", b"done")
        ref = json.loads(vfsd_cli("ref", run.run_dir, "huge.bin", timeout=120).stdout)
        assert ref["size"] == 1 << 44 and ref["hash"] == expected
        attrs = json.loads((run.root / ".vfsd" / "attr" / "huge.bin").read_bytes())
        assert attrs["hash"] == expected and attrs["size"] == 1 << 44
        report = json.loads(vfsd_cli("step", run.run_dir, "4", "--json", timeout=120).stdout)
        assert [(r["path"], r["hash"]) for r in report["evicted"]] == [("huge.bin", expected)]
        assert not big.exists()
        records = json.loads(vfsd_cli("evicted", run.run_dir, "--json").stdout)
        assert records[-1]["hash"] == expected
    finally:
        prober.stop.set()
        prober.join(timeout=30)
    assert not prober.errors, prober.errors
    assert prober.done > 0
