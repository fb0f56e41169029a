"""Helpers for the remote-tier tests: client settings, a durable upload backlog, chunks.

`FileBacklog` stands in for the daemon's LMDB pending-upload set: one file per
pending digest, so it survives a SIGKILL of the process using it, with the
paged scan in digest order that `Uploader.load_pending` expects.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vfsd.remote.objstore import RemoteSettings
from vfsd.remote.uploader import PendingChunk
from vfsd.store.chunks import ChunkStore, chunk_hash


def settings_for(server, **overrides) -> RemoteSettings:
    """Settings that reach an S3Server, with short timeouts and retries for tests."""
    values = dict(endpoint_url=server.endpoint_url, region="us-east-1",
                  access_key_id=server.access_key, secret_access_key=server.secret_key,
                  connect_timeout=2.0, read_timeout=5.0, max_attempts=3,
                  retry_base_delay=0.05, retry_max_delay=0.2)
    values.update(overrides)
    return RemoteSettings(**values)


class FileBacklog:
    """A durable set of PendingChunk, one small file each."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def add(self, digest: bytes, size: int, at: float | None = None) -> PendingChunk:
        item = PendingChunk(digest, size, time.time() if at is None else at)
        tmp = self.root / f".{digest.hex()}.tmp"
        tmp.write_text(json.dumps({"size": size, "at": item.enqueued_at}))
        os.rename(tmp, self.root / digest.hex())
        return item

    def remove(self, digests: list[bytes]) -> None:
        """`on_uploaded`: these are in the bucket."""
        for digest in digests:
            (self.root / digest.hex()).unlink(missing_ok=True)

    def load(self, after: bytes | None, limit: int) -> list[PendingChunk]:
        """`load_pending`: up to `limit` items with digests above `after`, in order."""
        names = sorted(n for n in os.listdir(self.root) if not n.startswith("."))
        if after is not None:
            names = [n for n in names if n > after.hex()]
        items = []
        for name in names[:limit]:
            try:
                meta = json.loads((self.root / name).read_text())
            except FileNotFoundError:
                continue
            items.append(PendingChunk(bytes.fromhex(name), meta["size"], meta["at"]))
        return items

    def digests(self) -> set[bytes]:
        return {bytes.fromhex(n) for n in os.listdir(self.root) if not n.startswith(".")}


def make_chunks(chunks: ChunkStore, count: int, size: int = 256 * 1024,
                seed: int = 0) -> dict[bytes, bytes]:
    """`count` distinct random chunks written to the local store: digest -> bytes."""
    import random

    rng = random.Random(seed)
    made = {}
    for i in range(count):
        data = rng.randbytes(size - (i % 7) * 1000)
        digest = chunk_hash(data)
        chunks.put(digest, data)
        made[digest] = data
    return made
