"""What a writer of the bucket can do to a mount (issue 20), on real mounts with a real SeaweedFS.

Someone who shares the bucket prefix (another tenant, a compromised worker)
plants manifests, heads and leases. docs/security.md promises that they can
deny service to the remote tier and no more: every record of a manifest is
checked against the invariants `vfsd fsck` checks, and against what local
operations refuse, before anything is written; numbers read from the bucket
are bounded; a failed import leaves no half-imported volume behind.

Each planted run below is a copy of a real published run (`base`) under a
fresh run id, with one record made hostile.
"""

from __future__ import annotations

import json
import secrets
import socket
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import xxhash
from conftest import VFSD, MountedRun, is_mounted, vfsd_cli
from remote_run import FAST, Bucket, snapshot, status, sync, use_server
from s3server import s3_server  # noqa: F401 - fixture

from vfsd.remote import manifest
from vfsd.remote.head import Head
from vfsd.remote.manifest import Manifest, decode, encode
from vfsd.snapshots.snapshots import pack_inode_entry, unpack_inode_entry
from vfsd.store.keys import dentry_key, inode_key
from vfsd.store.store import Store

pytestmark = pytest.mark.fuse
_U64 = struct.Struct(">Q")
ROOT = 1


@dataclass
class Base:
    """A run published by a real worker: its bucket, URL and first manifest."""

    url: str
    bucket: Bucket
    manifest: Manifest


@pytest.fixture(scope="module")
def base(s3_server, tmp_path_factory):  # noqa: F811
    with pytest.MonkeyPatch.context() as mp:
        use_server(s3_server, mp)
        url = s3_server.unique_url("hostile")
        a = MountedRun(tmp_path_factory.mktemp("hostile") / "a", ("--remote", url, *FAST))
        a.mount()
        try:
            (a.root / "dir").mkdir()
            (a.root / "dir" / "notes.txt").write_text("notes\n")
            (a.root / "small.txt").write_text("small\n")
            (a.root / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: two chunks
            snapshot(a)
            sync(a)
            run = status(a)["run"]
        finally:
            a.umount()
        bucket = Bucket(s3_server, url)
        yield Base(url, bucket, decode(bucket.get(f"runs/{run}/snapshots/1"), run=run, seq=1))


@pytest.fixture
def s3(s3_server, monkeypatch):  # noqa: F811
    use_server(s3_server, monkeypatch)
    return s3_server


def plant(base: Base, edit=None, **header) -> str:
    """A new run in the bucket: `base`'s snapshot with `edit(state)` applied to
    its {object key: value} and `header` fields replaced; its run id."""
    run = secrets.token_hex(16)
    state = dict(base.manifest.entries)
    if edit is not None:
        edit(state)
    m = replace(base.manifest, run=run, entries=sorted(state.items()), **header)
    base.bucket.put(f"runs/{run}/snapshots/1", encode(m))
    head = Head(run, generation=m.generation, latest=1, snapshots=[{
        "seq": 1, "parent": 0, "full": True, "step": min(m.step, 1 << 62),
        "created_ns": m.created_ns, "pinned": False, "entries": len(m.entries), "bytes": 0,
        "generation": m.generation}])
    base.bucket.put(f"runs/{run}/head", head.to_bytes())
    return run


def ino_of(state: dict, parent: int, name: bytes) -> int:
    return _U64.unpack(state[dentry_key(parent, name)])[0]


def edit_inode(state: dict, ino: int, **changes) -> None:
    e = unpack_inode_entry(ino, state[inode_key(ino)])
    for key, value in changes.items():
        if hasattr(e.inode, key):
            setattr(e.inode, key, value)
        else:
            setattr(e, key, value)
    state[inode_key(ino)] = pack_inode_entry(e)


def refused(base: Base, run: str, target: Path, *extra: str) -> str:
    """`vfsd mount --from` of `run` fails with a message, writing nothing
    locally and leaving the run's lease alone; the message."""
    proc = vfsd_cli("mount", target, "--remote", base.url, "--from", f"{run}@s1", *FAST,
                    *extra, check=False)
    if is_mounted(target / "fs"):  # on code that took it: leave no mount behind
        MountedRun(target).cleanup()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert not is_mounted(target / "fs")
    assert not (target / ".vfsd" / "lmdb").exists(), "nothing may be imported"
    assert f"runs/{run}/lease" not in base.bucket.keys(f"runs/{run}/"), "lease taken"
    return proc.stderr


# ------------------------------------------------------- records against the invariants


def _big(state):
    return ino_of(state, ROOT, b"big.bin")


def _dir(state):
    return ino_of(state, ROOT, b"dir")


def _second_name_for_dir(state):
    state[dentry_key(ROOT, b"again")] = _U64.pack(_dir(state))


def _dir_inside_itself(state):
    d = _dir(state)
    del state[dentry_key(ROOT, b"dir")]
    state[dentry_key(d, b"loop")] = _U64.pack(d)
    edit_inode(state, ROOT, nlink=2)


def _root_entry(name: bytes):
    def edit(state):
        state[dentry_key(ROOT, name)] = _U64.pack(_dir(state))
        del state[dentry_key(ROOT, b"dir")]
    return edit


HOSTILE_RECORDS = {
    # item 1: a file far past what the local filesystem takes (EFBIG past 16 TiB)
    "size 2^63-1": (lambda s: edit_inode(s, _big(s), size=(1 << 63) - 1, nblocks=0, blocks={}),
                    "largest file"),
    "size 16 TiB + 1": (lambda s: edit_inode(s, _big(s), size=(1 << 44) + 1), "largest file"),
    # item 3: names local operations refuse at the root
    "root entry .vfsd": (_root_entry(b".vfsd"), "reserved"),
    # item 7: records fsck counts as damage
    "status 9": (lambda s: edit_inode(s, _big(s), status=9), "status 9"),
    "step 2^64-1": (lambda s: edit_inode(s, _big(s), step=(1 << 64) - 1), "step"),
    "8 MiB xattr": (lambda s: edit_inode(s, _big(s), xattrs=[(b"user.x", bytes(8 << 20))]),
                    "xattr"),
    "20,000 xattr names": (lambda s: edit_inode(
        s, _big(s), xattrs=[(b"user.%05d" % i, b"") for i in range(20_000)]), "xattr"),
    "directory under two names": (_second_name_for_dir, "names"),
    "directory inside itself": (_dir_inside_itself, "reached from the root"),
    "wrong link count": (lambda s: edit_inode(s, _big(s), nlink=7), "link count"),
    "virtual xattr stored": (lambda s: edit_inode(
        s, _big(s), xattrs=[(b"user.vfsd.status", b"done")]), "daemon's own"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RECORDS))
def test_hostile_records_are_refused_with_nothing_written(s3, base, tmp_path, case):
    edit, why = HOSTILE_RECORDS[case]
    message = refused(base, plant(base, edit), tmp_path / "t")
    assert why in message, message


def test_a_manifest_step_past_the_local_bound_is_refused(s3, base, tmp_path):
    # item 7: the manifest's own step becomes the volume's; `vfsd step N+1` died on it.
    message = refused(base, plant(base, step=(1 << 64) - 1), tmp_path / "t")
    assert "step" in message, message


@pytest.mark.parametrize("field, value", [("entries", "many"), ("bytes", 1 << 70),
                                          ("generation", -1), ("pinned", "yes")])
def test_a_head_entry_with_numbers_out_of_range_is_refused(s3, base, tmp_path, field, value):
    # The publisher did int(entry["entries"]) on what the head said.
    run = plant(base)
    head = base.bucket.head(run)
    head["snapshots"][0][field] = value
    base.bucket.put(f"runs/{run}/head", json.dumps(head).encode())
    message = refused(base, run, tmp_path / "t")
    assert "damaged snapshot entry" in message, message


def test_a_sparse_file_at_the_local_bound_imports_and_hashes_at_once(s3, base, tmp_path):
    # item 1: 16 TiB, the largest file the local filesystem takes, imports; its
    # hash (attr view, `vfsd ref`) costs what is stored, not a digest per hole.
    run = plant(base, lambda s: edit_inode(s, _big(s), size=1 << 44))
    t = MountedRun(tmp_path / "t", ("--remote", base.url, "--from", f"{run}@s1", *FAST))
    t.mount()
    try:
        assert (t.root / "big.bin").stat().st_size == 1 << 44
        doc = json.loads((t.root / ".vfsd" / "attr" / "big.bin").read_bytes())
        ref = json.loads(vfsd_cli("ref", t.run_dir, "big.bin").stdout)
        assert doc["hash"] == ref["hash"] and ref["size"] == 1 << 44
    finally:
        t.umount()


def test_a_planted_label_reaches_no_terminal_as_escape_sequences(s3, base, tmp_path):
    """A label is shown by `vfsd snapshots`: ESC sequences in a planted one
    (OSC 52 writes the clipboard of many terminals) are printed escaped; one
    longer than a local label may be is refused."""
    assert "label" in refused(base, plant(base, label="x" * 201), tmp_path / "long")
    evil = "\x1b]52;c;ZXZpbA==\x07\x1b[2Jplanted"
    t = MountedRun(tmp_path / "t", ("--remote", base.url, "--from",
                                    f"{plant(base, label=evil)}@s1", *FAST))
    t.mount()
    try:
        out = vfsd_cli("snapshots", t.run_dir).stdout
        assert "planted" in out and "\x1b" not in out and "\x07" not in out, repr(out)
        assert "\\x1b]52" in out
        assert json.loads(vfsd_cli("snapshots", t.run_dir, "--json").stdout)[
            "snapshots"][0]["label"] == evil  # the data itself is kept as it is
    finally:
        t.umount()


# ------------------------------------------------------------------------ leases


def test_a_planted_lease_generation_at_the_top_never_wedges_the_run(s3, base, tmp_path):
    """item 4: a lease of generation 2**64-1 made the next worker write 2**64
    and die with struct.error, its volume left incomplete for good. Out of
    range, it is a damaged lease: held (read-only) until it lapses, then
    taken over like any damaged one."""
    run = plant(base)
    lease = {"vfsd_lease": 1, "run": run, "owner": {"host": "x", "pid": 1, "token": "t"},
             "generation": (1 << 64) - 1, "ttl": 5, "acquired_at": 0, "renewed_at": 0,
             "expires_at": 0, "released": True, "seq": 1, "session": "s"}
    base.bucket.put(f"runs/{run}/lease", json.dumps(lease).encode())
    t = MountedRun(tmp_path / "t", ("--remote", base.url, "--from", f"{run}@s1", *FAST))
    t.mount()
    st = status(t)["remote"]
    assert st["read_only"] and "damaged lease" in st["reason"], st
    assert json.loads(base.bucket.get(f"runs/{run}/lease"))["generation"] == (1 << 64) - 1
    t.umount()
    # Once it lapses, the run is taken over; nothing of the import is redone.
    t.mount("--remote-lease-wait", "30")
    st = status(t)["remote"]
    assert st["state"] == "held", st
    assert json.loads(base.bucket.get(f"runs/{run}/lease"))["generation"] == 1
    assert (t.root / "small.txt").read_text() == "small\n"
    t.umount()


def test_a_failed_import_leaves_no_half_imported_volume(s3, base, tmp_path):
    """item 4: an import that fails once it has started writing takes back
    what it wrote, so the run dir mounts afterwards as if never tried. The
    failure here: the shared store keeps one of the run's small objects as a
    chunk file (a store with a smaller inline_max made it)."""
    shared = tmp_path / "shared"
    blob = next(iter(base.manifest.blobs.values()))
    other = MountedRun(tmp_path / "other", ("--store", str(shared), "--inline-max", "1"))
    other.mount()
    (other.root / "same.txt").write_bytes(blob)
    other.umount()
    run = plant(base)
    target = tmp_path / "t"
    proc = vfsd_cli("mount", target, "--store", shared, "--remote", base.url, "--from",
                    f"{run}@s1", *FAST, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "stored" in proc.stderr, proc.stderr
    st = Store(shared, None, readonly=True, create=False)
    try:
        assert len(st.volumes()) == 1, st.volumes()  # the other run dir's only
    finally:
        st.close()
    t = MountedRun(target, ("--store", str(shared)))
    t.mount()
    assert list(t.root.iterdir()) == []
    t.umount()


def test_an_import_cut_short_is_done_again_from_scratch(s3, base, tmp_path):
    """A process killed mid-import leaves its volume marked incomplete: a plain
    mount refuses it, the next `--from` empties it and imports again."""
    run = plant(base)
    t = MountedRun(tmp_path / "t", ("--remote", base.url, "--from", f"{run}@s1", *FAST))
    t.mount()
    t.umount()
    st = Store(t.state_dir, "default", incomplete_ok=True)
    try:  # what a kill between two batches leaves: some records, the marker
        with st.txn(write=True) as txn:
            txn.put(st._vp + b"incomplete", _U64.pack(1), db=st.db["meta"])
        st.unlink(ROOT, b"small.txt")
    finally:
        st.close()
    proc = vfsd_cli("mount", t.run_dir, check=False)
    assert proc.returncode == 1 and "did not finish" in proc.stderr, proc.stderr
    t.mount()
    try:
        assert (t.root / "small.txt").read_text() == "small\n"
        assert sorted(p.name for p in t.root.iterdir()) == ["big.bin", "dir", "small.txt"]
    finally:
        t.umount()


# ------------------------------------------------------------------ endpoint URL


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("source", ["AWS_ENDPOINT_URL", "profile"])
@pytest.mark.parametrize("answers", [True, False])
def test_an_endpoint_url_with_a_password_is_refused_and_never_shown(s3, base, tmp_path,
                                                                     monkeypatch, source,
                                                                     answers):
    """item 5: `http://user:PASS@host` in AWS_ENDPOINT_URL reached `vfsd mount`'s
    output, `vfsd status` and vfsd.log; the TOML option refused it, the
    environment (or an AWS profile) was never checked."""
    secret = "s3cr3t-" + secrets.token_hex(4)
    host = s3.endpoint_url.split("//", 1)[1] if answers else f"127.0.0.1:{_dead_port()}"
    leaky = f"http://vfsd:{secret}@{host}"
    if source == "AWS_ENDPOINT_URL":
        monkeypatch.setenv("AWS_ENDPOINT_URL", leaky)
    else:
        monkeypatch.delenv("AWS_ENDPOINT_URL")
        config = tmp_path / "aws-config"
        config.write_text(f"[profile leaky]\nendpoint_url = {leaky}\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        monkeypatch.setenv("AWS_PROFILE", "leaky")
    target = MountedRun(tmp_path / "t", ("--remote", base.url, *FAST))
    proc = vfsd_cli("mount", target.run_dir, *target.extra_args, check=False)
    if is_mounted(target.root):
        status_text = vfsd_cli("status", target.run_dir, "--json", check=False).stdout
        target.cleanup()
    else:
        status_text = ""
    shown = proc.stdout + proc.stderr + status_text + target.log_text()
    gc = vfsd_cli("gc", "--remote", base.url, "--dry-run", check=False)
    shown += gc.stdout + gc.stderr
    assert secret not in shown
    assert proc.returncode == 1 and "credentials" in proc.stderr, proc.stderr
    assert gc.returncode != 0 and "credentials" in gc.stderr, gc.stderr


# ------------------------------------------------------------------ zlib bombs

PEAK_RSS = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(proc.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
sys.exit(proc.returncode)
"""


def peak_rss_mib(*cmd: str) -> tuple[subprocess.CompletedProcess, int]:
    """Run a command; (its process, the peak resident memory of it and its children)."""
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, *cmd], capture_output=True,
                          text=True, timeout=300)
    return proc, int(proc.stdout.split()[-1])


def zlib_bomb(run: str, raw: int = 1 << 30) -> bytes:
    """A manifest of 1 MB whose body decompresses to `raw` bytes of zeros."""
    c = zlib.compressobj(9)
    piece = bytes(16 << 20)
    body = b"".join(c.compress(piece) for _ in range(raw // len(piece))) + c.flush()
    head = manifest._HEAD.pack(manifest.MAGIC, manifest.FORMAT_VERSION, manifest.KIND_FULL, 0,
                               1, 0, 1, 1, 1, 1 << 20, 1, 0, len(body), raw)
    out = head + bytes((len(run),)) + run.encode() + struct.pack(">H", 0) + body
    return out + xxhash.xxh3_128_digest(out)


def test_a_zlib_bomb_is_refused_without_taking_the_memory(s3, base, tmp_path):
    """A 1 MB manifest that decompresses to 1 GiB: the worker decompressed it
    whole (1 GiB, then a copy of what it parsed) before finding it garbage;
    a GC sweep did the same for every such manifest, eight at a time. The
    body is now decompressed a piece at a time as it is parsed."""
    run = plant(base)
    base.bucket.put(f"runs/{run}/snapshots/1", zlib_bomb(run))
    proc, rss = peak_rss_mib(*VFSD, "mount", "-f", "--log-stderr", str(tmp_path / "t"),
                             "--remote", base.url, "--from", f"{run}@s1", *FAST)
    assert proc.returncode == 1 and "not sorted" in proc.stderr, proc.stderr[-2000:]
    assert rss < 400, f"the refused resume took {rss} MiB"
    proc, rss = peak_rss_mib(*VFSD, "gc", "--remote", base.url, "--dry-run")
    assert proc.returncode != 0 and "nothing was deleted" in proc.stderr, proc.stderr[-2000:]
    assert rss < 400, f"the refused sweep took {rss} MiB"
