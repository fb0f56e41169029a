"""Eviction a working tree survives (issue 19): ages from the last use, pinned
directories, units evicted whole (a git work tree, a virtualenv), and ordered
rules by path, on a real mount with real git and python.

Every test advances the step with `vfsd step` or `set_step` and then looks at
the tree with the tools an agent would use (`git status`, `ls`, `cat`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import vfsd_cli, wait_for
from ctl import call
from vfsdattr import attr_doc

import mount_tool

pytestmark = pytest.mark.fuse

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "gc.auto=0",
       "-c", "init.defaultBranch=main"]


def step_to(run, n: int) -> dict:
    return call(run.run_dir, "set_step", step=n)


def evicted(report: dict) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in report["evicted"]}


def files_under(path: Path) -> list[str]:
    """Regular files and symlinks below `path`, found with `find` (never opened)."""
    out = subprocess.run(["find", str(path), "-type", "f", "-o", "-type", "l"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return sorted(os.path.relpath(p, path) for p in out.split("\n") if p)


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------- last use


def test_a_source_file_read_every_step_stays_and_attr_shows_both_steps(run_factory) -> None:
    r = run_factory("use", "--max-age-steps", "3")
    src, other = r.root / "main.py", r.root / "notes.txt"
    src.write_text("print('hi')\n")
    other.write_text("written once\n")
    for n in range(1, 9):  # the agent reads its source at every step
        assert src.read_text() == "print('hi')\n"
        report = step_to(r, n)
        assert "main.py" not in evicted(report), f"step {n}"
    assert evicted(report) == {} and src.exists() and not other.exists()
    doc = attr_doc(src)  # the mirror is read without opening the file
    assert (doc["written_step"], doc["used_step"], doc["step"]) == (0, 7, 0)
    # Not read any more: it ages from its last use (step 7) and goes at 11.
    assert evicted(step_to(r, 10)) == {}
    [rec] = step_to(r, 11)["evicted"]
    assert (rec["path"], rec["reason"], rec["step"], rec["used_step"]) == (
        "main.py", "max_age", 0, 7)


def test_age_from_written_ignores_reads(run_factory) -> None:
    r = run_factory("written", "--max-age-steps", "3", "--age-from", "written")
    src = r.root / "main.py"
    src.write_text("print('hi')\n")
    for n in range(1, 4):
        src.read_text()
        step_to(r, n)
    src.read_text()
    assert evicted(step_to(r, 4)) == {"main.py": "max_age"}
    assert r.status()["eviction_policy"]["age_from"] == "written"


# ------------------------------------------------------------- pinned dirs


def test_a_pinned_directory_keeps_its_whole_subtree(run) -> None:
    root = run.root
    (root / "src/pkg/deep").mkdir(parents=True)
    for rel in ("src/a.py", "src/pkg/b.py", "src/pkg/deep/c.py"):
        (root / rel).write_text(rel)
    (root / "loose.txt").write_text("loose")
    proc = subprocess.run(["setfattr", "-n", "user.vfsd.pin", "-v", "1", str(root / "src")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    (root / "src/pkg/later.py").write_text("made after the pin")
    assert evicted(step_to(run, 100)) == {"loose.txt": "max_age"}
    assert files_under(root / "src") == ["a.py", "pkg/b.py", "pkg/deep/c.py", "pkg/later.py"]
    info = call(run.run_dir, "info", path="src/pkg/deep/c.py")
    assert info["eviction"]["rule"] == "pinned" and "directory" in info["eviction"]["text"]
    # Unpinned, the subtree ages like any other files.
    subprocess.run(["setfattr", "-n", "user.vfsd.pin", "-v", "0", str(root / "src")],
                   check=True, timeout=30)
    assert set(evicted(step_to(run, 101))) == {"src/a.py", "src/pkg/b.py",
                                                "src/pkg/deep/c.py", "src/pkg/later.py"}


# ------------------------------------------------------------------ units


def test_a_git_work_tree_survives_whole_then_goes_whole(run) -> None:
    proj = run.root / "proj"
    proj.mkdir()
    (proj / "app.py").write_text("print('app')\n")
    assert git(proj, "init", "-q").returncode == 0
    assert git(proj, "add", ".").returncode == 0
    done = git(proj, "commit", "-q", "-m", "first")
    assert done.returncode == 0, done.stderr
    tracked = files_under(proj)
    assert len(tracked) > 10 and ".git/HEAD" in tracked
    step_to(run, 15)
    (proj / "app.py").write_text("print('app v2')\n")  # the youngest file: step 15
    # Step 30: .git/HEAD, config, the objects are 30 steps old, past max age
    # 20, but the tree is one unit and its youngest file is 15 steps old.
    out = run.cli("step", run.run_dir, "30", "--json").stdout
    assert json.loads(out)["evicted"] == []
    assert files_under(proj) == tracked
    st = git(proj, "status", "--porcelain")
    assert st.returncode == 0 and st.stdout == " M app.py\n", st.stderr
    assert git(proj, "log", "--oneline").stdout.count("\n") == 1
    # git status read the tree at step 30: nothing of it goes before step 51,
    # then all of it at once, with the unit named in every record.
    assert step_to(run, 50)["evicted"] == []
    before = files_under(proj)
    report = step_to(run, 51)
    assert sorted(r["path"] for r in report["evicted"]) == [f"proj/{p}" for p in before]
    assert {r["unit"] for r in report["evicted"]} == {"proj"}
    # Its directories went with it (issue 28): `proj/.git/` left as a skeleton
    # of empty directories misled every tool that looks for `.git`.
    assert not proj.exists() and os.listdir(run.root) == []
    assert git(run.root, "status").returncode != 0  # no repository anywhere


def test_a_venv_is_a_unit_and_one_open_file_defers_all_of_it(run_factory) -> None:
    r = run_factory("venv", "--max-age-steps", "2")
    venv = r.root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    (venv / "marker.txt").write_text("m")
    (r.root / "loose.txt").write_text("loose")
    made = [p for p in files_under(venv) if not os.path.islink(venv / p)]
    assert "pyvenv.cfg" in made
    step_to(r, 2)
    (venv / "late.txt").write_text("written at step 2")
    # pyvenv.cfg and the rest are due at step 3, late.txt is not: all stay.
    assert evicted(step_to(r, 3)) == {"loose.txt": "max_age"}
    assert set(made) <= set(files_under(venv))
    # Due at step 6 (marker.txt was opened at step 3), but a program holds one
    # file of it open: all of it waits.
    with open(venv / "marker.txt", "rb"):
        report = step_to(r, 6)
        assert report["evicted"] == []
        assert [(d["path"], d["unit"]) for d in report["deferred"]] == [
            ("venv/marker.txt", "venv")]
        assert (venv / "pyvenv.cfg").exists()
    # Closed (and opened at step 3, so still due): the whole unit goes, its
    # directories and symlinks too.
    wait_for(lambda: not venv.exists(), "the unit to go after the close")
    recs = call(r.run_dir, "evicted")["records"]
    assert {x["path"] for x in recs if x.get("unit") == "venv"} == {
        f"venv/{p}" for p in [*made, "late.txt"]}


def test_a_directory_marked_a_unit_goes_whole_and_a_git_tree_can_opt_out(run_factory) -> None:
    r = run_factory("marks", "--max-age-steps", "2")
    root = r.root
    (root / "job").mkdir()
    (root / "job/a").write_text("a")
    (root / "repo").mkdir()
    (root / "repo/.git").write_text("gitdir: elsewhere\n")  # a worktree's .git file
    (root / "repo/old").write_text("old")
    os.setxattr(root / "job", "user.vfsd.unit", b"1")
    os.setxattr(root / "repo", "user.vfsd.unit", b"0")
    with pytest.raises(OSError):
        os.setxattr(root / "job/a", "user.vfsd.unit", b"1")  # files are no units
    step_to(r, 2)
    (root / "job/b").write_text("b")
    (root / "repo/new").write_text("new")
    # Step 3: job/a is due but job/b is not; repo is no unit, so files go one by one.
    assert evicted(step_to(r, 3)) == {"repo/old": "max_age", "repo/.git": "max_age"}
    assert files_under(root / "job") == ["a", "b"]
    assert set(evicted(step_to(r, 5))) == {"job/a", "job/b", "repo/new"}


# ------------------------------------------------------------------ rules


RULES = [
    {"path": "tool_outputs/**", "max_age_steps": 1},
    {"path": "tool_outputs/keep/**", "pin": True},  # never reached: rule 1 matches first
    {"path": "src/**", "pin": True},
    {"path": "scratch/**", "done_retention_steps": 0},
    {"path": "**/*.log", "max_age_steps": 3},
]


def test_rules_by_path_first_match_wins(tmp_path: Path) -> None:
    m = mount_tool.mount(tmp_path / "rules", eviction_rules=RULES, max_age_steps=6)
    try:
        root = m.root
        for rel in ("tool_outputs/t1.json", "tool_outputs/keep/t2.json", "src/main.py",
                    "scratch/s.txt", "scratch/kept.txt", "logs/run.log", "other.txt"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(rel)
        os.setxattr(root / "scratch/s.txt", "user.vfsd.status", b"done")
        status = json.loads((root / ".vfsd/status.json").read_text())
        shown = status["eviction_policy"]["rules"]
        assert [{k: v for k, v in x.items() if k != "index"}
                for x in shown[:len(RULES)]] == RULES
        assert all(x["builtin"] for x in shown[len(RULES):])  # the built-in ones follow
        out = vfsd_cli("status", m.run_dir).stdout
        assert "rule 1" in out and "tool_outputs/**: max_age_steps 1" in out
        assert "rule 3" in out and "src/**: pin true" in out

        report = m.client.call("set_step", step=1)
        assert evicted(report) == {"scratch/s.txt": "done"}
        assert report["evicted"][0]["rule_index"] == 4
        report = m.client.call("set_step", step=2)
        assert evicted(report) == {"tool_outputs/t1.json": "max_age",
                                   "tool_outputs/keep/t2.json": "max_age"}
        assert {x["rule_path"] for x in report["evicted"]} == {"tool_outputs/**"}
        assert evicted(m.client.call("set_step", step=4)) == {"logs/run.log": "max_age"}
        assert evicted(m.client.call("set_step", step=7)) == {"other.txt": "max_age",
                                                              "scratch/kept.txt": "max_age"}
        assert evicted(m.client.call("set_step", step=1000)) == {}
        assert (root / "src/main.py").read_text() == "src/main.py"
    finally:
        m.unmount()


@pytest.mark.parametrize("rule, named", [
    ({"path": "src/**", "pinned": True}, "unknown key(s) 'pinned'"),
    ({"path": "src/[ab", "pin": True}, "bad glob: unclosed '['"),
    ({"path": "src/**", "max_age_steps": "5"}, "max_age_steps must be a non-negative integer"),
    ({"path": "src/**", "pin": 1}, "pin must be true or false"),
    ({"max_age_steps": 5}, "no 'path'"),
])
def test_a_bad_rule_is_refused_naming_it(tmp_path: Path, rule: dict, named: str) -> None:
    rules = [{"path": "ok/**", "max_age_steps": 2}, rule]
    conf = tmp_path / "vfsd.toml"
    body = ", ".join(f"{k} = {json.dumps(v)}" for k, v in rule.items())
    conf.write_text('eviction_rules = [{path = "ok/**", max_age_steps = 2}, {' + body + "}]\n")
    proc = vfsd_cli("mount", tmp_path / "r1", "--config", conf, check=False)
    assert proc.returncode == 2 and "eviction rule 2" in proc.stderr, proc.stderr
    assert named in proc.stderr, proc.stderr
    assert not (tmp_path / "r1").exists()
    with pytest.raises(mount_tool.MountError, match="eviction rule 2"):
        mount_tool.mount(tmp_path / "r2", eviction_rules=rules)


# ------------------------------------------------------------ deep trees


def make_deep(root: Path, depth: int, name: str = "d") -> tuple[list[str], int]:
    """`depth` nested directories under `root` (walked by descriptor: the path
    is past PATH_MAX); (their names, a descriptor of the deepest)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    return [name] * depth, fd


@pytest.mark.timeout(300)
def test_a_file_deeper_than_4096_directories_is_evicted_and_counted(run_factory) -> None:
    """Issue 28, item 6: past 4,096 directories the path lookup gave up and the
    file was skipped silently, by age and by the quota alike."""
    r = run_factory("deep", "--max-age-steps", "2", "--quota-bytes", str(1 << 20))
    parts, fd = make_deep(r.root, 4200)
    try:
        fdf = os.open("deep.bin", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(fdf, b"x" * (600 << 10))
        os.close(fdf)
        # The quota takes it (the oldest file) to make room for a newer one.
        (r.root / "new.bin").write_bytes(b"y" * (600 << 10))
        records = json.loads(vfsd_cli("evicted", r.run_dir, "--json").stdout)
        deep = "/".join(parts) + "/deep.bin"
        assert [(rec["path"], rec["reason"]) for rec in records] == [(deep, "quota")]
        # By age: a file made there goes at its step.
        os.close(os.open("aged.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    report = step_to(r, 5)
    assert sorted(p.rsplit("/", 1)[-1] for p in evicted(report)) == ["aged.txt", "new.bin"]
