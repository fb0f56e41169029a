"""Chunks between a store and the bucket: reads through the fetcher, the store's
hooks for the uploader and the cache. Shared by a run dir's tier (`remotetier`)
and a shard's (`shardtier`), which make the bucket's client, the uploader,
the fetcher and the cache through it; the owner provides `store` and
`readahead`."""

from __future__ import annotations

import time
from pathlib import Path

import structlog

from vfsd import errors
from vfsd.store import remotestate
from vfsd.store.content import LOC_FILE, ref_digest, ref_loc, unpack_record

from .chunkcache import ChunkCache
from .fetcher import Fetcher, FetchError
from .objstore import ObjectStore, RemoteError, RemoteSettings
from .uploader import ChunkGone, PendingChunk, Uploader

log = structlog.get_logger("vfsd.remote")


class ChunkLink:
    """Mixin: the FUSE read hooks and the store hooks of a remote tier."""

    def _open_bucket(self, url, config, error: type[Exception]) -> None:
        """Keep `url` and `config` and make the bucket's client; `error` (the
        owner's start-up error) for a configuration the client refuses."""
        self.url, self.config = url, config
        try:
            self.objstore = ObjectStore(url, RemoteSettings.from_config(config))
        except RemoteError as exc:
            raise error(str(exc)) from None

    def _make_chunk_pieces(self, store) -> None:
        """The uploader, fetcher and cache of `store`'s chunks (blocking: before the mount)."""
        cfg = self.config
        self.uploader = Uploader(
            self.objstore, self._read_for_upload, on_uploaded=self._on_uploaded,
            load_pending=self._load_pending, workers=cfg.remote_workers,
            max_queued=cfg.remote_upload_queue,
            retry_base_delay=max(0.05, cfg.remote_retry_base_delay),
            retry_max_delay=cfg.remote_retry_max_delay)
        self.fetcher = Fetcher(self.objstore, store.chunks, install=self._install,
                               workers=max(2, cfg.remote_workers // 2),
                               timeout=cfg.remote_fetch_timeout)
        self.cache = ChunkCache(store, cfg.remote_cache_bytes)

    async def _start_chunk_pieces(self, nursery) -> None:
        """Run the cache, the uploader and the fetcher in `nursery`."""
        self.nursery = nursery
        await nursery.start(self.cache.run)
        await nursery.start(self.uploader.run)
        await nursery.start(self.fetcher.run)

    async def load_chunk(self, digest: bytes) -> bytes:
        """A chunk's verified bytes (local, or fetched with a bounded wait)."""
        try:
            data = await self.fetcher.fetch(digest)
        except FetchError as exc:
            log.warning("chunk_read_failed", digest=digest.hex(), error=str(exc))
            raise errors.Unavailable(str(exc)) from None
        self.cache.touch(digest)
        return data

    def on_read(self, ino: int, blocks: dict[int, bytes], off: int, size: int) -> None:
        """Readahead for a sequential reader: fetch the next chunks in the background."""
        cs = self.store.chunk_size
        wanted = self.readahead.on_read(ino, (off + size - 1) // cs if size else off // cs)
        digests = []
        for idx in wanted:
            ref = blocks.get(idx)
            if ref is not None and ref_loc(ref) == LOC_FILE:
                digests.append(ref_digest(ref))
        if digests:
            self.fetcher.prefetch(digests)

    def _install(self, tmp: Path, digest: bytes) -> None:
        """Fetcher callback (trio thread): a verified chunk goes into place, inside a
        write transaction, only while a record still wants it."""
        st = self.store
        size = tmp.stat().st_size
        with st.txn(write=True) as txn:
            raw = txn.get(digest, db=st.db["content"])
            if raw is None or unpack_record(raw)[0] == 0 or unpack_record(raw)[2] != LOC_FILE:
                tmp.unlink(missing_ok=True)
                return
            st.chunks.install(tmp, digest)
        self.cache.add(digest, size)

    # ------------------------------------------------------------ store hooks

    def _on_chunk_files(self, made: list[tuple[bytes, int]], gone: list[bytes]) -> None:
        now = time.time()
        for digest, size in made:
            self.uploader.enqueue(PendingChunk(digest, size, now))
            self.cache.add(digest, size)
        for digest in gone:
            self.cache.removed(digest)
            self.uploader.forget(digest)

    def _read_for_upload(self, digest: bytes) -> bytes:
        """Uploader callback (worker thread): the local chunk, or ChunkGone when it was
        superseded before its upload (a block rewritten while the upload waited)."""
        try:
            return self.store.chunks.read_all(digest)
        except errors.CorruptChunk:
            with self.store.txn() as txn:
                still = remotestate.entry(txn, self.store.db, digest)
            if still is None:
                raise ChunkGone(digest.hex()) from None
            raise

    def _on_uploaded(self, digests: list[bytes]) -> None:
        with self.store.txn(write=True) as txn:
            remotestate.mark_uploaded(txn, self.store.db, self.store._bump, digests)

    def _load_pending(self, after: bytes | None, limit: int) -> list[PendingChunk]:
        with self.store.txn() as txn:
            rows = remotestate.load_pending(txn, self.store.db, after, limit)
        return [PendingChunk(d, size, since / 1e9) for d, size, since in rows]

    def published_chunks(self, digests: set[bytes]) -> None:
        """A publication made these chunks evictable."""
        if self.cache.over():
            self.cache._wake.set()
