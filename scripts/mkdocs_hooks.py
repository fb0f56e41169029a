"""MkDocs hooks: the site's front page is README.md, and links out of docs/ stay honest.

The pages are written to read on GitHub too, so they link the way a checkout
does: README.md to `docs/PAGE.md`, a page to `../README.md` and to files of the
repository (`../bench/README.md`, `../vfsd/remote/__init__.py`). The site is
built from docs/ alone, so here:

- README.md becomes the site's `index.md`, its `docs/` links made relative to
  the site;
- a link to `../README.md` (from a page) becomes a link to `index.md`;
- a link to any other file outside docs/ becomes its text and the file's path
  in code: the site carries no copy of the repository, and a link that goes
  nowhere would fail `mkdocs build --strict`.

Nothing here fetches anything: the build needs no network.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
#: a Markdown link or image: [text](target) / ![alt](target)
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def on_files(files, config):
    """Add README.md as the site's front page."""
    files.append(File.generated(config, "index.md", content=(ROOT / "README.md").read_text()))
    return files


def on_page_markdown(markdown: str, page, config, files):
    """Rewrite the links that point out of docs/ (see the module docstring)."""
    is_index = page.file.src_uri == "index.md"
    out, in_fence = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
        if not in_fence:
            line = LINK.sub(lambda m: _relink(m, is_index), line)
        out.append(line)
    return "\n".join(out)


def _relink(m: re.Match, is_index: bool) -> str:
    bang, text, target = m.groups()
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):  # a URL, or an anchor on the page
        return m.group(0)
    path, _, anchor = target.partition("#")
    if is_index:
        if path.startswith("docs/"):
            return f"{bang}[{text}]({path[len('docs/'):]}{'#' + anchor if anchor else ''})"
        outside = path
    else:
        if path == "../README.md":
            return f"{bang}[{text}](index.md{'#' + anchor if anchor else ''})"
        if not path.startswith("../"):
            return m.group(0)  # another page of the site: mkdocs checks it
        outside = path[len("../"):]
    shown = outside.replace("\\", "")
    plain = text.replace("\\", "").strip("`")
    return f"`{shown}`" if plain == shown else f"{text} (`{shown}`)"
