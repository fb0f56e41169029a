"""Two threads of one shard, side by side: neither reaches the other's files.

A Runs with one shard serves both threads as directories of one mount
(`ROOT/shards/0/fs/t<A>` and `t<B>`), the closest two threads can be. Each
thread's `execute` runs, at the same time as the other's, a command that
tries every route to the other's files: `..` from its root, the shard
mount's own path, /proc (every process's root and cwd, /proc/self/root),
symlinks it plants in its own tree (relative and absolute, to the file and
to the directory), hard links, `mount`, and open_by_handle_at. Nothing of the
other thread comes back, nothing is written there, and the file tools refuse
the symlinks the command planted.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from conftest import tree

pytest.importorskip("deepagents")

from langchain_core.runnables.config import var_child_runnable_config  # noqa: E402

import mount_tool  # noqa: E402
from mount_tool.deepagents import VfsdBackend  # noqa: E402
from mount_tool.runs import thread_dir_name  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

# open_by_handle_at needs CAP_DAC_READ_SEARCH: try it on a handle of our own root.
BY_HANDLE = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Handle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
h = Handle(); h.bytes = 128; mount_id = ctypes.c_int()
r = libc.name_to_handle_at(-100, b"/", ctypes.byref(h), ctypes.byref(mount_id), 0)
print("name_to_handle_at", r, os.strerror(ctypes.get_errno()))
fd = libc.open_by_handle_at(os.open("/", os.O_RDONLY), ctypes.byref(h), os.O_RDONLY)
print("open_by_handle_at", fd, os.strerror(ctypes.get_errno()))
"""


def attack(other: str, shard_fs: Path) -> str:
    """A command that tries every route to volume `other`'s secret."""
    steps = [
        f"cat ../{other}/secret.txt /../{other}/secret.txt", "ls -a .. / /.. 2>&1",
        f"cd .. && cat {other}/secret.txt; cd /",
        f"ls {shard_fs} {shard_fs}/{other}; cat {shard_fs}/{other}/secret.txt",
        f"cat /proc/self/root/../{other}/secret.txt /proc/1/root/../{other}/secret.txt",
        "cat /proc/*/root/secret.txt /proc/*/cwd/secret.txt",
        f"ls /proc/*/root/../{other}",
        "mkdir -p /work",
        f"ln -s ../{other}/secret.txt /work/rel-link; cat /work/rel-link",
        f"ln -s /../{other}/secret.txt /work/abs-link; cat /work/abs-link",
        f"ln -s ../../{other} /work/dir-link; ls /work/dir-link/; cat /work/dir-link/secret.txt",
        f"ln ../{other}/secret.txt /work/hard-link",
        f"echo pwned > ../{other}/pwned; echo pwned > /../{other}/pwned",
        f"mount --bind {shard_fs} /work 2>&1; mount -t proc proc /work 2>&1",
        f"python3 -c '{BY_HANDLE}'",
        "cat /proc/self/mountinfo",
    ]
    # Twice, a second apart: the other thread's command runs meanwhile.
    body = "; ".join(s + " 2>&1" for s in steps)
    return f"{body}; sleep 1; {body}; echo END"


def run_in_thread(backend: VfsdBackend, thread: str, command: str) -> str:
    """`execute` as a tool call of `thread` makes it (the thread is the config's)."""
    var_child_runnable_config.set({"configurable": {"thread_id": thread}})
    return backend.execute(command, timeout=60).output


def test_two_threads_of_one_shard_cannot_reach_each_other(tmp_path):
    with mount_tool.runs(tmp_path / "runs", shards=1) as runs:
        secrets = {t: f"SECRET-{t}-{uuid.uuid4().hex}" for t in ("alice", "bob")}
        names = {t: thread_dir_name(t) for t in secrets}
        for t, secret in secrets.items():
            with runs.use(t) as m:
                m.write("secret.txt", secret)
                shard_fs = m.shard.mountpoint
        assert sorted(p.name for p in shard_fs.iterdir()) == sorted(names.values())
        backend = VfsdBackend(runs)
        outputs: dict[str, str] = {}

        def one(t: str) -> None:
            other = names["bob" if t == "alice" else "alice"]
            outputs[t] = run_in_thread(backend, t, attack(other, shard_fs))

        workers = [threading.Thread(target=one, args=(t,)) for t in secrets]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for t, out in outputs.items():
            other = "bob" if t == "alice" else "alice"
            # stdout and stderr are two pipes: stderr lines written just before
            # END may be read after it, so the command's last stdout line counts.
            stdout_lines = [ln for ln in out.splitlines() if not ln.startswith("[stderr] ")]
            assert stdout_lines[-1:] == ["END"], out[-2000:]
            assert secrets[other] not in out, out
            assert "open_by_handle_at -1 Operation not permitted" in out, out
            with runs.use(t) as m:
                files = tree(m.root)
                # Its own tree: its secret and the links it planted, nothing of the other's.
                assert files["secret.txt"] == secrets[t].encode()
                assert not any(k.startswith(names[other]) or "pwned" in k for k in files), files
                assert "work/hard-link" not in files
                # The file tools refuse every link that leads out of the thread.
                for link in ("/work/rel-link", "/work/abs-link", "/work/dir-link/secret.txt"):
                    res = run_tool(backend, t, lambda b, p=link: b.read(p))
                    assert res.error and secrets[other] not in str(res), (link, res)
                for path in (f"/../{names[other]}/secret.txt", f"/{names[other]}/secret.txt"):
                    res = run_tool(backend, t, lambda b, p=path: b.read(p))
                    assert res.error, (path, res)
                res = run_tool(backend, t, lambda b: b.grep("SECRET", "/"))
                assert [m["path"] for m in res.matches] == ["/secret.txt"], res
        for t, secret in secrets.items():  # each thread's files are as it left them
            with runs.use(t) as m:
                assert (m.root / "secret.txt").read_text() == secret
                assert not (m.root / "pwned").exists()


def run_tool(backend: VfsdBackend, thread: str, call):
    """A file tool call made as `thread`, from a thread of its own (own context)."""
    out = []

    def go() -> None:
        var_child_runnable_config.set({"configurable": {"thread_id": thread}})
        out.append(call(backend))

    worker = threading.Thread(target=go)
    worker.start()
    worker.join()
    return out[0]
