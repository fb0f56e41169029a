"""Every control op, fed generated requests by hypothesis, on a real mount with a real bucket.

The ops are the daemon's own list (its `unknown_op` reply names them all), and
the argument names are read from the control server's source, so ops and
arguments others add are fuzzed without this file changing. Values are drawn
from everything JSON can hold, plus the shapes that tend to break code: paths
that leave the mount, hold NUL or are very long, snapshot ids near their
limits, integers at the 63-, 64- and 128-bit edges, nested lists and objects.

What must hold, request after request: a reply comes, on the same connection,
with `ok` and, for a refusal, a code and a message; the code is never
`internal` (an exception nothing handled); and the daemon and its mount keep
answering. Directories a request names (`run_dir`) are kept under the test's
own directory, so a fork or copy never lands elsewhere on the machine.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import MountedRun, is_mounted
from ctl import connect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from remote_run import FAST, use_server
from s3server import s3_server  # noqa: F401 - fixture

pytestmark = pytest.mark.fuse
CONTROL = Path(__file__).resolve().parent.parent / "vfsd" / "control"
LONG = os.environ.get("VFSD_LONG") == "1"


def argument_names() -> list[str]:
    """Every request argument the control ops read (from their source)."""
    src = "".join(p.read_text() for p in sorted(CONTROL.glob("*.py")))
    names = set(re.findall(r'\barg\(\w+, "(\w+)"', src)) | set(re.findall(r'req\.get\("(\w+)"', src))
    names |= set(re.findall(r'"(\w+)" in req\b', src))
    return sorted(names - {"op", "id"})


@pytest.fixture(scope="module")
def fuzzed(s3_server, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as mp:
        use_server(s3_server, mp)
        r = MountedRun(base / "run", ("--remote", s3_server.unique_url("fuzz"), *FAST))
        r.mount()
        try:
            (r.root / "dir").mkdir()
            (r.root / "dir" / "a.txt").write_text("a\n")
            (r.root / "big.bin").write_bytes(os.urandom(3 << 20))
            os.symlink("dir/a.txt", r.root / "link")
            with connect(r.run_dir) as c:
                c.call("snapshot", label="fuzz base")
                ops = re.findall(r"\w+", c.error("no-such-op")["message"].split("known:")[1])
            yield r, base, sorted(ops)
        finally:
            if is_mounted(r.root):
                r.umount()
            r.cleanup()


EDGE_INTS = st.sampled_from([0, 1, -1, 2, 7, 2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63,
                             2**64 - 1, 2**64, -(2**63), 2**128, 10**30])
PATHS = st.sampled_from(["big.bin", "dir/a.txt", "dir", "link", "", "/", ".", "..", "../x",
                         "dir/../../etc/passwd", "/etc/passwd", ".vfsd", ".vfsd/status.json",
                         "tmp", "a\x00b", "\udcff", "x" * 300, "/".join(["d"] * 2000),
                         "dir//a.txt", "nonexistent"])
SNAPSHOT_IDS = st.sampled_from(["s1", "s0", "s2", "s-1", "live", "s" + "9" * 30, "S1", "1",
                                "s1\x00", "", "s18446744073709551616"])
SCALARS = (st.none() | st.booleans() | st.integers() | EDGE_INTS
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
           | PATHS | SNAPSHOT_IDS)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=8) | st.sampled_from(argument_names()),
                                        inner, max_size=5), max_leaves=12)


def requests(ops: list[str]):
    names = argument_names()
    return st.fixed_dictionaries(
        # Known ops most of the time: 250 examples must reach at least half of them.
        {"op": st.one_of(st.sampled_from(ops), st.sampled_from(ops), st.sampled_from(ops),
                         st.text(max_size=12), VALUES)},
        optional={"id": VALUES},
    ).flatmap(lambda req: st.dictionaries(st.sampled_from(names) | st.text(max_size=6), VALUES,
                                          max_size=4).map(lambda args: {**args, **req}))


def confined(req: dict, base: Path, n: int) -> dict:
    """The request with any directory it names moved under the test's directory."""
    if "run_dir" in req and isinstance(req["run_dir"], str):
        leaf = re.sub(r"[^\w.-]", "_", req["run_dir"])[:40] or "x"
        req["run_dir"] = str(base / "targets" / f"{n}-{leaf}")
    return req


def test_every_control_op_survives_generated_requests(fuzzed):
    run, base, ops = fuzzed
    assert {"ping", "snapshot", "restore", "fork", "ref", "set_step"} <= set(ops)
    seen: dict[str, int] = {}

    @settings(max_examples=3000 if LONG else 250, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(req=requests(ops))
    def one(req):
        n = sum(seen.values())
        req = confined(req, base, n)
        op = req["op"] if isinstance(req["op"], str) else "?"
        seen[op] = seen.get(op, 0) + 1
        try:
            line = json.dumps(req).encode()
        except (ValueError, UnicodeEncodeError):
            return  # not sendable as JSON (a lone surrogate key, say)
        with connect(run.run_dir, timeout=120) as c:
            c.send_raw(line + b"\n")
            reply = c.recv_reply()
            assert isinstance(reply.get("ok"), bool), reply
            if not reply["ok"]:
                err = reply.get("error") or {}
                assert isinstance(err.get("code"), str) and isinstance(err.get("message"), str)
                assert err["code"] != "internal", f"{req!r:.2000} -> {err}"
            assert c.call("ping")["pong"] is True  # the same connection goes on
        os.statvfs(run.root)  # and the mount answers

    one()
    fuzzed_ops = {op for op in seen if op in ops}
    assert len(fuzzed_ops) >= len(ops) // 2, (sorted(fuzzed_ops), ops)
    assert "control_request_failed" not in run.log_text()
