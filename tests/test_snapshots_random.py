"""Random histories of whole writes, in-place page writes (hot blocks), some
through descriptors kept open across snapshots (their pages still dirty in
the kernel), truncates, renames, unlinks, snapshots and restores on a real
mount, checked against a model of what each snapshot held.

The tree is read back through the mount after each restore and at random
points, so the kernel's caches are part of what is checked; at the end the
store must pass `vfsd fsck --verify`.
"""

from __future__ import annotations

import os
import random

import pytest
from conftest import MountedRun, tree, vfsd_cli

import mount_tool

pytestmark = pytest.mark.fuse

CS = 64 * 1024
SEEDS = 150 if os.environ.get("VFSD_LONG") == "1" else 16
OPS = ["put", "put", "pwrite", "pwrite", "hold", "held write", "held write", "truncate",
       "unlink", "rename", "snapshot", "snapshot", "restore", "check"]


@pytest.mark.parametrize("seed", range(SEEDS))
def test_restores_bring_back_exactly_what_each_snapshot_held(tmp_path, seed):
    rnd = random.Random(seed)
    run = MountedRun(tmp_path / "run", ("--chunk-size", str(CS), "--inline-max", "4096"))
    try:
        run.mount()
        m = mount_tool.Mount.attach(run.run_dir)
        root = run.root
        model: dict[str, bytes] = {}
        held: dict[str, dict[str, bytes]] = {}  # snapshot id -> the model then
        pool = [rnd.randbytes(CS) for _ in range(3)]  # shared chunks
        open_fds: dict[str, int] = {}  # name -> descriptor kept open

        def close_held() -> None:
            for fd in open_fds.values():
                os.close(fd)
            open_fds.clear()

        def written(name: str, off: int, data: bytes) -> None:
            cur = bytearray(model[name])
            cur[off:off + len(data)] = data
            model[name] = bytes(cur)
        for step in range(60):
            op = rnd.choice(OPS)
            name = f"f{rnd.randrange(5)}"
            path = root / name
            if op == "put":
                data = b"".join(rnd.choice(pool) for _ in range(rnd.randint(0, 3)))
                data += rnd.randbytes(rnd.randint(0, 5000))
                path.write_bytes(data)
                model[name] = data
            elif op == "pwrite" and name in model:
                off, data = rnd.randint(0, len(model[name])), rnd.randbytes(rnd.randint(1, 9000))
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, data, off)
                finally:
                    os.close(fd)
                written(name, off, data)
            elif op == "hold" and name in model and name not in open_fds:
                open_fds[name] = os.open(path, os.O_RDWR)
            elif op == "held write" and open_fds:
                # The name may have moved or gone: follow the file, as the kernel does.
                held_name = rnd.choice(sorted(open_fds))
                if held_name in model:
                    off = rnd.randint(0, len(model[held_name]))
                    data = rnd.randbytes(rnd.randint(1, 9000))
                    os.pwrite(open_fds[held_name], data, off)
                    written(held_name, off, data)
            elif op == "truncate" and name in model:
                size = rnd.randint(0, 3 * CS)
                os.truncate(path, size)
                model[name] = model[name][:size].ljust(size, b"\0")
            elif op == "unlink" and name in model:
                path.unlink()
                del model[name]
                if name in open_fds:
                    os.close(open_fds.pop(name))
            elif op == "rename" and name in model:
                dest = f"f{rnd.randrange(5)}"
                if dest != name:
                    os.rename(path, root / dest)
                    model[dest] = model.pop(name)
                    if dest in open_fds:  # the file it replaced is gone
                        os.close(open_fds.pop(dest))
                    if name in open_fds:
                        open_fds[dest] = open_fds.pop(name)
            elif op == "snapshot":
                ident = m.snapshot()["id"]
                held[ident] = dict(model)
                # Read from the snapshot itself: the live files' pages (some
                # still dirty behind open descriptors) are not touched.
                assert tree(root / ".vfsd" / "snapshots" / ident) == model, (step, ident)
            elif op == "restore":
                retained = {s["id"] for s in m.snapshots()} & set(held)
                if retained:
                    ident = rnd.choice(sorted(retained))
                    close_held()  # a restore reverts what holders see only at reopen
                    m.restore(ident)
                    model = dict(held[ident])
                    assert tree(root) == model, (step, ident)
            elif op == "check":
                assert tree(root) == model, step
        close_held()
        assert tree(root) == model
        m.detach()
        run.umount()
        vfsd_cli("fsck", str(run.run_dir), "--verify")
    finally:
        run.cleanup()


@pytest.mark.parametrize("seed", range(SEEDS // 2))
def test_restores_bring_back_evicted_files(tmp_path, seed):
    """Files written, marked done or pinned, removed, and evicted as the step
    advances: a restore brings back exactly the snapshot's tree, evicted files
    included, for as long as the snapshot is retained."""
    rnd = random.Random(seed)
    run = MountedRun(tmp_path / "run", ("--chunk-size", str(CS), "--inline-max", "4096"))
    try:
        run.mount()
        m = mount_tool.Mount.attach(run.run_dir)
        root = run.root
        held: dict[str, dict[str, bytes]] = {}
        for step in range(50):
            op = rnd.choice(["put", "put", "done", "pin", "step", "step", "snapshot",
                             "restore", "unlink"])
            name = f"d{rnd.randrange(2)}/f{rnd.randrange(4)}"
            path = root / name
            if op == "put":
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(rnd.randbytes(rnd.choice([10, 5000, CS + 10, 3 * CS])))
            elif op == "done" and path.exists():
                m.client.call("set_status", path=name, status="done")
            elif op == "pin" and path.exists():
                m.client.call("pin", path=name)
            elif op == "unlink" and path.exists():
                path.unlink()
            elif op == "step":
                now = m.client.call("get_step")["step"]
                m.client.call("set_step", step=now + rnd.randint(1, 30))  # evicts
            elif op == "snapshot":
                ident = m.snapshot()["id"]
                held[ident] = tree(root)
                assert tree(root / ".vfsd" / "snapshots" / ident) == held[ident], step
            elif op == "restore":
                retained = {s["id"] for s in m.snapshots()} & set(held)
                if retained:
                    ident = rnd.choice(sorted(retained))
                    m.restore(ident)
                    assert tree(root) == held[ident], (step, ident)
        m.detach()
        run.umount()
        vfsd_cli("fsck", str(run.run_dir), "--verify")
    finally:
        run.cleanup()
