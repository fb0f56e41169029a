"""A warm process that runs `vfsd` commands by forking: mounts in milliseconds.

Starting a daemon from nothing costs an interpreter and its imports (trio
alone is ~60 ms on a quiet machine, several times that on a busy one), twice
over: once for `vfsd mount`, once for the daemon it starts. A program that
mounts many run dirs (one per agent thread) keeps this process instead:
it has imported the command line and the daemon once, and runs each
command in a forked child; `vfsd mount` there forks the daemon too
(`vfsd.cli.mount.FORK_DAEMON`), so a mount costs two forks, the store's
opening and the FUSE mount.

    python -m vfsd.cli.spawner FD [ROOM]

FD is one end of a Unix stream socketpair; the process that started it
(mount_tool) holds the other and is the only one that can talk to it. Each
command arrives as one byte with a file descriptor attached (SCM_RIGHTS): a
socket of its own, on which the child reads one JSON line {"argv": [...],
"env": {...}, "cwd": str, "umask": int}, answers {"pid": N} at once (so the
caller can kill a command that outlasts its timeout) and then {"code": N,
"stdout": str, "stderr": str}, as the same `vfsd` command run as a process
would have exited and printed. End of file on FD (the caller closed it, or
died) ends the spawner; daemons it started run on, as daemons do.

The spawner is single-threaded and opens no store, so forking it is safe.
In `ps` it is `vfsd spawner for pid N` (N: the process it serves), a command
it runs `vfsd ARGS...`, and the daemons it forks name what they serve
(`vfsd.daemon.set_process_title`). A title takes the room of the process's
arguments, which forked processes share with the spawner: ROOM, an argument
of spaces alone, makes that room (mount_tool passes TITLE_ROOM of them).
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import tempfile

from vfsd import serve  # noqa: F401 - first: the daemon's imports, without rich
from vfsd.daemon import set_process_title

from . import mount as mount_verb
from .common import cli, printable

#: bytes a command's request may take (its environment included)
MAX_REQUEST = 1 << 20
#: characters of a command's line its process title shows
COMMAND_TITLE_CHARS = 400
#: spaces of ROOM that give every process title (a daemon's names its run dir) room
TITLE_ROOM = 2048


def main(argv: list[str]) -> int:
    room_only = len(argv) == 1 or (len(argv) == 2 and not argv[1].strip(" "))
    if not argv or not argv[0].isdigit() or not room_only:
        print("usage: python -m vfsd.cli.spawner FD [ROOM] (started by mount_tool)",
              file=sys.stderr)
        return 2
    ctl = socket.socket(fileno=int(argv[0]))
    mount_verb.FORK_DAEMON = True
    # Named for `ps` and `top` (the daemons forked from here name themselves).
    set_process_title(f"vfsd spawner for pid {os.getppid()}", "vfsd spawner")
    # What is loaded now stays shared with every daemon forked from here: the
    # collector would otherwise write to every object's header in each child
    # and copy all their pages.
    gc.collect()
    gc.freeze()
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 1, 1)
        except (ConnectionError, OSError):
            return 0
        _reap()
        if not msg:
            return 0
        if not fds:
            continue
        pid = os.fork()
        if pid == 0:
            ctl.close()
            os._exit(_run_command(fds[0]))
        os.close(fds[0])


def _reap() -> None:
    """Collect the commands' children that finished (daemons are not ours: the
    `vfsd mount` child that forked one exits before it)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _run_command(fd: int) -> int:
    """In the forked child: run one command as `vfsd ARGV...` would run."""
    conn = socket.socket(fileno=fd)
    try:
        request = _read_request(conn)
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        command = " ".join(["vfsd", *request["argv"]])
        set_process_title(printable(command[:COMMAND_TITLE_CHARS]),
                          " ".join(["vfsd", *request["argv"][:1]]))
        code, out, err = _as_process(request)
        conn.sendall(json.dumps({"code": code, "stdout": out, "stderr": err}).encode() + b"\n")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        try:
            conn.sendall(json.dumps({"code": 2, "stdout": "",
                                     "stderr": f"vfsd: spawner: bad request: {exc}\n"}).encode()
                         + b"\n")
        except OSError:
            pass
        return 2
    return 0


def _read_request(conn: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        more = conn.recv(65536)
        if not more:
            raise ValueError("the request ended before its newline")
        data += more
        if len(data) > MAX_REQUEST:
            raise ValueError(f"a request is at most {MAX_REQUEST} bytes")
    request = json.loads(data)
    if not isinstance(request.get("argv"), list) or \
            not all(isinstance(a, str) for a in request["argv"]):
        raise ValueError("'argv' must be a list of strings")
    return request


def _as_process(request: dict) -> tuple[int, str, str]:
    """Run the command with the caller's environment, directory and umask,
    its output captured as a process's would be: (exit code, stdout, stderr)."""
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            cli.main(args=request["argv"], prog_name="vfsd", standalone_mode=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException as exc:  # noqa: BLE001 - reported as a crashed command would be
            print(f"vfsd: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    return code, texts[0], texts[1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
