"""Which tool call made and last changed each file, recorded with no help from the model.

A real Deep Agent (scripted model) on a real mount: write_file, edit_file,
execute (a background process, a detached one, a script that forks) and an
offloaded tool output are each attributed to their call; the shell outside
any tool is "no tool call". Seen in `.vfsd/attr/PATH`, in `vfsd ref`, after
a remount and after a restore.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("deepagents")

from langchain_core.messages import AIMessage  # noqa: E402
from test_deepagents import run_agent, tool_call, turn  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.daemon import toolcalls  # noqa: E402
from mount_tool.deepagents import VfsdBackend  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]


def attrs(root, path: str) -> dict:
    return json.loads((root / ".vfsd" / "attr" / path).read_text())


def who(doc: dict | None) -> str | None:
    return None if doc is None else f"{doc['tool']}:{doc['id']}"


@pytest.fixture
def mnt(run):
    m = mount_tool.Mount.attach(run.run_dir)
    yield m
    m.detach()


EXECUTE = (
    "echo a > fg.txt; "
    "(sleep 0.2; echo b > bg.txt) & "
    "setsid sh -c 'echo c > detached.txt' </dev/null >/dev/null 2>&1 & "
    "python3 -c \"import os; pid = os.fork(); "
    "open('forked.txt' if pid == 0 else 'parent.txt', 'w').write('x'); "
    "os._exit(0) if pid == 0 else os.waitpid(pid, 0)\"; "
    "echo more >> notes/plan.md; "
    "sleep 1"
)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_every_file_names_its_tool_call(run, mnt):
    script = [
        turn(tool_call("write_file", "w1", file_path="/notes/plan.md", content="step one\n")),
        turn(tool_call("edit_file", "e1", file_path="/notes/plan.md", old_string="one",
                       new_string="two")),
        turn(tool_call("write_file", "w2", file_path="/notes/other.md", content="other\n")),
        turn(tool_call("execute", "x1", command=EXECUTE)),
        turn(tool_call("execute", "x2", command="seq 1 200000")),  # offloaded output
        AIMessage(content="done"),
    ]
    _, _, state = run_agent(mnt, script)
    root = run.root
    # The shell outside any tool.
    (root / "shell.txt").write_text("from the shell\n")
    with open(root / "notes" / "other.md", "a") as f:
        f.write("appended by the shell\n")

    plan = attrs(root, "notes/plan.md")
    assert who(plan["made_by"]) == "write_file:w1"
    assert who(plan["changed_by"]) == "execute:x1"  # `>>` in the command, after the edit
    assert plan["made_by"]["thread"] == "t1"
    assert isinstance(plan["made_by"]["step"], int)
    other = attrs(root, "notes/other.md")
    assert who(other["made_by"]) == "write_file:w2"
    assert other["changed_by"] is None  # the shell changed it last
    for name in ("fg.txt", "bg.txt", "detached.txt", "forked.txt", "parent.txt"):
        doc = attrs(root, name)
        assert who(doc["made_by"]) == "execute:x1", name
        assert who(doc["changed_by"]) == "execute:x1", name
    offloaded = [k for k in state["files"] if k.startswith("/large_tool_results/")]
    assert len(offloaded) == 1
    doc = attrs(root, offloaded[0].lstrip("/"))
    assert who(doc["made_by"]) == "execute:x2"
    shell = attrs(root, "shell.txt")
    assert shell["made_by"] is None and shell["changed_by"] is None

    # The reference says the same; graph state keeps only the FileRef keys.
    ref = json.loads(run.cli("ref", run.run_dir, "notes/plan.md").stdout)
    assert who(ref["made_by"]) == "write_file:w1" and who(ref["changed_by"]) == "execute:x1"
    assert set(state["files"]["/notes/plan.md"]) == set(mount_tool.refs.REF_KEYS)

    # Kept in the store: a remount shows the same.
    sid = run.cli("snapshot", run.run_dir).stdout.strip()
    run.remount()
    assert who(attrs(root, "notes/plan.md")["changed_by"]) == "execute:x1"
    # A restore brings back each file's provenance with its content.
    (root / "fg.txt").write_text("overwritten by the shell\n")
    assert attrs(root, "fg.txt")["changed_by"] is None
    run.cli("restore", run.run_dir, sid)
    assert who(attrs(root, "fg.txt")["changed_by"]) == "execute:x1"


def test_edit_keeps_the_maker_and_names_the_editor(run, mnt):
    backend = VfsdBackend(mnt)
    with toolcalls.running("write_file", "c1", "thread-a"):
        assert backend.write("/a.txt", "alpha\n").error is None
    with toolcalls.running("edit_file", "c2", "thread-a"):
        assert backend.edit("/a.txt", "alpha", "beta").error is None
    doc = attrs(run.root, "a.txt")
    assert who(doc["made_by"]) == "write_file:c1"
    assert who(doc["changed_by"]) == "edit_file:c2"
    assert doc["changed_by"]["thread"] == "thread-a"
    # Overwriting an existing file through write_file: a change, not a new maker.
    with toolcalls.running("write_file", "c3"):
        mnt.write("a.txt", "gamma\n")
    doc = attrs(run.root, "a.txt")
    assert who(doc["made_by"]) == "write_file:c1" and who(doc["changed_by"]) == "write_file:c3"
    # Outside any tool call the program's own writes are "no tool call".
    mnt.write("b.txt", "b\n")
    assert attrs(run.root, "b.txt")["made_by"] is None


def test_a_bad_tag_is_refused_and_changes_nothing(run):
    c = mount_tool.ControlClient(run.state_dir / "vfsd.sock")
    assert c.ping()  # tags count only from a process that reached the control socket
    c.close()
    target = run.root / "t.txt"
    target.write_text("t\n")
    for value in (b"not json", b"[1]", b'{"tool": "x"}', b'{"tool": "x", "id": ""}',
                  json.dumps({"tool": "x" * 200, "id": "1"}).encode(),
                  json.dumps({"tool": "x", "id": "1", "step": -1}).encode(),
                  json.dumps({"tool": "x", "id": "1", "thread": "t" * 70000}).encode()[:4000],
                  json.dumps({"key": "00000000000000ab"}).encode(), b"{" * 5000):
        with pytest.raises(OSError) as err:
            os.setxattr(target, toolcalls.CALL_XATTR, value)
        assert err.value.errno == 22, value  # EINVAL
    assert attrs(run.root, "t.txt")["changed_by"] is None
    assert target.read_text() == "t\n"
    # A tag on a closed file names its last changer at once.
    os.setxattr(target, toolcalls.CALL_XATTR, json.dumps({"tool": "fix", "id": "9"}).encode())
    assert who(attrs(run.root, "t.txt")["changed_by"]) == "fix:9"
    assert attrs(run.root, "t.txt")["made_by"] is None


#: writes each path given with a forged `user.vfsd.call`; says what the daemon answered
FORGE = r"""
import json, os, sys
forged = [{"tool": "write_file", "id": "call_legit", "thread": "t1"},
          {"tool": "human_review", "id": "approved-by-alice", "thread": "ops"}]
for path, call in zip(sys.argv[1:], forged):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755)
    try:
        os.setxattr(fd, "user.vfsd.call", json.dumps(call).encode())
        print("tagged", path, flush=True)
    except OSError as exc:
        print("refused", exc.errno, path, flush=True)
    os.write(fd, b"forged\n")
    os.close(fd)
"""


def test_a_process_that_never_reached_the_control_socket_cannot_name_a_call(run):
    """Issue 28, item 2: any process could set `user.vfsd.call` with any tool,
    id and thread."""
    proc = subprocess.run([sys.executable, "-c", FORGE, str(run.root / "report.md")],
                          capture_output=True, text=True, timeout=30)
    assert proc.stdout.split()[:2] == ["refused", str(errno.EPERM)], proc.stdout + proc.stderr
    doc = attrs(run.root, "report.md")
    assert doc["made_by"] is None and doc["changed_by"] is None
    # The agent program, which holds a control connection, still names its calls.
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        with toolcalls.running("write_file", "w1", "t1"):
            m.write("report.md", "legit\n")
    finally:
        m.detach()
    assert who(attrs(run.root, "report.md")["changed_by"]) == "write_file:w1"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_command_inside_execute_cannot_forge_provenance(run, mnt):
    """A command overwrote /report.md as `write_file call_legit` and made
    /dropper.sh as `human_review approved-by-alice, thread ops`: whatever a
    command does is its execute call's."""
    backend = VfsdBackend(mnt)
    with toolcalls.running("write_file", "w1", "t1"):
        assert backend.write("/report.md", "legit\n").error is None
    (run.root / "forge.py").write_text(FORGE)
    with toolcalls.running("execute", "x1", "t1"):
        out = backend.execute("python3 /forge.py /report.md /dropper.sh").output
    assert out.count(f"refused {errno.EPERM}") == 2, out
    report, dropper = attrs(run.root, "report.md"), attrs(run.root, "dropper.sh")
    assert who(report["made_by"]) == "write_file:w1"
    assert who(report["changed_by"]) == "execute:x1"
    assert who(dropper["made_by"]) == who(dropper["changed_by"]) == "execute:x1"
    assert dropper["made_by"]["thread"] == "t1"


@pytest.mark.parametrize("thread", ["t" * 300, "a\x01b\nc\x1b[2J", "\ud800 lone", "x" * 65536,
                                    "\x07" * 20000],
                         ids=["300 chars", "control chars", "lone surrogate", "64 KiB",
                              "64 KiB escaped"])
def test_every_thread_id_a_runs_accepts_is_recorded_as_it_is(run, thread):
    """Issue 28, item 10: a thread id over 256 characters, or with control
    characters, was refused by the daemon and the file recorded no author,
    silently. Runs accepts any string up to 64 KiB (UTF-8)."""
    from mount_tool.runs import thread_key

    assert thread_key(thread) == thread
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        with toolcalls.running("write_file", "w1", thread):
            m.write("a.txt", "a\n")
        backend = VfsdBackend(m)
        with toolcalls.running("edit_file", "e1", thread):
            assert backend.edit("/a.txt", "a", "b").error is None
    finally:
        m.detach()
    doc = attrs(run.root, "a.txt")
    assert who(doc["made_by"]) == "write_file:w1" and doc["made_by"]["thread"] == thread
    assert who(doc["changed_by"]) == "edit_file:e1" and doc["changed_by"]["thread"] == thread


def test_call_registration_is_checked(run):
    from conftest import vfsd_cli  # noqa: F401 - the daemon is the one under test

    c = mount_tool.ControlClient(run.state_dir / "vfsd.sock")
    try:
        for bad in ({"call": {"tool": "x", "id": "1"}},
                    {"call": {"tool": "x", "id": "1"}, "cgroup": "../etc"},
                    {"call": {"tool": "x", "id": "1"}, "cgroup": "a/b"},
                    {"call": {"tool": "x", "id": "1"}, "pidns": "net:[1]"},
                    {"call": "x", "cgroup": "g"},
                    {"call": {"id": "1"}, "cgroup": "g"}):
            with pytest.raises(mount_tool.ControlError) as err:
                c.call("call_begin", **bad)
            assert err.value.code == "bad_request", bad
        key = c.call("call_begin", call={"tool": "x", "id": "1"}, cgroup="g")["key"]
        assert c.call("call_end", key=key) == {"ended": True}
        assert c.call("call_end", key=key) == {"ended": False}
        with pytest.raises(mount_tool.ControlError):
            c.call("call_end", key="zz")
    finally:
        c.close()


@pytest.mark.parametrize("isolation, use_cgroups", [
    ("bwrap", False),  # the sandbox's pid namespace
    ("none", False),   # the host shell's session
    ("none", True),    # the call's cgroup
])
def test_attribution_without_the_agent(run, isolation, use_cgroups):
    """Sandbox.run's hook, however the command is held: its files are the call's."""
    from mount_tool.sandbox import Sandbox

    if isolation == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    sandbox = Sandbox(run.root, isolation=isolation, use_cgroups=use_cgroups)
    c = mount_tool.ControlClient(run.state_dir / "vfsd.sock")
    seen: list[dict] = []

    def confined(where):
        seen.append(where)
        c.call("call_begin", call={"tool": "execute", "id": f"{isolation}-{use_cgroups}"},
               **where)

    try:
        out = sandbox.run("echo x > made.txt; (echo y > child.txt) & wait", 30,
                          on_confined=confined)
    finally:
        c.close()
    assert out.exit_code == 0, out.output
    kind = next(iter(seen[0]))
    if use_cgroups and "cgroup" not in seen[0]:
        pytest.skip("no usable cgroup here")
    assert kind == {("bwrap", False): "pidns", ("none", False): "session"}.get(
        (isolation, use_cgroups), "cgroup")
    for name in ("made.txt", "child.txt"):
        assert who(attrs(run.root, name)["made_by"]) == f"execute:{isolation}-{use_cgroups}"


def test_a_process_is_looked_up_once(run):
    """While a call is registered, a process's first request reads /proc once;
    the next thousand read nothing."""
    c = mount_tool.ControlClient(run.state_dir / "vfsd.sock")
    try:
        assert c.call("perf", watch=0)["provenance"]["proc_reads"] == 0
        target = run.root / "p.txt"
        target.write_text("p")
        for _ in range(100):  # no call registered: no lookup at all
            os.close(os.open(target, os.O_WRONLY))
        assert c.call("perf", watch=0)["provenance"]["proc_reads"] == 0
        key = c.call("call_begin", call={"tool": "execute", "id": "q"}, cgroup="no-such-group")
        for _ in range(1000):
            os.close(os.open(target, os.O_WRONLY))
        figures = c.call("perf", watch=0)["provenance"]
        assert figures["proc_reads"] == 1 and figures["active_calls"] == 1
        c.call("call_end", key=key["key"])
    finally:
        c.close()
    assert attrs(run.root, "p.txt")["changed_by"] is None


def test_a_schema_2_store_is_upgraded_in_place(tmp_path):
    """Inode records of schema 2 are 16 bytes shorter: they read as made and
    changed by an unknown call, and the first writer upgrades the store."""
    from conftest import as_old_schema

    from vfsd.store import store as store_mod
    from vfsd.store.inode import _FORMAT_V2, UNKNOWN_CALL
    from vfsd.store.store import Store

    st = Store(tmp_path / "s")
    ino = st.create(st.root_ino, b"old.txt", 0o100644, 0, 0).ino
    st.close()
    as_old_schema(tmp_path / "s", 2, _FORMAT_V2.size, drop_dbs=(b"call", b"steplog"))

    ro = Store(tmp_path / "s", readonly=True, create=False)  # read as it is
    assert ro.get_inode(ino).made_by == UNKNOWN_CALL
    assert ro.get_call(5) is None and ro.step_records() == []
    ro.close()
    st = Store(tmp_path / "s")
    assert st.get_inode(ino).changed_by == UNKNOWN_CALL
    with st.txn() as txn:
        assert int.from_bytes(txn.get(b"schema", db=st.db["meta"]), "big") == \
            store_mod.SCHEMA_VERSION
    st.set_attrs(ino, mode=0o600)  # rewritten whole: the unknown keys stay unknown
    assert st.get_inode(ino).made_by == UNKNOWN_CALL
    st.close()
