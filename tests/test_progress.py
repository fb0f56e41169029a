"""Progress bars for long work, as the real commands show them: on a terminal
only (stderr a pty), never with --json, never in a pipe or a log.

`vfsd gc --compact` (the LMDB copy, in bytes), `vfsd gc --remote` (the
manifests read, the chunks listed) and a `vfsd mount --from` resume (the
entries imported, told by the daemon) against a real store and a real
SeaweedFS; `vfsd fsck --verify` (inodes, blocks, content).
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess

import pytest
from conftest import VFSD, vfsd_cli
from remote_run import FAST, snapshot, status, sync, use_server
from s3server import s3_server  # noqa: F401 - fixture

pytestmark = pytest.mark.fuse


def on_a_terminal(*args) -> tuple[int, str, str]:
    """Run `vfsd ARGS` with stderr on a pseudo-terminal: (exit code, stdout, what
    the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*VFSD, *map(str, args)], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return proc.wait(timeout=60), out, seen.decode(errors="replace")


def a_bar(text: str, phase: str) -> bool:
    """tqdm's line for `phase`: its name, a count and a rate or a percentage."""
    return any(line.lstrip().startswith(f"{phase}:") and ("/s]" in line or "%|" in line)
               for line in text.replace("\r", "\n").splitlines())


def test_compact_shows_a_bar_on_a_terminal_only(run):
    for i in range(200):
        (run.root / f"f{i}").write_bytes(os.urandom(20_000))
    for i in range(200):
        (run.root / f"f{i}").unlink()
    run.umount()
    code, out, term = on_a_terminal("gc", run.run_dir, "--compact")
    assert code == 0 and a_bar(term, "compact"), term
    assert "LMDB file" in out and "compact:" not in out
    # --json on a terminal, and a plain pipe: no bar anywhere.
    code, out, term = on_a_terminal("gc", run.run_dir, "--compact", "--json")
    assert code == 0 and "compact:" not in term and json.loads(out)["after_bytes"] > 0
    piped = vfsd_cli("gc", run.run_dir, "--compact")
    assert "compact:" not in piped.stderr and "\r" not in piped.stderr
    # fsck --verify, the first long job that had one, goes on showing it.
    code, out, term = on_a_terminal("fsck", run.run_dir, "--verify")
    assert code == 0 and a_bar(term, "inodes"), term


def test_bucket_gc_shows_its_phases_on_a_terminal(s3_server, run_factory,  # noqa: F811
                                                  monkeypatch):
    use_server(s3_server, monkeypatch)
    url = s3_server.unique_url("progress")
    a = run_factory("progress", "--remote", url, *FAST)
    (a.root / "big.bin").write_bytes(os.urandom(3 << 20))
    snapshot(a)
    sync(a)
    code, out, term = on_a_terminal("gc", "--remote", url, "--dry-run")
    assert code == 0, term
    assert a_bar(term, "manifests") and a_bar(term, "chunks"), term
    assert "manifests read" in out
    piped = vfsd_cli("gc", "--remote", url, "--dry-run")
    assert "manifests:" not in piped.stderr and "chunks:" not in piped.stderr
    # A --from resume: the import's entries, counted by the daemon, on the terminal.
    run = status(a)["run"]
    b = run_factory("resumed", mount=False)
    code, out, term = on_a_terminal("mount", b.run_dir, "--remote", url, *FAST, "--from", run)
    assert code == 0 and a_bar(term, "import"), term
    assert (b.root / "big.bin").stat().st_size == 3 << 20


@pytest.mark.skipif(os.environ.get("VFSD_LONG") != "1", reason="VFSD_LONG=1: 20,000 files")
def test_a_first_snapshot_of_a_big_tree_shows_its_progress(run):
    """The daemon builds a big tree's first snapshot in steps and says how far it
    got in its stats; `vfsd snapshot` on a terminal draws that."""
    subprocess.run("for d in $(seq 40); do mkdir d$d; for f in $(seq 500); do "
                   ": > d$d/f$f; done; done", shell=True, cwd=run.root, check=True, timeout=900)
    code, out, term = on_a_terminal("snapshot", run.run_dir)
    assert code == 0 and out.strip() == "s1" and a_bar(term, "snapshot"), term
    assert json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)[
        "snapshot_in_progress"] is None
