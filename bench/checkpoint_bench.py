"""Checkpoint cost of an agent's files: state vs deepagents' backend vs vfsd references.

The seed trajectory (50 tool-call steps: 45 `write_file` calls, 8 MiB in all, five
files of 1 MiB, and 5 `execute` calls) is played by a scripted chat model, no LLM,
three ways in one process:

- classic:    files in graph state under a plain dict-merge reducer, messages under
              `add_messages` (how LangGraph < 1.2 stored both: the whole channel
              value in every checkpoint that changes it);
- deepagents: `create_deep_agent` with its default `StateBackend` on the current
              releases (DeltaChannel for `messages` and `files`);
- vfsd:       `create_vfsd_deep_agent` on a vfsd mount (refs in state, large
              tool-call arguments kept in the mount), its checkpointer wrapped
              in `VfsdCheckpointer` (each checkpoint records a snapshot of the
              mount, taken at the step boundary);
- vfsd-bare:  the same agent without the wrapper (`create_deep_agent` with
              VfsdBackend and VfsdMiddleware): what the wrapper costs.

each with InMemorySaver and with PostgresSaver on a private PostgreSQL server.
The vfsd variant also runs with the files scaled to 80 MiB. Reported at steps
5/15/30/50: serialized state size (LangGraph's serializer over `get_state()`),
checkpoint bytes written so far (everything the saver serialized: checkpoints,
channel blobs and pending writes), and p50/p95 of `put` and `put_writes` calls in
the window that ends at the step (for vfsd, the wrapper's `put`, as LangGraph
calls it), and for vfsd the snapshots the wrapper takes at step boundaries
(as LangGraph checkpoints the graph's boundary channel). Invocations use `durability="sync"` so each put
is timed on its own rather than overlapping the next step.

    .venv/bin/python bench/checkpoint_bench.py [--savers memory,postgres] [--variants ...]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NotRequired

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from deepagents import create_deep_agent  # noqa: E402
from deepagents.backends import StateBackend  # noqa: E402
from deepagents.middleware.filesystem import (  # noqa: E402
    FilesystemMiddleware,
    _file_data_reducer,
)
from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import AgentState  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from pgserver import PgServer, find_pg_bin  # noqa: E402
from test_deepagents import (  # noqa: E402
    scripted_model,
    seed_steps,
    serialized_size,
    tool_call,
    turn,
)

import mount_tool  # noqa: E402
from mount_tool.deepagents import VfsdBackend, VfsdMiddleware, create_vfsd_deep_agent  # noqa: E402
from mount_tool.langgraph import VfsdCheckpointer  # noqa: E402
from mount_tool.langgraph.checkpoints import CountingSerializer  # noqa: E402

MARKS = (5, 15, 30, 50)
VARIANTS = ("classic", "deepagents", "vfsd", "vfsd-bare")




def timed_saver(cls: type) -> type:
    """A subclass of the saver `cls` that records how long put/put_writes (and
    the step-boundary captures where VfsdCheckpointer snapshots) take."""

    class Timed(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.put_times: list[float] = []
            self.write_times: list[float] = []
            self.version_times: list[float] = []

        def _capture(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return super()._capture(*args, **kwargs)
            finally:
                self.version_times.append(time.perf_counter() - start)

        def put(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return super().put(*args, **kwargs)
            finally:
                self.put_times.append(time.perf_counter() - start)

        def put_writes(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return super().put_writes(*args, **kwargs)
            finally:
                self.write_times.append(time.perf_counter() - start)

    Timed.__name__ = f"Timed{cls.__name__}"
    return Timed


# -- the three agents ------------------------------------------------------------------


class ClassicFilesState(AgentState):
    """`files` under a plain dict-merge reducer (deepagents before DeltaChannel)."""

    files: NotRequired[Annotated[dict[str, Any], _file_data_reducer]]


def classic_agent(model: Any, saver: Any) -> Any:
    """Files and messages as plain reducer channels: the pre-1.2 storage."""
    middleware = FilesystemMiddleware(backend=StateBackend())
    middleware.state_schema = ClassicFilesState
    return create_agent(model, middleware=[middleware], checkpointer=saver)


def deepagents_agent(model: Any, saver: Any) -> Any:
    """`create_deep_agent` with its default StateBackend."""
    return create_deep_agent(model, checkpointer=saver)


def vfsd_agent(model: Any, saver: Any, mount: Any) -> Any:
    return create_vfsd_deep_agent(mount, model, checkpointer=saver)


def vfsd_bare_agent(model: Any, saver: Any, mount: Any) -> Any:
    """The vfsd agent with the saver as is: checkpoints without snapshots."""
    return create_deep_agent(
        model, backend=VfsdBackend(mount), middleware=[VfsdMiddleware(mount)], checkpointer=saver
    )


# -- one run -----------------------------------------------------------------------------


@dataclass
class Row:
    variant: str
    saver: str
    payload: int
    step: int
    state_bytes: int
    files_bytes: int
    messages_bytes: int
    checkpoint_bytes: int
    put_p50: float
    put_p95: float
    writes_p50: float
    writes_p95: float
    extra: dict[str, Any] = field(default_factory=dict)


def chunked_script(scale: int) -> tuple[list[list[AIMessage]], int]:
    """The seed trajectory cut into one script per mark, and the payload in bytes."""
    steps = seed_steps(scale)
    payload = sum(len(a["content"]) for n, a in steps if n == "write_file")
    chunks, start = [], 0
    for mark in MARKS:
        msgs = [
            turn(tool_call(name, f"call_{i:03d}", **args))
            for i, (name, args) in enumerate(steps[start:mark], start)
        ]
        chunks.append([*msgs, AIMessage(content=f"paused after step {mark}")])
        start = mark
    return chunks, payload


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def run_one(variant: str, saver_name: str, make_saver: Callable, scale: int) -> list[Row]:
    chunks, payload = chunked_script(scale)
    serde = CountingSerializer()
    with ExitStack() as stack:
        saver = stack.enter_context(make_saver(serde))
        model = scripted_model([m for chunk in chunks for m in chunk])
        timed = saver  # whose put LangGraph calls
        if variant.startswith("vfsd"):
            run_dir = Path(tempfile.mkdtemp(prefix="vfsd-bench-"))
            stack.callback(shutil.rmtree, run_dir, ignore_errors=True)
            # No age eviction: every ref stays in state, the worst case for its size.
            mnt = stack.enter_context(mount_tool.mount(run_dir, max_age_steps=1000))
            if variant == "vfsd":
                timed = timed_saver(VfsdCheckpointer)(saver, mnt)
                agent = vfsd_agent(model, timed, mnt)
            else:
                agent = vfsd_bare_agent(model, saver, mnt)
        elif variant == "classic":
            agent = classic_agent(model, saver)
        else:
            agent = deepagents_agent(model, saver)
        config = {
            "configurable": {"thread_id": f"{variant}-{saver_name}-{scale}"},
            "recursion_limit": 10_000,
        }
        rows: list[Row] = []
        puts_seen = writes_seen = 0
        # Postgres keeps the checkpoint skeleton as JSONB, outside the serializer:
        # count what its tables hold instead.
        stored = postgres_stored_bytes if saver_name.startswith("postgres") else None
        for mark in MARKS:
            text = "go" if mark == MARKS[0] else "continue"
            agent.invoke({"messages": [HumanMessage(text)]}, config, durability="sync")
            values = agent.get_state(config).values
            puts = timed.put_times[puts_seen:]
            writes = timed.write_times[writes_seen:]
            puts_seen, writes_seen = len(timed.put_times), len(timed.write_times)
            rows.append(
                Row(
                    variant=variant,
                    saver=saver_name,
                    payload=payload,
                    step=mark,
                    state_bytes=serialized_size(values),
                    files_bytes=serialized_size(values.get("files", {})),
                    messages_bytes=serialized_size(values.get("messages", [])),
                    checkpoint_bytes=stored(saver, config) if stored else serde.bytes,
                    put_p50=quantile(puts, 0.50) * 1000,
                    put_p95=quantile(puts, 0.95) * 1000,
                    writes_p50=quantile(writes, 0.50) * 1000,
                    writes_p95=quantile(writes, 0.95) * 1000,
                )
            )
        rows[-1].extra["run_put_p50"] = quantile(timed.put_times, 0.50) * 1000
        rows[-1].extra["run_put_p95"] = quantile(timed.put_times, 0.95) * 1000
        rows[-1].extra["puts"] = len(timed.put_times)
        if timed is not saver:
            rows[-1].extra["snap_p50"] = quantile(timed.version_times, 0.50) * 1000
            rows[-1].extra["snap_p95"] = quantile(timed.version_times, 0.95) * 1000
            rows[-1].extra["snaps"] = len(mnt.snapshots())
            rows[-1].extra["version_calls"] = len(timed.version_times)
        return rows


def postgres_stored_bytes(saver: Any, config: dict) -> int:
    """Bytes the thread occupies in the checkpoint tables (payload columns)."""
    thread = config["configurable"]["thread_id"]
    queries = (
        "select coalesce(sum(octet_length(blob)), 0) from checkpoint_blobs where thread_id = %s",
        "select coalesce(sum(octet_length(blob)), 0) from checkpoint_writes where thread_id = %s",
        "select coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)), 0)"
        " from checkpoints where thread_id = %s",
    )
    total = 0
    with saver.conn.cursor() as cur:
        for q in queries:
            cur.execute(q, (thread,))
            row = cur.fetchone()
            total += int(list(row.values())[0] if isinstance(row, dict) else row[0])
    return total


# -- savers --------------------------------------------------------------------------------


class _MemorySaverFactory:
    def __call__(self, serde: CountingSerializer) -> Any:
        from contextlib import nullcontext

        return nullcontext(timed_saver(InMemorySaver)(serde=serde))


class _PostgresSaverFactory:
    def __init__(self, dsn: str, options: str = "") -> None:
        self.dsn = dsn
        self.options = options

    def __call__(self, serde: CountingSerializer) -> Any:
        from contextlib import contextmanager

        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        @contextmanager
        def opened():
            with psycopg.connect(
                self.dsn,
                autocommit=True,
                prepare_threshold=0,
                row_factory=dict_row,
                options=self.options,
            ) as conn:
                saver = timed_saver(PostgresSaver)(conn, serde=serde)
                saver.setup()
                yield saver

        return opened()


# -- report -------------------------------------------------------------------------------


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def print_table(rows: list[Row]) -> None:
    print(
        "| variant | saver | files | step | state | files in state | messages in state "
        "| checkpoint bytes (total) | put p50 / p95 ms | put_writes p50 / p95 ms |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.variant} | {r.saver} | {fmt_bytes(r.payload)} | {r.step} "
            f"| {fmt_bytes(r.state_bytes)} | {fmt_bytes(r.files_bytes)} "
            f"| {fmt_bytes(r.messages_bytes)} | {fmt_bytes(r.checkpoint_bytes)} "
            f"| {r.put_p50:.2f} / {r.put_p95:.2f} | {r.writes_p50:.2f} / {r.writes_p95:.2f} |"
        )


def print_targets(rows: list[Row]) -> None:
    """The vfsd targets, checked on the step-50 rows."""
    final = {(r.variant, r.saver, r.payload): r for r in rows if r.step == MARKS[-1]}
    print()
    print("vfsd at step 50 against the targets:")
    for (variant, saver, payload), r in sorted(final.items()):
        if variant != "vfsd" or payload == 0:
            continue
        budget = 0.01 * payload + r.messages_bytes
        base = final.get((variant, saver, 0))
        if base is not None:
            extra = r.checkpoint_bytes - base.checkpoint_bytes
            print(
                f"- {saver}, {fmt_bytes(payload)}: checkpoint bytes beyond the same run with "
                f"empty files: {fmt_bytes(extra)} = {extra / payload * 100:.2f}% of the payload"
            )
        print(
            f"- {saver}, {fmt_bytes(payload)}: files in state {fmt_bytes(r.files_bytes)}, "
            f"whole state {fmt_bytes(r.state_bytes)} (target < 16 KB); checkpoint bytes "
            f"{fmt_bytes(r.checkpoint_bytes)} (target < {fmt_bytes(budget)}: 1% of payload "
            f"+ messages {fmt_bytes(r.messages_bytes)}); put p50/p95 over the run "
            f"{r.extra['run_put_p50']:.2f}/{r.extra['run_put_p95']:.2f} ms (target p95 < 5)"
        )
    print()
    print("checkpoint put with VfsdCheckpointer against without (vfsd-bare), step 50:")
    for (variant, saver, payload), r in sorted(final.items()):
        bare = final.get(("vfsd-bare", saver, payload))
        if variant != "vfsd" or bare is None:
            continue
        print(
            f"- {saver}, {fmt_bytes(payload)}: put p50/p95 in the window ending at step 50 "
            f"{r.put_p50:.2f}/{r.put_p95:.2f} ms against {bare.put_p50:.2f}/{bare.put_p95:.2f}; "
            f"over the run {r.extra['run_put_p50']:.2f}/{r.extra['run_put_p95']:.2f} against "
            f"{bare.extra['run_put_p50']:.2f}/{bare.extra['run_put_p95']:.2f} ms "
            f"({r.extra['puts']} puts); snapshots at step boundaries "
            f"p50/p95 {r.extra['snap_p50']:.2f}/{r.extra['snap_p95']:.2f} ms over "
            f"{r.extra['version_calls']} calls, {r.extra['snaps']} snapshots retained"
        )
    print()
    print("vfsd, 80 MiB against 8 MiB (target: within 10%):")
    for saver in sorted({s for (_, s, _) in final}):
        pair = sorted(
            (r for (v, s, p), r in final.items() if v == "vfsd" and s == saver and p),
            key=lambda r: r.payload,
        )
        if len(pair) != 2:
            continue
        a, b = pair
        for label, x, y in (
            ("state bytes", a.state_bytes, b.state_bytes),
            ("checkpoint bytes", a.checkpoint_bytes, b.checkpoint_bytes),
            ("put p50 ms", a.extra["run_put_p50"], b.extra["run_put_p50"]),
            ("put p95 ms", a.extra["run_put_p95"], b.extra["run_put_p95"]),
        ):
            print(f"- {saver} {label}: {x:,.2f} vs {y:,.2f} ({(y - x) / x * 100:+.1f}%)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--savers", default="memory,postgres")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--no-scale", action="store_true", help="skip the 80 MiB vfsd run")
    parser.add_argument(
        "--pg-async-commit",
        action="store_true",
        help="also run PostgresSaver with synchronous_commit=off (no fsync per commit)",
    )
    args = parser.parse_args(argv)
    savers = args.savers.split(",")
    variants = args.variants.split(",")

    with ExitStack() as stack:
        factories: dict[str, Any] = {}
        if "memory" in savers:
            factories["memory"] = _MemorySaverFactory()
        if "postgres" in savers:
            if find_pg_bin() is None:
                print("PostgreSQL binaries not found: skipping PostgresSaver", file=sys.stderr)
            else:
                pg = stack.enter_context(PgServer(durable=True))
                factories["postgres"] = _PostgresSaverFactory(pg.dsn)
                if args.pg_async_commit:
                    # Same server, commits not waiting for the WAL flush: what is
                    # left is the saver's own work, without the disk's fsync.
                    factories["postgres-async-commit"] = _PostgresSaverFactory(
                        pg.dsn, "-c synchronous_commit=off"
                    )
        rows: list[Row] = []
        for saver_name, factory in factories.items():
            for variant in variants:
                scales = (1,)
                if variant == "vfsd":
                    # 0: the same 50 steps with empty files, LangGraph's own cost.
                    scales = (0, 1) if args.no_scale else (0, 1, 10)
                elif variant == "vfsd-bare":
                    scales = (1,)
                for scale in scales:
                    start = time.perf_counter()
                    rows += run_one(variant, saver_name, factory, scale)
                    print(
                        f"# {variant} / {saver_name} / {scale * 8} MiB: "
                        f"{time.perf_counter() - start:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    print_table(rows)
    print_targets(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
