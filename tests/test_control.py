"""The control socket on a real mount (issue 3, docs/control.md).

Requests and replies (ref, resolve, changes, status and pins by request), then
hostile input: every attack is followed by a `ping` on a fresh connection and
on a connection opened before the attack, proving that neither the daemon nor
other clients suffer.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from ctl import Conn, call, connect, error, sock_path
from vfsdattr import vfsd_attr

from mount_tool.refs import content_hash

pytestmark = pytest.mark.fuse

REF_KEYS = {"ino", "gen", "path", "size", "hash", "step", "status", "made_by", "changed_by"}
RECORD_KEYS = {"path", "ino", "gen", "hash", "size", "step", "evicted_step", "reason"}


def h(data: bytes) -> str:
    return content_hash(data)


def assert_pong(conn: Conn) -> None:
    result = conn.call("ping")
    assert result["pong"] is True and isinstance(result["pid"], int)


@contextlib.contextmanager
def survivors(run):
    """Around an attack: a bystander connection opened before it, and after it
    a ping on that bystander and on a fresh connection."""
    with connect(run.run_dir) as bystander:
        assert_pong(bystander)
        yield
        assert_pong(bystander)
        with connect(run.run_dir) as fresh:
            assert_pong(fresh)
            assert fresh.call("get_step")["step"] >= 0


# ------------------------------------------------------------- requests


def test_basic_requests_and_id_echo(run) -> None:
    with connect(run.run_dir) as c:
        reply = c.request("ping", id="abc")
        assert reply["ok"] is True and reply["id"] == "abc"
        assert reply["result"]["pong"] is True
        assert reply["result"]["pid"] == int((run.state_dir / "vfsd.pid").read_text())
        assert isinstance(reply["result"]["version"], str)
        reply = c.request("get_step", id={"nested": [1, 2]})
        assert reply == {"ok": True, "id": {"nested": [1, 2]}, "result": {"step": 0}}
        # Errors echo the id too.
        reply = c.request("no_such_op", id=7)
        assert reply["ok"] is False and reply["id"] == 7
        # Several requests on one connection, replies in order.
        c.send_raw(b'{"op":"get_step","id":1}\n{"op":"ping","id":2}\n\n{"op":"get_step","id":3}\n')
        assert [c.recv_reply()["id"] for _ in range(3)] == [1, 2, 3]
        stats = c.call("stats")
        assert stats["step"] == 0 and stats["files"] == 0
        assert stats["store"] == run.status()["store"]


def test_ref_of_files(run) -> None:
    root = run.root
    (root / "out").mkdir()
    data = b"tool output\n"
    (root / "out/a.txt").write_bytes(data)
    call(run.run_dir, "set_step", step=2)
    big = os.urandom(1_500_000)
    (root / "big").write_bytes(big)
    ref = call(run.run_dir, "ref", path="out/a.txt")
    assert set(ref) == REF_KEYS
    assert ref["ino"] == os.stat(root / "out/a.txt").st_ino
    assert (ref["path"], ref["size"], ref["hash"], ref["step"], ref["status"]) == (
        "out/a.txt",
        len(data),
        h(data),
        0,
        "active",
    )
    assert isinstance(ref["gen"], int)
    assert len(json.dumps(ref)) < 200
    # A leading "/" is the mount root, "." components are harmless.
    assert call(run.run_dir, "ref", path="/out/a.txt") == ref
    assert call(run.run_dir, "ref", path="./out//a.txt") == ref
    big_ref = call(run.run_dir, "ref", path="big")
    assert (big_ref["size"], big_ref["hash"], big_ref["step"]) == (len(big), h(big), 2)

    # The CLI: relative to the mount root, or absolute inside it.
    out = json.loads(run.cli("ref", run.run_dir, "out/a.txt").stdout)
    assert out == ref
    assert json.loads(run.cli("ref", run.run_dir, str(root / "out/a.txt")).stdout) == ref
    proc = run.cli("ref", run.run_dir, "/etc/passwd", check=False)
    assert proc.returncode != 0
    proc = run.cli("ref", run.run_dir, "out/missing", check=False)
    assert proc.returncode != 0 and "not found" in proc.stderr


def test_ref_errors(run) -> None:
    root = run.root
    (root / "dir").mkdir()
    (root / "dir/f").write_bytes(b"f")
    os.symlink("dir/f", root / "link")
    with survivors(run), connect(run.run_dir) as c:
        assert c.error("ref", path="nope")["code"] == "not_found"
        assert c.error("ref", path="dir/nope/deeper")["code"] == "not_found"
        assert c.error("ref", path="dir")["code"] == "not_a_file"
        assert c.error("ref", path="/")["code"] == "not_a_file"
        for bad in ("..", "../etc/passwd", "dir/../../x", "/../run", "dir/../.."):
            assert c.error("ref", path=bad)["code"] == "forbidden", bad
        assert c.error("ref")["code"] == "bad_request"
        assert c.error("ref", path=5)["code"] == "bad_request"
        assert c.error("ref", path=None)["code"] == "bad_request"
        assert c.error("set_status", ino=10**12, status="done")["code"] == "not_found"
        assert c.error("pin", ino="2")["code"] == "bad_request"
        assert c.error("pin")["code"] == "bad_request"
        assert c.error("set_status", path="dir/f", status="finished")["code"] == "bad_request"
        assert c.error("set_status", path="dir/f")["code"] == "bad_request"
        assert c.error("set_status", path="dir/f", status=1)["code"] == "bad_request"
        # Nothing above changed the file.
        ref = c.call("ref", path="dir/f")
        assert (ref["status"], ref["hash"]) == ("active", h(b"f"))


def test_status_and_pin_by_ino(run) -> None:
    root = run.root
    (root / "f").write_bytes(b"data")
    ino = os.stat(root / "f").st_ino
    with connect(run.run_dir) as c:
        ref = c.call("set_status", ino=ino, status="done")
        assert ref["status"] == "done" and ref["path"] == "f"
        assert vfsd_attr(root / "f", "status") == "done"
        c.call("pin", ino=ino)
        assert vfsd_attr(root / "f", "pin") == "1"
        assert c.call("set_step", step=50)["files"] == 0
        c.call("set_status", ino=ino, status="active")
        c.call("unpin", ino=ino)
        assert vfsd_attr(root / "f", "pin") == "0"
        report = c.call("evict")
        assert [(r["path"], r["reason"]) for r in report["evicted"]] == [("f", "max_age")]
        # The inode is gone: requests by ino now say so.
        assert c.error("pin", ino=ino)["code"] == "not_found"


# ----------------------------------------------------------------- resolve


def test_resolve_live_changed_evicted_missing(run) -> None:
    root = run.root
    (root / "live").write_bytes(b"live content")
    (root / "changing").write_bytes(b"version 1")
    (root / "doomed").write_bytes(b"doomed content")
    (root / "removed").write_bytes(b"removed by rm")
    with connect(run.run_dir) as c:
        live = c.call("ref", path="live")
        changing = c.call("ref", path="changing")
        doomed = c.call("ref", path="doomed")
        removed = c.call("ref", path="removed")

        res = c.call("resolve", ref=live)
        assert res == {"state": "live", "ref": live, "matches": True, "evicted": None}
        # ino and gen are enough.
        res = c.call("resolve", ref={"ino": live["ino"], "gen": live["gen"]})
        assert res["state"] == "live" and res["ref"] == live

        # Renamed: still live, at its new path.
        os.rename(root / "live", root / "moved")
        res = c.call("resolve", ref=live)
        assert res["state"] == "live" and res["ref"]["path"] == "moved"

        c.call("set_step", step=1)
        (root / "changing").write_bytes(b"version 2, longer")
        res = c.call("resolve", ref=changing)
        assert res["state"] == "changed" and res["matches"] is False
        assert res["ref"]["hash"] == h(b"version 2, longer")
        assert res["ref"]["size"] == len(b"version 2, longer") and res["ref"]["step"] == 1
        assert res["evicted"] is None

        os.setxattr(root / "doomed", "user.vfsd.status", b"done")
        report = c.call("set_step", step=4)
        assert [r["path"] for r in report["evicted"]] == ["doomed"]
        res = c.call("resolve", ref=doomed)
        assert res["state"] == "evicted" and res["ref"] is None and res["matches"] is False
        rec = res["evicted"]
        assert RECORD_KEYS <= set(rec)
        assert (rec["path"], rec["ino"], rec["gen"], rec["hash"], rec["size"]) == (
            "doomed",
            doomed["ino"],
            doomed["gen"],
            h(b"doomed content"),
            14,
        )
        assert (rec["step"], rec["evicted_step"], rec["reason"]) == (0, 4, "done")
        assert rec == c.call("evicted")["records"][-1]

        os.unlink(root / "removed")
        res = c.call("resolve", ref=removed)
        assert res == {"state": "missing", "ref": None, "matches": False, "evicted": None}

        # A wrong generation never resolves to the inode's content.
        res = c.call("resolve", ref={**changing, "gen": changing["gen"] ^ 1})
        assert res["state"] == "missing" and res["ref"] is None
        res = c.call("resolve", ref={**doomed, "gen": doomed["gen"] ^ 1})
        assert res["state"] == "missing" and res["evicted"] is None
        res = c.call("resolve", ref={"ino": 10**9, "gen": 0})
        assert res["state"] == "missing"

        for bad in (
            {},
            {"ref": "x"},
            {"ref": {"ino": 1}},
            {"ref": {"ino": "1", "gen": 0}},
            {"ref": {"ino": 1, "gen": True}},
            {"ref": None},
        ):
            assert c.error("resolve", **bad)["code"] == "bad_request", bad


# ----------------------------------------------------------------- changes


def test_changes_since_a_step(run) -> None:
    root = run.root
    (root / "sub").mkdir()
    for name in ("a", "b", "sub/c", "e", "old"):
        (root / name).write_bytes(name.encode())
    os.setxattr(root / "e", "user.vfsd.status", b"done")
    inos = {n: os.stat(root / n).st_ino for n in ("a", "b", "sub/c", "e", "old")}
    with connect(run.run_dir) as c:
        c.call("set_step", step=2)
        with open(root / "a", "ab") as f:
            f.write(b" changed")
        (root / "d").write_bytes(b"new at 2")
        c.call("set_step", step=3)
        subprocess.run(["rm", "--", root / "b", root / "sub/c"], check=True)
        report = c.call("set_step", step=4)
        assert [r["path"] for r in report["evicted"]] == ["e"]

        ch = c.call("changes", since=2)
        assert ch["step"] == 4
        changed = {r["path"]: r for r in ch["changed"]}
        assert set(changed) == {"a", "d"}
        for path, ref in changed.items():
            assert ref == c.call("ref", path=path)
        assert changed["a"]["hash"] == h(b"a changed") and changed["a"]["step"] == 2
        removed = {r["ino"]: r for r in ch["removed"]}
        assert set(removed) == {inos["b"], inos["sub/c"], inos["e"]}
        for rec in removed.values():
            assert {"ino", "gen", "step", "reason"} <= set(rec)
        assert (removed[inos["b"]]["reason"], removed[inos["b"]]["step"]) == ("unlink", 3)
        assert (removed[inos["sub/c"]]["reason"], removed[inos["sub/c"]]["step"]) == ("unlink", 3)
        assert removed[inos["e"]]["reason"] == "done" and removed[inos["e"]]["step"] == 4
        assert removed[inos["e"]]["path"] == "e"

        everything = c.call("changes", since=0)
        assert {r["path"] for r in everything["changed"]} == {"a", "d", "old"}
        assert len(everything["removed"]) == 3
        later = c.call("changes", since=5)
        assert later == {"step": 4, "changed": [], "removed": [], "next": None}
        assert c.error("changes")["code"] == "bad_request"
        assert c.error("changes", since="2")["code"] == "bad_request"


def test_changes_removal_record_of_unlink_has_path(run) -> None:
    (run.root / "sub").mkdir()
    (run.root / "sub/c").write_bytes(b"c")
    os.unlink(run.root / "sub/c")
    (rec,) = call(run.run_dir, "changes", since=0)["removed"]
    assert rec["path"] == "sub/c" and rec["reason"] == "unlink"


# ------------------------------------------------------------ hostile input


def test_garbage_and_invalid_utf8(run) -> None:
    with survivors(run), connect(run.run_dir) as c:
        for junk in (
            b"\x00\xff\xfe garbage \x01\n",
            b"not json at all\n",
            b"{\n",
            b'{"op": "\xff\xfe"}\n',
            b"\xc3\x28\n",
            b"}}}{{{\n",
            b"nan\n",
        ):
            c.send_raw(junk)
            reply = c.recv_reply()
            assert reply["ok"] is False and reply["error"]["code"] == "bad_json", junk
            assert reply["id"] is None
        # The connection itself is still usable after bad lines.
        assert_pong(c)


def test_truncated_json_then_close(run) -> None:
    with survivors(run):
        c = connect(run.run_dir)
        c.send_raw(b'{"op": "set_step", "step": 99')
        c.sock.shutdown(socket.SHUT_WR)
        line = c.recv_line()
        if line:  # an error reply is welcome; silence is acceptable too
            assert json.loads(line)["error"]["code"] == "bad_json"
        assert c.is_closed_by_peer()
        c.close()
        # Truncated without a half-close: just drop the connection.
        c = connect(run.run_dir)
        c.send_raw(b'{"op": "pi')
        c.close()
    assert call(run.run_dir, "get_step") == {"step": 0}


def test_json_that_is_not_an_object(run) -> None:
    with survivors(run), connect(run.run_dir) as c:
        for doc in (b'["ping"]', b'"ping"', b"42", b"null", b"true", b'[{"op": "ping"}]'):
            c.send_raw(doc + b"\n")
            err = c.recv_reply()["error"]
            assert err["code"] == "bad_request", doc
        assert_pong(c)


def test_oversized_line_gets_too_large_and_a_closed_connection(run) -> None:
    total = 100 * (1 << 20)
    with survivors(run):
        c = connect(run.run_dir, timeout=30)
        sent = [0]

        def flood() -> None:
            piece = b"x" * (1 << 20)
            try:
                while sent[0] < total:  # bounded: at most 100 MiB, no newline
                    c.sock.sendall(piece)
                    sent[0] += len(piece)
            except OSError:
                pass  # the daemon closed the connection: expected

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        try:
            line = c.recv_line()
        except ConnectionResetError:
            line = b""
        t.join(timeout=60)
        assert not t.is_alive()
        assert line, "no error reply before the connection closed"
        reply = json.loads(line)
        assert reply["ok"] is False and reply["error"]["code"] == "too_large"
        assert c.is_closed_by_peer()
        assert sent[0] < total, "the daemon read all 100 MiB instead of stopping early"
        c.close()

        # Just over the limit with a newline: refused too; just under: parsed.
        with connect(run.run_dir) as c2:
            c2.send_raw(b'{"op": "ping", "pad": "' + b"y" * (1 << 20) + b'"}\n')
            assert c2.recv_reply()["error"]["code"] == "too_large"
        with connect(run.run_dir) as c3:
            reply = c3.request("ping", pad="z" * ((1 << 20) - 100))
            assert reply["ok"] is True


def test_set_step_expecting_a_step_refuses_one_that_moved(run) -> None:
    """`expect`: a client advancing the step it last saw (one round trip with
    the changes, in a batch) learns that it moved meanwhile; nothing changes."""
    with connect(run.run_dir) as c:
        c.call("set_step", step=3)
        err = c.error("set_step", step=3, expect=2)
        assert err["code"] == "step_moved" and "is 3, not 2" in err["message"]
        assert c.call("get_step") == {"step": 3}
        assert c.call("set_step", step=4, expect=3)["step"] == 4
        res = c.call("batch", stop_on_error=True, requests=[
            {"op": "changes", "since": 9}, {"op": "set_step", "step": 10, "expect": 9}])
        assert [r["ok"] for r in res["results"]] == [True, False]
        assert res["results"][1]["error"]["code"] == "step_moved"
        assert c.call("get_step") == {"step": 4}
        assert c.error("set_step", step=5, expect="4")["code"] == "bad_request"


def test_wrong_argument_types(run) -> None:
    with survivors(run), connect(run.run_dir) as c:
        for step in ("5", True, False, -1, 1.5, None, [3], {"n": 3}):
            err = c.error("set_step", step=step)
            assert err["code"] == "bad_request", step
        assert c.error("set_step")["code"] == "bad_request"
        for dry in ("yes", 1, None):
            assert c.error("evict", dry_run=dry)["code"] == "bad_request", dry
        assert c.error("evicted", limit="10")["code"] == "bad_request"
        assert c.error("evicted", limit=-1)["code"] == "bad_request"
        assert c.error("changes", since=True)["code"] == "bad_request"
        assert c.call("get_step") == {"step": 0}


def test_unknown_missing_and_wrongly_typed_op(run) -> None:
    with survivors(run), connect(run.run_dir) as c:
        err = c.error("drop_everything")
        assert err["code"] == "unknown_op" and "drop_everything" in err["message"]
        assert c.error("PING")["code"] == "unknown_op"
        assert c.error("")["code"] == "unknown_op"
        assert c.error(None, step=3)["code"] == "bad_request"  # no op at all
        for op in (1, None, ["ping"], {"x": 1}, True):
            c.send_raw(json.dumps({"op": op}).encode() + b"\n")
            assert c.recv_reply()["error"]["code"] == "bad_request", op


def test_set_step_backwards_is_refused(run) -> None:
    (run.root / "f").write_bytes(b"f")
    with survivors(run), connect(run.run_dir) as c:
        c.call("set_step", step=10)
        err = c.error("set_step", step=9)
        assert err["code"] == "bad_request" and "10" in err["message"]
        assert c.call("get_step") == {"step": 10}
        # Setting the same step again is allowed and evicts nothing new.
        assert c.call("set_step", step=10)["files"] == 0
    assert vfsd_attr(run.root / "f", "step") == "0"
    proc = run.cli("step", run.run_dir, "3", check=False)
    assert proc.returncode != 0 and "before the current step" in proc.stderr


def test_many_connections_at_once(run) -> None:
    """100 connections against 64 slots: newcomers make room by closing the
    oldest connections that had not sent a request yet; the bystander, which
    had, keeps its connection, and nobody gets a confusing reply."""
    with survivors(run):
        conns = [connect(run.run_dir) for _ in range(100)]
        try:
            for i, c in enumerate(conns):
                try:
                    c.send_raw(json.dumps({"op": "ping", "id": i}).encode() + b"\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # closed to make room: no reply below
            ok, closed = 0, []
            for i, c in enumerate(conns):
                try:
                    line = c.recv_line()
                except ConnectionResetError:
                    line = b""
                if not line:
                    closed.append(i)
                    continue
                reply = json.loads(line)
                assert reply["ok"] is True, reply
                assert reply["id"] == i and reply["result"]["pong"] is True
                ok += 1
            # Closed ones were silent when they made room (which ones depends
            # on how far the daemon's accepting had got while pings came in).
            assert ok + len(closed) == 100 and ok >= 60, (ok, closed)
        finally:
            for c in conns:
                c.close()
    # All slots are free again.
    conns = [connect(run.run_dir) for _ in range(30)]
    try:
        for c in conns:
            assert_pong(c)
    finally:
        for c in conns:
            c.close()


def test_silent_and_stalled_clients_block_nobody(run) -> None:
    (run.root / "f").write_bytes(b"f")
    with survivors(run):
        silent = connect(run.run_dir)
        stalled = connect(run.run_dir)
        stalled.send_raw(b'{"op": "ping"')  # half a request, then nothing
        try:
            with connect(run.run_dir) as c:
                assert_pong(c)
                c.call("set_step", step=1)
                assert c.call("ref", path="f")["size"] == 1
            # The filesystem is not blocked either.
            assert (run.root / "f").read_bytes() == b"f"
            # The stalled client can still finish its request.
            stalled.send_raw(b"}\n")
            assert stalled.recv_reply()["result"]["pong"] is True
        finally:
            silent.close()
            stalled.close()


def test_out_of_range_integers_are_bad_requests(run) -> None:
    run.expect_errors = True  # the bug logs tracebacks; asserted below instead
    with survivors(run), connect(run.run_dir) as c:
        codes = [
            c.error("set_step", step=2**70)["code"],
            c.error("pin", ino=2**70)["code"],
            c.error("pin", ino=-1)["code"],
            c.error("resolve", ref={"ino": -1, "gen": 0})["code"],
            c.error("changes", since=-1)["code"],
        ]
        assert c.call("get_step") == {"step": 0}
    assert "Traceback" not in run.log_text()
    assert all(code in ("bad_request", "not_found") for code in codes), codes


# ---------------------------------------------------------------- security


def test_socket_is_owner_only(run) -> None:
    st = os.stat(sock_path(run.run_dir))
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()


def _connect_as_nobody(state_dir: Path) -> str:
    """In a forked child running as uid/gid 65534, connect to the socket and
    read one line; what happened, as text ("EACCES", "closed", or the reply).

    The child reaches the socket through a directory fd opened before dropping
    privileges, so the test's private tmp dirs do not stop it first: only the
    socket's own mode and the daemon's peer-uid check are under test.
    """
    dirfd = os.open(state_dir, os.O_PATH | os.O_DIRECTORY)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            try:
                s.connect(f"/proc/self/fd/{dirfd}/vfsd.sock")
            except PermissionError:
                msg = b"EACCES"
            else:
                try:
                    s.sendall(b'{"op": "set_step", "step": 1000}\n')
                except OSError:
                    pass  # already closed by the daemon
                buf = b""
                try:
                    while b"\n" not in buf:
                        chunk = s.recv(4096)
                        if not chunk:
                            break
                        buf += chunk
                except OSError:
                    pass
                msg = buf.split(b"\n")[0] if buf else b"closed"
            os.write(w, msg)
        except BaseException as exc:  # report anything, exit regardless
            os.write(w, f"child error: {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(dirfd)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to switch to another uid")
def test_another_uid_is_refused(run) -> None:
    with survivors(run):
        # The socket mode alone stops another user at connect().
        assert _connect_as_nobody(run.state_dir) == "EACCES"
        # With the modes opened up (the state dir is 0700 too), the daemon's
        # peer-uid check still refuses.
        path = sock_path(run.run_dir)
        dir_mode = run.state_dir.stat().st_mode & 0o7777
        os.chmod(run.state_dir, 0o711)
        os.chmod(path, 0o777)
        try:
            out = _connect_as_nobody(run.state_dir)
        finally:
            os.chmod(path, 0o600)
            os.chmod(run.state_dir, dir_mode)
        assert not out.startswith("child error"), out
        if out != "closed":
            reply = json.loads(out)
            assert reply["ok"] is False and reply["error"]["code"] == "forbidden"
    # The refused request did nothing.
    assert call(run.run_dir, "get_step") == {"step": 0}


def test_errors_never_reach_the_daemon_log_as_crashes(run) -> None:
    """A burst of every bad request above on one connection; the fixture then
    checks that the daemon logged no error or traceback."""
    with survivors(run), connect(run.run_dir) as c:
        bad_lines = [
            b"\xff\n",
            b"[]\n",
            b'{"op": 3}\n',
            b'{"op": "x"}\n',
            b'{"op": "ref", "path": {"a": 1}}\n',
            b'{"op": "resolve", "ref": []}\n',
            b'{"op": "evicted", "limit": 1e9}\n',
            b'{"op": "set_status", "path": "/", "status": "done"}\n',
            b'{"op": "ref", "path": "\\u0000"}\n',
            b'{"op": "ref", "path": "' + b"a/" * 2000 + b'"}\n',
        ]
        for line in bad_lines:
            c.send_raw(line)
        for line in bad_lines:
            reply = c.recv_reply()
            assert reply["ok"] is False and reply["error"]["code"] != "internal", (line, reply)
    assert error(run.run_dir, "ref", path="x" * 300)["code"] in ("not_found", "bad_request")


def test_overlong_path_component_is_a_bad_request(run) -> None:
    # Longer than any name can be, and than an LMDB key may be: a clear
    # refusal, not an internal error.
    reply = error(run.run_dir, "ref", path="x" * 600 + "/y")
    assert reply["code"] == "bad_request" and "255" in reply["message"]
    assert call(run.run_dir, "ping")["pong"] is True


# ------------------------------------------------- malformed beyond parsing


def strict_json(line: bytes) -> dict:
    """A reply parsed as strict JSON: NaN and Infinity are not JSON."""

    def refuse(name: str):
        raise AssertionError(f"the reply holds {name}, which is not JSON: {line[:200]!r}")

    return json.loads(line, parse_constant=refuse)


def test_deeply_nested_request_gets_an_error_not_a_dead_daemon(run) -> None:
    pid = int((run.state_dir / "vfsd.pid").read_text())
    with survivors(run), connect(run.run_dir) as c:
        for depth in (33, 1_000, 100_000):
            for line in (
                b'{"op": "ping", "x": ' + b"[" * depth + b"]" * depth + b"}",
                b'{"op": "ping", "x": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}",
                b"[" * depth,  # never closed
            ):
                c.send_raw(line + b"\n")
                reply = strict_json(c.recv_line())
                assert reply["ok"] is False and reply["error"]["code"] == "bad_json", depth
                assert "arrays and objects" in reply["error"]["message"]
        # Brackets inside strings do not count; 32 levels are fine.
        assert c.request("ping", x="[" * 5000)["ok"] is True
        nested: list = []
        for _ in range(30):
            nested = [nested]
        assert c.request("ping", x=nested)["ok"] is True
    assert int((run.state_dir / "vfsd.pid").read_text()) == pid
    assert (run.root / "alive").write_bytes(b"the mount still answers") == 23


def test_non_finite_ids_and_numbers_are_refused(run) -> None:
    with survivors(run), connect(run.run_dir) as c:
        for doc in (
            b'{"op": "ping", "id": NaN}',
            b'{"op": "ping", "id": Infinity}',
            b'{"op": "ping", "id": [-Infinity]}',
            b'{"op": "ping", "id": 1e999}',
            b'{"op": "set_step", "step": 1e400}',
        ):
            c.send_raw(doc + b"\n")
            reply = strict_json(c.recv_line())
            assert reply["ok"] is False and reply["error"]["code"] == "bad_json", doc
            assert reply["id"] is None
        # Finite floats still echo as they came.
        assert strict_json(json.dumps(c.request("ping", id=1.5)).encode())["id"] == 1.5


def test_lone_surrogate_path_is_a_bad_request(run) -> None:
    (run.root / "f").write_bytes(b"f")
    with survivors(run), connect(run.run_dir) as c:
        for raw in (b'"\\ud800"', b'"f\\udfff/x"', b'"\\ud83d"'):
            c.send_raw(b'{"op": "ref", "path": ' + raw + b"}\n")
            reply = strict_json(c.recv_line())
            assert reply["ok"] is False and reply["error"]["code"] == "bad_request", raw
            assert "Unicode" in reply["error"]["message"]
        # Surrogate escapes of non-UTF-8 bytes are names, not errors.
        assert c.error("ref", path="caf\udce9")["code"] == "not_found"
    assert "Traceback" not in run.log_text()


def test_client_vanishing_mid_reply(run) -> None:
    """A client that asks for a large reply and closes before reading it."""
    with survivors(run):
        for _ in range(20):
            c = connect(run.run_dir)
            c.send_raw(json.dumps({"op": "ping", "id": "x" * 900_000}).encode() + b"\n")
            c.close()
        c = connect(run.run_dir)
        c.send_raw(json.dumps({"op": "stats", "id": "y" * 900_000}).encode() + b"\n")
        c.recv_line  # noqa: B018 - nothing read: the reply is still being sent
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()


# ------------------------------------------------------ connection slots


def test_idle_connections_do_not_lock_out_the_control_plane(run) -> None:
    """64 connections that send nothing: clients still get in, mount_tool's
    persistent client and the vfsd CLI alike."""
    import mount_tool
    from mount_tool.daemon.client import ControlClient

    idle = [connect(run.run_dir) for _ in range(64)]
    try:
        client = ControlClient(sock_path(run.run_dir))
        assert client.ping()
        assert client.call("get_step") == {"step": 0}
        step = run.cli("step", run.run_dir, "1")
        assert step.returncode == 0 and "step 1" in step.stdout
        m = mount_tool.Mount.attach(run.run_dir)
        assert m.get_step() == 1
        # More idle connections arrive; the clients that already made requests keep theirs.
        idle += [connect(run.run_dir) for _ in range(64)]
        assert client.call("get_step") == {"step": 1} and m.get_step() == 1
        m.detach()
        client.close()
    finally:
        for c in idle:
            c.close()


@pytest.fixture
def short_idle(run_factory):
    return run_factory("short-idle", "--control-idle-timeout", "1")


def read_until_closed(sock: socket.socket, limit_s: float = 30.0) -> int:
    """Bytes received until the daemon closed the connection (bounded wait)."""
    sock.settimeout(limit_s)
    total = 0
    while chunk := sock.recv(1 << 16):
        total += len(chunk)
    return total


def test_idle_timeout_closes_silent_stalled_and_unread_connections(short_idle) -> None:
    from mount_tool.daemon.client import ControlClient

    run = short_idle
    silent, stalled, unread = (connect(run.run_dir) for _ in range(3))
    try:
        stalled.send_raw(b'{"op": "pi')
        request = json.dumps({"op": "ping", "id": "z" * 900_000}).encode() + b"\n"
        unread.send_raw(request)
        assert read_until_closed(silent.sock) == 0
        assert read_until_closed(stalled.sock) == 0
        time.sleep(0.5)  # not a measurement: lets the daemon give up on the reply first
        assert read_until_closed(unread.sock) < len(request), "the whole reply was sent"
        # A client that keeps its connection open reconnects once the daemon closed it.
        client = ControlClient(sock_path(run.run_dir))
        assert client.ping()
        kept = client._sock
        assert kept is not None and read_until_closed(kept) == 0  # closed while idle
        assert client.call("get_step") == {"step": 0}
        assert client._sock is not kept
        client.close()
    finally:
        for c in (silent, stalled, unread):
            c.close()
    with connect(run.run_dir) as c:
        assert_pong(c)


def test_saturated_daemon_gives_a_clear_error(run) -> None:
    """Every slot is busy sending a reply that its client does not read: a new
    client is told so, in words, instead of `reply id None != 2`."""
    import mount_tool
    from mount_tool.daemon.client import ControlClient

    stuck = []
    try:
        for i in range(64):  # 64 slots (48 per uid for a daemon not running as root)
            c = connect(run.run_dir)
            # A ~900 KB reply: far more than the socket holds, so the daemon
            # waits (up to the idle timeout) for a reader that never comes.
            try:
                c.send_raw(json.dumps({"op": "ping", "id": f"{i}" + "w" * 900_000}).encode())
                c.send_raw(b"\n")
            except BrokenPipeError:  # refused: every slot is stuck already
                c.close()
                break
            stuck.append(c)
            c.sock.settimeout(30)
            assert c.sock.recv(100, socket.MSG_PEEK), "the daemon did not start replying"
        client = ControlClient(sock_path(run.run_dir))
        with pytest.raises(mount_tool.ControlError) as exc:
            client.call("get_step")
        assert exc.value.code == "busy"
        assert "saturated" in str(exc.value) and "None" not in str(exc.value)
        proc = run.cli("step", run.run_dir, "1", check=False)
        assert proc.returncode == 1 and "saturated" in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        for c in stuck:
            c.close()
    # The stuck replies fail, their slots come back.
    with connect(run.run_dir) as c:
        assert_pong(c)
    assert ControlClient(sock_path(run.run_dir)).call("get_step") == {"step": 0}


def test_changes_come_in_pages_and_never_grow_the_store(run) -> None:
    """`changes(since=0)` over thousands of files: every ref arrives, a page at a
    time, and the LMDB file does not grow (a long read transaction held across
    per-file writes once made it grow by hundreds of MB)."""
    root = run.root
    n = 3000
    for i in range(n):
        (root / f"f{i:05d}").write_bytes(b"%d" % i)
    data_mdb = run.state_dir / "lmdb" / "data.mdb"
    before = data_mdb.stat().st_size
    with connect(run.run_dir) as c:
        first = c.call("changes", since=0, limit=1000)
        assert len(first["changed"]) == 1000 and first["next"]
        seen = {r["path"] for r in first["changed"]}
        page = first
        while page["next"]:
            page = c.call("changes", since=0, after=page["next"], limit=1000)
            assert page["removed"] == []
            seen |= {r["path"] for r in page["changed"]}
        assert seen == {f"f{i:05d}" for i in range(n)}
        assert c.error("changes", since=0, after=[1])["code"] == "bad_request"
        assert c.error("changes", since=0, after=["x", 1])["code"] == "bad_request"
    import mount_tool

    with mount_tool.Mount.attach(run.run_dir) as m:
        assert len(m.changes(0)["changed"]) == n
    assert data_mdb.stat().st_size - before < 4 << 20


def test_which_replies_are_encoded_off_the_loop() -> None:
    """A reply with thousands of items (an eviction pass's records) is encoded in a
    worker thread; a usual one on the loop, without the thread's round trip."""
    from vfsd.control.protocol import BULKY_ITEMS, is_bulky

    record = {"path": "d/f.txt", "reason": "max_age", "size": 3}
    assert is_bulky({"step": 9, "evicted": [record] * (BULKY_ITEMS + 1)})
    assert is_bulky({"a": {"b": [0] * (BULKY_ITEMS + 1)}})
    assert is_bulky([[0] * 1000, [0] * 1000, [0] * 1000])
    assert not is_bulky({"step": 9, "evicted": [record] * 10, "files": 10})
    assert not is_bulky(None) and not is_bulky("x" * 100_000) and not is_bulky(7)
