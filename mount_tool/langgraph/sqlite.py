"""LangGraph's AsyncSqliteSaver with `prune` and `delete_for_runs`.

    async with PrunableSqliteSaver.from_conn_string("ROOT/checkpoints.sqlite") as saver:
        await saver.setup()
        checkpointer = VfsdCheckpointer(saver, runs)

`langgraph-checkpoint-sqlite` (3.1) keeps checkpoints in one SQLite file: an
embedded saver that outlives the process, with no server to run. It lacks
the two optional capabilities LangGraph's server asks a custom checkpointer
for: `aprune` (thread history pruning; without it the server warns that
storage grows without bound) and `adelete_for_runs` (the rollback of a
cancelled run). This subclass adds both, with the semantics of
AsyncPostgresSaver's `prune` (`"delete"`, `"keep_latest"`) and of the
conformance suite's `delete_for_runs`; VfsdCheckpointer, which exposes an
optional method only when its saver has it, then has them too (and releases
the snapshots of the checkpoints they drop).

Each call runs in one SQLite transaction (`BEGIN IMMEDIATE`) under the
saver's lock, so no `put` of this process interleaves with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langgraph.checkpoint.serde.types import TASKS
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

__all__ = ["PRUNE_STRATEGIES", "PrunableSqliteSaver"]

#: what `prune` takes: delete every checkpoint of the threads, or keep the latest of each namespace
PRUNE_STRATEGIES = ("keep_latest", "delete")
#: ids bound in one statement (SQLite's variable limit is 32,766 on current builds, 999 on old ones)
_BATCH = 500
#: metadata keys a DeltaChannel leaves: its values are rebuilt from older checkpoints
_DELTA_KEYS = ("counters_since_delta_snapshot", "delta_writes_versioned")


class PrunableSqliteSaver(AsyncSqliteSaver):
    """AsyncSqliteSaver with `aprune`/`prune` and `adelete_for_runs`/`delete_for_runs`."""

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune the checkpoints of `thread_ids`.

        `"delete"` removes every checkpoint and write of the threads.
        `"keep_latest"` keeps, in each namespace, the latest checkpoint (the
        one `get_tuple` loads), with its pending writes, plus its parent when
        the latest predates checkpoint format 4 and reads pending sends from
        it; the rest goes, with its writes, and a kept checkpoint whose parent
        went is left with no parent. A subgraph call's namespace (a task id
        after a ":") goes whole with the root checkpoint its call started
        from. Threads that use a DeltaChannel are refused
        (NotImplementedError, nothing pruned): their latest values are
        rebuilt from older checkpoints.
        """
        ids = _distinct(thread_ids, "thread_ids", "thread IDs")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        if not ids:
            return
        async with self._transaction():
            if strategy == "delete":
                for part in _batches(ids):
                    marks = _marks(part)
                    await self.conn.execute(
                        f"DELETE FROM checkpoints WHERE thread_id IN ({marks})", part)
                    await self.conn.execute(
                        f"DELETE FROM writes WHERE thread_id IN ({marks})", part)
            else:
                await self._refuse_delta_threads(ids)
                for thread_id in ids:
                    await self._keep_latest(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint whose metadata names one of `run_ids` (in
        every thread and namespace), with its writes; a checkpoint left whose
        parent went is left with no parent."""
        ids = _distinct(run_ids, "run_ids", "run IDs")
        if not ids:
            return
        async with self._transaction():
            gone: list[tuple[str, str, str]] = []
            for part in _batches(ids):
                async with self.conn.execute(
                    "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints "
                    "WHERE json_extract(CAST(metadata AS TEXT), '$.run_id') "
                    f"IN ({_marks(part)})", part) as cur:
                    gone += [tuple(row) for row in await cur.fetchall()]
            await self._delete_checkpoints(gone)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`aprune` from another thread than the saver's event loop."""
        self._refuse_on_loop("aprune")
        asyncio.run_coroutine_threadsafe(
            self.aprune(thread_ids, strategy=strategy), self.loop).result()

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`adelete_for_runs` from another thread than the saver's event loop."""
        self._refuse_on_loop("adelete_for_runs")
        asyncio.run_coroutine_threadsafe(self.adelete_for_runs(run_ids), self.loop).result()

    # -- the pieces --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        """The saver's lock and one IMMEDIATE transaction, rolled back on any error."""
        await self.setup()
        async with self.lock:
            await self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                await self.conn.rollback()
                raise
            await self.conn.commit()

    def _refuse_on_loop(self, method: str) -> None:
        # As AsyncSqliteSaver's own sync methods: from the loop, waiting would deadlock.
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return
        if on_loop:
            raise asyncio.InvalidStateError(
                "Synchronous calls to AsyncSqliteSaver are only allowed from a different "
                f"thread. From the main thread, use the async interface: `await "
                f"checkpointer.{method}(...)`.")

    async def _refuse_delta_threads(self, thread_ids: list[str]) -> None:
        found: set[str] = set()
        test = " OR ".join(f"json_extract(CAST(metadata AS TEXT), '$.{key}') IS NOT NULL"
                           for key in _DELTA_KEYS)
        for part in _batches(thread_ids):
            async with self.conn.execute(
                    f"SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id IN "
                    f"({_marks(part)}) AND ({test})", part) as cur:
                found.update(row[0] for row in await cur.fetchall())
        if found:
            raise NotImplementedError(
                f"keep_latest can't prune threads that use a DeltaChannel: {', '.join(sorted(found))}")

    async def _keep_latest(self, thread_id: str) -> None:
        heads = await self._heads(thread_id)
        kept: dict[str, set[str]] = {}
        for ns, head in heads.items():
            kept[ns] = {head["checkpoint_id"]}
            if head["sends_parent"]:
                kept[ns].add(head["sends_parent"])
        root_ids = await self._ids(thread_id, "")
        # A subgraph call's namespace goes with the root checkpoint its call
        # started from, once that one is saved and is not kept.
        calls = [ns for ns, head in heads.items()
                 if ":" in ns and head["root"] in root_ids and head["root"] not in kept.get("", ())]
        gone: list[tuple[str, str, str]] = []
        for ns in heads:
            ids = await self._ids(thread_id, ns) if ns else root_ids
            keep = set() if ns in calls else kept[ns]
            gone += [(thread_id, ns, cid) for cid in ids if cid not in keep]
        await self._delete_checkpoints(gone)
        for ns in calls:  # writes saved ahead of a checkpoint of the call go too
            await self.conn.execute("DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ?",
                                    (thread_id, ns))

    async def _heads(self, thread_id: str) -> dict[str, dict[str, Any]]:
        """Each namespace's latest checkpoint: its id, the parent it reads
        pending sends from (format < 4), the root checkpoint its call started from."""
        heads: dict[str, dict[str, Any]] = {}
        async with self.conn.execute(
                "SELECT c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type, "
                "c.checkpoint, c.metadata FROM checkpoints c WHERE c.thread_id = ? AND "
                "c.checkpoint_id = (SELECT MAX(checkpoint_id) FROM checkpoints m WHERE "
                "m.thread_id = c.thread_id AND m.checkpoint_ns = c.checkpoint_ns)",
                (thread_id,)) as cur:
            rows = await cur.fetchall()
        for ns, cid, parent, type_, blob, metadata in rows:
            checkpoint = self.serde.loads_typed((type_, blob))
            sends_parent = None
            if parent and checkpoint.get("v", 0) < 4 and await self._has_sends(thread_id, ns,
                                                                               parent):
                sends_parent = parent
            meta = json.loads(metadata) if metadata is not None else {}
            heads[ns] = {"checkpoint_id": cid, "sends_parent": sends_parent,
                         "root": ((meta.get("parents") or {}).get("") if isinstance(meta, dict)
                                  else None)}
        return heads

    async def _has_sends(self, thread_id: str, ns: str, checkpoint_id: str) -> bool:
        async with self.conn.execute(
                "SELECT 1 FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND "
                "checkpoint_id = ? AND channel = ? LIMIT 1",
                (thread_id, ns, checkpoint_id, TASKS)) as cur:
            return await cur.fetchone() is not None

    async def _ids(self, thread_id: str, ns: str) -> set[str]:
        async with self.conn.execute(
                "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ?",
                (thread_id, ns)) as cur:
            return {row[0] for row in await cur.fetchall()}

    async def _delete_checkpoints(self, gone: list[tuple[str, str, str]]) -> None:
        """Delete these (thread, namespace, checkpoint id) with their writes (a
        run saves writes before their checkpoint, so writes go by the
        checkpoints deleted, never by the ones kept); children left lose their parent."""
        await self.conn.executemany(
            "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND "
            "checkpoint_id = ?", gone)
        await self.conn.executemany(
            "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            gone)
        await self.conn.executemany(
            "UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = ? AND "
            "checkpoint_ns = ? AND parent_checkpoint_id = ?", gone)


def _batches(ids: list[str]) -> list[list[str]]:
    return [ids[i:i + _BATCH] for i in range(0, len(ids), _BATCH)]


def _marks(part: list[str]) -> str:
    return ", ".join("?" * len(part))


def _distinct(values: Sequence[str], name: str, what: str) -> list[str]:
    """`values` as strings, each once, in order; a str is refused (it would be
    taken character by character)."""
    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of {what}, not a str")
    return list(dict.fromkeys(str(v) for v in values))
