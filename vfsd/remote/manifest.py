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
#: and its body may not decompress to more than this (a resume allows less when
#: memory is short: `vfsd.remote.resume.manifest_memory`)
MAX_RAW_BYTES = 4 << 30
MAX_LABEL_BYTES = 1024
#: what a local snapshot's label may hold (`Snapshots.create`)
MAX_LABEL_CHARS = 200

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
    #: decoded without its entries (`decode(keep_entries=False)`): the chunks they name
    chunks: set[bytes] | None = field(default=None, compare=False)
    #: the body's decompressed size, as decoded
    raw_len: int = field(default=0, compare=False)

    @property
    def full(self) -> bool:
        return self.parent == 0

    def chunk_digests(self) -> set[bytes]:
        """Digests of the chunk files (not blobs) this manifest's entries name."""
        if self.chunks is not None:
            return set(self.chunks)
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


def decode(data: bytes, *, run: str | None = None, seq: int | None = None,
           max_raw: int = MAX_RAW_BYTES, keep_entries: bool = True) -> Manifest:
    """The manifest in `data`, fully checked; ManifestError if anything is off.

    `run` and `seq`, when given, must be what the manifest says it is (the
    key it was read from). A body recorded as larger than `max_raw` bytes is
    refused before any of it is decompressed; the body is decompressed a
    piece at a time while it is parsed, so a body that decompresses to
    gigabytes of garbage costs a piece, not gigabytes. Without
    `keep_entries` the entries are checked but not kept (the manifest's
    `chunks` is filled instead): what a GC sweep needs, in memory that
    follows the chunks named, not the entries.
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
    if len(label) > MAX_LABEL_CHARS:
        raise ManifestError(f"{where}: a label of {len(label)} characters (a snapshot's is at "
                            f"most {MAX_LABEL_CHARS})")
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
    if raw_len > min(max_raw, MAX_RAW_BYTES):
        raise ManifestError(f"{where}: its body of {raw_len} bytes is larger than allowed "
                            f"here ({min(max_raw, MAX_RAW_BYTES)} bytes)")
    body = _Body(memoryview(data)[pos:pos + body_len], raw_len, where)
    m = Manifest(m_run_s, m_seq, parent, step, created_ns, generation, chunk_size, [],
                 pinned=bool(flags & FLAG_PINNED), label=label, raw_len=raw_len)
    _parse_body(body, m, n_entries, n_blobs, kind == KIND_FULL, where, keep_entries)
    body.finish()
    return m


class _Body:
    """A manifest's compressed body, decompressed in pieces as it is read.

    At most `PIECE` bytes are decompressed ahead of the reader, and never
    more in all than the header recorded: a body that lies about its size,
    or is a zlib bomb, fails when the lie shows, holding one piece.
    """

    PIECE = 1 << 20

    def __init__(self, compressed: memoryview, raw_len: int, where: str) -> None:
        self.src = compressed
        self.src_pos = 0
        self.dec = zlib.decompressobj()
        self.buf = b""
        self.pos = 0
        self.left = raw_len  # bytes still to come out of the decompressor
        self.where = where

    def take(self, n: int) -> bytes:
        """The next `n` bytes of the body (ManifestError past its end)."""
        buf, pos = self.window(self.pos, n)
        self.pos = pos + n
        return buf[pos:pos + n]

    def window(self, pos: int, n: int) -> tuple[bytes, int]:
        """(buffer, position) with `n` bytes available from `pos` on, where
        `pos` is a position in the current buffer (ManifestError past the end)."""
        if len(self.buf) - pos >= n:
            return self.buf, pos
        self.buf = self.buf[pos:]
        while len(self.buf) < n:
            if not self._more(n - len(self.buf)):
                raise ManifestError(f"{self.where}: body is truncated")
        return self.buf, 0

    def _more(self, wanted: int) -> bool:
        """Decompress some more (up to a piece past `wanted`); False at the end."""
        try:
            while True:
                limit = min(max(wanted, self.PIECE), self.left + 1)
                if self.dec.unconsumed_tail:
                    got = self.dec.decompress(self.dec.unconsumed_tail, limit)
                elif self.src_pos < len(self.src) and not self.dec.eof:
                    step = self.src[self.src_pos:self.src_pos + self.PIECE]
                    self.src_pos += len(step)
                    got = self.dec.decompress(step, limit)
                else:
                    return False
                if len(got) > self.left:
                    raise ManifestError(f"{self.where}: body decompresses to a different "
                                        "size than recorded (more)")
                self.left -= len(got)
                if got:
                    self.buf = self.buf + got
                    return True
        except zlib.error as exc:
            raise ManifestError(f"{self.where}: body does not decompress ({exc})") from None

    def finish(self) -> None:
        """ManifestError unless the body ended exactly where the parse did."""
        if len(self.buf) - self.pos or self._more(1):
            raise ManifestError(f"{self.where}: stray bytes after the blobs")
        if self.left or not self.dec.eof or self.dec.unused_data \
                or self.src_pos < len(self.src):
            raise ManifestError(f"{self.where}: body decompresses to a different size than "
                                "recorded")


def _parse_body(body: _Body, m: Manifest, n_entries: int, n_blobs: int, full: bool,
                where: str, keep: bool) -> None:
    last = b""
    chunks: set[bytes] = set()
    buf, pos = body.buf, body.pos
    u16, u32 = _U16.unpack_from, _U32.unpack_from
    for _ in range(n_entries):
        if len(buf) - pos < 6:
            buf, pos = body.window(pos, 6)
        klen = u16(buf, pos)[0]
        if len(buf) - pos < 6 + klen:
            buf, pos = body.window(pos, 6 + klen)
        vlen = u32(buf, pos + 2 + klen)[0]
        need = 6 + klen + vlen
        if len(buf) - pos < need:
            buf, pos = body.window(pos, need)
        okey = buf[pos + 2:pos + 2 + klen]
        value = buf[pos + 6 + klen:pos + need]
        pos += need
        if okey <= last:
            raise ManifestError(f"{where}: entries are not sorted or not unique")
        last = okey
        check_entry(okey, value, where, allow_gone=not full)
        if keep:
            m.entries.append((okey, value))
        else:
            chunks |= entry_digests([(okey, value)], LOC_FILE)
    body.pos = pos
    prev = b""
    for _ in range(n_blobs):
        digest = body.take(_DIGEST_LEN)
        blen = _U32.unpack(body.take(4))[0]
        if digest <= prev:
            raise ManifestError(f"{where}: blobs are not sorted or not unique")
        if blen > m.chunk_size:
            raise ManifestError(f"{where}: blob {digest.hex()} is larger than a chunk")
        blob = body.take(blen)
        prev = digest
        if xxhash.xxh3_128_digest(blob) != digest:
            raise ManifestError(f"{where}: blob {digest.hex()} does not match its name")
        if keep:
            m.blobs[digest] = blob
    if not keep:
        m.chunks = chunks


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
