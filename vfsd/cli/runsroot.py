"""A Runs root as `vfsd threads` and `vfsd status` read it: its shards, thread records and volumes.

The layout is mount_tool's (`mount_tool.runs`, whose docstring describes it
and names what vfsd reads of it); vfsd does not import mount_tool
(tests/test_layers.py), so what it relies on is repeated here:

    ROOT/shards/<k>/                 a shard's run dir (`vfsd mount --shard`): fs/ its
                                     mount, .vfsd/ its store, socket, log and pid
    ROOT/store                       the earlier layout's shared store, served as
                                     shard "legacy" (run dir ROOT/shards/legacy)
    ROOT/threads/t<hex>/thread.json  {"version": 2, "thread_id", "shard", "copying"?};
                                     version 1: a thread of the earlier layout, its
                                     volume named in .vfsd/store.json, not moved yet
    ROOT/threads/t<hex>/.vfsd/langgraph.position
                                     rewritten by VfsdCheckpointer at every checkpoint

A thread's names are `t` + the first 32 hex digits of SHA-256 of its id's
UTF-8 bytes (surrogatepass): its directory under threads/ and its volume on
its shard. Everything is read without changing anything, and defensively:
a record that cannot be read, names another id than its directory's, or a
shard that holds no volume for it, is a problem in the report, never a
guess. A mounted shard is asked over its control socket (`shard`,
`volumes`); an unmounted one's store is opened read-only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from vfsd.control.client import ControlClient, ControlError, DaemonUnreachable
from vfsd.rundir import RunDir

from .common import daemon_state

THREADS_DIR = "threads"
SHARDS_DIR = "shards"
RECORD = "thread.json"
#: the shard that serves the earlier layout's store, and where that store is
LEGACY_SHARD = "legacy"
LEGACY_STORE = "store"
#: VfsdCheckpointer's file rewritten at every checkpoint (its mtime: the last one)
POSITION = Path(".vfsd") / "langgraph.position"
#: the earlier layout's record of the volume a thread's run dir used
EARLIER_STORE_RECORD = Path(".vfsd") / "store.json"
THREAD_NAME = re.compile(r"t[0-9a-f]{32}")
SHARD_NAME = re.compile(r"[0-9]{1,6}|" + LEGACY_SHARD)
#: the volume names a shard serves (vfsd.shard.VOLUME_NAME)
SERVED_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: a thread id longer than this (UTF-8 bytes) names no thread (mount_tool refuses it)
MAX_THREAD_ID_BYTES = 64 * 1024
#: bytes of a thread.json read at most (a 64 KiB id escaped in JSON fits many times)
MAX_RECORD_BYTES = 1 << 20
#: seconds a shard's daemon has to answer
SHARD_TIMEOUT_S = 30.0


def thread_name(thread_id: str) -> str:
    """The name of a thread's directory and volume: `t` + 32 hex digits of SHA-256."""
    return "t" + hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def is_runs_root(path: Path) -> bool:
    """Whether `path` looks like a Runs root (threads/ or shards/, and no
    store of a run dir of its own)."""
    from vfsd.store import compact

    if compact.exists(path / ".vfsd"):
        return False
    return (path / THREADS_DIR).is_dir() or (path / SHARDS_DIR).is_dir()


def shard_of_root(run_path: Path) -> tuple[Path, str] | None:
    """(Runs root, shard name) when `run_path` is ROOT/shards/<k>, else None."""
    run_path = Path(os.path.abspath(run_path))
    if run_path.parent.name == SHARDS_DIR and SHARD_NAME.fullmatch(run_path.name):
        return run_path.parent.parent, run_path.name
    return None


def shard_store(run_path: Path) -> Path:
    """Where a shard run dir's store is: RUN/.vfsd, but ROOT/store for the
    legacy shard of a Runs root (started with `--store ROOT/store`)."""
    run = RunDir(run_path)
    found = shard_of_root(run.path)
    if found is not None and found[1] == LEGACY_SHARD:
        return found[0] / LEGACY_STORE
    return run.state


# -- shards ------------------------------------------------------------------------------


@dataclass
class ShardView:
    """One shard as found: its daemon's state, its store's totals, its volumes."""

    name: str
    run_dir: Path
    store_dir: Path
    daemon: dict = field(default_factory=dict)
    uptime_s: float | None = None
    #: volume name -> `vfsd.status.volume_summary` (+ served)
    volumes: dict[str, dict] = field(default_factory=dict)
    store: dict | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.daemon.get("state") == "running"

    def as_dict(self) -> dict:
        served = sum(1 for v in self.volumes.values() if v.get("served"))
        return {"name": self.name, "run_dir": str(self.run_dir), "store": str(self.store_dir),
                "daemon": self.daemon, "uptime_s": self.uptime_s,
                "volumes": len(self.volumes), "served": served,
                "store_summary": self.store, "problems": self.problems}


def read_shard(name: str, run_dir: Path, store_dir: Path, only: str | None = None) -> ShardView:
    """The shard at `run_dir`: asked over its socket when mounted, its store
    read otherwise. With `only` (a volume name), that volume's facts alone."""
    run = RunDir(run_dir)
    view = ShardView(name, run.path, store_dir)
    args = {"volume": only} if only is not None else {}
    try:
        with ControlClient(run.sock, timeout=SHARD_TIMEOUT_S) as c:
            info = c.call("shard")
            listed = c.call("volumes", **args)
    except DaemonUnreachable:
        view.daemon = daemon_state(run, {})
        _read_store(view, only)
        if view.daemon["state"] in ("dead", "unresponsive"):
            view.problems.append(f"shard {name}: {view.daemon['advice']}")
        return view
    except ControlError as exc:
        view.daemon = daemon_state(run, {})
        view.problems.append(f"shard {name} ({run.path}) answered {exc.code}: {exc.message} "
                             "(is it a shard daemon of this version?)")
        _read_store(view, only)
        return view
    view.daemon = {"state": "running", "pid": info.get("pid")}
    view.uptime_s = info.get("uptime_s")
    view.store = listed.get("store")
    view.volumes = {v["volume"]: v for v in listed.get("volumes", [])}
    return view


def _read_store(view: ShardView, only: str | None) -> None:
    """An unmounted shard: its volumes from its store, opened read-only."""
    from vfsd.errors import NoSuchVolume, StoreError, StoreVersionError
    from vfsd.status import store_summary, volume_summary
    from vfsd.store import compact
    from vfsd.store.store import Store

    if not compact.exists(view.store_dir):
        return  # never mounted: no store yet (its threads, if any, are said to lack one)
    try:
        st = Store.base(view.store_dir, readonly=True, create=False)
    except (StoreError, StoreVersionError) as exc:
        view.problems.append(f"shard {view.name}: cannot read its store: {exc}")
        return
    try:
        view.store = store_summary(st)
        names = [only] if only is not None else sorted(st.volumes())
        for name in names:
            if not SERVED_NAME.fullmatch(name):
                continue  # an earlier layout's volume, named by its run dir's path
            try:
                view.volumes[name] = {**volume_summary(st.view(name)), "served": False}
            except NoSuchVolume:
                continue
    finally:
        st.close()



def find_shards(root: Path) -> dict[str, ShardView]:
    """Every shard of the root: ROOT/shards/<k>, and the legacy one when
    ROOT/store exists (whether its run dir was made yet or not)."""
    try:
        names = [n for n in os.listdir(root / SHARDS_DIR)
                 if SHARD_NAME.fullmatch(n) and (root / SHARDS_DIR / n).is_dir()]
    except FileNotFoundError:
        names = []
    if (root / LEGACY_STORE).is_dir() and LEGACY_SHARD not in names:
        names.append(LEGACY_SHARD)
    out = {}
    for name in sorted(names, key=_shard_order):
        run_dir = root / SHARDS_DIR / name
        out[name] = read_shard(name, run_dir, shard_store(run_dir))
    return out


def _shard_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


# -- threads -----------------------------------------------------------------------------


@dataclass
class ThreadView:
    """One directory under ROOT/threads: its record, where its files are, what they hold."""

    name: str
    dir: Path
    thread_id: str | None = None
    shard: str | None = None
    #: "ok", "copying" (a copy that did not finish), "earlier" (a thread of the
    #: earlier layout, moved onto the legacy shard at its first use), "broken"
    state: str = "ok"
    files_at: Path | None = None
    volume: dict | None = None
    last_checkpoint_ns: int | None = None
    problems: list[str] = field(default_factory=list)

    def as_dict(self, shards: dict[str, ShardView]) -> dict:
        v = self.volume or {}
        shard = shards.get(self.shard) if self.shard else None
        last_use, source = self.last_use()
        return {"thread_id": self.thread_id, "name": self.name, "state": self.state,
                "shard": self.shard, "files_at": str(self.files_at) if self.files_at else None,
                "records": str(self.dir),
                "files": v.get("files"), "bytes": v.get("bytes"), "step": v.get("step"),
                "snapshots": v.get("snapshots"), "last_snapshot": v.get("last_snapshot"),
                "last_snapshot_ns": v.get("last_snapshot_ns"),
                "last_checkpoint_ns": self.last_checkpoint_ns,
                "unbound_checkpoints": v.get("unbound_checkpoints"),
                "last_use_ns": last_use, "last_use_from": source,
                "shard_running": bool(shard and shard.running),
                "served": bool(shard and shard.running and v.get("served")),
                "problems": self.problems}

    def last_use(self) -> tuple[int | None, str | None]:
        """When the thread was last used, as far as vfsd can tell, and from what:
        its last checkpoint (VfsdCheckpointer rewrites langgraph.position at
        each) or its newest snapshot, whichever is later."""
        found = [(self.last_checkpoint_ns, "checkpoint"),
                 ((self.volume or {}).get("last_snapshot_ns"), "snapshot")]
        found = [(ns, what) for ns, what in found if isinstance(ns, int)]
        if not found:
            return None, None
        return max(found)


def read_record(thread_dir: Path) -> tuple[dict | None, str | None]:
    """(thread.json as a dict, None) or (None, why it cannot be used)."""
    path = thread_dir / RECORD
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, (f"{path} is missing: no thread a Runs made is recorded there (or its "
                      "record was lost)")
    except OSError as exc:
        return None, f"{path} cannot be opened ({exc.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, f"{path} is not a regular file"
        raw = os.read(fd, MAX_RECORD_BYTES + 1)
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror})"
    finally:
        os.close(fd)
    if len(raw) > MAX_RECORD_BYTES:
        return None, f"{path} is larger than any record a Runs writes"
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"{path} is not valid JSON ({exc})"
    if not isinstance(doc, dict) or not isinstance(doc.get("thread_id"), str):
        return None, f"{path} names no thread (no string thread_id)"
    return doc, None


def read_thread(root: Path, name: str) -> ThreadView:
    """What ROOT/threads/NAME says (its volume's numbers are joined later)."""
    t = ThreadView(name, root / THREADS_DIR / name)
    doc, problem = read_record(t.dir)
    if problem is not None:
        t.state = "broken"
        t.problems.append(problem)
        return t
    t.thread_id = doc["thread_id"]
    if thread_name(t.thread_id) != name:
        t.state = "broken"
        t.problems.append(f"{t.dir / RECORD} records a thread whose directory would be "
                          f"{thread_name(t.thread_id)}, not {name} (moved or edited by hand): "
                          "not counted as that thread")
        return t
    t.last_checkpoint_ns = _mtime_ns(t.dir / POSITION)
    version = doc.get("version", 1)
    if version == 1:
        t.state, t.shard = "earlier", LEGACY_SHARD
        return t
    shard = doc.get("shard")
    if version != 2 or not isinstance(shard, str) or not SHARD_NAME.fullmatch(shard):
        t.state = "broken"
        t.problems.append(f"{t.dir / RECORD} is a version {str(version)[:20]} record naming "
                          f"shard {str(shard)[:40]!r}: not one this vfsd reads")
        return t
    t.shard = shard
    t.files_at = root / SHARDS_DIR / shard / "fs" / name
    if doc.get("copying") is True:
        t.state = "copying"
        t.problems.append(f"{t.dir}: a copy that did not finish (delete the thread, with "
                          "Runs.delete or the checkpointer's delete_thread, and copy again)")
    return t


def _mtime_ns(path: Path) -> int | None:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime_ns
    except OSError:
        return None


def join_volume(t: ThreadView, shards: dict[str, ShardView]) -> None:
    """Give `t` its volume's numbers, or say why it has none: a volume that
    records another thread is never shown as this one."""
    if t.state == "broken" or t.shard is None:
        return
    if t.state == "earlier":
        _join_earlier(t, shards)
        return
    shard = shards.get(t.shard)
    if shard is None:
        t.state = "broken"
        t.problems.append(f"{t.dir / RECORD} names shard {t.shard}, which {t.dir.parent.parent} "
                          "does not have (no shards/" + t.shard + ")")
        return
    volume = shard.volumes.get(t.name)
    if volume is None:
        elsewhere = [s.name for s in shards.values() if t.name in s.volumes]
        where = (f"; a volume of that name is on shard {', '.join(elsewhere)}" if elsewhere
                 else "")
        if t.state != "copying":
            t.state = "broken"
            t.problems.append(f"shard {t.shard} holds no volume {t.name} for thread "
                              f"{_short(t.thread_id)}: its files are gone{where}")
        return
    if volume.get("thread") not in (None, t.thread_id):
        t.state = "broken"
        t.problems.append(f"volume {t.name} of shard {t.shard} records thread "
                          f"{_short(volume['thread'])}, not {_short(t.thread_id)} (two ids "
                          "with one hash, or a record edited by hand): its files are not "
                          "shown as this thread's")
        return
    if volume.get("incomplete") and t.state != "copying":
        t.problems.append(f"volume {t.name} of shard {t.shard} is a copy still being made "
                          "(or one that died)")
    t.volume = volume


def _join_earlier(t: ThreadView, shards: dict[str, ShardView]) -> None:
    """A thread of the earlier layout: its volume in ROOT/store is named by the
    run dir's path (.vfsd/store.json); its files come back when a Runs moves
    it onto the legacy shard at its first use."""
    root = t.dir.parent.parent
    try:
        doc = json.loads((t.dir / EARLIER_STORE_RECORD).read_bytes()[:MAX_RECORD_BYTES])
        old = doc.get("volume") if isinstance(doc, dict) else None
    except FileNotFoundError:
        t.problems.append(f"{t.dir}: a thread of the earlier layout that never mounted "
                          "(no files)")
        return
    except (OSError, ValueError) as exc:
        t.state = "broken"
        t.problems.append(f"{t.dir / EARLIER_STORE_RECORD} is unreadable ({exc})")
        return
    if not isinstance(old, str):
        t.state = "broken"
        t.problems.append(f"{t.dir / EARLIER_STORE_RECORD} names no volume")
        return
    volume, problem = _earlier_volume(root / LEGACY_STORE, old)
    if problem is not None:
        t.state = "broken"
        t.problems.append(problem)
        return
    if volume.get("thread") not in (None, t.thread_id):
        t.state = "broken"
        t.problems.append(f"its volume in {root / LEGACY_STORE} records thread "
                          f"{_short(volume['thread'])}, not {_short(t.thread_id)}")
        return
    t.volume = {**volume, "served": False}


def _earlier_volume(store_dir: Path, name: str) -> tuple[dict | None, str | None]:
    from vfsd.errors import NoSuchVolume, StoreError, StoreVersionError
    from vfsd.status import volume_summary
    from vfsd.store.store import Store

    try:
        st = Store.base(store_dir, readonly=True, create=False)
    except (StoreError, StoreVersionError) as exc:
        return None, f"cannot read {store_dir}: {exc}"
    try:
        return volume_summary(st.view(name)), None
    except NoSuchVolume:
        return None, f"{store_dir} holds no volume {name[:200]!r}: this thread's files are gone"
    finally:
        st.close()


def _short(thread_id: str | None) -> str:
    """A thread id in a message: quoted and escaped, the first 80 characters."""
    from .common import shown_id

    if thread_id is None:
        return "(none)"
    if len(thread_id) <= 80:
        return shown_id(thread_id)
    return f"{shown_id(thread_id[:80])}... ({len(thread_id):,} characters)"


# -- the whole root ------------------------------------------------------------------------


@dataclass
class RootView:
    root: Path
    shards: dict[str, ShardView]
    threads: list[ThreadView]
    problems: list[str]


def read_root(root: Path) -> RootView:
    """Every shard and every thread of `root`, joined, with the problems found."""
    root = Path(os.path.abspath(root))
    shards = find_shards(root)
    problems = [p for s in shards.values() for p in s.problems]
    threads = []
    try:
        names = sorted(os.listdir(root / THREADS_DIR))
    except FileNotFoundError:
        names = []
    for name in names:
        if not THREAD_NAME.fullmatch(name):
            problems.append(f"{root / THREADS_DIR / _safe(name)} is no thread directory "
                            "(their names are t and 32 hex digits)")
            continue
        t = read_thread(root, name)
        join_volume(t, shards)
        threads.append(t)
        problems += t.problems
    # A volume named like a thread directory is that directory's (whose own
    # problems, if any, are said above).
    claimed = {t.name for t in threads}
    for shard in shards.values():
        for name, volume in shard.volumes.items():
            if name not in claimed:
                problems.append(f"volume {name} of shard {shard.name} belongs to no thread "
                                f"record (thread {_short(volume.get('thread'))}): a copy that "
                                "died before its record, or a record removed by hand")
    return RootView(root, shards, threads, problems)


def read_one(root: Path, thread_id: str) -> tuple[ThreadView, dict[str, ShardView]]:
    """One thread of `root` by its id, and the shard it was read from."""
    root = Path(os.path.abspath(root))
    name = thread_name(thread_id)
    t = read_thread(root, name)
    shards: dict[str, ShardView] = {}
    if t.shard is not None and t.state != "earlier":
        run_dir = root / SHARDS_DIR / t.shard
        if run_dir.is_dir() or (t.shard == LEGACY_SHARD and (root / LEGACY_STORE).is_dir()):
            shards[t.shard] = read_shard(t.shard, run_dir, shard_store(run_dir), only=name)
            t.problems[:0] = shards[t.shard].problems
    join_volume(t, shards)
    return t, shards


def _safe(name: str) -> str:
    from .common import escaped

    return escaped(name, "surrogateescape")
