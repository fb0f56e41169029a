"""Warm-up after a resume: fetch a run's chunks before programs read them.

A resumed run (`vfsd mount --from`) starts with its content in the bucket
and fetches each chunk on its first read. `vfsd warmup` asks the daemon for
a plan (`plan`: which chunks of the files asked for are local, which are
only in the bucket, and which of those fit), then has it fetch the chosen
ones in batches (`fetch`), through the same fetcher as reads (verified,
installed only while a record wants them, counted by the chunk cache).

Bounded by the cache: the chunks fetched, together with those of the same
files already local, stay under the chunk cache's low-water mark
(`remote_cache_bytes` x LOW_WATER; without a bound, the disk's free space
less a reserve), so a warm-up never makes the cache evict what it has just
fetched. Files are taken in the order asked (a directory's in listing
order), so the first ones asked for are the ones that get in.
"""

from __future__ import annotations

import os

import trio

from vfsd import errors
from vfsd.store.content import LOC_FILE, unpack_record
from vfsd.store.inode import Inode
from vfsd.store.placement import placement

from .chunkcache import LOW_WATER
from .fetcher import FetchError

#: files looked at between two yields to other requests while planning
FILES_PER_TURN = 200
#: room left free on the disk when the cache has no bound
DISK_RESERVE = 256 << 20
#: chunks one `fetch` call takes
MAX_BATCH = 256


async def _files(store, roots: list[Inode]):
    """Regular files under `roots` (each once), depth first, yielding to the loop."""
    seen: set[int] = set()
    stack = list(reversed(roots))
    turn = 0
    while stack:
        inode = stack.pop()
        if inode.ino in seen:
            continue
        seen.add(inode.ino)
        if inode.is_reg:
            yield inode
        elif inode.is_dir:
            children = []
            after = 0
            while batch := store.readdir(inode.ino, after):
                for cookie, _name, child in batch:
                    after = cookie
                    children.append(child)
            stack.extend(reversed(children))
        turn += 1
        if turn % FILES_PER_TURN == 0:
            await trio.sleep(0)


def budget(store, cache) -> tuple[int, int | None]:
    """(bytes a warm-up may hold locally, the cache's bound or None)."""
    limit = getattr(cache, "limit", None)
    if limit:
        return int(limit * LOW_WATER), limit
    st = os.statvfs(store.dir)
    return max(st.f_bavail * st.f_frsize - DISK_RESERVE, 0), None


async def plan(store, cache, roots: list[Inode]) -> dict:
    """What a warm-up of `roots` would fetch (see the module docstring)."""
    allowed, limit = budget(store, cache)
    files = 0
    local: dict[bytes, int] = {}
    missing: dict[bytes, int] = {}
    async for inode in _files(store, roots):
        files += 1
        where = placement(store, inode.ino)
        local.update(where["present"])
        for digest, size in where["missing"]:
            missing.setdefault(digest, size)
    room = allowed - sum(local.values())
    chosen = []
    for digest, size in missing.items():
        if size > room:
            continue  # a smaller one further on may still fit
        chosen.append([digest.hex(), size])
        room -= size
    chosen_bytes = sum(size for _, size in chosen)
    missing_bytes = sum(missing.values())
    return {
        "files": files, "chunks": len(local) + len(missing),
        "local_chunks": len(local), "local_bytes": sum(local.values()),
        "missing_chunks": len(missing), "missing_bytes": missing_bytes,
        "cache_limit": limit, "budget_bytes": allowed,
        "fetch": chosen, "fetch_bytes": chosen_bytes,
        "skipped_chunks": len(missing) - len(chosen),
        "skipped_bytes": missing_bytes - chosen_bytes,
    }


async def fetch(remote, store, digests: list[bytes]) -> dict:
    """Fetch chunks the store references (the fetcher's workers bound the
    concurrency); what came, what was there already, what failed."""
    out = {"fetched": 0, "bytes": 0, "already": 0, "failed": []}
    limiter = trio.CapacityLimiter(max(remote.fetcher.workers, 1))

    async def one(digest: bytes) -> None:
        if not wanted(store, digest):
            out["failed"].append({"digest": digest.hex(), "error": "not a chunk of this run"})
            return
        if store.chunks.exists(digest):
            out["already"] += 1
            return
        async with limiter:
            try:
                data = await remote.fetcher.fetch(digest)
            except FetchError as exc:
                out["failed"].append({"digest": digest.hex(), "error": str(exc)})
                return
        remote.cache.touch(digest)
        out["fetched"] += 1
        out["bytes"] += len(data)

    async with trio.open_nursery() as nursery:
        for digest in digests:
            nursery.start_soon(one, digest)
    return out


def wanted(store, digest: bytes) -> bool:
    """Whether the store references `digest` as a chunk file (nothing else is fetched)."""
    with store.txn() as txn:
        raw = txn.get(digest, db=store.db["content"])
    if raw is None:
        return False
    count, _size, loc = unpack_record(raw)
    return count > 0 and loc == LOC_FILE


def parse_digests(values: object) -> list[bytes]:
    """Digests from a request: a list of at most MAX_BATCH 32-digit hex strings."""
    if not isinstance(values, list) or len(values) > MAX_BATCH:
        raise errors.InvalidArgument(f"'digests' is a list of at most {MAX_BATCH} chunk digests")
    out = []
    for value in values:
        if not isinstance(value, str) or len(value) != 32:
            raise errors.InvalidArgument("a chunk digest is 32 hex digits")
        try:
            out.append(bytes.fromhex(value))
        except ValueError:
            raise errors.InvalidArgument("a chunk digest is 32 hex digits") from None
    return out
