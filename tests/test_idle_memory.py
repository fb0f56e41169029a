"""An idle daemon gives back the heap its start freed (glibc keeps it otherwise)."""

from __future__ import annotations

import json
import time


def test_idle_daemon_trims_the_heap_its_start_freed(run):
    deadline = time.monotonic() + 60  # a bound on a loaded machine, not a timing
    while '"heap_trimmed"' not in run.log_text():
        assert time.monotonic() < deadline, "the daemon never trimmed its heap"
        time.sleep(0.05)
    line = next(ln for ln in run.log_text().splitlines() if '"heap_trimmed"' in ln)
    rec = json.loads(line)
    # Imports, the store's opening and the page walk free a few MiB on the
    # way; what is handed back shows in the daemon's own RssAnon.
    assert rec["anon_kib_after"] < rec["anon_kib_before"] - 512, rec
    # The mount still answers after it.
    (run.root / "f").write_text("x")
    assert (run.root / "f").read_text() == "x"
