"""The README's Python snippets run as written.

Each ```python block of README.md runs in a fresh interpreter with an empty
temporary working directory; it must exit 0 and leave no mount behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
