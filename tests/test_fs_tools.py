"""Shell tools on a real vfsd mount: data written is data read, at every tier edge.

Each test drives coreutils (cp, cat, head, tail, grep, wc, sha256sum, dd, truncate,
tar, mv, rm, ln) through `bash -c` with the mount as cwd, and checks the result
against expectations computed here from the bytes we generated.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest
from pagecache import drop_page_cache

pytestmark = pytest.mark.fuse

KiB = 1024
MiB = 1024 * KiB
INLINE_MAX = 64 * KiB
CHUNK = 1 * MiB

ROUND_TRIP_SIZES = [
    0,
    1,
    INLINE_MAX - 1,
    INLINE_MAX,
    INLINE_MAX + 1,
    CHUNK - 1,
    CHUNK,
    CHUNK + 1,
    64 * MiB,
]


def sh(cmd: str, cwd: Path, *, input: bytes | None = None, timeout: float = 120) -> bytes:
    """Run `cmd` with bash in `cwd`; fail with its stderr if it exits non-zero."""
    proc = subprocess.run(
        ["bash", "-c", cmd], cwd=cwd, input=input, capture_output=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"`{cmd}` in {cwd} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}"
    )
    return proc.stdout


def random_bytes(size: int, seed: int) -> bytes:
    """Deterministic random bytes, so a failure can be reproduced from the seed."""
    return random.Random(seed).randbytes(size)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()




def sha256sum(path: str, cwd: Path) -> str:
    """The digest `sha256sum` prints for `path`, read from the daemon (not the cache)."""
    drop_page_cache(cwd / path)
    return sh(f"sha256sum -- '{path}'", cwd).split()[0].decode()


@pytest.mark.parametrize("size", ROUND_TRIP_SIZES, ids=lambda n: f"{n}B")
def test_round_trip_with_coreutils(run, tmp_path, size):
    data = random_bytes(size, seed=size)
    want = sha256(data)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    root = run.root

    sh(f"mkdir -p d && cp '{src}' d/f", root)
    assert os.stat(root / "d/f").st_size == size
    _assert_blocks_sane(root / "d/f", stored_at_most=size + CHUNK)
    assert sha256sum("d/f", root) == want
    assert sh("cat d/f | sha256sum", root).split()[0].decode() == want
    assert int(sh("wc -c < d/f", root)) == size
    drop_page_cache(root / "d/f")
    assert sh("head -c 4097 d/f", root) == data[:4097]
    assert sh("tail -c 4097 d/f", root) == data[-4097:]
    # A window straddling the first chunk boundary (or what exists of it).
    drop_page_cache(root / "d/f")
    assert sh(f"tail -c +{CHUNK - 9} d/f | head -c 20", root) == data[CHUNK - 10 : CHUNK + 10]

    back = tmp_path / "back.bin"
    drop_page_cache(root / "d/f")
    sh(f"cp d/f '{back}'", root)
    assert sha256(back.read_bytes()) == want
    with open(root / "d/f", "rb") as f:
        assert sha256(f.read()) == want


def test_odd_sized_writes_and_reads(run):
    """Unaligned write sizes that straddle the inline limit and chunk boundaries."""
    data = random_bytes(3 * CHUNK + 12345, seed=7)
    path = run.root / "odd.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pos = 0
        for step in [1, 4095, 65537, 999_999, 7, 1_048_577] * 10:
            if pos >= len(data):
                break
            pos += os.write(fd, data[pos : pos + step])
        while pos < len(data):
            pos += os.write(fd, data[pos:])
    finally:
        os.close(fd)
    assert sha256sum("odd.bin", run.root) == sha256(data)
    drop_page_cache(path)
    with open(path, "rb") as f:
        for off, length in [(0, 1), (INLINE_MAX - 3, 7), (CHUNK - 1, 2), (2 * CHUNK - 5, 70_000)]:
            f.seek(off)
            assert f.read(length) == data[off : off + length], (off, length)
        f.seek(len(data) - 10)
        assert f.read(100) == data[-10:]


def test_grep_recursive_finds_text_across_tree_and_chunk_boundaries(run):
    root = run.root
    sh("mkdir -p logs/a/b logs/c empty", root)
    expected_hits = set()
    for i, rel in enumerate(["logs/a/one.txt", "logs/a/b/two.txt", "logs/c/three.log"]):
        lines = [f"line {n} of {rel}" for n in range(200)]
        lines.insert(50 + i, "NEEDLE found here")
        (root / rel).write_text("\n".join(lines) + "\n")
        expected_hits.add(rel)
    (root / "logs/c/clean.txt").write_text("nothing to see\n" * 1000)

    # A needle split over the first chunk boundary of a large file.
    filler = b"x" * (CHUNK - 3) + b"NEEDLE" + b"y" * (CHUNK + 5)
    (root / "logs/big.txt").write_bytes(filler + b"\n")
    expected_hits.add("logs/big.txt")

    for rel in expected_hits:
        drop_page_cache(root / rel)
    listed = sh("grep -rl NEEDLE .", root).decode().split()
    assert {p.removeprefix("./") for p in listed} == expected_hits
    counts = sh("grep -rc NEEDLE logs | sort", root).decode().splitlines()
    assert "logs/c/clean.txt:0" in counts and "logs/a/one.txt:1" in counts
    assert sh("grep -n NEEDLE logs/a/b/two.txt", root) == b"52:NEEDLE found here\n"


def test_mkdir_p_mv_across_directories_and_rm_r(run, tmp_path):
    root = run.root
    big = random_bytes(2 * CHUNK + 1, seed=11)
    (tmp_path / "big").write_bytes(big)
    sh(f"mkdir -p a/b/c/d x/y && echo hello > a/b/c/d/small && cp '{tmp_path}/big' a/b/big", root)
    assert (root / "a/b/c/d").is_dir()
    sh("mkdir -p a/b/c/d", root)  # idempotent

    sh("mv a/b/c/d/small x/y/ && mv a/b/big x/", root)
    assert not (root / "a/b/c/d/small").exists()
    assert (root / "x/y/small").read_text() == "hello\n"
    assert sha256sum("x/big", root) == sha256(big)

    # A whole subtree moves to another parent, renamed on the way.
    sh("mv a/b x/y/moved", root)
    assert sorted(os.listdir(root / "a")) == []
    assert (root / "x/y/moved/c/d").is_dir()
    assert sorted(os.listdir(root / "x/y")) == ["moved", "small"]

    sh("rm -r x a", root)
    assert os.listdir(root) == []
    # Names are free again.
    sh("mkdir -p x/y && echo again > x/y/small", root)
    assert (root / "x/y/small").read_text() == "again\n"


def test_ln_hard_and_symbolic_and_readlink(run):
    root = run.root
    sh("mkdir dir sub && printf 'content\\n' > dir/f", root)
    sh("ln dir/f hard && ln -s dir/f soft && ln -s ../dir/f sub/up && ln -s nowhere dangling", root)

    st_f, st_hard = os.stat(root / "dir/f"), os.stat(root / "hard")
    assert st_f.st_ino == st_hard.st_ino and st_f.st_nlink == st_hard.st_nlink == 2
    sh("printf 'more\\n' >> hard", root)
    assert (root / "dir/f").read_text() == "content\nmore\n"

    assert sh("readlink soft", root) == b"dir/f\n"
    assert sh("readlink sub/up", root) == b"../dir/f\n"
    assert sh("cat soft sub/up", root) == b"content\nmore\n" * 2
    assert sh("readlink -f sub/up", root).decode().strip() == str((root / "dir/f").resolve())
    assert stat.S_ISLNK(os.lstat(root / "soft").st_mode)
    assert os.lstat(root / "soft").st_size == len("dir/f")

    assert sh("readlink dangling", root) == b"nowhere\n"
    proc = subprocess.run(["cat", "dangling"], cwd=root, capture_output=True)
    assert proc.returncode != 0 and b"No such file" in proc.stderr

    long_target = "/".join([f"segment{i:03d}" for i in range(90)])  # ~900 bytes
    os.symlink(long_target, root / "long")
    assert os.readlink(root / "long") == long_target

    sh("rm dir/f", root)
    assert (root / "hard").read_text() == "content\nmore\n"
    assert os.stat(root / "hard").st_nlink == 1


def _tree_listing(base: Path) -> dict[str, tuple]:
    """Type, permission bits, mtime (s), and content hash or link target per path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(base))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), int(st.st_mtime))
            else:
                digest = sha256(p.read_bytes())
                out[rel] = ("file", stat.S_IMODE(st.st_mode), int(st.st_mtime), st.st_size, digest)
    return out


def _make_native_tree(base: Path) -> None:
    (base / "docs/deep/er").mkdir(parents=True)
    (base / "empty").mkdir()
    for i, size in enumerate([0, 1, 500, INLINE_MAX, INLINE_MAX + 1, CHUNK + 1, 3 * CHUNK]):
        (base / f"docs/f{i}.bin").write_bytes(random_bytes(size, seed=100 + i))
    (base / "docs/deep/er/note.txt").write_text("deep note\n")
    script = base / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    (base / "docs/f1.bin").chmod(0o600)
    os.symlink("docs/deep/er/note.txt", base / "note-link")
    for p in [base / "docs/f2.bin", base / "docs/deep"]:
        os.utime(p, (1_600_000_000, 1_600_000_000))


def test_tar_round_trip(run, tmp_path):
    native = tmp_path / "native"
    native.mkdir()
    _make_native_tree(native)
    want = _tree_listing(native)
    archive = tmp_path / "in.tar"
    sh(f"tar -C '{native}' -cf '{archive}' .", tmp_path)

    sh(f"mkdir x && tar -C x -xpf '{archive}'", run.root)
    assert _tree_listing(run.root / "x") == want
    assert sh("./x/run.sh", run.root) == b"ran\n"

    back = tmp_path / "back.tar"
    native2 = tmp_path / "native2"
    native2.mkdir()
    sh(f"tar -C x -cf '{back}' . && tar -C '{native2}' -xpf '{back}'", run.root)
    assert _tree_listing(native2) == want


def _assert_blocks_sane(path: Path, *, stored_at_most: int) -> None:
    """st_blocks must not claim more than the file can occupy, nor zero for data.

    Tools such as cp and tar treat st_blocks == 0 on a non-empty file as "all hole",
    so a non-empty file must report some blocks.
    """
    st = os.stat(path)
    if st.st_size:
        assert st.st_blocks > 0, f"{path}: non-empty file reports st_blocks == 0"
    assert st.st_blocks * 512 <= stored_at_most, (st.st_blocks, stored_at_most)


def test_dd_seek_makes_sparse_file(run, tmp_path):
    root = run.root
    piece = random_bytes(4096, seed=3)
    (tmp_path / "piece").write_bytes(piece)
    # 4 KiB of data 10 MiB into an empty file: a hole of 2.5k blocks before it.
    sh(f"dd if='{tmp_path}/piece' of=sparse bs=4096 seek=2560 status=none", root)
    want = bytes(2560 * 4096) + piece
    assert os.stat(root / "sparse").st_size == len(want)
    assert sha256sum("sparse", root) == sha256(want)
    drop_page_cache(root / "sparse")
    with open(root / "sparse", "rb") as f:
        f.seek(5 * MiB)
        assert f.read(4096) == bytes(4096)
    _assert_blocks_sane(root / "sparse", stored_at_most=len(want) + CHUNK)
    assert int(sh("du -b sparse", root).split()[0]) == len(want)
    du_kib = int(sh("du -k sparse", root).split()[0])
    assert 0 < du_kib * KiB <= len(want) + CHUNK


def test_dd_overwrites_in_place_across_boundaries(run, tmp_path):
    root = run.root
    data = bytearray(random_bytes(3 * CHUNK, seed=4))
    (tmp_path / "base").write_bytes(data)
    patch = b"PATCHED-" * 4  # 32 bytes
    (tmp_path / "patch").write_bytes(patch)
    sh(f"cp '{tmp_path}/base' f", root)
    for offset in [0, INLINE_MAX - 16, CHUNK - 16, 2 * CHUNK - 1, 3 * CHUNK - 32]:
        sh(
            f"dd if='{tmp_path}/patch' of=f bs=1 seek={offset} conv=notrunc status=none",
            root,
        )
        data[offset : offset + len(patch)] = patch
    assert os.stat(root / "f").st_size == len(data)
    assert sha256sum("f", root) == sha256(bytes(data))

    # A small (inline) file grown past the inline limit by a seek beyond its end.
    (root / "small").write_bytes(b"s" * 100)
    sh(f"dd if='{tmp_path}/patch' of=small bs=1 seek={200 * KiB} conv=notrunc status=none", root)
    want = b"s" * 100 + bytes(200 * KiB - 100) + patch
    assert sha256sum("small", root) == sha256(want)
    _assert_blocks_sane(root / "small", stored_at_most=len(want) + CHUNK)
    _assert_blocks_sane(root / "f", stored_at_most=len(data) + CHUNK)


def test_shell_append_to_large_file(run, tmp_path):
    root = run.root
    data = bytearray(random_bytes(5 * MiB + 17, seed=5))
    (tmp_path / "start").write_bytes(data)
    sh(f"cp '{tmp_path}/start' big", root)
    for i, size in enumerate([1, 4095, INLINE_MAX, CHUNK - 17, 1, CHUNK + 1, 3 * KiB]):
        piece = random_bytes(size, seed=1000 + i)
        (tmp_path / "piece").write_bytes(piece)
        sh(f"cat '{tmp_path}/piece' >> big", root)
        data += piece
        assert os.stat(root / "big").st_size == len(data)
    sh('for i in $(seq 1 50); do echo "line $i" >> big; done', root)
    data += "".join(f"line {i}\n" for i in range(1, 51)).encode()
    assert sha256sum("big", root) == sha256(bytes(data))
    assert sh("tail -n 2 big", root) == b"line 49\nline 50\n"

    # Appends that carry a file from the inline tier into chunks.
    small = bytearray(random_bytes(INLINE_MAX - 10, seed=6))
    (root / "grow").write_bytes(small)
    sh("printf '0123456789ABCDEFGHIJ' >> grow", root)
    small += b"0123456789ABCDEFGHIJ"
    assert sha256sum("grow", root) == sha256(bytes(small))


def test_shell_redirect_replaces_large_file(run, tmp_path):
    """`>` truncates on open: a chunked file becomes a small one, and back."""
    root = run.root
    big = random_bytes(3 * CHUNK + 1, seed=9)
    (tmp_path / "big").write_bytes(big)
    sh(f"cp '{tmp_path}/big' f && echo small > f", root)
    assert os.stat(root / "f").st_size == 6
    assert sha256sum("f", root) == sha256(b"small\n")
    sh(f"cat '{tmp_path}/big' > f", root)
    assert sha256sum("f", root) == sha256(big)
    sh(": > f", root)
    assert os.stat(root / "f").st_size == 0
    assert sha256sum("f", root) == sha256(b"")


def test_truncate_grow_and_shrink_across_tiers(run, tmp_path):
    root = run.root
    data = random_bytes(3 * CHUNK + 7, seed=8)
    (tmp_path / "src").write_bytes(data)
    sh(f"cp '{tmp_path}/src' t", root)
    want = data
    sizes = [
        2 * CHUNK + 5,
        CHUNK + 1,
        CHUNK,
        CHUNK - 1,
        INLINE_MAX + 1,
        INLINE_MAX,
        INLINE_MAX - 1,
        1000,
        3 * CHUNK,  # grow after shrinking: the regrown range must read as zeros
        INLINE_MAX + 1,
        0,
        CHUNK + 1,
        70_000,
        INLINE_MAX - 1,
        5 * CHUNK + 3,
    ]
    for size in sizes:
        sh(f"truncate -s {size} t", root)
        want = want[:size] + bytes(max(0, size - len(want)))
        assert os.stat(root / "t").st_size == size
        assert sha256sum("t", root) == sha256(want), f"after truncate -s {size}"

    # ftruncate on an open descriptor, then writing past the new end.
    with open(root / "t", "r+b") as f:
        f.truncate(CHUNK - 2)
        f.seek(CHUNK + 2)
        f.write(b"tail")
    want = want[: CHUNK - 2] + bytes(4) + b"tail"
    assert sha256sum("t", root) == sha256(want)
    sh("truncate -s +10 t", root)
    assert os.stat(root / "t").st_size == len(want) + 10
