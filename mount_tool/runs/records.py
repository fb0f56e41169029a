"""A Runs root on disk: the thread directories under ROOT/threads and their records.

    ROOT/threads/t<hex>/thread.json  {"version": 2, "thread_id": ..., "shard": "k"}
                                     (and "copying": true while a copy is made)
    ROOT/threads/t<hex>/.vfsd/       the thread's records (VfsdCheckpointer's)
    ROOT/threads/t<hex>/fs           a link to ROOT/shards/<k>/fs/t<hex>

A record is written whole (temporary file, then rename) and read as input:
one that does not parse, or names no thread or no shard, is refused with
the file named, never guessed at. Version 1 (the earlier layout, see
`legacy`) names no shard. Removing a thread's directory removes what a Runs
made there and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import MountToolError
from . import legacy
from .jsonfile import read_json_record
from .shards import Shard

logger = logging.getLogger(__name__)

THREADS_DIR = "threads"
SHARDS_DIR = "shards"
THREAD_RECORD = "thread.json"
RECORD_VERSION = 2
#: what a shard's name may be (a number, or the earlier layout's)
_SHARD_NAME = re.compile(r"[0-9]{1,6}|" + legacy.LEGACY_SHARD)


@dataclass(frozen=True)
class ThreadRecord:
    """What `ROOT/threads/t<hex>/thread.json` says: the thread's id, its shard
    (None: a run dir of the earlier layout, version 1), and whether it is a
    copy still being made (`copying`: its record is written first, so a copy
    that dies half way leaves a thread that says so, which `delete` removes)."""

    thread_id: str
    shard: str | None
    copying: bool = False


def read_record(run_dir: Path) -> ThreadRecord | None:
    """What a thread's record says, None when it has none yet."""
    path = run_dir / THREAD_RECORD
    doc = read_json_record(path, "the thread whose files are there (or remove it)")
    if doc is None:
        return None
    thread = doc.get("thread_id")
    if not isinstance(thread, str):
        raise MountToolError(f"{path} names no thread")
    if doc.get("version", 1) == 1:
        return ThreadRecord(thread, None)
    shard = doc.get("shard")
    if not isinstance(shard, str) or not _SHARD_NAME.fullmatch(shard):
        raise MountToolError(f"{path} names no shard ({shard!r:.80}): fix or remove it")
    return ThreadRecord(thread, shard, copying=doc.get("copying") is True)


def write_record(run_dir: Path, record: ThreadRecord) -> None:
    """Write a thread's record (temporary file, then rename)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / THREAD_RECORD
    tmp = path.with_name(f".{THREAD_RECORD}.{os.getpid()}.{threading.get_ident()}")
    doc = {"version": RECORD_VERSION, "thread_id": record.thread_id, "shard": record.shard}
    if record.copying:
        doc["copying"] = True
    # The owner's only: with --allow-other other users may reach the thread's directory.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc))
    os.replace(tmp, path)


def link_thread_files(run_dir: Path, shard: Shard, name: str) -> None:
    """The thread's record directory (.vfsd/) and its `fs` link to its files."""
    (run_dir / ".vfsd").mkdir(mode=0o700, exist_ok=True)
    fs = run_dir / "fs"
    target = os.path.join("..", "..", SHARDS_DIR, shard.name, "fs", name)
    try:
        if os.readlink(fs) == target:
            return
    except FileNotFoundError:
        pass
    except OSError:  # not a link: something else took the name
        logger.warning("vfsd: %s is not a link to the thread's files (%s): left as it is",
                       fs, shard.mountpoint / name)
        return
    tmp = run_dir / f".fs.{os.getpid()}.{threading.get_ident()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, fs)


#: what a thread's directory holds that a Runs (or the earlier layout's daemon) made
_OWN_FILES = ("thread.json", "fs")
_OWN_STATE = ("langgraph.json", "langgraph.position", "store.json", "store.json.adopted",
              "vfsd.log", "vfsd.log.1", "vfsd.pid", "vfsd.sock", "accesslog")


def remove_thread_dir(run_dir: Path) -> None:
    """Remove what a thread's directory holds of ours; anything else stays
    (and then the directory too, said in the log)."""
    state = run_dir / ".vfsd"
    for path in [*(run_dir / n for n in _OWN_FILES), *(state / n for n in _OWN_STATE)]:
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                os.rmdir(path)  # the earlier layout's mountpoint: empty
            else:
                path.unlink()
    for directory in (run_dir, state):
        for leftover in _listdir(directory):
            if leftover.startswith((".thread.json.", ".langgraph.json.", ".fs.")):
                with contextlib.suppress(OSError):
                    (directory / leftover).unlink()
    for directory in (state, run_dir):
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError:
            logger.warning("vfsd: %s holds files no Runs made (%s): left there", directory,
                           ", ".join(sorted(_listdir(directory))[:5]))


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
