"""Read every page of a store's LMDB file in a child process.

LMDB maps its file and follows page numbers it finds there: a damaged branch
page can send it past the end of the file, and the process dies of SIGBUS
(no exception to catch). So the daemon (before it mounts) and fsck first let
a child process touch every key and value of every table; if the child dies
or LMDB reports damage, the store is refused with a message instead of the
daemon crashing on the first unlucky read.

    python -m vfsd.store.lmdbcheck STORE_DIR      exit 0: readable; 2: damaged
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lmdb

from vfsd import LMDB_MAP_SIZE


class Damaged(Exception):
    """The LMDB file is not whole (what LMDB itself would not say clearly)."""


def walk(store_dir: Path) -> int:
    """Touch every record of every table; the number of records."""
    data_file = Path(store_dir) / "lmdb" / "data.mdb"
    size = data_file.stat().st_size
    if size < 2 * 4096:  # not even LMDB's two meta pages
        raise Damaged(f"{data_file} is empty or cut short ({size} bytes)")
    # Mapped as the daemon maps it: a record that claims to reach past the
    # end of the file then faults here exactly as it would there (SIGBUS).
    env = lmdb.open(str(Path(store_dir) / "lmdb"), readonly=True, lock=True, max_dbs=64,
                    map_size=LMDB_MAP_SIZE)
    n = 0
    try:
        # A file cut short: every page past its end would fault. Its size is
        # read after the metadata: another daemon sharing the store writes a
        # transaction's pages before the metadata that names them, so the file
        # may grow between the two, never shrink.
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = data_file.stat().st_size
        if size < needed:
            raise Damaged(f"{data_file} is truncated ({size} bytes, its own metadata "
                          f"says {needed})")
        with env.begin() as txn:
            names = [bytes(k) for k in txn.cursor().iternext(values=False)]
        for name in names:
            db = env.open_db(name, create=False)
            with env.begin(db=db, buffers=True) as txn:
                for key, value in txn.cursor(db=db):
                    # Touch the bytes: a page past the end faults only when read.
                    if len(key):
                        key[0]
                    if len(value):
                        value[0]
                        value[len(value) - 1]
                    n += 1
    finally:
        env.close()
    return n


def check_readable(store_dir: Path, timeout: float = 600.0) -> str | None:
    """None if the whole LMDB file reads cleanly, else what went wrong.

    A single-threaded caller (the daemon before it mounts, the CLI) forks:
    lmdb is loaded already, so the walk starts at once instead of after a
    new interpreter's start-up. Anyone else runs a new process (fork() in a
    threaded process may copy another thread's held locks).
    """
    if threading.active_count() == 1:
        return _check_in_fork(Path(store_dir), timeout)
    try:
        proc = subprocess.run([sys.executable, "-m", "vfsd.store.lmdbcheck", str(store_dir)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"reading the store's LMDB file took over {timeout:.0f} s"
    return _verdict(proc.returncode, proc.stdout.strip() or proc.stderr.strip()[-500:])


def _verdict(returncode: int, said: str) -> str | None:
    if returncode == 0:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"reading the store's LMDB file crashed the reader ({name}): pages are damaged"
    return said or "the LMDB file is damaged"


def _check_in_fork(store_dir: Path, timeout: float) -> str | None:
    """`check_readable` in a forked child; what it says comes back on a pipe."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: walk, say what went wrong, never return
        code = 1
        try:
            os.close(rfd)
            code = main([str(store_dir)], out=wfd)
        except BaseException as exc:  # noqa: BLE001 - said to the parent instead
            os.write(wfd, f"reading the store's LMDB file failed: {type(exc).__name__}: "
                          f"{exc}".encode())
        finally:
            os._exit(code)
    os.close(wfd)
    said = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"reading the store's LMDB file took over {timeout:.0f} s"
            data = os.read(rfd, 4096)
            if not data:
                break
            said += data
    finally:
        os.close(rfd)
    status = os.waitpid(pid, 0)[1]
    return _verdict(os.waitstatus_to_exitcode(status), said.decode(errors="replace").strip())


def main(argv: list[str], out: int = 1) -> int:
    """Walk the store `argv[0]`; 0 if it reads, else 2 with the damage said on `out`."""
    try:
        walk(Path(argv[0]))
    except (lmdb.Error, Damaged) as exc:
        os.write(out, f"the store's LMDB file is damaged: {exc}\n".encode())
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
