"""The execute sandbox on a real mount with real bubblewrap (mount_tool/sandbox/).

One path space: `/` inside a command is the run's mount root, so the file
tools and the shell name every file the same way. Isolation: attempts to
write or read outside the run's files, to see the host's processes, to follow
symlinks out, to fork without bound, to leave processes behind and to reach
the network all fail. Limits bite and say so. Without bubblewrap, execute
refuses with an error that says what to install.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import open_files_under
from test_deepagents import RecordingModel, tool_call, tool_result, turn

pytest.importorskip("deepagents")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.deepagents import VfsdBackend, create_vfsd_deep_agent  # noqa: E402
from mount_tool.sandbox import (  # noqa: E402
    SANDBOX_DIRS,
    ExecLimits,
    Sandbox,
    SandboxUnavailable,
    cgroups,  # noqa: E402
)

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]


@pytest.fixture
def mnt(run):
    m = mount_tool.Mount.attach(run.run_dir)
    yield m
    m.detach()


@pytest.fixture
def token():
    """A unique name for the paths a test command writes.

    Should a regression run commands on the host, they would write these host
    paths: the names collide with nothing, and whatever appeared under them is
    removed afterwards.
    """
    name = f"vfsd-sandbox-test-{uuid.uuid4().hex[:8]}"
    yield name
    for parent in ("/", "/usr", "/usr/bin", "/etc", "/tmp"):
        path = Path(parent, name)
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def sleep_marker() -> str:
    """A unique `sleep` argument of under an hour, to find the process by."""
    return f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6:06d}"


def host_processes_with(marker: str, kill: bool = True) -> list[str]:
    """Command lines of host processes whose arguments contain `marker` (then killed)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline}")
            if kill:  # a regression must not leave them running on a shared machine
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
    return found


# -- one path space ---------------------------------------------------------------


def test_agent_writes_then_runs_by_absolute_path(mnt):
    """The turn that failed before: write_file /app/main.py, then `python3 /app/main.py`."""
    main = "import sys\nprint('hello from', sys.argv[0])\nopen('/app/out.txt', 'w').write('ran')\n"
    recording = RecordingModel([
        turn(tool_call("write_file", "w1", file_path="/app/main.py", content=main)),
        turn(tool_call("execute", "x1", command="python3 /app/main.py && cat /app/out.txt")),
        turn(tool_call("read_file", "r1", file_path="/app/out.txt")),
        AIMessage(content="done"),
    ])
    agent = create_vfsd_deep_agent(mnt, recording.model, checkpointer=InMemorySaver())
    state = agent.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t"}})
    ran = tool_result(state, "x1").content
    assert "hello from /app/main.py" in ran and "ran" in ran, ran
    assert "succeeded" in ran
    assert "ran" in tool_result(state, "r1").content
    assert (mnt.root / "app" / "out.txt").read_text() == "ran"
    assert set(state["files"]) == {"/app/main.py", "/app/out.txt"}
    # The model was told the convention.
    system = recording.calls[0][0]
    assert isinstance(system, SystemMessage)
    assert "share one filesystem" in system.text and "/app/main.py" in system.text


def test_file_tools_and_shell_see_the_same_files(mnt, token):
    b = VfsdBackend(mnt)
    top = f"/{token}"
    work, links = f"{top}/work", f"{top}/links"
    blob = bytes(range(256)) * 64
    assert b.write(f"{work}/notes/plan.md", "# plan\n- one\n").error is None
    assert b.upload_files([(f"{work}/data/blob.bin", blob)])[0].error is None
    made = b.execute(
        f"mkdir -p {work}/out/deep {links} && printf 'from the shell\\n' > "
        f"'{work}/out/deep/é ü.txt' && ln -s ../work/notes/plan.md {links}/plan.md"
    )
    assert made.exit_code == 0, made.output
    # Listings agree.
    found = b.execute(f"cd {work} && find . \\( -type f -o -type l \\)").output.split("\n")
    globbed = ["." + m["path"].removeprefix(work) for m in b.glob("**/*", work).matches]
    assert sorted(f for f in found if f) == sorted(globbed), (found, globbed)
    assert len(globbed) == 3
    # Contents agree, both ways.
    sums = b.execute(f"sha256sum {work}/data/blob.bin '{work}/out/deep/é ü.txt'").output
    down = b.download_files([f"{work}/data/blob.bin", f"{work}/out/deep/é ü.txt"])
    assert [line.split()[0] for line in sums.split("\n")[:2]] == [
        hashlib.sha256(d.content).hexdigest() for d in down
    ]
    assert down[0].content == blob
    assert b.read(f"{links}/plan.md").file_data["content"] == "# plan\n- one"
    assert b.execute(f"cat {links}/plan.md").output == "# plan\n- one\n"
    # An edit through the file tools is what the shell reads next.
    assert b.edit(f"{work}/notes/plan.md", "one", "two").error is None
    assert b.execute(f"grep -c two {work}/notes/plan.md").output.strip() == "1"
    # The mount points of the sandbox are not the run's files, for either;
    # /tmp is, for both.
    assert sorted(e["path"] for e in b.ls("/").entries) == sorted([top, "/tmp"])
    assert sorted(b.execute("ls -A /").output.split()) == sorted([token, "tmp"])


def test_sandbox_dirs_are_refused_by_the_file_tools_with_a_reason(mnt, token):
    b = VfsdBackend(mnt, tmp="call")
    written = b.write("/tmp/scratch.txt", "x")
    assert "private to each execute call" in written.error
    assert "read-only system directory" in b.write("/usr/local/bin/tool", "x").error
    assert "/etc is" in b.read("/etc/passwd").error
    assert "/run is private to each execute call" in b.write("/run/x", "x").error
    assert b.upload_files([("/proc/x", b"x")])[0].error == "invalid_path"
    assert b.ls("/dev").error
    # tmp="call": what one call leaves in /tmp, the next does not see.
    assert b.execute(f"echo left > /tmp/{token} && cat /tmp/{token}").output == "left\n"
    assert b.execute("ls -A /tmp").output == ""
    assert os.listdir(mnt.root) == ["tmp"]  # its mount point, empty
    assert os.listdir(mnt.root / "tmp") == []


def test_tmp_is_kept_across_calls_and_evicted_like_done_files(mnt):
    """The default /tmp is the run's own `tmp` directory: a second call finds
    what the first left, the file tools see the same files, and what commands
    leave there is marked done and evicted after `done_retention_steps`."""
    b = VfsdBackend(mnt)
    assert "/tmp is yours and is kept from one command to the next" in b.prompt_note()
    made = b.execute("cd /tmp && echo 'print(6 * 7)' > calc.py && mkdir -p cache && "
                     "echo warm > cache/entry && echo $HOME")
    assert made.output == "/tmp\n", made.output
    again = b.execute("python3 /tmp/calc.py; cat ~/cache/entry")
    assert again.output == "42\nwarm\n"
    assert b.read("/tmp/calc.py").file_data["content"] == "print(6 * 7)"
    assert b.write("/tmp/notes.txt", "from the file tools").error is None
    assert b.execute("cat /tmp/notes.txt").output == "from the file tools"
    assert (mnt.root / "tmp" / "cache" / "entry").read_text() == "warm\n"
    assert mnt.ref("tmp/calc.py")["status"] == "done"
    assert mnt.ref("tmp/cache/entry")["status"] == "done"
    assert mnt.ref("tmp/notes.txt")["status"] == "done"  # the file tools' too
    # done_retention_steps is 3 on the default mount: past it they leave.
    mnt.set_step(mnt.get_step() + 5)
    assert not (mnt.root / "tmp" / "calc.py").exists()
    assert (mnt.root / "tmp").is_dir()
    assert b.execute("ls /tmp/calc.py 2>&1; echo fresh > /tmp/x; cat /tmp/x").output.endswith(
        "No such file or directory\nfresh\n")
    # Removed altogether, it comes back with the next call.
    shutil.rmtree(mnt.root / "tmp")
    assert b.execute("echo again > /tmp/y && cat /tmp/y").output == "again\n"


def test_each_thread_of_a_runs_keeps_its_own_tmp(tmp_path):
    """In a real agent run: /tmp survives from one execute call to the next,
    and each thread of a Runs has its own."""
    def calls(name: str) -> list[AIMessage]:
        return [
            turn(tool_call("execute", f"{name}1",
                           command=f"cat /tmp/who 2>&1; echo {name} > /tmp/who")),
            turn(tool_call("execute", f"{name}2", command="cat /tmp/who")),
            AIMessage(content="done"),
        ]

    recording = RecordingModel([*calls("A"), *calls("B")])
    with mount_tool.runs(tmp_path / "runs") as runs:
        agent = create_vfsd_deep_agent(runs, recording.model, checkpointer=InMemorySaver())
        states = {
            name: agent.invoke({"messages": [HumanMessage("go")]},
                               {"configurable": {"thread_id": name}})
            for name in ("A", "B")
        }
        for name, state in states.items():
            assert "No such file or directory" in tool_result(state, f"{name}1").content
            assert tool_result(state, f"{name}2").content.startswith(f"{name}\n")
            with runs.use(name) as m:
                assert (m.root / "tmp" / "who").read_text() == f"{name}\n"
            # Scratch files stay out of the graph state.
            assert not any(k.startswith("/tmp") for k in state.get("files", {}))


def test_the_mount_points_match_the_daemons():
    """mount_tool keeps its own copy of the list (it never imports vfsd)."""
    from vfsd.fuse import ctldir

    assert sorted(SANDBOX_DIRS) == sorted(n.decode() for n in ctldir.SANDBOX_DIRS)


# -- escape attempts ----------------------------------------------------------------


def test_cannot_write_or_read_outside_the_runs_files(mnt, tmp_path, token):
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.txt").write_text("CANARY-SECRET")
    b = VfsdBackend(mnt)
    res = b.execute(
        f"echo pwned > {canary}/written; cat {canary}/secret.txt; "
        f"echo pwned > /usr/{token}; echo pwned > /etc/{token}; echo pwned > /bin/{token}; "
        f"cat /etc/shadow; ls {mnt.root}; echo pwned > /.vfsd/x; echo done"
    )
    assert "done" in res.output
    assert "CANARY-SECRET" not in res.output
    assert not (canary / "written").exists()
    assert not any(Path(p, token).exists() for p in ("/usr", "/etc", "/usr/bin"))
    assert "Read-only file system" in res.output
    assert "/etc/shadow: Permission denied" in res.output
    # The write to the host path went into the sandbox's private /tmp, not the host's.
    assert not (canary / "written").exists()


def test_cannot_see_or_signal_host_processes(mnt):
    b = VfsdBackend(mnt)
    res = b.execute("ls /proc | grep -c '^[0-9]'; cat /proc/*/cmdline | tr '\\0' ' '; echo")
    count = int(res.output.split("\n")[0])
    assert count < 10, res.output  # the sandbox's own few processes
    assert "pytest" not in res.output
    assert str(os.getpid()) not in b.execute(f"ls /proc/{os.getpid()} 2>&1; echo").output.split()
    killed = b.execute(f"kill -0 {os.getpid()} && echo reachable")
    assert "reachable" not in killed.output


def test_symlinks_to_host_paths_lead_nowhere(mnt, tmp_path, token):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET")
    os.symlink(secret, mnt.root / "leak")
    os.symlink("/etc/shadow", mnt.root / "shadow")
    os.symlink("../../../../../../../../" + str(secret).lstrip("/"), mnt.root / "climb")
    b = VfsdBackend(mnt)
    res = b.execute("cat /leak /shadow /climb; echo done")
    assert "HOST-SECRET" not in res.output and "done" in res.output
    for name in ("/leak", "/climb"):
        assert b.read(name).error and "HOST-SECRET" not in (b.read(name).error or "")
    assert b.download_files(["/leak"])[0].content is None
    # A link the command makes to a host path is just as empty.
    made = b.execute(f"ln -s {secret} /{token} && cat /{token}; echo done")
    assert "HOST-SECRET" not in made.output


def test_a_masked_file_replaced_while_the_sandbox_starts_costs_no_call(mnt, token,
                                                                       monkeypatch):
    """`useradd` and `passwd` replace /etc/shadow by a rename; when that lands
    while bwrap mounts /dev/null over it, bwrap fails before the command runs
    ("Can't bind mount ... No such file or directory"): once 1 call in 20 with
    this churn, and the command said exit 1 with bwrap's words. The set-up is
    tried again, and no command runs twice."""
    from mount_tool.sandbox import sandbox as sandbox_module

    masked = Path("/etc", token)
    masked.write_text("secret\n")
    monkeypatch.setattr(sandbox_module, "MASKED_PATHS",
                        (*sandbox_module.MASKED_PATHS, str(masked)))
    # A real rename is one moment; this churn never stops, so a machine under
    # load may lose several set-ups in a row.
    monkeypatch.setattr(sandbox_module, "SETUP_ATTEMPTS", 10, raising=False)
    stop = threading.Event()

    def churn():
        fresh = masked.with_name(token + ".new")
        while not stop.is_set():
            fresh.write_text("secret\n")
            os.rename(fresh, masked)
            time.sleep(0.001)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        b = VfsdBackend(mnt)
        results = [b.execute(f"echo {i} >> /ran.txt && echo call {i}") for i in range(60)]
    finally:
        stop.set()
        churner.join()
    failed = [r.output for r in results if r.exit_code != 0]
    assert failed == [], failed[:3]
    assert [r.output for r in results] == [f"call {i}\n" for i in range(60)]
    assert (mnt.root / "ran.txt").read_text().split() == [str(i) for i in range(60)]


def test_fork_bomb_is_bounded_by_the_process_limit(mnt):
    b = VfsdBackend(mnt, limits=ExecLimits(processes=32, timeout=60))
    if "cgroup" not in b.sandbox_info()["limits"]["processes"]["enforced_by"]:
        pytest.skip("no pids cgroup here: a fork bomb as root would not be bounded")
    marker = uuid.uuid4().hex
    bomb = f"bomb{marker}"
    res = b.execute(f"{bomb}() {{ {bomb} | {bomb} & }}; {bomb}; sleep 3; echo survived", timeout=30)
    assert "survived" in res.output, res.output[-2000:]
    assert "process limit (32) refused" in res.output
    assert host_processes_with(bomb) == []


def test_detached_processes_are_gone_when_the_call_returns(mnt):
    b = VfsdBackend(mnt)
    marker = sleep_marker()
    res = b.execute(
        f"setsid sleep 1{marker} & nohup sleep 2{marker} >/dev/null 2>&1 & disown; "
        f"(sleep 3{marker} &); echo started"
    )
    assert res.output == "started\n" and res.exit_code == 0
    assert host_processes_with(marker) == []
    assert open_files_under(mnt.root) == []


# -- nothing left behind, whatever bwrap's timing ----------------------------------


@contextlib.contextmanager
def descriptors_above(number: int):
    """Hold open files until new descriptors get numbers above `number`, as in a
    server with many threads' mounts open (select() cannot watch those)."""
    held = []
    try:
        while not held or held[-1] < number:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)


def slow_bwrap(tmp_path: Path, seconds: float) -> str:
    """A bwrap that takes `seconds` to start a command (a loaded machine's); the
    availability probe, which passes no --args, runs at once."""
    real = shutil.which("bwrap")
    if real is None:
        pytest.skip("bubblewrap is not installed")
    path = tmp_path / "slow-bwrap"
    path.write_text(f'#!/bin/sh\n[ "$1" = --args ] && sleep {seconds}\nexec {real} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_descriptors_past_1024_leave_no_process_behind(mnt, tmp_path):
    """What threads_bench met: with descriptors numbered past select()'s 1024 the
    call gave up on bwrap's child PID and closed the pipe bwrap writes it to;
    bwrap, writing later, died of SIGPIPE before waking its child, which then
    waited for it for ever (keeping the run's mount busy)."""
    b = VfsdBackend(mnt, bwrap=slow_bwrap(tmp_path, 0.5))
    marker = uuid.uuid4().hex
    with descriptors_above(1100):
        ran = b.execute(f": {marker}; echo ran")
        timed_out = b.execute(f": {marker}; sleep 30", timeout=1)
    assert host_processes_with(marker) == []  # (killed, should a regression leave them)
    assert ran.output == "ran\n" and ran.exit_code == 0, ran.output
    assert timed_out.exit_code == 124, timed_out.output


def test_bwrap_slower_than_the_wall_time_leaves_nothing(mnt, tmp_path):
    """bwrap has not said which child it made when the wall time is up: it is
    stopped, and its children found and killed, before it is."""
    b = VfsdBackend(mnt, bwrap=slow_bwrap(tmp_path, 10))
    marker = uuid.uuid4().hex
    res = b.execute(f": {marker}; echo ran", timeout=1)
    assert host_processes_with(marker) == []
    assert res.exit_code == 124 and "ran" not in res.output, res.output


def test_bwrap_killed_before_it_names_its_child_leaves_nothing(mnt, tmp_path):
    """bwrap dies after its clone, before its --info-fd JSON (strace kills it at
    that first write): its child, which sets no parent-death signal before it
    forks, would wait for it for ever; bwrap ran in the call's cgroup, so the
    group's kill ends the child."""
    strace, real = shutil.which("strace"), shutil.which("bwrap")
    if strace is None or real is None:
        pytest.skip("needs strace and bubblewrap")
    if not cgroups.available():
        pytest.skip("no cgroup here: a child bwrap never named cannot be found")
    path = tmp_path / "killed-bwrap"
    path.write_text(
        f'#!/bin/sh\n[ "$1" = --args ] && exec {strace} -o /dev/null -e trace=write '
        f'-e inject=write:signal=KILL:when=1 {real} "$@"\nexec {real} "$@"\n')
    path.chmod(0o755)
    b = VfsdBackend(mnt, bwrap=str(path))
    marker = uuid.uuid4().hex
    res = b.execute(f": {marker}; echo ran", timeout=30)
    assert host_processes_with(marker) == []
    assert "ran" not in res.output and res.exit_code != 0, res.output


@pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1",
                    reason="stress of many concurrent calls under CPU load: VFSD_LONG=1")
@pytest.mark.timeout(600)
def test_concurrent_calls_under_load_leave_nothing(mnt):
    """40 threads at once beside CPU hogs, short commands and ones the wall time
    kills, with descriptors past 1024: every call answers, nothing stays."""
    marker = uuid.uuid4().hex
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    failures: list[str] = []

    def calls(i: int) -> None:
        b = VfsdBackend(mnt)
        for j in range(8):
            if (i + j) % 2:
                res = b.execute(f": {marker}; echo {i}-{j}")
                if res.output != f"{i}-{j}\n":
                    failures.append(res.output)
            else:
                res = b.execute(f": {marker}; sleep 30", timeout=(j % 3) + 1)
                if res.exit_code != 124:
                    failures.append(res.output)

    try:
        with descriptors_above(1100):
            threads = [threading.Thread(target=calls, args=(i,)) for i in range(40)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert host_processes_with(marker) == []
    assert failures == []
    assert open_files_under(mnt.root) == []


def test_no_network_unless_asked(mnt):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
        probe = (
            "python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
            f"{port}), timeout=5); print('connected')\""
        )
        off = VfsdBackend(mnt).execute(probe + " ; ip -o link 2>/dev/null | wc -l")
        assert "connected" not in off.output and "Connection refused" in off.output
        assert VfsdBackend(mnt).sandbox_info()["network"] is False
        on = VfsdBackend(mnt, network=True).execute(probe)
        assert "connected" in on.output, on.output


def test_environment_is_an_allowlist(mnt, monkeypatch):
    monkeypatch.setenv("VFSD_TEST_API_KEY", "sk-secret")
    monkeypatch.setenv("TZ", "UTC")
    b = VfsdBackend(mnt, env={"EXTRA": "given"})
    env = dict(line.split("=", 1) for line in b.execute("env").output.split("\n") if "=" in line)
    assert "VFSD_TEST_API_KEY" not in env
    assert env["TZ"] == "UTC" and env["EXTRA"] == "given" and env["HOME"] == "/tmp"
    allowed = VfsdBackend(mnt, env_allowlist=["VFSD_TEST_API_KEY"]).execute("echo $VFSD_TEST_API_KEY")
    assert allowed.output == "sk-secret\n"


# -- limits --------------------------------------------------------------------------


def test_memory_limit(mnt):
    b = VfsdBackend(mnt, limits=ExecLimits(memory_bytes=128 << 20))
    res = b.execute("python3 -c \"x = bytearray(600 << 20); print('allocated')\"")
    assert "allocated" not in res.output
    assert res.exit_code != 0
    enforced = b.sandbox_info()["limits"]["memory_bytes"]["enforced_by"]
    if "cgroup" in enforced:
        assert "over the memory limit (128 MiB)" in res.output, res.output
    else:
        assert "MemoryError" in res.output


def test_cpu_time_limit_counts_all_processes(mnt):
    b = VfsdBackend(mnt, limits=ExecLimits(cpu_seconds=2, timeout=60))
    if "cgroup" not in b.sandbox_info()["limits"]["cpu_seconds"]["enforced_by"]:
        pytest.skip("no CPU accounting cgroup here: only RLIMIT_CPU per process")
    res = b.execute("for i in 1 2 3 4; do (while :; do :; done) & done; wait")
    assert "seconds of CPU time (all its processes together)" in res.output, res.output
    assert res.exit_code == 137


def test_private_tmp_is_bounded(mnt):
    b = VfsdBackend(mnt, limits=ExecLimits(tmp_bytes=8 << 20), tmp="call")
    res = b.execute("head -c 20000000 /dev/zero > /tmp/big; ls -l /tmp/big | cut -d' ' -f5")
    assert "No space left on device" in res.output


def test_sandbox_info_reports_what_is_in_force(mnt):
    info = VfsdBackend(mnt).sandbox_info()
    assert info["isolation"] == "bwrap" and info["reason"] is None
    assert {"mount", "pid", "net"} <= set(info["namespaces"])
    assert info["filesystem"]["/tmp"].startswith("the run's own /tmp directory")
    assert VfsdBackend(mnt, tmp="call").sandbox_info()["filesystem"]["/tmp"].startswith(
        "private tmpfs")
    assert "/etc/shadow" in info["filesystem"]["masked"]
    assert info["cleanup"].startswith("PID namespace")
    for name in ("wall_seconds", "cpu_seconds", "memory_bytes", "processes", "output_bytes"):
        assert info["limits"][name]["enforced_by"]


# -- without the sandbox -------------------------------------------------------------


def test_missing_bubblewrap_gives_a_clear_error(mnt):
    b = VfsdBackend(mnt, bwrap="/nonexistent/bwrap")
    res = b.execute("echo hi")
    assert res.exit_code == 126
    assert "bubblewrap" in res.output and "apt-get install bubblewrap" in res.output
    assert 'isolation="none"' in res.output
    assert "hi" not in res.output.split()
    assert b.isolation == "unavailable"
    assert b.sandbox_info()["isolation"] == "unavailable"
    # The file tools keep working.
    assert b.write("/still.txt", "fine").error is None


def test_a_root_without_mount_points_is_refused(tmp_path):
    """A daemon older than the mount points: bwrap would create them as real directories."""
    with pytest.raises(SandboxUnavailable, match="mount point"):
        Sandbox(tmp_path).run("true")
    assert os.listdir(tmp_path) == []


def test_unisolated_mode_is_opt_in_by_name(mnt):
    with pytest.raises(ValueError, match="isolation must be one of"):
        VfsdBackend(mnt, isolation="off")
    b = VfsdBackend(mnt, isolation="none")
    assert b.isolation == "none"
    res = b.execute("pwd; echo $VFSD_ROOT; echo err >&2")
    assert res.output.split("\n")[:3] == [str(mnt.root), str(mnt.root), "[stderr] err"]
    assert "relative to the working directory" in b.prompt_note()
    # Without a PID namespace, the per-call cgroup still ends detached processes.
    if "cgroup" in b.sandbox_info()["cleanup"]:
        marker = sleep_marker()
        assert b.execute(f"setsid sleep 1{marker} & echo ok").output == "ok\n"
        assert host_processes_with(marker) == []
