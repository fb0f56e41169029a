"""Manifests: a published snapshot as one immutable, self-checking object.

The byte format is documented with the rest of the bucket layout in
`vfsd.remote` (`runs/<run>/snapshots/<seq>`). This module encodes and decodes
it, and checks everything a damaged (or hostile) object could get wrong
before anyone uses it: the magic and version, the trailing xxh3-128 over every
byte, the lengths, the decompressed size (bounded before it is produced),
entries sorted and unique, object keys and entry values that decode, blobs
that hash to their names. A manifest that fails any check raises
`ManifestError` saying what is wrong; nothing is half-used.

Pure functions of bytes, no I/O: run them in worker threads (a full manifest
of a large tree takes a while to compress and to hash).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import xxhash

from vfsd import errors
from vfsd.snapshots.snapshots import unpack_inode_entry
from vfsd.store.content import LOC_FILE, LOC_LMDB, ref_digest, ref_loc
from vfsd.store.invariants import MAX_STEP

MAGIC = b"VFSDMNF\0"
FORMAT_VERSION = 1
KIND_FULL = 0
KIND_DELTA = 1
FLAG_PINNED = 1
#: a manifest object larger than this is refused before its body is read
MAX_MANIFEST_BYTES = 2 << 30
#: and its body may not decompress to more than this
MAX_RAW_BYTES = 4 << 30
MAX_LABEL_BYTES = 1024

_HEAD = struct.Struct(">8sHBBQQQQQIIIQQ")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_DIGEST_LEN = 16


class ManifestError(Exception):
    """A manifest that does not decode or does not check; the message says why."""


@dataclass
class Manifest:
    """One published snapshot: its header, its entries and the small objects they name."""

    run: str
    seq: int
    parent: int  # the published snapshot a delta applies to; 0 for a full manifest
    step: int
    created_ns: int
    generation: int
    chunk_size: int
    entries: list[tuple[bytes, bytes]]  # (object key, value), sorted by key
    blobs: dict[bytes, bytes] = field(default_factory=dict)  # digest -> bytes
    pinned: bool = False
    label: str = ""

    @property
    def full(self) -> bool:
        return self.parent == 0

    def chunk_digests(self) -> set[bytes]:
        """Digests of the chunk files (not blobs) this manifest's entries name."""
        return entry_digests(self.entries, LOC_FILE)


def entry_digests(entries, loc: int) -> set[bytes]:
    """Digests of the content objects at location `loc` that `entries` name."""
    out: set[bytes] = set()
    for okey, value in entries:
        if value and okey[:1] == b"i":
            ino = _U64.unpack(okey[1:9])[0]
            for ref in unpack_inode_entry(ino, value).blocks.values():
                if ref_loc(ref) == loc:
                    out.add(ref_digest(ref))
    return out


# ------------------------------------------------------------------ encoding


def encode(m: Manifest, level: int = 6) -> bytes:
    """The manifest's bytes (see `vfsd.remote` for the format)."""
    run = m.run.encode("ascii")
    label = m.label.encode("utf-8")
    if len(run) > 255 or len(label) > MAX_LABEL_BYTES:
        raise ValueError("run id or label too long for a manifest")
    parts: list[bytes] = []
    last = None
    for okey, value in m.entries:
        if last is not None and okey <= last:
            raise ValueError("manifest entries must be sorted and unique")
        last = okey
        parts += [_U16.pack(len(okey)), okey, _U32.pack(len(value)), value]
    for digest in sorted(m.blobs):
        data = m.blobs[digest]
        parts += [digest, _U32.pack(len(data)), data]
    raw = b"".join(parts)
    body = zlib.compress(raw, level)
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, KIND_FULL if m.full else KIND_DELTA,
                      FLAG_PINNED if m.pinned else 0, m.seq, m.parent, m.step, m.created_ns,
                      m.generation, m.chunk_size, len(m.entries), len(m.blobs), len(body),
                      len(raw))
    out = b"".join([head, bytes((len(run),)), run, _U16.pack(len(label)), label, body])
    return out + xxhash.xxh3_128_digest(out)


# ------------------------------------------------------------------ decoding


def decode(data: bytes, *, run: str | None = None, seq: int | None = None) -> Manifest:
    """The manifest in `data`, fully checked; ManifestError if anything is off.

    `run` and `seq`, when given, must be what the manifest says it is (the
    key it was read from).
    """
    where = f"manifest {run or '?'}/s{seq or '?'}"
    if len(data) < _HEAD.size + 1 + 2 + 16:
        raise ManifestError(f"{where} is truncated ({len(data)} bytes)")
    if data[:8] != MAGIC:
        raise ManifestError(f"{where} is not a vfsd manifest (bad magic)")
    if xxhash.xxh3_128_digest(data[:-16]) != data[-16:]:
        raise ManifestError(f"{where} is damaged: its checksum does not match its bytes")
    (_magic, version, kind, flags, m_seq, parent, step, created_ns, generation, chunk_size,
     n_entries, n_blobs, body_len, raw_len) = _HEAD.unpack_from(data)
    if version != FORMAT_VERSION:
        raise ManifestError(f"{where} has format version {version}; this vfsd reads "
                            f"version {FORMAT_VERSION}")
    pos = _HEAD.size
    rlen = data[pos]
    m_run = data[pos + 1:pos + 1 + rlen]
    pos += 1 + rlen
    try:
        m_run_s = m_run.decode("ascii")
        llen = _U16.unpack_from(data, pos)[0]
        label = data[pos + 2:pos + 2 + llen].decode("utf-8")
    except (UnicodeDecodeError, struct.error):
        raise ManifestError(f"{where}: header does not decode") from None
    pos += 2 + llen
    if pos + body_len != len(data) - 16:
        raise ManifestError(f"{where}: body length {body_len} does not match the object size")
    if run is not None and m_run_s != run:
        raise ManifestError(f"{where} belongs to run {m_run_s!r}")
    if seq is not None and m_seq != seq:
        raise ManifestError(f"{where} says it is snapshot s{m_seq}")
    if kind not in (KIND_FULL, KIND_DELTA) or (kind == KIND_FULL) != (parent == 0):
        raise ManifestError(f"{where}: kind {kind} with parent {parent}")
    if not 0 < m_seq < 1 << 63 or parent >= m_seq:
        raise ManifestError(f"{where}: parent s{parent} is not older than s{m_seq}")
    if step > MAX_STEP or created_ns >= 1 << 63 or generation >= 1 << 63:
        raise ManifestError(f"{where}: step, time or generation out of range")
    if not 4096 <= chunk_size <= 64 << 20:
        raise ManifestError(f"{where}: chunk size {chunk_size} is out of range")
    if raw_len > MAX_RAW_BYTES:
        raise ManifestError(f"{where}: body of {raw_len} bytes is larger than allowed")
    dec = zlib.decompressobj()
    try:
        raw = dec.decompress(data[pos:pos + body_len], raw_len + 1)
    except zlib.error as exc:
        raise ManifestError(f"{where}: body does not decompress ({exc})") from None
    if len(raw) != raw_len or not dec.eof or dec.unused_data:
        raise ManifestError(f"{where}: body decompresses to a different size than recorded")
    entries, blobs = _parse_body(raw, n_entries, n_blobs, kind == KIND_FULL, chunk_size, where)
    return Manifest(m_run_s, m_seq, parent, step, created_ns, generation, chunk_size, entries,
                    blobs, pinned=bool(flags & FLAG_PINNED), label=label)


def _parse_body(raw: bytes, n_entries: int, n_blobs: int, full: bool, chunk_size: int,
                where: str) -> tuple[list[tuple[bytes, bytes]], dict[bytes, bytes]]:
    view = memoryview(raw)
    pos = 0
    entries: list[tuple[bytes, bytes]] = []
    last = b""
    try:
        for _ in range(n_entries):
            klen = _U16.unpack_from(view, pos)[0]
            okey = bytes(view[pos + 2:pos + 2 + klen])
            pos += 2 + klen
            vlen = _U32.unpack_from(view, pos)[0]
            value = bytes(view[pos + 4:pos + 4 + vlen])
            pos += 4 + vlen
            if len(okey) != klen or len(value) != vlen:
                raise ManifestError(f"{where}: an entry runs past the end of the body")
            if okey <= last:
                raise ManifestError(f"{where}: entries are not sorted or not unique")
            last = okey
            check_entry(okey, value, where, allow_gone=not full)
            entries.append((okey, value))
        blobs: dict[bytes, bytes] = {}
        prev = b""
        for _ in range(n_blobs):
            digest = bytes(view[pos:pos + _DIGEST_LEN])
            blen = _U32.unpack_from(view, pos + _DIGEST_LEN)[0]
            start = pos + _DIGEST_LEN + 4
            blob = bytes(view[start:start + blen])
            pos = start + blen
            if len(blob) != blen or len(digest) != _DIGEST_LEN:
                raise ManifestError(f"{where}: a blob runs past the end of the body")
            if digest <= prev:
                raise ManifestError(f"{where}: blobs are not sorted or not unique")
            prev = digest
            if blen > chunk_size or xxhash.xxh3_128_digest(blob) != digest:
                raise ManifestError(f"{where}: blob {digest.hex()} does not match its name")
            blobs[digest] = blob
    except struct.error:
        raise ManifestError(f"{where}: body is truncated") from None
    if pos != len(raw):
        raise ManifestError(f"{where}: {len(raw) - pos} stray bytes after the blobs")
    return entries, blobs


def check_entry(okey: bytes, value: bytes, where: str, *, allow_gone: bool) -> None:
    """ManifestError unless (okey, value) is a well-formed snapshot entry."""
    kind = okey[:1]
    if kind == b"i":
        if len(okey) != 9:
            raise ManifestError(f"{where}: bad inode key {okey.hex()}")
        ino = _U64.unpack(okey[1:9])[0]
        if not 1 <= ino < 1 << 40:
            raise ManifestError(f"{where}: inode number {ino} is out of range")
        if not value:
            if not allow_gone:
                raise ManifestError(f"{where}: a full manifest lists inode {ino} as gone")
            return
        try:
            e = unpack_inode_entry(ino, value)
        except errors.Corrupt as exc:
            raise ManifestError(f"{where}: {exc}") from None
        for idx, ref in e.blocks.items():
            if ref_loc(ref) not in (LOC_FILE, LOC_LMDB) or idx >= 1 << 40:
                raise ManifestError(f"{where}: inode {ino} has a bad block reference")
        return
    if kind == b"d":
        if len(okey) < 11 or okey[9] != len(okey) - 10:
            raise ManifestError(f"{where}: bad name key {okey.hex()}")
        name = okey[10:]
        if b"/" in name or b"\0" in name or name in (b".", b".."):
            raise ManifestError(f"{where}: bad name {name!r}")
        if not value:
            if not allow_gone:
                raise ManifestError(f"{where}: a full manifest lists a name as gone")
            return
        if len(value) != 8 or not 1 <= _U64.unpack(value)[0] < 1 << 40:
            raise ManifestError(f"{where}: name {name!r} points at a bad inode number")
        return
    raise ManifestError(f"{where}: unknown object key {okey[:12].hex()}")
