"""Random histories published through a real SeaweedFS and resumed elsewhere.

A worker writes (whole files sharing chunks, in-place page writes, truncates,
renames, unlinks), snapshots and publishes some of the snapshots (full and
delta manifests, retention retiring old ones); a fresh worker with a store
of its own resumes a random published snapshot, must see exactly the tree
that snapshot held, goes on changing it, publishes, and a third worker
resumes that in turn.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from conftest import vfsd_cli
from remote_run import FAST, snapshot, status, sync, tree, use_server
from s3server import s3_server  # noqa: F401 - fixture

pytestmark = pytest.mark.fuse

CS = 64 * 1024
OPTS = ("--chunk-size", str(CS), "--inline-max", "4096", "--snapshot-keep-last", "4")
SEEDS = 40 if os.environ.get("VFSD_LONG") == "1" else 2


def change(root: Path, rnd: random.Random, pool: list[bytes], steps: int) -> None:
    """`steps` random changes to the tree under `root`."""
    for _ in range(steps):
        names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                       if p.is_file() and ".vfsd" not in p.parts)
        op = rnd.choice(["put", "put", "pwrite", "truncate", "rename", "unlink"])
        if op == "put" or not names:
            path = root / f"d{rnd.randrange(2)}" / f"f{rnd.randrange(5)}"
            path.parent.mkdir(exist_ok=True)
            data = b"".join(rnd.choice(pool) for _ in range(rnd.randint(0, 3)))
            path.write_bytes(data + rnd.randbytes(rnd.randint(0, 6000)))
            continue
        path = root / rnd.choice(names)
        if op == "pwrite":
            with open(path, "r+b") as f:
                f.seek(rnd.randint(0, path.stat().st_size))
                f.write(rnd.randbytes(rnd.randint(1, 9000)))
        elif op == "truncate":
            os.truncate(path, rnd.randint(0, 3 * CS))
        elif op == "rename":
            dest = root / f"d{rnd.randrange(2)}" / f"f{rnd.randrange(5)}"
            dest.parent.mkdir(exist_ok=True)
            os.rename(path, dest)
        else:
            path.unlink()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_any_published_snapshot_resumes_exactly(s3_server, monkeypatch, run_factory,  # noqa: F811
                                               seed):
    use_server(s3_server, monkeypatch)
    rnd = random.Random(seed)
    url = s3_server.unique_url(f"random{seed}")
    pool = [rnd.randbytes(CS) for _ in range(3)]

    a = run_factory("a", "--remote", url, *FAST, *OPTS)
    published: dict[str, dict] = {}  # snapshot id -> the tree it holds
    for _ in range(8):
        change(a.root, rnd, pool, rnd.randint(1, 6))
        ident = snapshot(a)
        if rnd.random() < 0.6:
            sync(a)
            published[ident] = tree(a.root)
    ident = snapshot(a)
    sync(a)
    published[ident] = tree(a.root)
    run = status(a)["run"]
    retained = {s["id"] for s in json.loads(
        vfsd_cli("snapshots", a.run_dir, "--json").stdout)["snapshots"]}
    a.umount()  # gives the lease back

    # Any published snapshot retention kept can be resumed on a fresh worker.
    ident = rnd.choice(sorted(set(published) & retained))
    b = run_factory("b", "--remote", url, "--from", f"{run}@{ident}", *FAST, *OPTS)
    assert tree(b.root) == published[ident]
    change(b.root, rnd, pool, 6)
    on_b = snapshot(b)
    sync(b)
    expected = tree(b.root)
    b.umount()

    c = run_factory("c", "--remote", url, "--from", f"{run}@{on_b}", *FAST, *OPTS)
    assert tree(c.root) == expected
