"""The command-line conventions (vfsd.cli's docstring) hold for every verb.

Run as real commands: `vfsd --help` shows every verb's one-line summary whole,
every verb has `--json`, `-h` and help on each option, `mount-tool -h` works,
sizes take units, and a misspelt TOML key gets the name it most likely meant.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import click
import pytest
from conftest import VFSD, vfsd_cli

from vfsd.cli import cli
from vfsd.config import ConfigError, load_config, parse_size

MOUNT_TOOL = [sys.executable, "-m", "mount_tool.cli"]


def leaf_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()):
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from leaf_commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


COMMANDS = list(leaf_commands())


def summary(cmd: click.Command) -> str:
    """The docstring's first sentence, as the conventions define the summary."""
    first = inspect.cleandoc(cmd.help or "").split("\n\n")[0].replace("\n", " ")
    return first.split(". ")[0].rstrip(".")


def test_every_verb_has_json_help_and_a_summary():
    missing_json, no_help, no_summary = [], [], []
    for path, cmd in COMMANDS:
        names = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
        if "--json" not in names:
            missing_json.append(" ".join(path))
        for p in cmd.params:
            if isinstance(p, click.Option) and not (p.help or "").strip():
                no_help.append(f"{' '.join(path)} {p.opts[0]}")
        if not summary(cmd):
            no_summary.append(" ".join(path))
    assert (missing_json, no_help, no_summary) == ([], [], [])


def test_group_help_shows_every_summary_whole():
    out = subprocess.run([*VFSD, "--help"], capture_output=True, text=True, check=True,
                         env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"}).stdout
    commands = out[out.index("Commands:"):]
    flat = " ".join(commands.split())
    assert "..." not in commands
    for name, cmd in cli.commands.items():
        assert " ".join(summary(cmd).split()) in flat, name


@pytest.mark.parametrize("path", [(), *[p for p, _ in COMMANDS]],
                         ids=lambda p: " ".join(p) or "vfsd")
def test_dash_h_is_help(path):
    proc = subprocess.run([*VFSD, *path, "-h"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: "), proc.stderr


def test_mount_tool_takes_dash_h_and_documents_every_option():
    proc = subprocess.run([*MOUNT_TOOL, "-h"], capture_output=True, text=True)
    assert proc.returncode == 0 and "JSON" in proc.stdout, proc.stderr
    proc = subprocess.run([*MOUNT_TOOL, "mount", "-h"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from mount_tool.cli import main as mount_tool_main

    for name, cmd in mount_tool_main.commands.items():
        for p in cmd.params:
            if isinstance(p, click.Option):
                assert (p.help or "").strip(), (name, p.opts)


def test_sizes_take_units():
    assert parse_size("65536") == 65536
    assert parse_size("10G") == 10 << 30
    assert parse_size("256MiB") == 256 << 20
    assert parse_size("1.5 KB") == 1536
    assert parse_size(4096) == 4096
    for bad in ("", "ten", "10Q", "-1", "1.3", "iB", True):
        with pytest.raises(ConfigError):
            parse_size(bad, "quota_bytes")


def test_toml_sizes_and_a_misspelt_key(tmp_path):
    conf = tmp_path / "vfsd.toml"
    conf.write_text('quota_bytes = "256MiB"\nremote_cache_bytes = "1G"\n')
    config = load_config(conf, {})
    assert (config.quota_bytes, config.remote_cache_bytes) == (256 << 20, 1 << 30)
    conf.write_text("quota_byte = 10\n")
    with pytest.raises(ConfigError, match="did you mean 'quota_bytes'"):
        load_config(conf, {})
    # The same through the command line: exit 2, the suggestion on stderr.
    proc = vfsd_cli("mount", tmp_path / "r", "--config", conf, check=False)
    assert proc.returncode == 2 and "did you mean 'quota_bytes'" in proc.stderr, proc.stderr
    proc = vfsd_cli("mount", tmp_path / "r", "--quota-bytes", "lots", check=False)
    assert proc.returncode == 2 and "10G" in proc.stderr, proc.stderr
    assert not (tmp_path / "r" / "fs").exists()


def test_gc_prints_text_and_json_on_request(run):
    (run.root / "f").write_bytes(b"x" * 200_000)
    text = run.cli("gc", run.run_dir).stdout
    assert "chunk files removed" in text and "{" not in text
    doc = json.loads(run.cli("gc", run.run_dir, "--json").stdout)
    assert set(doc) >= {"chunks_removed", "tombstones_removed", "temps_removed"}


def test_diff_legend_attribute_only_directories_and_a_post_mortem(run):
    """`vfsd diff` text: a mark per line and its legend; a directory whose only
    change is its times is left out unless --all; snapshots and diff work on
    the run dir once unmounted; fsck says when content was not read back."""
    (run.root / "d").mkdir()
    (run.root / "d" / "keep.txt").write_text("one")
    (run.root / "old.txt").write_text("old")
    s1 = run.cli("snapshot", run.run_dir).stdout.split()[-1]
    (run.root / "d" / "new.txt").write_text("two")  # d's times change with it
    (run.root / "d" / "keep.txt").write_text("ONE")
    os.rename(run.root / "old.txt", run.root / "renamed.txt")
    os.chmod(run.root / "renamed.txt", 0o600)
    s2 = run.cli("snapshot", run.run_dir).stdout.split()[-1]
    text = run.cli("diff", run.run_dir, s1, s2).stdout
    lines = text.splitlines()
    assert "A  d/new.txt" in " ".join(lines) and any(x.startswith("M  d/keep.txt") for x in lines)
    assert lines[-1].startswith("(A added, D deleted, M content changed"), text
    assert not any(x.split()[-1] == "d" for x in lines[:-1] if x.startswith("T")), text
    every = run.cli("diff", run.run_dir, s1, s2, "--all").stdout
    assert any(x.startswith("T  d") for x in every.splitlines()), every
    run.umount()
    # A post-mortem: the same answers from the store, no daemon.
    assert run.cli("diff", run.run_dir, s1, s2).stdout == text
    listed = run.cli("snapshots", run.run_dir).stdout
    assert s1 in listed and s2 in listed
    plain = run.cli("fsck", run.run_dir)
    assert "content not verified" in plain.stdout + plain.stderr
    verified = run.cli("fsck", run.run_dir, "--verify")
    assert "content not verified" not in verified.stdout + verified.stderr


@pytest.mark.fuse
def test_drop_right_behind_a_daemon_on_its_way_out(tmp_path):
    """A daemon removes its pid file, then closes the store and lets go of its
    volume's lock: a drop just behind its unmount (a LangGraph thread's
    deletion) waits for the lock instead of failing "in use by another vfsd"."""
    from vfsd.rundir import RunDir

    store, run_dir = tmp_path / "store", tmp_path / "a"
    vfsd_cli("mount", run_dir, "--store", store)
    (run_dir / "fs" / "x.txt").write_text("x\n")
    vfsd_cli("umount", run_dir)
    store_dir, volume = RunDir(run_dir).store_location()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from vfsd.rundir import lock_volume; "
        "fd = lock_volume(Path(sys.argv[1]), sys.argv[2]); print('held', flush=True); "
        "time.sleep(1.5)"), str(store_dir), volume], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = vfsd_cli("drop", run_dir, check=False)
        assert proc.returncode == 0, proc.stderr
        assert holder.poll() is not None  # it dropped once the lock was let go
        assert not run_dir.exists()
    finally:
        holder.kill()
        holder.wait()


def test_file_names_reach_no_terminal_as_escape_sequences(run_factory):
    """Issue 28, item 9: `vfsd step`, `evict`, `evicted`, the `restore`
    refusal and `fsck` printed file names raw, so a name holding ESC
    sequences (OSC 52 writes the clipboard of many terminals, `ESC[2J`
    clears the screen) reached the operator's terminal."""
    import os

    from conftest import vfsd_cli

    r = run_factory("esc", "--done-retention-steps", "0", "--inline-max", "0")
    evil = "\x1b]52;c;cHduZWQ=\x07\x1b[2Jx\x9b1m"
    for name in ("x.old", "x.old2", "x.db"):
        (r.root / (evil + name)).write_bytes(b"d" * 4096)
    os.setxattr(r.root / (evil + "x.db"), "user.vfsd.pin", b"1")
    os.setxattr(r.root / (evil + "x.old"), "user.vfsd.status", b"done")
    out = [vfsd_cli("step", r.run_dir, "1")]
    os.setxattr(r.root / (evil + "x.old2"), "user.vfsd.status", b"done")
    out += [vfsd_cli("evict", r.run_dir), vfsd_cli("evicted", r.run_dir)]
    assert all("x.old" in p.stdout for p in out), [p.stdout for p in out]
    snap = vfsd_cli("snapshot", r.run_dir).stdout.split()[-1]
    with open(r.root / (evil + "x.db"), "r+b") as held:  # open for writing: refused
        held.write(b"changed")
        held.flush()
        os.fsync(held.fileno())
        refused = vfsd_cli("restore", r.run_dir, snap, check=False)
    assert refused.returncode != 0 and "x.db" in refused.stderr, refused.stderr
    out.append(refused)
    r.umount()
    chunks = [p for p in (r.state_dir / "chunks").rglob("*") if p.is_file()]
    for p in chunks:
        p.unlink()  # the .db's content is gone: fsck --verify names it
    checked = vfsd_cli("fsck", r.run_dir, "--verify", check=False)
    assert "x.db" in checked.stdout, checked.stdout
    out.append(checked)
    for proc in out:
        shown = proc.stdout + proc.stderr
        assert not any(c in shown for c in "\x1b\x07\x9b"), repr(shown)
        assert "\\x1b" in shown
