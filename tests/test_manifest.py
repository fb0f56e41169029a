"""The manifest format (vfsd/remote/manifest.py): round trips, and every way a damaged
object is refused with a clear error before anything uses it."""

from __future__ import annotations

import struct
import zlib

import pytest
import xxhash

from vfsd.remote.layout import BadResumeSpec, parse_resume_spec
from vfsd.remote.manifest import Manifest, ManifestError, decode, encode
from vfsd.snapshots.snapshots import InodeEntry, pack_inode_entry
from vfsd.store.content import LOC_FILE, LOC_LMDB, make_ref
from vfsd.store.inode import Inode
from vfsd.store.keys import dentry_key, inode_key

RUN = "0123456789abcdef0123456789abcdef"


def inode_value(ino: int, mode: int, blocks: dict[int, bytes] | None = None,
                size: int = 0) -> bytes:
    inode = Inode(ino, 1, mode, nlink=1, uid=0, gid=0, size=size)
    return pack_inode_entry(InodeEntry(inode, 1, b"f", blocks or {}, b"", []))


def sample(seq: int = 3, parent: int = 0) -> Manifest:
    blob = b"small file\n"
    blob_digest = xxhash.xxh3_128_digest(blob)
    chunk = xxhash.xxh3_128_digest(b"x" * 100)
    entries = sorted([
        (inode_key(1), inode_value(1, 0o40755)),
        (inode_key(2), inode_value(2, 0o100644, {0: make_ref(blob_digest, LOC_LMDB)},
                                   len(blob))),
        (inode_key(3), inode_value(3, 0o100644, {0: make_ref(chunk, LOC_FILE)}, 100)),
        (dentry_key(1, b"a.txt"), struct.pack(">Q", 2)),
        (dentry_key(1, b"big"), struct.pack(">Q", 3)),
    ])
    if parent:
        entries.append((dentry_key(1, b"zz-gone"), b""))
        entries.sort()
    return Manifest(RUN, seq, parent, 7, 1234, 2, 1 << 20, entries, {blob_digest: blob},
                    pinned=True, label="checkpoint 7")


def reseal(data: bytes) -> bytes:
    """Recompute the trailing checksum, so a test reaches the checks behind it."""
    body = data[:-16]
    return body + xxhash.xxh3_128_digest(body)


def test_round_trip_full_and_delta():
    for m in (sample(), sample(seq=5, parent=3)):
        got = decode(encode(m), run=RUN, seq=m.seq)
        assert got == m
        assert got.chunk_digests() == {xxhash.xxh3_128_digest(b"x" * 100)}


def test_every_flipped_byte_is_caught():
    data = encode(sample())
    for pos in range(0, len(data), 7):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(ManifestError):
            decode(bytes(bad), run=RUN, seq=3)


@pytest.mark.parametrize("cut", [0, 10, 90, -17, -1])
def test_truncated(cut):
    data = encode(sample())
    with pytest.raises(ManifestError):
        decode(data[:cut], run=RUN, seq=3)


def test_wrong_run_or_seq_or_version():
    data = encode(sample())
    with pytest.raises(ManifestError, match="belongs to run"):
        decode(data, run="other", seq=3)
    with pytest.raises(ManifestError, match="says it is snapshot s3"):
        decode(data, run=RUN, seq=4)
    newer = bytearray(data)
    newer[8:10] = struct.pack(">H", 9)
    with pytest.raises(ManifestError, match="format version 9"):
        decode(reseal(bytes(newer)), run=RUN, seq=3)
    with pytest.raises(ManifestError, match="not a vfsd manifest"):
        decode(b"PK\x03\x04" + data[4:], run=RUN, seq=3)


def test_body_that_lies_about_its_size_is_refused():
    data = bytearray(encode(sample()))
    # raw length field (offset 72) one byte short: decompression must notice
    raw_len = struct.unpack_from(">Q", data, 72)[0]
    struct.pack_into(">Q", data, 72, raw_len - 1)
    with pytest.raises(ManifestError, match="different size"):
        decode(reseal(bytes(data)), run=RUN, seq=3)


def test_hostile_body_a_zip_bomb_is_bounded():
    m = sample()
    data = bytearray(encode(m))
    bomb = zlib.compress(b"\0" * (64 << 20))
    head_len = len(data) - 16 - struct.unpack_from(">Q", data, 64)[0]
    out = bytearray(bytes(data[:head_len]) + bomb + bytes(16))  # checksum: see reseal
    struct.pack_into(">Q", out, 64, len(bomb))  # body length right, raw length still small
    with pytest.raises(ManifestError, match="different size"):
        decode(reseal(bytes(out)), run=RUN, seq=3)


def test_blob_not_matching_its_name_is_refused():
    m = sample()
    digest = next(iter(m.blobs))
    m.blobs[digest] = b"other bytes"
    with pytest.raises(ManifestError, match="does not match its name"):
        decode(encode(m), run=RUN, seq=3)


def test_full_manifest_cannot_list_gone_objects_and_entries_must_decode():
    m = sample()
    m.entries = sorted(m.entries + [(dentry_key(1, b"gone"), b"")])
    with pytest.raises(ManifestError, match="full manifest lists a name as gone"):
        decode(encode(m), run=RUN, seq=3)
    m = sample()
    m.entries = sorted(m.entries[:-1] + [(inode_key(9), b"\x01\x00garbage")])
    with pytest.raises(ManifestError):
        decode(encode(m), run=RUN, seq=3)
    m = sample()
    m.entries = sorted(m.entries + [(dentry_key(1, b"../x"), struct.pack(">Q", 2))])
    with pytest.raises(ManifestError, match="bad name"):
        decode(encode(m), run=RUN, seq=3)


def test_parent_must_be_older():
    with pytest.raises(ManifestError, match="not older"):
        decode(encode(sample(seq=3, parent=3)), run=RUN, seq=3)


@pytest.mark.parametrize("text, why", [
    ("", "RUN_ID"), ("@s1", "RUN_ID"), ("a@b@s1", "run id"),
    ("run@", "not a snapshot id"), ("run@1", "not a snapshot id"), ("run@s0", "not a snapshot"),
    ("run@s01", "not a snapshot"), ("../x@s1", "run id"), ("a b@s1", "run id"),
    ("run@s99999999999999999999", "not a snapshot"),
])
def test_bad_resume_specs(text, why):
    with pytest.raises(BadResumeSpec, match=why):
        parse_resume_spec(text)


def test_good_resume_spec():
    assert parse_resume_spec(f"{RUN}@s12") == (RUN, 12)
    assert parse_resume_spec(RUN) == (RUN, None)  # its latest published snapshot


def test_a_body_larger_than_memory_allows_is_refused_before_decompressing():
    data = encode(sample())
    raw_len = struct.unpack_from(">Q", data, 72)[0]
    with pytest.raises(ManifestError, match="larger than allowed here"):
        decode(data, run=RUN, seq=3, max_raw=raw_len - 1)
    assert decode(data, run=RUN, seq=3, max_raw=raw_len).raw_len == raw_len


def test_without_entries_a_manifest_still_names_its_chunks():
    m = sample()
    slim = decode(encode(m), run=RUN, seq=3, keep_entries=False)
    assert slim.entries == [] and slim.blobs == {}
    assert slim.chunk_digests() == m.chunk_digests() and slim.chunk_digests()
