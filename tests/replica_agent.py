"""One replica of a deployment, as a process: a Runs of its own, a shared PostgreSQL and bucket.

    python replica_agent.py ROOT REMOTE DSN OPTIONS_JSON

serves tests/history_agent.py's Deep Agents graph (its scripted model) on
`mount_tool.runs(ROOT, remote=REMOTE, **OPTIONS)` with an AsyncPostgresSaver
on DSN, the way a LangGraph deployment's replica would: the threads' truth is
the saver's checkpoints and the bucket, this process's root only a cache.

It takes commands on stdin, one JSON object a line ({"id", "op", ...}), runs
each as an asyncio task (so a replica runs several threads at once) and
answers on stdout as each ends: {"id", "ok": true, "result"} or {"id", "ok":
false, "error": {"type", "message"}}. `Replica` (below) is the test's side.

Ops: `run` (a graph run: `text` a user message, or `resume` a value for an
interrupt, or neither: go on from the checkpoint; `checkpoint_id` to run from
a past checkpoint; `durability`), `history` (the thread's checkpoints, newest
first), `delete`, `copy`, `prune`, `update` (threads.update_state: a user
message `text` as node `as_node` on `checkpoint_id`), `runs_held` (the runs
its shards hold), `pids` (this process and its shard daemons).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

#: seconds a command may take, at most
COMMAND_TIMEOUT = 240.0


def _message(m: Any) -> dict[str, Any]:
    return {"type": m.type, "content": m.content if isinstance(m.content, str) else str(m.content),
            "tool_call_id": getattr(m, "tool_call_id", None),
            "tool_calls": [c["id"] for c in getattr(m, "tool_calls", None) or []]}


async def serve(root: str, remote: str, dsn: str, options: dict[str, Any]) -> None:
    from history_agent import MOUNT_OPTIONS, make_agent
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.types import Command

    import mount_tool

    out_lock = asyncio.Lock()

    async def answer(doc: dict[str, Any]) -> None:
        async with out_lock:
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()

    async with mount_tool.runs(root, remote=remote, **{**MOUNT_OPTIONS, **options}) as runs, \
            AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()
        agent = make_agent(runs, checkpointer=saver)
        wrapped = agent.checkpointer

        def config(cmd: dict[str, Any]) -> dict[str, Any]:
            conf: dict[str, Any] = {"thread_id": cmd["thread"]}
            if cmd.get("checkpoint_id"):
                conf["checkpoint_id"] = cmd["checkpoint_id"]
            return {"configurable": conf}

        async def run(cmd: dict[str, Any]) -> Any:
            if "resume" in cmd:
                graph_input: Any = Command(resume=cmd["resume"])
            elif cmd.get("text") is not None:
                graph_input = {"messages": [{"role": "user", "content": cmd["text"]}]}
            else:
                graph_input = None
            kwargs = {"durability": cmd["durability"]} if cmd.get("durability") else {}
            out = await agent.ainvoke(graph_input, config(cmd), **kwargs)
            return {"messages": [_message(m) for m in out.get("messages", [])],
                    "interrupt": "__interrupt__" in out}

        async def history(cmd: dict[str, Any]) -> Any:
            return [{"checkpoint_id": s.config["configurable"]["checkpoint_id"],
                     "step": s.metadata.get("step"), "vfsd": s.metadata.get("vfsd"),
                     "next": list(s.next),
                     "messages": [_message(m) for m in s.values.get("messages", [])]}
                    async for s in agent.aget_state_history(config(cmd))]

        async def update(cmd: dict[str, Any]) -> Any:
            done = await agent.aupdate_state(
                config(cmd), {"messages": [{"role": "user", "content": cmd["text"]}]},
                as_node=cmd.get("as_node"))
            return done["configurable"]["checkpoint_id"]

        def runs_held(cmd: dict[str, Any]) -> Any:
            held = []
            for shard in runs.shards():
                if shard["alive"]:
                    held += runs.shard(shard["name"]).call("remote_runs")["runs"]
            return held

        def pids(cmd: dict[str, Any]) -> Any:
            return {"worker": os.getpid(),
                    "shards": [s["pid"] for s in runs.shards() if s["alive"]]}

        ops = {
            "run": run, "history": history, "update": update,
            "delete": lambda cmd: wrapped.adelete_thread(cmd["thread"]),
            "copy": lambda cmd: wrapped.acopy_thread(cmd["source"], cmd["target"]),
            "prune": lambda cmd: wrapped.aprune([cmd["thread"]], strategy="keep_latest"),
            "runs_held": lambda cmd: asyncio.to_thread(runs_held, cmd),
            "pids": lambda cmd: asyncio.to_thread(pids, cmd),
        }

        async def handle(cmd: dict[str, Any]) -> None:
            try:
                result = await asyncio.wait_for(ops[cmd["op"]](cmd), COMMAND_TIMEOUT)
                await answer({"id": cmd["id"], "ok": True, "result": result})
            except Exception as exc:  # noqa: BLE001 - every failure is the test's to see
                await answer({"id": cmd["id"], "ok": False,
                              "error": {"type": type(exc).__name__, "message": str(exc)}})

        await answer({"id": 0, "ok": True, "result": "ready"})
        loop = asyncio.get_running_loop()
        tasks = set()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd["op"] == "exit":
                break
            task = asyncio.create_task(handle(cmd))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)


# -- the test's side --------------------------------------------------------------------------


class ReplicaError(Exception):
    """A command the replica answered with an error: `type` is the exception's class name."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message


class Replica:
    """A replica_agent.py process, driven from a test."""

    def __init__(self, name: str, root: Path, remote: str, dsn: str, log: Path,
                 **options: Any) -> None:
        self.name, self.root, self.remote, self.dsn, self.log = name, root, remote, dsn, log
        self.options = options
        self.proc: subprocess.Popen | None = None
        self._next = 1
        self._waiting: dict[int, Future] = {}
        self._lock = threading.Lock()

    def start(self, timeout: float = 120.0) -> Replica:
        here = Path(__file__).resolve().parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
        self._log = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(here / "replica_agent.py"), str(self.root), self.remote,
             self.dsn, json.dumps(self.options)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            text=True, start_new_session=True)
        ready: Future = Future()
        self._waiting[0] = ready
        threading.Thread(target=self._read, name=f"replica-{self.name}", daemon=True).start()
        ready.result(timeout)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                future = self._waiting.pop(doc["id"], None)
            if future is None:
                continue
            if doc["ok"]:
                future.set_result(doc["result"])
            else:
                future.set_exception(ReplicaError(doc["error"]["type"], doc["error"]["message"]))
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            future.set_exception(ReplicaError("Exited", f"replica {self.name} exited "
                                              f"(see {self.log})"))

    def send(self, op: str, **args: Any) -> Future:
        """Send a command; its Future (the result, or ReplicaError)."""
        assert self.proc is not None and self.proc.stdin is not None
        future: Future = Future()
        with self._lock:
            cid, self._next = self._next, self._next + 1
            self._waiting[cid] = future
        self.proc.stdin.write(json.dumps({"id": cid, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return future

    def call(self, op: str, timeout: float = COMMAND_TIMEOUT + 10, **args: Any) -> Any:
        return self.send(op, **args).result(timeout)

    def run(self, thread: str, text: str | None = None, **args: Any) -> dict[str, Any]:
        return self.call("run", thread=thread, text=text, **args)

    def pids(self) -> list[int]:
        """This process and its shard daemons (from their pid files: a live or a dead one)."""
        out = [self.proc.pid] if self.proc is not None else []
        for pidfile in self.root.glob("shards/*/.vfsd/vfsd.pid"):
            try:
                out.append(int(pidfile.read_text()))
            except (OSError, ValueError):
                pass
        return out

    def crash(self) -> None:
        """SIGKILL the process and its shard daemons (a machine lost), and
        remove their dead mounts."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.wait(30)
        deadline = time.monotonic() + 30
        for pid in self.pids():
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        self._unmount_all()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"id": -1, "op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(90)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None
        self._unmount_all()
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def _unmount_all(self) -> None:
        # Not a glob of shards/*/fs: a dead daemon's mount point cannot be stat'ed.
        shards = self.root / "shards"
        for shard in os.listdir(shards) if shards.is_dir() else ():
            subprocess.run(["fusermount3", "-u", "-z", str(shards / shard / "fs")],
                           capture_output=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    # What mount_tool decides (restores, holds, hand-overs) goes to the replica's log.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("mount_tool").setLevel(logging.INFO)
    asyncio.run(serve(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
