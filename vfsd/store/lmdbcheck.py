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

import signal
import subprocess
import sys
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
        # A file cut short: every page past its end would fault.
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
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
    """None if the whole LMDB file reads cleanly, else what went wrong."""
    try:
        proc = subprocess.run([sys.executable, "-m", "vfsd.store.lmdbcheck", str(store_dir)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"reading the store's LMDB file took over {timeout:.0f} s"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return f"reading the store's LMDB file crashed the reader ({name}): pages are damaged"
    return proc.stdout.strip() or proc.stderr.strip()[-500:] or "the LMDB file is damaged"


def main(argv: list[str]) -> int:
    try:
        walk(Path(argv[0]))
    except (lmdb.Error, Damaged) as exc:
        print(f"the store's LMDB file is damaged: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
