"""`.vfsd/accesslog`, `vfsd stats` and `vfsd profile` on a real mount."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import vfsd_cli

pytestmark = pytest.mark.fuse


class LogReader:
    """Reads `.vfsd/accesslog` in a thread, as `cat` would."""

    def __init__(self, root: Path) -> None:
        self.fd = os.open(root / ".vfsd" / "accesslog", os.O_RDONLY)
        self.lines: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pending = b""
        while not self.stop.is_set():
            data = os.read(self.fd, 1 << 16)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            self.lines += [ln.decode() for ln in lines]

    def wait_for(self, predicate, what: str) -> list[str]:
        for _ in range(200):  # a read answers within a second (a keep-alive `#`)
            found = [ln for ln in self.lines if predicate(ln)]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {what} line in:\n" + "\n".join(self.lines[-30:]))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(self.fd)


def fields(line: str) -> dict:
    parts = line.split()
    return {"op": parts[2], "path": " ".join(parts[3:-5]), "bytes": int(parts[-5]),
            "seconds": float(parts[-4]), "pid": parts[-3], "call": parts[-2],
            "result": parts[-1]}


def test_access_log_streams_operations(run):
    reader = LogReader(run.root)
    try:
        (run.root / "notes").mkdir()
        data = b"x" * 5000
        (run.root / "notes" / "my plan.md").write_bytes(data)
        assert (run.root / "notes" / "my plan.md").read_bytes() == data
        os.rename(run.root / "notes" / "my plan.md", run.root / "notes" / "plan.md")
        with pytest.raises(FileNotFoundError):
            os.stat(run.root / "missing.txt")
        writes = reader.wait_for(lambda ln: " write notes/my\\x20plan.md " in ln, "write")
        w = fields(writes[0])
        assert w["bytes"] == 5000 and w["result"] == "OK" and w["call"] == "call=-"
        assert w["pid"] == f"pid={os.getpid()}"  # the opener: write requests carry none
        assert 0 < w["seconds"] < 60
        creates = reader.wait_for(lambda ln: " create notes/my\\x20plan.md " in ln, "create")
        assert fields(creates[0])["pid"] == f"pid={os.getpid()}"
        reader.wait_for(lambda ln: " mkdir notes " in ln, "mkdir")
        reader.wait_for(lambda ln: " rename notes/my\\x20plan.md -> notes/plan.md " in ln,
                        "rename")
        miss = reader.wait_for(lambda ln: " lookup missing.txt " in ln, "lookup")
        assert fields(miss[0])["result"] == "OK"  # a cached negative entry, not an error
        # The log's own reads are not logged.
        assert not [ln for ln in reader.lines if "accesslog" in ln]
    finally:
        reader.close()
    # No reader: nothing is recorded, and the next reader sees only what follows.
    (run.root / "quiet.txt").write_text("q")
    reader = LogReader(run.root)
    try:
        (run.root / "loud.txt").write_text("l")
        reader.wait_for(lambda ln: " create loud.txt " in ln, "create")
        assert not [ln for ln in reader.lines if "quiet.txt" in ln]
    finally:
        reader.close()


def test_a_stalled_reader_never_stalls_the_mount(run):
    """A reader that opens the log and stops reading: operations go on at full
    speed, lines past its buffer are dropped and counted."""
    fd = os.open(run.root / ".vfsd" / "accesslog", os.O_RDONLY)
    try:
        target = run.root / "f.txt"
        target.write_text("x")
        for _ in range(12000):  # open + release: two lines of ~75 bytes each, ~1.8 MiB
            os.close(os.open(target, os.O_RDONLY))
        first = os.read(fd, 1 << 16).decode()
        assert first.startswith("# dropped ")
        dropped = int(first.split()[2])
        assert dropped > 1000
        # After the drop notice, what fit in its buffer, in order.
        body = first.splitlines()[1:]
        assert body and " f.txt " in body[0]
    finally:
        os.close(fd)
    # The mount answers as before.
    assert (run.root / "f.txt").read_text() == "x"


def test_idle_reader_gets_keepalives_and_unmount_does_not_wait(run):
    fd = os.open(run.root / ".vfsd" / "accesslog", os.O_RDONLY)
    try:
        assert os.read(fd, 4096) == b"#\n"
    finally:
        os.close(fd)


def test_stats_shows_rates_and_latency(run):
    stop = threading.Event()

    def busy():
        i = 0
        while not stop.is_set():
            p = run.root / f"s{i % 50}.txt"
            p.write_bytes(b"y" * 1000)
            p.read_bytes()
            i += 1

    t = threading.Thread(target=busy)
    t.start()
    try:
        out = vfsd_cli("stats", run.run_dir, "--json", "--count", "2", "--interval", "0.5")
    finally:
        stop.set()
        t.join()
    samples = json.loads(out.stdout)["samples"]
    assert len(samples) == 2
    last = samples[-1]
    assert last["requests_per_s"] > 0
    assert last["ops"]["open"]["per_s"] > 0  # the files exist after the first round
    assert last["ops"]["write"]["avg_ms"] > 0
    assert last["write_bytes_per_s"] > 0
    assert last["remote"] is None
    text = vfsd_cli("stats", run.run_dir, "--count", "1", "--interval", "0.2", "--ops").stdout
    assert text.splitlines()[0].split()[:4] == ["time", "step", "req/s", "avg"]


def test_profile_live_and_from_a_saved_log(run, tmp_path):
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            (run.root / "hot.bin").write_bytes(b"z" * 20000)
            (run.root / "cold.txt").write_text("c")

    t = threading.Thread(target=busy)
    t.start()
    try:
        out = vfsd_cli("profile", run.run_dir, "--seconds", "1.5", "--json")
    finally:
        stop.set()
        t.join()
    doc = json.loads(out.stdout)
    assert doc["operations"] > 0
    paths = {r["path"]: r for r in doc["by_path"]}
    assert paths["hot.bin"]["bytes"] > paths.get("cold.txt", {"bytes": 0})["bytes"]
    assert doc["by_call"][0]["call"] == "-"  # all from outside any tool call
    saved = tmp_path / "access.log"
    saved.write_text(
        "2025-01-15 08:26:11.000001 write a\\x20b.txt 4096 0.250000 pid=7 "
        "call=execute:call_1 OK\n"
        "2025-01-15 08:26:11.000002 rename a\\x20b.txt -> c.txt 0 0.500000 pid=7 "
        "call=execute:call_1 OK\n"
        "# dropped 3 lines: the reader fell behind\n"
        "2025-01-15 08:26:11.000003 read c.txt 100 0.125000 pid=8 call=- OK\n"
        "garbage\n")
    doc = json.loads(vfsd_cli("profile", run.run_dir, "--file", str(saved), "--json").stdout)
    assert doc["operations"] == 3 and doc["dropped"] == 3 and doc["unparsed"] == 1
    assert doc["by_call"][0] == {"call": "execute:call_1", "ops": 2, "seconds": 0.75,
                                 "bytes": 4096, "busiest_ops": ["rename", "write"]}
    assert doc["by_path"][0]["path"] == "a\\x20b.txt -> c.txt"
    text = vfsd_cli("profile", run.run_dir, "--file", str(saved)).stdout
    assert "execute:call_1" in text and "(no tool call)" in text
