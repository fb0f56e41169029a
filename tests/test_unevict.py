"""Bring one file back: `vfsd unevict` / `Mount.unevict` and `vfsd restore RUN
SNAPSHOT PATH...` / `Mount.restore(paths=...)` on a real mount.

Single files and subtrees come back from retained snapshots without touching
the rest of the tree (nor the step); the shell sees them at once (the
kernel had cached the miss); a FileRef taken before eviction resolves again;
a restored file is evicted again like any file written at the step it came
back; the store checks clean afterwards. Bad input is refused clearly and
changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import tree, vfsd_cli

import mount_tool
from mount_tool.errors import ControlError

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]


def cat(root, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["cat", path], cwd=root, capture_output=True, text=True)


@pytest.fixture
def gone(run_factory):
    """s1 holds report.txt, src/{a,b}.py and src/sub/c.py; all four were
    evicted at step 5 (max_age 2); keep.txt is pinned."""
    run = run_factory("back", "--max-age-steps", "2")
    m = mount_tool.Mount.attach(run.run_dir)
    m.write("report.txt", "the report\n")
    m.write("src/a.py", "print('a')\n")
    m.write("src/b.py", "print('b')\n")
    m.write("src/sub/c.py", "print('c')\n")
    m.pin(m.write("keep.txt", "kept\n"))
    refs = {p: m.ref(p) for p in ("report.txt", "src/a.py")}
    assert m.snapshot()["id"] == "s1"
    evicted = {r["path"] for r in m.set_step(5)["evicted"]}
    assert evicted == {"report.txt", "src/a.py", "src/b.py", "src/sub/c.py"}
    yield run, m, refs
    m.detach()


def test_unevict_a_file_and_a_subtree(gone):
    run, m, refs = gone
    root = m.root
    assert cat(root, "report.txt").returncode == 1  # the kernel now caches the miss
    m.write("later.txt", "made after the eviction\n")
    before = tree(root)

    back = m.unevict("report.txt")
    assert back["restored"] == ["report.txt"] and back["from"] == ["s1"] and back["lost"] == []
    assert cat(root, "report.txt").stdout == "the report\n"
    assert m.resolve(refs["report.txt"])["state"] == "live"  # same inode, same generation
    assert m.read(refs["report.txt"]) == b"the report\n"
    assert m.get_step() == 5
    # The whole directory, whose subdirectory is gone too: made again from s1.
    m.remove("src/sub", directory=True)
    back = m.unevict([str(root / "src")])
    assert sorted(back["restored"]) == ["src/a.py", "src/b.py", "src/sub/c.py"]
    assert cat(root, "src/sub/c.py").stdout == "print('c')\n"
    now = tree(root)
    for path in ("report.txt", "src/a.py", "src/b.py", "src/sub/", "src/sub/c.py"):
        now.pop(path)
    assert now == {k: v for k, v in before.items() if k != "src/sub/"}  # nothing else moved
    assert os.listdir(root / ".vfsd" / "evicted") == []
    attrs = json.loads((root / ".vfsd" / "attr" / "src" / "a.py").read_text())
    assert attrs["step"] == 5

    # Back files are evicted again like any file written at step 5.
    again = {r["path"]: r for r in m.set_step(8)["evicted"]}
    assert set(again) == {"report.txt", "src/a.py", "src/b.py", "src/sub/c.py", "later.txt"}
    assert again["report.txt"]["step"] == 5
    assert m.unevict("report.txt")["restored"] == ["report.txt"]
    m.detach()
    run.umount()
    proc = vfsd_cli("fsck", run.run_dir, "--json", check=False)
    assert json.loads(proc.stdout)["clean"], proc.stdout
    run.mount()


def test_restore_paths_leaves_the_rest_untouched(run):
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        root = m.root
        m.write("src/a.py", "a1\n")
        m.write("src/gone.py", "gone1\n")
        m.write("docs/x.md", "x1\n")
        assert m.snapshot()["id"] == "s1"
        m.set_step(3)
        (root / "src" / "a.py").write_text("a2\n")
        (root / "src" / "gone.py").unlink()
        (root / "src" / "new.py").write_text("new\n")
        (root / "docs" / "x.md").write_text("x2\n")
        assert cat(root, "src/gone.py").returncode == 1
        before = tree(root)
        with pytest.raises(ControlError) as refused:
            m.restore("s1", paths=["src"])
        assert refused.value.code == "exists"
        assert "'src/a.py' exists in the live tree" in refused.value.message
        assert "--force" in refused.value.message
        assert tree(root) == before  # nothing changed, not even src/gone.py
        res = m.restore("s1", paths=["src"], force=True)
        assert sorted(res["restored"]) == ["src/a.py", "src/gone.py"]
        assert res["step"] == 3 and m.get_step() == 3
        after = tree(root)
        assert after.pop("src/a.py") == b"a1\n" and after.pop("src/gone.py") == b"gone1\n"
        before.pop("src/a.py")
        assert after == before  # src/new.py stays, docs/x.md keeps its change
        assert cat(root, "src/gone.py").stdout == "gone1\n"
        # One file, when the live one already is what the snapshot holds: nothing to do.
        res = m.restore("s1", paths=["src/gone.py"])
        assert res["restored"] == [] and res["unchanged"] == ["src/gone.py"]
    finally:
        m.detach()


def test_bad_requests_are_refused_and_change_nothing(gone):
    run, m, _ = gone
    root = m.root

    def refused(code: str, fn, *args, **kwargs) -> str:
        with pytest.raises(ControlError) as err:
            fn(*args, **kwargs)
        assert err.value.code == code, err.value
        return err.value.message

    before = tree(root)
    assert "eviction never removed 'nothing.txt'" in refused("not_found", m.unevict, "nothing.txt")
    assert "was not evicted: it is in the live tree" in refused("exists", m.unevict, "keep.txt")
    assert "leaves the mount" in refused("forbidden", m.unevict, "../report.txt")
    assert "leaves the mount" in refused("forbidden", m.restore, "s1", paths=["src/../../x"])
    assert "restore the whole snapshot" in refused("bad_request", m.unevict, ".")
    assert "snapshot s1 has no 'nothing.txt'" in refused(
        "not_found", m.restore, "s1", paths=["nothing.txt"])
    assert "no snapshot s9" in refused("not_found", m.restore, "s9", paths=["report.txt"])
    # A file made again where one was evicted: kept, unless --force.
    m.write("report.txt", "a new report\n")
    assert "was not evicted" in refused("exists", m.unevict, "report.txt")
    before["report.txt"] = b"a new report\n"
    assert tree(root) == before
    assert m.unevict("report.txt", force=True)["restored"] == ["report.txt"]
    assert cat(root, "report.txt").stdout == "the report\n"
    # Evicted with no retained snapshot holding it: its content is gone.
    m.write("fresh.txt", "never in a snapshot\n")
    m.delete_snapshot("s1")
    assert "fresh.txt" in {r["path"] for r in m.set_step(9)["evicted"]}
    said = refused("not_found", m.unevict, "fresh.txt")
    assert "'fresh.txt' was evicted at step 9 (max_age), but no retained snapshot holds" in said

    # The CLI: text, --json, exit codes (0 done, 1 refused, 2 not a path of the mount).
    cli = [run.run_dir]
    proc = vfsd_cli("unevict", *cli, "fresh.txt", check=False)
    assert proc.returncode == 1 and "no retained snapshot holds" in proc.stderr
    proc = vfsd_cli("unevict", *cli, "/elsewhere/x", check=False)
    assert proc.returncode == 2 and "is not inside" in proc.stderr
    proc = vfsd_cli("unevict", *cli, "a/../../x", check=False)
    assert proc.returncode == 2 and "leaves the mount" in proc.stderr
    m.write("fresh.txt", "again\n")
    s2 = m.snapshot()["id"]
    m.set_step(13)
    proc = vfsd_cli("unevict", *cli, "fresh.txt", "--json", check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["restored"] == ["fresh.txt"]
    proc = vfsd_cli("restore", *cli, s2, "fresh.txt", check=False)
    assert proc.returncode == 0 and "1 file(s) already as the snapshot has them" in proc.stdout


def test_unevict_brings_a_git_work_tree_back_whole(run_factory):
    """A git work tree is a unit: evicted whole, and `vfsd unevict DIR` brings
    every file of it back, so git works again."""
    run = run_factory("git", "--max-age-steps", "2")
    proj = run.root / "proj"
    proj.mkdir()
    (proj / "app.py").write_text("v1\n")
    git = ["git", "-C", str(proj), "-c", "user.email=a@b.c", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    vfsd_cli("snapshot", run.run_dir)
    report = json.loads(vfsd_cli("step", run.run_dir, "5", "--json").stdout)
    assert {r.get("unit") for r in report["evicted"]} == {"proj"}
    assert subprocess.run([*git, "status"], capture_output=True).returncode != 0
    proc = vfsd_cli("unevict", run.run_dir, str(proj))
    assert f"brought back {report['files']} file(s) from s1" in proc.stdout
    status = subprocess.run([*git, "status", "--short"], capture_output=True, text=True,
                            check=True)
    assert status.stdout == ""
    log = subprocess.run([*git, "log", "--format=%s"], capture_output=True, text=True,
                         check=True)
    assert log.stdout == "first\n"
