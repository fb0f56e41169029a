"""The README's snippets run as written.

Each ```python block of README.md runs in a fresh interpreter with an empty
temporary working directory; it must exit 0 and leave no mount behind. The
remote tier's two-worker ```console example runs line by line, each worker in a
directory of its own, against a private SeaweedFS; the Install section's
commands are the ones tests/test_install.py runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from s3server import s3_server  # noqa: F401 - fixture

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.S | re.M)

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block in `text`."""
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


BLOCKS = python_blocks(README.read_text())


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below `directory` in this mount namespace."""
    prefix = os.path.realpath(directory) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p.startswith(prefix)]


def _text(output: str | bytes) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def test_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 4, "README.md lost its Agent integration snippets"


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{n}" for n, _ in BLOCKS])
def test_readme_block_runs(line: int, code: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    work = tmp_path / "cwd"
    work.mkdir()
    # The repo's packages must come from the venv, not from the working directory.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        failure = None if proc.returncode == 0 else f"exited {proc.returncode}"
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        failure = "did not finish in 90 s"
        stdout, stderr = exc.stdout or "", exc.stderr or ""
    finally:
        left = mounts_under(work)
        for point in left:
            subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
    if failure:
        pytest.fail(
            f"README.md block at line {line} {failure}\n--- block ---\n{code}"
            f"--- stdout ---\n{_text(stdout)}--- stderr ---\n{_text(stderr)}",
            pytrace=False,
        )
    assert not left, f"README.md block at line {line} left mounts behind: {left}\n{code}"


# ------------------------------------------------ the shell examples, as written

CONSOLE = re.compile(r"^```console\n(.*?)^```[ \t]*$", re.S | re.M)
PROMPT = re.compile(r"^worker ([A-Z])\$ (.*)$")
INSTALL = re.compile(r"^## Install\n.*?^```sh\n(.*?)^```", re.S | re.M)


def worker_script(block: str, root: Path, url: str) -> str:
    """A bash script running each `worker X$` line in root/X (one shell, so a
    variable set on one line is there on the next, as on a worker's terminal)."""
    lines = ["set -euo pipefail"]
    for text in block.splitlines():
        m = PROMPT.match(text)
        if not m:
            continue  # output shown in the README
        worker, command = m.groups()
        (root / worker).mkdir(exist_ok=True)
        lines.append(f"cd {root / worker}")
        lines.append(command.replace("s3://agents/prod", url))
    return "\n".join(lines) + "\n"


def test_readme_remote_example_runs_as_written(tmp_path, s3_server):  # noqa: F811
    (block,) = [b for b in CONSOLE.findall(README.read_text()) if "worker B$" in b]
    script = worker_script(block, tmp_path, s3_server.unique_url("readme"))
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **s3_server.env,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              env=env, timeout=120)
    finally:
        for point in mounts_under(tmp_path):
            subprocess.run([str(Path(sys.executable).parent / "vfsd"), "umount", "--force",
                            str(Path(point).parent)], capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, f"{script}\n--- stdout ---\n{proc.stdout}\n" \
                                 f"--- stderr ---\n{proc.stderr}"
    # B read what A wrote; A's umount published it first, with nothing left over.
    assert proc.stdout.rstrip().endswith("# findings"), proc.stdout
    assert "left unpublished" not in proc.stderr and "read-only" not in proc.stderr


def test_readme_install_section_names_what_test_install_runs():
    (block,) = INSTALL.findall(README.read_text())
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    commands = [c for c in commands if c]
    assert commands == ["pip install .", "pipx install .", "make dist", "sudo make install"]
