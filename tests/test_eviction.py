"""Steps, status, pins and eviction on a real mount (issue 3).

Every test writes real files through the mount, advances the agent step (with
`vfsd step` or the `set_step` request) and then checks with `ls`, `stat` and
`cat` exactly which paths are gone and which are intact, and what the eviction
log, the chunk directory and the daemon log say.

Policy arithmetic (docs/control.md, DESIGN.md): age = current step - step of
the last use (content change or open; the last content change alone with
age_from = "written"); a `done` file goes once age > done_retention_steps,
any unpinned file once age > max_age_steps.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import wait_for
from ctl import call, connect
from vfsdattr import attr_doc, vfsd_attr

from mount_tool.refs import content_hash

pytestmark = pytest.mark.fuse

MiB = 1 << 20
HEX32 = re.compile(r"^[0-9a-f]{32}$")


# ----------------------------------------------------------------- helpers


def step_to(run, n: int) -> dict:
    """Advance the step with the `set_step` request; the eviction report."""
    return call(run.run_dir, "set_step", step=n)


def step_cli(run, n: int) -> dict:
    """Advance the step with `vfsd step RUN_DIR N --json`; the eviction report."""
    return json.loads(run.cli("step", run.run_dir, str(n), "--json").stdout)


def evicted_paths(report: dict) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in report["evicted"]}


def set_xattr_tool(path: Path, name: str, value: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setfattr", "-n", name, "-v", value, str(path)], capture_output=True, text=True, timeout=30
    )


def xattr(path: Path, name: str) -> str:
    return vfsd_attr(path, name)


def assert_gone(path: Path) -> None:
    """`path` is absent from `ls` of its directory, `stat` and `cat`."""
    ls = subprocess.run(["ls", "-a", str(path.parent)], capture_output=True, text=True, timeout=30)
    assert ls.returncode == 0, ls.stderr
    assert path.name not in ls.stdout.split(), f"{path} still listed by ls"
    with pytest.raises(FileNotFoundError):
        os.stat(path)
    cat = subprocess.run(["cat", str(path)], capture_output=True, text=True, timeout=30)
    assert cat.returncode != 0 and "No such file or directory" in cat.stderr, cat


def assert_present(path: Path, content: bytes) -> None:
    """`path` is listed by `ls`, stat-able, and `cat` prints exactly `content`."""
    ls = subprocess.run(["ls", "-a", str(path.parent)], capture_output=True, text=True, timeout=30)
    assert path.name in ls.stdout.split(), f"{path} missing from ls: {ls.stdout!r}"
    assert os.stat(path).st_size == len(content)
    cat = subprocess.run(["cat", str(path)], capture_output=True, timeout=60)
    assert cat.returncode == 0, cat.stderr
    assert cat.stdout == content, f"{path}: content differs"


def assert_listed(path: Path, size: int) -> None:
    """`path` is listed by `ls` and stat-able, with `size`; never opened (an
    open is a use: it would make the file young again)."""
    ls = subprocess.run(["ls", "-a", str(path.parent)], capture_output=True, text=True, timeout=30)
    assert path.name in ls.stdout.split(), f"{path} missing from ls: {ls.stdout!r}"
    assert os.stat(path).st_size == size


def chunk_files(run) -> set[str]:
    """Names of the chunk files on disk (RUN_DIR/.vfsd/chunks/??/<hash>)."""
    return {p.name for p in run.state_dir.glob("chunks/??/*") if HEX32.match(p.name)}


def mark_done(path: Path) -> None:
    os.setxattr(path, "user.vfsd.status", b"done")


# ------------------------------------------------------------- the policy


def test_default_policy_evicts_exactly_the_expired_files(run_factory) -> None:
    # Ages from the last write: the checks below read every file at every step
    # (the default, ages from the last use, is tested further down).
    run = run_factory("written", "--age-from", "written")
    root = run.root
    files: dict[str, bytes] = {}

    def write(rel: str, data: bytes) -> Path:
        p = root / rel
        p.write_bytes(data)
        files[rel] = data
        return p

    # step 0
    write("active0", b"active at step 0\n")
    write("done0", b"done at step 0\n")
    proc = set_xattr_tool(root / "done0", "user.vfsd.status", "done")
    assert proc.returncode == 0, proc.stderr
    write("pinned0", b"pinned and done at step 0\n")
    assert set_xattr_tool(root / "pinned0", "user.vfsd.pin", "1").returncode == 0
    assert set_xattr_tool(root / "pinned0", "user.vfsd.status", "done").returncode == 0
    (root / "sub" / "deeper").mkdir(parents=True)
    write("sub/deeper/only", b"the only file of sub/deeper\n")
    mark_done(root / "sub/deeper/only")
    write("rewritten", b"first version\n")
    # Status and pin are metadata, not content: they do not restamp the step.
    assert xattr(root / "done0", "user.vfsd.step") == "0"

    assert step_to(run, 1)["files"] == 0
    write("done1", b"done at step 1\n")
    with connect(run.run_dir) as c:
        ref = c.call("set_status", path="done1", status="done")
        assert ref["status"] == "done" and ref["step"] == 1

    assert step_cli(run, 2)["files"] == 0
    write("active2", b"active at step 2\n")
    write("pinned2", b"pinned by request at step 2\n")
    write("unpinned2", b"pinned then unpinned at step 2\n")
    with connect(run.run_dir) as c:
        assert c.call("pin", path="pinned2")["ino"] == os.stat(root / "pinned2").st_ino
        c.call("set_status", path="pinned2", status="done")
        c.call("pin", path="unpinned2")
        c.call("unpin", path="unpinned2")
        c.call("set_status", path="unpinned2", status="done")
    assert xattr(root / "pinned2", "user.vfsd.pin") == "1"
    assert xattr(root / "unpinned2", "user.vfsd.pin") == "0"
    assert xattr(root / "unpinned2", "user.vfsd.status") == "done"

    expected_at = {
        3: {},  # done files of step 0 are 3 steps old: not yet past retention
        4: {"done0": "done", "sub/deeper/only": "done"},
        5: {"done1": "done"},
        6: {"unpinned2": "done"},
        10: {},
    }
    gone: set[str] = set()
    for n, want in expected_at.items():
        report = step_cli(run, n) if n % 2 else step_to(run, n)
        assert report["step"] == n and report["dry_run"] is False
        assert evicted_paths(report) == want, f"step {n}"
        assert report["files"] == len(want)
        assert report["bytes"] == sum(len(files[p]) for p in want)
        gone |= set(want)
        for rel, data in files.items():
            if rel in gone:
                assert_gone(root / rel)
            else:
                assert_present(root / rel, data)

    # A directory emptied by eviction stays, and stays usable.
    assert (root / "sub" / "deeper").is_dir()
    assert os.listdir(root / "sub" / "deeper") == []
    (root / "sub/deeper/new").write_bytes(b"x")
    os.unlink(root / "sub/deeper/new")

    # A content change restamps the file: "rewritten" now ages from step 10.
    write("rewritten", b"second version\n")
    assert xattr(root / "rewritten", "user.vfsd.step") == "10"

    # max_age_steps = 20: age 20 stays, age 21 goes.
    assert evicted_paths(step_to(run, 20)) == {}
    assert evicted_paths(step_to(run, 21)) == {"active0": "max_age"}
    assert evicted_paths(step_cli(run, 22)) == {}
    assert evicted_paths(step_to(run, 23)) == {"active2": "max_age"}
    assert evicted_paths(step_to(run, 30)) == {}
    assert evicted_paths(step_to(run, 31)) == {"rewritten": "max_age"}
    for rel in ("active0", "active2", "rewritten"):
        assert_gone(root / rel)

    # Pinned files are never evicted.
    assert evicted_paths(step_to(run, 10_000)) == {}
    assert_present(root / "pinned0", files["pinned0"])
    assert_present(root / "pinned2", files["pinned2"])
    assert sorted(os.listdir(root)) == ["pinned0", "pinned2", "sub"]


def test_jumping_many_steps_evicts_everything_due_at_once(run) -> None:
    root = run.root
    (root / "a").write_bytes(b"a")
    (root / "b").write_bytes(b"b")
    mark_done(root / "b")
    (root / "keep").write_bytes(b"k")
    os.setxattr(root / "keep", "user.vfsd.pin", b"1")
    report = step_to(run, 100)
    assert evicted_paths(report) == {"a": "max_age", "b": "done"}
    assert sorted(os.listdir(root)) == ["keep"]


def test_custom_policy_flags(run_factory) -> None:
    r = run_factory("custom", "--done-retention-steps", "0", "--max-age-steps", "2")
    root = r.root
    (root / "active").write_bytes(b"active")
    (root / "done").write_bytes(b"done")
    mark_done(root / "done")
    assert evicted_paths(step_to(r, 1)) == {"done": "done"}
    assert_gone(root / "done")
    assert evicted_paths(step_to(r, 2)) == {}
    assert_listed(root / "active", len(b"active"))
    assert evicted_paths(step_to(r, 3)) == {"active": "max_age"}
    assert_gone(root / "active")


def test_policy_from_config_file_and_flag_override(run_factory, tmp_path: Path) -> None:
    conf = tmp_path / "vfsd.toml"
    conf.write_text("[vfsd]\ndone_retention_steps = 1\nmax_age_steps = 5\n")
    r = run_factory("conf", "--config", str(conf), "--max-age-steps", "3")
    root = r.root
    (root / "active").write_bytes(b"a")
    (root / "done").write_bytes(b"d")
    mark_done(root / "done")
    assert evicted_paths(step_to(r, 1)) == {}
    assert evicted_paths(step_to(r, 2)) == {"done": "done"}  # from the file
    assert evicted_paths(step_to(r, 3)) == {}
    assert evicted_paths(step_to(r, 4)) == {"active": "max_age"}  # the flag wins over 5


# ---------------------------------------------------------- log and dry run


def test_eviction_log_records(run) -> None:
    root = run.root
    small = b"small done file\n"
    big = os.urandom(2 * MiB + 123)
    (root / "logs").mkdir()
    (root / "logs/small").write_bytes(small)
    (root / "big").write_bytes(big)
    ino_small = os.stat(root / "logs/small").st_ino
    ino_big = os.stat(root / "big").st_ino
    mark_done(root / "logs/small")
    step_to(run, 2)
    (root / "late").write_bytes(b"late")
    assert step_to(run, 4)["files"] == 1
    assert step_to(run, 21)["files"] == 1
    assert step_to(run, 23)["files"] == 1

    records = call(run.run_dir, "evicted")["records"]
    assert [r["path"] for r in records] == ["logs/small", "big", "late"]  # newest last
    want = [
        ("logs/small", ino_small, small, 0, 4, "done"),
        ("big", ino_big, big, 0, 21, "max_age"),
        ("late", None, b"late", 2, 23, "max_age"),
    ]
    for rec, (path, ino, data, written, at, reason) in zip(records, want, strict=True):
        assert {"path", "ino", "gen", "hash", "size", "step", "evicted_step", "reason"} <= set(rec)
        assert rec["path"] == path
        if ino is not None:
            assert rec["ino"] == ino
        assert rec["hash"] == content_hash(data)
        assert rec["size"] == len(data)
        assert (rec["step"], rec["evicted_step"], rec["reason"]) == (written, at, reason)
        assert isinstance(rec["gen"], int)

    assert call(run.run_dir, "evicted", limit=1)["records"] == records[-1:]
    assert call(run.run_dir, "evicted", limit=0)["records"] == []

    text = run.cli("evicted", run.run_dir).stdout
    lines = text.strip().splitlines()
    assert len(lines) == 3
    assert "logs/small" in lines[0] and "done" in lines[0] and f"ino={ino_small}" in lines[0]
    assert content_hash(big) in lines[1] and f"size={len(big)}" in lines[1]
    as_json = json.loads(run.cli("evicted", run.run_dir, "--json").stdout)
    assert as_json == records


def test_dry_run_removes_nothing(run) -> None:
    root = run.root
    (root / "f").write_bytes(b"will be done")
    (root / "g").write_bytes(b"stays active")
    step_to(run, 10)
    # Marked done after the step advanced: due now, but eviction only runs on
    # a step change or on request.
    mark_done(root / "f")
    assert_listed(root / "f", len(b"will be done"))
    before = chunk_files(run)

    report = call(run.run_dir, "evict", dry_run=True)
    assert report["dry_run"] is True and report["step"] == 10
    assert evicted_paths(report) == {"f": "done"}
    assert report["evicted"][0]["hash"] == content_hash(b"will be done")
    out = run.cli("evict", run.run_dir, "--dry-run").stdout
    assert "would evict 1 file" in out and " f " in out + " "
    assert_listed(root / "f", len(b"will be done"))
    assert call(run.run_dir, "evicted")["records"] == []
    assert chunk_files(run) == before
    assert call(run.run_dir, "ref", path="f")["status"] == "done"

    out = run.cli("evict", run.run_dir).stdout
    assert "evicted 1 file" in out
    assert_gone(root / "f")
    assert_present(root / "g", b"stays active")
    assert [r["path"] for r in call(run.run_dir, "evicted")["records"]] == ["f"]
    # Nothing left to do: a second run evicts nothing.
    assert call(run.run_dir, "evict")["files"] == 0


# -------------------------------------------------------------- chunks


def test_eviction_deletes_chunk_files_and_keeps_shared_ones(run) -> None:
    root = run.root
    assert chunk_files(run) == set()
    data1 = os.urandom(3 * MiB)
    data3 = os.urandom(2 * MiB + 1000)
    (root / "one").write_bytes(data1)
    subprocess.run(["cp", str(root / "one"), str(root / "copy")], check=True, timeout=60)
    (root / "three").write_bytes(data3)
    (root / "inline").write_bytes(b"i" * 1000)
    # one and copy share their 3 chunks; three has 2 of its own (its 1000-byte
    # tail, like the small file, is an object in LMDB, not a chunk file).
    assert len(chunk_files(run)) == 5
    shared = chunk_files(run)

    mark_done(root / "one")
    assert evicted_paths(step_to(run, 4)) == {"one": "done"}
    assert_gone(root / "one")
    assert chunk_files(run) == shared, "a chunk still used by 'copy' was deleted"
    assert_present(root / "copy", data1)

    mark_done(root / "copy")
    assert evicted_paths(step_to(run, 8)) == {"copy": "done"}
    wait_for(lambda: len(chunk_files(run)) == 2, "the chunks of the last copy to go")
    assert_present(root / "three", data3)

    mark_done(root / "three")
    mark_done(root / "inline")
    assert evicted_paths(step_to(run, 12)) == {"three": "done", "inline": "done"}
    wait_for(lambda: chunk_files(run) == set(), "every chunk file to go")
    st = run.status()
    assert st["files"] == 0 and st["chunk_count"] == 0 and st["logical_bytes"] == 0


def log_events(run, event: str) -> list[dict]:
    out = []
    for line in run.log_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("event") == event:
            out.append(doc)
    return out


def test_file_read_across_the_step_is_deferred_then_evicted_at_close(run) -> None:
    root = run.root
    data = os.urandom(3 * MiB + 17)
    (root / "held").write_bytes(data)
    mark_done(root / "held")
    with open(root / "held", "rb") as f:
        head = f.read(1000)
        out = run.cli("step", run.run_dir, "4").stdout
        assert "evicted 0 file(s)" in out and "deferred 1 open file(s)" in out, out
        assert re.search(r"done\s+held\s+\(open, 1 handle", out), out
        # Still there for everyone, and the descriptor reads on.
        assert_listed(root / "held", len(data))
        assert head + f.read() == data
        assert call(run.run_dir, "evicted")["records"] == []
        assert run.status()["eviction_deferred"] == ["held"]
        [event] = log_events(run, "eviction_deferred")
        assert event["paths"] == ["held"] and event["why"] == "open" and event["step"] == 4
    # Closed: it is looked at again, is still due, and goes.
    wait_for(lambda: not (root / "held").exists(), "the deferred file to go after its close")
    assert_gone(root / "held")
    [record] = call(run.run_dir, "evicted")["records"]
    assert (record["path"], record["reason"], record["evicted_step"]) == ("held", "done", 4)
    assert record["hash"] == content_hash(data)
    wait_for(lambda: chunk_files(run) == set(), "the chunks to go")


def test_writer_that_keeps_writing_across_the_step_loses_nothing(run_factory) -> None:
    r = run_factory("writer", "--max-age-steps", "2")
    log_path = r.root / "server.log"
    # A shell writer holding the file open, told when to write each line.
    writer = subprocess.Popen(["sh", "-c", 'exec > "$1"; while read -r l; do echo "$l"; done',
                               "sh", str(log_path)], stdin=subprocess.PIPE, text=True)
    expected = ""

    def line(i: int) -> None:
        nonlocal expected
        writer.stdin.write(f"line {i}\n")
        writer.stdin.flush()
        expected += f"line {i}\n"
        wait_for(lambda: log_path.exists() and log_path.stat().st_size == len(expected),
                 f"line {i} to land")

    try:
        for i in range(10):
            line(i)
        report = step_to(r, 5)  # the file is 5 steps old, past max_age 2
        assert report["evicted"] == [] and [(d["path"], d["reason"], d["why"])
                                            for d in report["deferred"]] == [
            ("server.log", "max_age", "open")]
        for i in range(10, 30):
            line(i)
    finally:
        writer.stdin.close()
        assert writer.wait(timeout=30) == 0
    # Written at step 5 until its close: young, so it stays, every line in it.
    wait_for(lambda: r.status()["eviction_deferred"] == [], "the look at it after its close")
    assert log_path.read_text() == expected
    assert vfsd_attr(log_path, "step") == "5"
    assert call(r.run_dir, "evicted")["records"] == []
    # Closed and old enough now: the next advance evicts it like any file.
    assert evicted_paths(step_to(r, 8)) == {"server.log": "max_age"}


# --------------------------------------------------------- quota and limits


quota_log_events = log_events


def test_quota_evicts_oldest_unpinned_then_refuses_with_enospc(run_factory) -> None:
    quota = 3 * MiB + MiB // 2
    r = run_factory("quota", "--quota-bytes", str(quota))
    root = r.root
    content = {name: os.urandom(MiB) for name in "abcdefg"}
    (root / "a").write_bytes(content["a"])
    step_to(r, 1)
    (root / "b").write_bytes(content["b"])
    step_to(r, 2)
    (root / "c").write_bytes(content["c"])
    step_to(r, 3)
    # 4 MiB would exceed 3.5 MiB: the oldest unpinned file (a) makes room.
    (root / "d").write_bytes(content["d"])
    assert_gone(root / "a")
    for n in "bcd":
        assert_present(root / n, content[n])
    recs = call(r.run_dir, "evicted")["records"]
    assert [(x["path"], x["reason"], x["step"]) for x in recs] == [("a", "quota", 0)]

    # Pin everything: nothing can be evicted any more.
    for n in "bcd":
        os.setxattr(root / n, "user.vfsd.pin", b"1")
    fd = os.open(root / "e", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with pytest.raises(OSError) as info:
            os.write(fd, content["e"])
            os.fsync(fd)
        assert info.value.errno == errno.ENOSPC
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    os.unlink(root / "e")

    dd = subprocess.run(
        ["dd", "if=/dev/zero", f"of={root / 'f'}", "bs=1M", "count=1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dd.returncode != 0
    assert "No space left on device" in dd.stderr
    os.unlink(root / "f")
    cp = subprocess.run(
        ["cp", str(root / "b"), str(root / "g")], capture_output=True, text=True, timeout=60
    )
    assert cp.returncode != 0 and "No space left on device" in cp.stderr
    os.unlink(root / "g")

    # The pinned files are intact, and the daemon said why it refused.
    for n in "bcd":
        assert_present(root / n, content[n])
    events = quota_log_events(r, "quota_exceeded")
    assert len(events) >= 3
    assert all(e["quota_bytes"] == quota and e["level"] == "warning" for e in events)

    # Unpin one: the next write evicts it (oldest unpinned) and succeeds.
    with connect(r.run_dir) as c:
        c.call("unpin", path="b")
    (root / "h").write_bytes(content["e"])
    assert_gone(root / "b")
    assert_present(root / "h", content["e"])
    # Exactly a and b were evicted: the refused writes evicted nothing else.
    recs = call(r.run_dir, "evicted")["records"]
    assert [(x["path"], x["reason"]) for x in recs] == [("a", "quota"), ("b", "quota")]
    assert r.status()["logical_bytes"] <= quota


def test_max_files_evicts_oldest_then_refuses_creates(run_factory) -> None:
    r = run_factory("maxfiles", "--max-files", "3")
    root = r.root
    for i in range(3):
        (root / f"f{i}").write_bytes(b"%d" % i)
        step_to(r, i + 1)
    (root / "f3").write_bytes(b"3")
    assert_gone(root / "f0")
    recs = call(r.run_dir, "evicted")["records"]
    assert [(x["path"], x["reason"]) for x in recs] == [("f0", "max_files")]
    assert sorted(os.listdir(root)) == ["f1", "f2", "f3"]
    # Directories do not count as files.
    (root / "dir").mkdir()

    for n in ("f1", "f2", "f3"):
        os.setxattr(root / n, "user.vfsd.pin", b"1")
    with pytest.raises(OSError) as info:
        os.open(root / "f4", os.O_WRONLY | os.O_CREAT, 0o644)
    assert info.value.errno == errno.ENOSPC
    touch = subprocess.run(["touch", str(root / "f5")], capture_output=True, text=True, timeout=30)
    assert touch.returncode != 0 and "No space left on device" in touch.stderr
    assert sorted(os.listdir(root)) == ["dir", "f1", "f2", "f3"]
    assert quota_log_events(r, "max_files_exceeded")


def test_refused_write_leaves_no_phantom_size(run_factory) -> None:
    r = run_factory("phantom", "--quota-bytes", str(MiB))
    root = r.root
    (root / "pinned").write_bytes(os.urandom(MiB - 1000))
    os.setxattr(root / "pinned", "user.vfsd.pin", b"1")
    dd = subprocess.run(
        ["dd", "if=/dev/urandom", f"of={root / 'f'}", "bs=64K", "count=4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dd.returncode != 0 and "No space left on device" in dd.stderr
    stored = call(r.run_dir, "ref", path="f")["size"]
    assert os.stat(root / "f").st_size == stored
    assert len((root / "f").read_bytes()) == stored


# ---------------------------------------------------------- step clock


def test_times_changed_on_an_open_file_do_not_make_it_younger(run) -> None:
    """The age counts from the last content change: times the kernel (or
    `touch`) sets on an open file, held until its release, must not stamp the
    step current at the release (the kernel sends RELEASE after close()
    returns, so a step advance can come first)."""
    path = run.root / "kept.txt"
    with open(path, "wb") as f:
        f.write(b"written at step 0\n")
        f.flush()
        os.fsync(f.fileno())
        step_to(run, 5)
        os.utime(f.fileno(), ns=(1_000_000_000, 2_000_000_000))
    wait_for(lambda: call(run.run_dir, "stats")["open_files"] == 0, "the release")
    doc = attr_doc(path)
    assert doc["mtime_ns"] == 2_000_000_000
    assert doc["step"] == 0
    # And so the default policy (max age 20) takes it at step 21, not 26.
    assert evicted_paths(step_to(run, 21)) == {"kept.txt": "max_age"}


def test_step_clock_persists_across_remount(run) -> None:
    root = run.root
    step_cli(run, 7)
    (root / "a").write_bytes(b"a")
    mark_done(root / "a")
    assert xattr(root / "a", "user.vfsd.step") == "7"
    run.remount()
    assert call(run.run_dir, "get_step") == {"step": 7}
    assert run.status()["step"] == 7
    assert xattr(root / "a", "user.vfsd.step") == "7"
    assert xattr(root / "a", "user.vfsd.status") == "done"
    (root / "b").write_bytes(b"b")
    assert xattr(root / "b", "user.vfsd.step") == "7"
    with connect(run.run_dir) as c:
        assert c.error("set_step", step=6)["code"] == "bad_request"
    assert evicted_paths(step_to(run, 10)) == {}
    assert evicted_paths(step_to(run, 11)) == {"a": "done"}
    run.umount()
    # Readable from the store while unmounted.
    assert run.status()["step"] == 11
    run.mount()
    assert call(run.run_dir, "get_step") == {"step": 11}


def test_step_advanced_without_eviction_is_finished_at_start(run) -> None:
    # A SIGKILL between a step advance's two transactions (store the step,
    # then evict) leaves the step advanced and nothing evicted. Simulated by
    # setting the step in the unmounted store: the next start evicts what the
    # policy says, with eviction records, before any name is visible.
    from vfsd.store.store import Store

    root = run.root
    for name in ("done", "active", "pinned"):
        (root / name).write_bytes(name.encode() * 1000)
    mark_done(root / "done")
    mark_done(root / "pinned")
    os.setxattr(root / "pinned", "user.vfsd.pin", b"1")
    big = os.urandom(3 * MiB)
    (root / "old_big").write_bytes(big)
    mark_done(root / "old_big")
    run.umount()
    store = Store(run.state_dir, create=False)
    store.set_step(4)
    store.close()
    run.mount()
    assert call(run.run_dir, "get_step") == {"step": 4}
    assert sorted(os.listdir(root)) == ["active", "pinned"]
    records = {r["path"]: r for r in call(run.run_dir, "evicted")["records"]}
    assert sorted(records) == ["done", "old_big"]
    assert {(r["evicted_step"], r["reason"]) for r in records.values()} == {(4, "done")}
    assert records["old_big"]["hash"] == content_hash(big)
    assert not list((run.state_dir / "chunks").glob("??/*")), "evicted chunks were kept"
    # Nothing more is due at the same step.
    assert evicted_paths(step_to(run, 4)) == {}
    run.umount()
    proc = run.cli("fsck", run.run_dir, "--json", check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["clean"], proc.stdout


# --------------------------------------------------------------- xattrs


def test_vfsd_xattr_values(run) -> None:
    root = run.root
    step_to(run, 3)
    cases = {
        "empty": b"",
        "small": b"hello\n",
        "at_inline_max": os.urandom(64 * 1024),
        "over_inline_max": os.urandom(64 * 1024 + 1),
        "big": os.urandom(3 * MiB + 5),
    }
    for name, data in cases.items():
        (root / name).write_bytes(data)
    for name, data in cases.items():
        p = root / name
        assert xattr(p, "user.vfsd.step") == "3"
        assert xattr(p, "user.vfsd.status") == "active"
        assert xattr(p, "user.vfsd.pin") == "0"
        assert xattr(p, "user.vfsd.hash") == content_hash(data), name
        tier = "inline" if len(data) <= 64 * 1024 else "chunked"
        assert xattr(p, "user.vfsd.tier") == tier, name
    # cat, as a shell user would read them.
    out = subprocess.run(
        ["cat", ".vfsd/attr/small"], cwd=root, capture_output=True, text=True, timeout=30,
        check=True,
    ).stdout
    doc = json.loads(out)
    assert doc["hash"] == content_hash(cases["small"])
    assert (doc["tier"], doc["step"], doc["path"]) == ("inline", 3, "small")

    # Growing past inline_max moves the file to the chunked tier; a rewrite restamps.
    step_to(run, 5)
    grown = cases["small"] + os.urandom(100_000)
    with open(root / "small", "ab") as f:
        f.write(grown[len(cases["small"]) :])
    assert xattr(root / "small", "user.vfsd.tier") == "chunked"
    assert xattr(root / "small", "user.vfsd.hash") == content_hash(grown)
    assert xattr(root / "small", "user.vfsd.step") == "5"
    os.truncate(root / "small", 10)
    assert xattr(root / "small", "user.vfsd.tier") == "inline"
    assert xattr(root / "small", "user.vfsd.hash") == content_hash(grown[:10])

    # Read-write xattrs take effect and read back.
    p = root / "empty"
    os.setxattr(p, "user.vfsd.status", b"done")
    os.setxattr(p, "user.vfsd.pin", b"1")
    os.setxattr(p, "user.vfsd.step", b"1")
    assert (
        xattr(p, "user.vfsd.status"),
        xattr(p, "user.vfsd.pin"),
        xattr(p, "user.vfsd.step"),
    ) == ("done", "1", "1")
    ref = call(run.run_dir, "ref", path="empty")
    assert (ref["status"], ref["step"]) == ("done", 1)
    os.setxattr(p, "user.vfsd.pin", b"0")
    # Setting the step back makes it older: done at step 1, now step 5 -> evicted.
    assert evicted_paths(call(run.run_dir, "evict")) == {"empty": "done"}


def test_vfsd_xattrs_refuse_bad_writes(run) -> None:
    root = run.root
    p = root / "f"
    p.write_bytes(b"content")
    (root / "d").mkdir()
    before = {
        n: xattr(p, n)
        for n in (
            "user.vfsd.step",
            "user.vfsd.status",
            "user.vfsd.pin",
            "user.vfsd.hash",
            "user.vfsd.tier",
        )
    }

    for name in ("user.vfsd.hash", "user.vfsd.tier"):
        with pytest.raises(OSError) as info:
            os.setxattr(p, name, b"00")
        assert info.value.errno == errno.EPERM, name
    for name in ("user.vfsd.hash", "user.vfsd.step", "user.vfsd.status"):
        with pytest.raises(OSError) as info:
            os.removexattr(p, name)
        assert info.value.errno == errno.EPERM, name
    proc = set_xattr_tool(p, "user.vfsd.hash", "0123")
    assert proc.returncode != 0 and "Operation not permitted" in proc.stderr

    bad = [
        ("user.vfsd.status", b"finished"),
        ("user.vfsd.status", b""),
        ("user.vfsd.pin", b"2"),
        ("user.vfsd.pin", b"yes please"),
        ("user.vfsd.step", b"abc"),
        ("user.vfsd.step", b"-1"),
        ("user.vfsd.step", b"1.5"),
        ("user.vfsd.nonsense", b"1"),
    ]
    for name, value in bad:
        with pytest.raises(OSError) as info:
            os.setxattr(p, name, value)
        assert info.value.errno == errno.EINVAL, (name, value)
    proc = set_xattr_tool(p, "user.vfsd.status", "finished")
    assert proc.returncode != 0 and "Invalid argument" in proc.stderr
    # Per-file policy does not apply to directories.
    with pytest.raises(OSError) as info:
        os.setxattr(root / "d", "user.vfsd.status", b"done")
    assert info.value.errno == errno.EINVAL

    after = {n: xattr(p, n) for n in before}
    assert after == before
    # Ordinary user xattrs still work next to the vfsd ones.
    os.setxattr(p, "user.note", b"kept")
    assert attr_doc(p)["xattrs"]["user.note"] == "kept"
    assert_present(p, b"content")


def test_step_xattr_out_of_range_is_refused(run) -> None:
    f = run.root / "f"
    f.write_bytes(b"x")
    for bad in (str(1 << 70), "-1", "seven"):
        with pytest.raises(OSError) as exc:
            os.setxattr(f, "user.vfsd.step", bad.encode())
        assert exc.value.errno == errno.EINVAL
    assert vfsd_attr(f, "step") == "0"
