"""mount_tool core: path confinement, FileRefs, and Mount on a real vfsd mount."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from conftest import unmount_quietly

import mount_tool
from mount_tool.daemon.mountinfo import is_mounted
from mount_tool.daemon.spawn import mount_flags
from mount_tool.paths import confine, mount_relative
from mount_tool.refs import as_ref, content_hash

SAMPLE_REF = {
    "ino": 123456,
    "gen": 1,
    "path": "artifacts/step-0042/report.json",
    "size": 1048576,
    "hash": "0f" * 16,
    "step": 42,
    "status": "active",
}


# -- pure parts: confinement on a plain directory, refs, flags -----------------


@pytest.fixture
def plain_root(tmp_path: Path) -> Path:
    root = tmp_path / "fs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("a")
    (tmp_path / "outside.txt").write_text("secret")
    return root


def test_confine_accepts_paths_inside(plain_root: Path) -> None:
    real = Path(os.path.realpath(plain_root))
    assert confine(plain_root, "sub/a.txt") == real / "sub" / "a.txt"
    assert confine(plain_root, "sub/../new/b.txt") == real / "new" / "b.txt"
    assert confine(plain_root, "./x") == real / "x"
    assert confine(plain_root, real / "sub") == real / "sub"
    assert mount_relative(plain_root, real / "sub" / "a.txt") == "sub/a.txt"


@pytest.mark.parametrize(
    "bad",
    ["../outside.txt", "sub/../../outside.txt", "../fs/sub/a.txt", "/etc/passwd", "a\0b", ""],
)
def test_confine_refuses_escapes(plain_root: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        confine(plain_root, bad)


def test_confine_refuses_symlinks_leading_out(plain_root: Path) -> None:
    os.symlink(plain_root.parent / "outside.txt", plain_root / "link-out")
    os.symlink(plain_root.parent, plain_root / "dir-out")
    os.symlink("sub/a.txt", plain_root / "link-in")
    with pytest.raises(ValueError):
        confine(plain_root, "link-out")
    with pytest.raises(ValueError):
        confine(plain_root, "dir-out/new-file")
    assert confine(plain_root, "link-in") == Path(os.path.realpath(plain_root)) / "sub" / "a.txt"


def test_file_ref_serializes_small() -> None:
    ref = as_ref(SAMPLE_REF)
    assert type(ref) is dict
    assert json.loads(json.dumps(ref)) == ref
    assert msgpack.unpackb(msgpack.packb(ref)) == ref
    assert len(json.dumps(ref)) < 200
    assert len(msgpack.packb(ref)) < 150
    with pytest.raises(ValueError):
        as_ref({"ino": 1})
    assert mount_tool.is_ref(ref) and not mount_tool.is_ref({"path": "x"})


def test_mount_flags() -> None:
    assert mount_flags({"done_retention_steps": 3, "allow_other": True, "store": None}) == [
        "--done-retention-steps",
        "3",
        "--allow-other",
    ]
    with pytest.raises(ValueError):
        mount_flags({"foreground": True})


# -- real mount --------------------------------------------------------------------


@pytest.fixture
def make_mount(tmp_path: Path):
    """Start vfsd through mount_tool.mount with given options; unmounted in teardown."""
    pytest.importorskip("vfsd.cli")
    made: list[mount_tool.Mount] = []

    def make(name: str = "run", **options) -> mount_tool.Mount:
        m = mount_tool.mount(tmp_path / name, **options)
        made.append(m)
        return m

    yield make
    for m in made:
        unmount_quietly(m)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory):
    """One default mount for the tests that need no special options (each
    works in its own paths), because a daemon's start and stop cost ~2.5 s."""
    pytest.importorskip("vfsd.cli")
    m = mount_tool.mount(tmp_path_factory.mktemp("shared") / "run")
    yield m
    unmount_quietly(m)


def test_write_ref_read_round_trip(shared) -> None:
    m = shared
    data = os.urandom(300_000)  # larger than inline_max: the chunked tier
    ref = m.write("out/deep/blob.bin", data)
    assert set(ref) == {"ino", "gen", "path", "size", "hash", "step", "status"}
    assert ref["path"] == "out/deep/blob.bin"
    assert ref["size"] == len(data)
    assert ref["hash"] == content_hash(data)
    assert m.read(ref) == data
    assert m.ref("out/deep/blob.bin") == ref
    small = m.write("note.txt", "hello\n")
    assert m.read_text(small) == "hello\n"
    cat = subprocess.run(["cat", str(m.root / "note.txt")], capture_output=True, check=True)
    assert cat.stdout == b"hello\n"
    # A ref survives being stored as JSON (as in a checkpoint).
    assert m.read(json.loads(json.dumps(ref))) == data


def test_ref_of_file_written_by_shell(shared) -> None:
    m = shared
    subprocess.run(
        ["sh", "-c", "mkdir -p logs && seq 1 1000 > logs/seq.txt"], cwd=m.root, check=True
    )
    ref = m.ref("logs/seq.txt")
    expected = "".join(f"{i}\n" for i in range(1, 1001)).encode()
    assert ref["size"] == len(expected)
    assert m.read(ref) == expected
    with pytest.raises(mount_tool.ControlError) as err:
        m.ref("logs/missing.txt")
    assert err.value.code == "not_found"


def test_stale_ref_after_shell_append(shared) -> None:
    m = shared
    ref = m.write("report.md", "# report\n")
    subprocess.run(["sh", "-c", "echo more >> report.md"], cwd=m.root, check=True)
    with pytest.raises(mount_tool.StaleRef) as err:
        m.read(ref)
    assert err.value.current is not None
    assert err.value.current["size"] == len("# report\nmore\n")
    fresh = m.ref("report.md")
    assert m.read_text(fresh) == "# report\nmore\n"


def test_stale_ref_after_same_size_rewrite(shared) -> None:
    m = shared
    ref = m.write("same.txt", "aaaa")
    (m.root / "same.txt").write_text("bbbb")
    with pytest.raises(mount_tool.StaleRef):
        m.read(ref)


def test_evicted_after_max_age(make_mount) -> None:
    m = make_mount(max_age_steps=5)
    ref = m.write("old.txt", "old")
    keep = m.write("kept.txt", "kept")
    m.pin(keep)
    report = m.set_step(ref["step"] + 6)
    assert ref["ino"] in {r["ino"] for r in report["evicted"]}
    # readdir asks the daemon; a lookup may hit the kernel's dentry cache for a
    # moment, since the daemon invalidates it asynchronously.
    assert "old.txt" not in os.listdir(m.root)
    with pytest.raises(mount_tool.Evicted) as err:
        m.read(ref)
    assert err.value.record["reason"] == "max_age"
    assert err.value.record["ino"] == ref["ino"]
    assert m.read_text(keep) == "kept"
    assert any(r["ino"] == ref["ino"] for r in m.evicted())
    assert m.get_step() == ref["step"] + 6


def test_done_files_evicted_after_retention(make_mount) -> None:
    m = make_mount(done_retention_steps=2)
    ref = m.write("scratch.txt", "tmp")
    done = m.set_status("scratch.txt", "done")
    assert done["status"] == "done" and done["ino"] == ref["ino"]
    assert m.set_step(ref["step"] + 1)["evicted"] == []
    report = m.set_step(ref["step"] + 3)
    assert [r["reason"] for r in report["evicted"]] == ["done"]
    with pytest.raises(mount_tool.Evicted):
        m.read(done)
    with pytest.raises(ValueError):
        m.set_status("scratch.txt", "finished")


def test_path_escapes_raise_and_touch_nothing(shared, tmp_path: Path) -> None:
    m = shared
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, m.root / "escape-link")
    before = sorted(os.listdir(m.root))
    for bad in ["../escape.txt", "a/../../escape.txt", str(outside / "x.txt"), "escape-link/x.txt"]:
        with pytest.raises(ValueError):
            m.write(bad, "nope")
        with pytest.raises(ValueError):
            m.ref(bad)
        with pytest.raises(ValueError):
            m.resolve_path(bad)
    assert sorted(os.listdir(m.root)) == before
    assert list(outside.iterdir()) == []
    assert not (m.run_dir / "escape.txt").exists()


def test_changes_lists_shell_writes_and_removals(shared) -> None:
    m = shared
    start = m.get_step()
    m.set_step(start + 1)
    subprocess.run(["sh", "-c", "echo a > a.txt && echo b > b.txt"], cwd=m.root, check=True)
    a, b = m.ref("a.txt"), m.ref("b.txt")
    os.unlink(m.root / "b.txt")
    delta = m.changes(start)
    assert a in delta["changed"]
    assert b["ino"] in {r["ino"] for r in delta["removed"]}
    assert delta["step"] == start + 1


def test_removal_records_carry_path(shared) -> None:
    m = shared
    ref = m.write("dir/b.txt", "b")
    os.unlink(m.root / "dir" / "b.txt")
    removed = [r for r in m.changes(0)["removed"] if r["ino"] == ref["ino"]]
    assert [r["path"] for r in removed] == ["dir/b.txt"]


def test_missing_after_unlink(shared) -> None:
    m = shared
    ref = m.write("gone.txt", "soon gone")
    os.unlink(m.root / "gone.txt")
    with pytest.raises(mount_tool.Missing):
        m.read(ref)


def test_attach_and_context_manager(make_mount, tmp_path: Path) -> None:
    m = make_mount("ctx")
    with mount_tool.Mount.attach(tmp_path / "ctx") as attached:
        assert attached.client.call("ping")["pong"] is True
        ref = attached.write("x.txt", "x")
    assert is_mounted(m.root), "an attached Mount must not unmount on exit"
    assert m.read_text(ref) == "x"
    with mount_tool.mount(tmp_path / "ctx") as again:  # already mounted: attaches
        assert again.started is False
    assert is_mounted(m.root)

    with mount_tool.mount(tmp_path / "own", max_age_steps=50) as own:
        assert own.started and is_mounted(own.root)
        own.write("y.txt", "y")
    assert not is_mounted(own.root)
    with pytest.raises(mount_tool.MountError):
        mount_tool.Mount.attach(tmp_path / "own")


def test_a_run_dir_with_spaces_tabs_and_backslashes_is_seen_mounted(tmp_path: Path) -> None:
    """/proc/self/mountinfo escapes these as \\ooo: a mount there is found, and
    found gone after the unmount, by the path and by the Mount."""
    link = tmp_path / "via link"
    link.symlink_to(tmp_path, target_is_directory=True)
    odd = link / "a b\tc\\d"
    with mount_tool.mount(odd) as m:
        assert m.is_mounted() and is_mounted(m.root) and is_mounted(odd / "fs")
        assert not str(m.root).startswith(str(link))  # canonical: the link resolved
        m.write("x.txt", "x")
    assert not m.is_mounted() and not is_mounted(odd / "fs")


def test_stats_and_unknown_op(shared) -> None:
    m = shared
    m.write("s.txt", "s")
    assert isinstance(m.stats(), dict)
    with pytest.raises(mount_tool.ControlError) as err:
        m.client.call("no_such_op")
    assert err.value.code == "unknown_op"


def test_cli_ref_and_read(shared) -> None:
    m = shared
    ref = m.write("cli/data.txt", "from the cli\n")
    tool = [sys.executable, "-m", "mount_tool.cli"]
    out = subprocess.run(
        [*tool, "ref", str(m.run_dir), "cli/data.txt"], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == ref
    out = subprocess.run(
        [*tool, "read", str(m.run_dir), json.dumps(ref)], capture_output=True, check=True
    )
    assert out.stdout == b"from the cli\n"
    (m.root / "cli" / "data.txt").write_text("changed\n")
    out = subprocess.run([*tool, "read", str(m.run_dir), json.dumps(ref)], capture_output=True)
    assert out.returncode != 0 and b"changed since" in out.stderr


def test_write_refuses_a_fifo_without_blocking(shared) -> None:
    """A FIFO where a file is written (made by a shell command) is refused at
    once, with or without a reader; nothing goes into the pipe."""
    import threading

    m = shared
    os.mkfifo(m.root / "fifo")
    outcome: dict[str, BaseException | None] = {}

    def write() -> None:
        try:
            m.write("fifo", "hello")
            outcome["error"] = None
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome["error"] = exc

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(10)
    if writer.is_alive():  # the old open blocks until a reader comes: be one
        os.close(os.open(m.root / "fifo", os.O_RDONLY | os.O_NONBLOCK))
        writer.join(10)
        pytest.fail("Mount.write blocked on a FIFO")
    assert isinstance(outcome["error"], OSError) and "not a regular file" in str(outcome["error"])
    reader = os.open(m.root / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            m.write("fifo", "hello")
        assert os.read(reader, 10) == b""  # nothing was written into the pipe
    finally:
        os.close(reader)
    os.unlink(m.root / "fifo")


def test_remove_a_symlink_removes_the_link_not_its_target(shared) -> None:
    m = shared
    m.write("rm/target.txt", "keep me")
    os.symlink("target.txt", m.root / "rm/link")
    os.symlink("rm", m.root / "rmlink")
    m.remove("rm/link")
    assert not os.path.lexists(m.root / "rm/link")
    assert (m.root / "rm/target.txt").read_text() == "keep me"
    # A symlink in the parent is followed (inside the mount); the last name is not.
    os.symlink("target.txt", m.root / "rm/link2")
    m.remove("rmlink/link2")
    assert not os.path.lexists(m.root / "rm/link2") and os.path.islink(m.root / "rmlink")
    m.remove("rmlink")
    assert (m.root / "rm/target.txt").read_text() == "keep me"
    # A link pointing outside is removed too; its target is not touched.
    os.symlink("/etc/passwd", m.root / "rm/out")
    m.remove("rm/out")
    assert not os.path.lexists(m.root / "rm/out") and os.path.exists("/etc/passwd")
    for bad in (".", "rm/..", "rm/.", str(m.root)):
        with pytest.raises(ValueError):
            m.remove(bad)
    assert (m.root / "rm/target.txt").read_text() == "keep me"


def test_advance_step_never_jumps_a_step_that_moved_back(run):
    """`advance_step` advances the step the Mount last saw, in one round trip:
    when a restore elsewhere moved it back meanwhile, the daemon refuses
    (`expect`) and the step advances from where it really is."""
    m = mount_tool.Mount.attach(run.run_dir)
    other = mount_tool.Mount.attach(run.run_dir)
    snap = m.snapshot()["id"]
    m.set_step(5)  # m saw step 5
    other.restore(snap)  # back to step 0, behind m's back
    (m.root / "new.txt").write_text("x")
    delta, report = m.advance_step()
    assert report["step"] == 1 and m.get_step() == 1
    assert [r["path"] for r in delta["changed"]] == ["new.txt"]
    delta, report = m.advance_step()  # and in one round trip once it knows
    assert report["step"] == 2 and delta["changed"] == []
