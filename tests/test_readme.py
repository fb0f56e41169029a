"""The documentation's snippets run as written, and the site builds.

Each ```python block of README.md and of docs/*.md runs in a fresh interpreter
with an empty temporary working directory; it must exit 0 and leave no mount
behind. A block that cannot run here says so on the line before its fence:
`<!-- sketch: WHY -->` (it needs a real chat model, a database DSN or a bucket
it does not create, or it is a fragment of a page's full example); it is
reported as skipped, with WHY. The remote tier's two-worker ```console example
(docs/remote.md) runs line by line, each worker in a directory of its own,
against a private SeaweedFS; the install section's commands (docs/operations.md)
are the ones tests/test_install.py runs. `mkdocs build --strict` must succeed
(every link and anchor of the pages resolves), and README.md stays a front page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from s3server import s3_server  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
#: every page whose ```python blocks run: the front page, then docs/ by name
PAGES = [README, *sorted(DOCS.glob("*.md"))]
#: the page holding the install section tests/test_install.py runs
OPERATIONS = DOCS / "operations.md"
#: README.md is the front page: what vfsd is, the commands, an example, the map
README_MAX_BYTES = 20 * 1024

FENCE = re.compile(r"^(```|~~~)")
SKETCH = re.compile(r"^<!--\s*sketch:\s*(.+?)\s*-->\s*$")

pytestmark = pytest.mark.timeout(120)


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(first code line number, code, sketch reason or None) of every
    ```python block in `text`."""
    blocks = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            start = i + 1
            end = start
            while end < len(lines) and not re.match(r"^```[ \t]*$", lines[end]):
                end += 1
            if line.strip() == "```python":
                previous = lines[i - 1] if i else ""
                sketch = SKETCH.match(previous)
                code = "\n".join(lines[start:end]) + "\n"
                blocks.append((start + 1, code, sketch.group(1) if sketch else None))
            i = end + 1
            continue
        i += 1
    return blocks


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


BLOCKS = [(_name(page), line, code, sketch)
          for page in PAGES for line, code, sketch in python_blocks(page.read_text())]


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below `directory` in this mount namespace."""
    prefix = os.path.realpath(directory) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p.startswith(prefix)]


def _text(output: str | bytes) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def test_the_pages_have_python_blocks() -> None:
    runnable = [(page, line) for page, line, _, sketch in BLOCKS if sketch is None]
    assert [line for page, line in runnable if page == "README.md"], \
        "README.md lost its many-threads example"
    assert len({page for page, _ in runnable}) >= 3 and len(runnable) >= 10, \
        "the docs lost their Agent integration snippets"


def test_python_blocks_parse() -> None:
    """Every block is Python, sketches included (they are read, if not run)."""
    for page, line, code, _ in BLOCKS:
        try:
            compile(code, f"{page}:{line}", "exec")
        except SyntaxError as exc:
            pytest.fail(f"{page}:{line}: {exc}")


@pytest.mark.fuse
@pytest.mark.parametrize(("page", "line", "code", "sketch"), BLOCKS,
                         ids=[f"{page}:{line}" for page, line, _, _ in BLOCKS])
def test_python_block_runs(page: str, line: int, code: str, sketch: str | None,
                           tmp_path: Path) -> None:
    if sketch is not None:
        pytest.skip(f"{page}:{line} is a sketch: {sketch}")
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
            f"{page} block at line {line} {failure}\n--- block ---\n{code}"
            f"--- stdout ---\n{_text(stdout)}--- stderr ---\n{_text(stderr)}",
            pytrace=False,
        )
    assert not left, f"{page} block at line {line} left mounts behind: {left}\n{code}"


# ------------------------------------------------ the shell examples, as written

CONSOLE = re.compile(r"^```console\n(.*?)^```[ \t]*$", re.S | re.M)
PROMPT = re.compile(r"^worker ([A-Z])\$ (.*)$")
INSTALL = re.compile(r"^## Install for production\n.*?^```sh\n(.*?)^```", re.S | re.M)


def install_commands() -> list[str]:
    """The commands of the install section (docs/operations.md), comments dropped."""
    (block,) = INSTALL.findall(OPERATIONS.read_text())
    return [c for c in (line.split("#")[0].strip() for line in block.splitlines()) if c]


def worker_script(block: str, root: Path, url: str) -> str:
    """A bash script running each `worker X$` line in root/X (one shell, so a
    variable set on one line is there on the next, as on a worker's terminal)."""
    lines = ["set -euo pipefail"]
    for text in block.splitlines():
        m = PROMPT.match(text)
        if not m:
            continue  # output shown on the page
        worker, command = m.groups()
        (root / worker).mkdir(exist_ok=True)
        lines.append(f"cd {root / worker}")
        lines.append(command.replace("s3://agents/prod", url))
    return "\n".join(lines) + "\n"


@pytest.mark.fuse
def test_remote_example_runs_as_written(tmp_path, s3_server):  # noqa: F811
    (block,) = [b for page in PAGES for b in CONSOLE.findall(page.read_text())
                if "worker B$" in b]
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


def test_install_section_names_what_test_install_runs():
    assert install_commands() == ["pip install .", "pipx install .", "make dist",
                                  "sudo make install"]


# ------------------------------------------------------------------ the site

def test_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, \
        f"README.md is {size:,} bytes: keep it a front page (at most {README_MAX_BYTES:,}) " \
        "and move the rest to a page of docs/"


def test_every_page_is_in_the_site_nav():
    import yaml

    def names(nav) -> list[str]:
        out = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += names(value) if isinstance(value, list) else [value]
        return out

    # mkdocs.yml is plain YAML (no !!python tags), so the safe loader reads it.
    nav = names(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    assert sorted(nav) == sorted(["index.md", *(p.name for p in DOCS.glob("*.md"))])


def test_mkdocs_builds_strict(tmp_path):
    """`make docs`: every link and anchor resolves, README.md included (it is the
    site's front page), and nothing is fetched."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert "WARNING" not in proc.stderr, proc.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert "One graph, every thread" in index and 'href="threads.html"' in index
    assert (tmp_path / "site" / "timeline.png").exists()
    assert "fonts.googleapis.com" not in index
