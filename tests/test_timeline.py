"""`vfsd timeline` of a real run, mounted and unmounted, and its HTML page in chromium."""

from __future__ import annotations

import html.parser
import json
import os

import chromium
import pytest
from conftest import vfsd_cli

import mount_tool
from mount_tool.daemon import toolcalls

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(240)]


def history(run) -> str:
    """Six steps of agent-like work: tool calls writing files, a delete, an eviction,
    snapshots and a restore. Returns the id of the snapshot restored."""
    m = mount_tool.Mount.attach(run.run_dir)
    try:
        for step in range(1, 5):
            with toolcalls.running("write_file", f"w{step}", "t1"):
                for i in range(step):
                    m.write(f"notes/s{step}_{i}.md", "x" * (step * 1000))
            with toolcalls.running("execute", f"x{step}", "t1"):
                m.write(f"out/run{step}.log", os.urandom(100_000 * step))
            (run.root / f"shell{step}.txt").write_text("from the shell\n")
            if step == 2:
                m.client.call("snapshot", label="ckpt two")
                os.remove(run.root / "notes/s1_0.md")
                os.setxattr(run.root / "out/run1.log", "user.vfsd.status", b"done")
            m.client.call("set_step", step=step)  # run1.log (done at step 0) goes at step 4
        snap = m.client.call("snapshots")["snapshots"][0]["id"]
        m.client.call("restore", snapshot=snap)
    finally:
        m.detach()
    return snap


class Page(html.parser.HTMLParser):
    """What the rendered DOM shows: chart points, marks, table rows and their text."""

    def __init__(self) -> None:
        super().__init__()
        self.points: dict[str, list[int]] = {}
        self.marks: list[tuple[str, str]] = []
        self.rows: list[int] = []
        self.text: list[str] = []
        self.rendered = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "circle" and "data-series" in a:
            self.points.setdefault(a["data-series"], []).append(int(a["data-step"]))
        elif tag == "g" and "mark" in (a.get("class") or ""):
            self.marks.append((a["class"], a.get("data-snapshot") or a.get("data-restore")))
        elif tag == "tr" and a.get("class") == "step":
            self.rows.append(int(a["data-step"]))
        elif tag == "body":
            self.rendered = a.get("data-rendered")

    def handle_data(self, data):
        self.text.append(data)


def test_timeline_mounted_unmounted_and_in_chromium(run, tmp_path):
    snap = history(run)
    doc = json.loads(vfsd_cli("timeline", run.run_dir, "--json").stdout)
    # One record per step, in order, and one more for the step the restore went back to.
    assert [s["step"] for s in doc["steps"]] == [0, 1, 2, 3, 4, 1]
    assert [s["seq"] for s in doc["steps"]] == sorted(s["seq"] for s in doc["steps"])
    s0, s1, _, _, s4, back = doc["steps"]
    assert s1["created"] == 2 + 1 + 1 and s1["changed"] == 4  # made during step 1
    calls = {(c["call"] or {}).get("id"): c for c in s1["calls"]}
    assert calls["w2"] == {"call": {"tool": "write_file", "id": "w2", "thread": "t1",
                                    "step": 1}, "created": 2, "changed": 2, "deleted": 0}
    assert calls["x2"]["created"] == 1 and calls[None]["created"] == 1  # the shell's file
    assert calls[None]["deleted"] == 1  # os.remove, outside any tool call
    assert "notes/s2_0.md" in s1["created_paths"]
    assert s1["snapshots"] == [{"id": snap, "label": "ckpt two", "retained": True}]
    assert s1["deleted"] == 1 and s1["deleted_paths"] == ["notes/s1_0.md"]
    assert s4["evicted"] == 1 and s4["evicted_paths"] == ["out/run1.log (done)"]
    assert s1["files"] > s0["files"] and s1["logical_bytes"] > s0["logical_bytes"]
    # The restore went back to the snapshot's step, and says so there.
    assert back["restores"] == [{"id": snap, "from_step": 4}] and back["created"] == 0
    assert back["files"] == s1["files"] + 1  # as at the snapshot, before the delete
    text = vfsd_cli("timeline", run.run_dir).stdout
    assert "write_file w2 (2 made, 2 changed)" in text and "ckpt two" in text

    run.umount()
    offline = json.loads(vfsd_cli("timeline", run.run_dir, "--json").stdout)
    def settled(steps):  # the unmount wrote the running step's record once more
        return [{k: v for k, v in s.items() if k != "last_ns"} for s in steps]

    assert settled(offline["steps"]) == settled(doc["steps"])
    page = tmp_path / "timeline.html"
    vfsd_cli("timeline", run.run_dir, "--html", str(page))
    source = page.read_text()
    assert "http://" not in source.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in source
    if chromium.binary() is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    seen = Page()
    seen.feed(chromium.dump_dom(page))
    recorded = [s["step"] for s in doc["steps"]]
    assert seen.rendered == str(len(doc["steps"]))
    assert seen.points["files"] == recorded and seen.points["logical_bytes"] == recorded
    assert ("mark snapshot", snap) in seen.marks and ("mark restore", snap) in seen.marks
    assert seen.rows == recorded[::-1]  # newest first
    shown = " ".join(seen.text)
    assert "notes/s2_0.md" in shown and "write_file w2 (2 made, 2 changed)" in shown
    assert "out/run1.log (done)" in shown
    shot = chromium.screenshot(page, tmp_path / "timeline.png")
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(head[16:20], "big") == 1040
    run.mount()


def test_hostile_names_stay_text(run, tmp_path):
    """A file named like markup is shown as its name, never run as a script."""
    evil = '</script><script>document.title="pwned"</script><b id="x">'
    (run.root / (evil.replace("/", "_") + ".txt")).write_text("x")
    vfsd_cli("step", run.run_dir, "1")
    page = tmp_path / "t.html"
    vfsd_cli("timeline", run.run_dir, "--html", str(page))
    if chromium.binary() is None:
        pytest.skip("chromium is not installed")
    dom = chromium.dump_dom(page)
    assert "pwned" not in dom.split("<title>")[1].split("</title>")[0]
    assert '<b id="x">' not in dom
    seen = Page()
    seen.feed(dom)
    assert int(seen.rendered) >= 1
    assert evil.replace("/", "_") + ".txt" in " ".join(seen.text)  # shown as text


def test_a_name_that_opens_an_html_comment_leaves_the_page_whole(run, tmp_path):
    """Issue 28, item 8: a file named `<!--x` blanked the page (`<\\!--` is not
    JSON, so the embedded data did not parse and nothing was drawn)."""
    names = ["<!--x", "<script>y", "a&amp;b", "\u2028z"]
    for name in names:
        (run.root / name).write_text("x")
    vfsd_cli("step", run.run_dir, "1")
    page = tmp_path / "t.html"
    vfsd_cli("timeline", run.run_dir, "--html", str(page))
    if chromium.binary() is None:
        pytest.skip("chromium is not installed")
    seen = Page()
    seen.feed(chromium.dump_dom(page))
    assert seen.rendered is not None and int(seen.rendered) >= 1, "the page drew nothing"
    shown = " ".join(seen.text)
    for name in names[:3]:
        assert name in shown, name
