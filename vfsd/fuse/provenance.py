"""Which tool call a request comes from: the author of each file change.

Two ways in, both without help from the model:

- The file tools tag their own writes: before writing through a descriptor
  they set `user.vfsd.call` on it to the call's JSON description (tool, id,
  thread, step). The daemon takes it as the author of whatever that open
  file commits next (`OpenFile.writer`); nothing is stored for the xattr
  itself.
- `execute` runs each call in a cgroup of its own (mount_tool/sandbox/cgroups.py)
  and, before the command starts, registers the cgroup's name with the
  `call_begin` control request (or, where no cgroup could be made, the
  sandbox's pid namespace or session). A request is then attributed by the
  process that made it (pyfuse3's `ctx.pid`): the first request of a process
  costs one read of `/proc/PID/cgroup` (or `ns/pid`, `stat`), cached per
  pid; later ones a dict lookup. Background processes a command started,
  and everything a script forks, stay in its cgroup, so they count too.
  While no call is registered nothing is read at all: every request is
  "no tool call", which is also what the shell outside any tool gets.

The cache is dropped whenever a call begins or ends, so a process id
reused by a new process, or a process that has just joined a call's
cgroup, is looked at again.

Who may name a call (`may_tag`): the tag is honoured only from a process
that has reached the daemon's control socket (its `SO_PEERCRED` pid,
recorded with the process's start time so a reused pid is not mistaken
for it: `ControlPeers`), and never from a process that belongs to a
registered call. The control socket lives outside the mount and is not in
the sandbox, so a command inside `execute` cannot name a call: whatever it
does is its `execute` call's. The check costs no control round trip: one
`stat` of `/proc/PID/task/TID` per peer and one read of the peer's start
time, per tag.
"""

from __future__ import annotations

import contextlib
import os

from vfsd import errors
from vfsd.store.calls import call_key, check_call, describe
from vfsd.store.inode import NO_CALL, UNKNOWN_CALL

#: processes remembered; past this the cache starts afresh
MAX_PIDS = 4096
#: calls whose descriptions are kept in memory (for log lines and documents)
MAX_KNOWN = 4096
#: calls registered at once by `call_begin`
MAX_ACTIVE = 256
#: processes remembered as having reached the control socket
MAX_PEERS = 256


def _start_time(pid: int) -> bytes | None:
    """When process `pid` started (clock ticks since boot, field 22 of its
    stat), or None if it is gone: with the pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


class ControlPeers:
    """Processes that reached the control socket: the only ones whose
    `user.vfsd.call` tags name a tool call.

    A process counts from its first connection for as long as it lives (its
    connection may be closed for idleness and reopened later); FUSE names the
    requesting thread, so a request is a peer's when its thread id is one of
    the peer's tasks.
    """

    def __init__(self) -> None:
        self._procs: dict[int, bytes] = {}  # pid -> start time
        self._last = 0  # the peer the last tag came from: looked at first

    def add(self, pid: int) -> None:
        """A connection from `pid` (SO_PEERCRED) was accepted."""
        start = _start_time(pid) if pid > 0 else None
        if start is None or self._procs.get(pid) == start:
            return
        if len(self._procs) >= 16:  # the dead ones go (CLI runs come and go)
            for gone in [p for p, s in self._procs.items() if _start_time(p) != s]:
                del self._procs[gone]
            while len(self._procs) >= MAX_PEERS:
                del self._procs[next(iter(self._procs))]
        self._procs[pid] = start

    def holds(self, tid: int) -> bool:
        """True if thread `tid` belongs to a process that reached the socket."""
        if tid <= 0:
            return False
        last = self._last
        peers = ([last] if last in self._procs else []) + [p for p in self._procs if p != last]
        for pid in peers:
            if os.path.exists(f"/proc/{pid}/task/{tid}"):
                if _start_time(pid) == self._procs[pid]:
                    self._last = pid
                    return True
                del self._procs[pid]  # the pid was reused: not our peer
        return False


class Provenance:
    """Call keys for requests, and what a call key stands for."""

    def __init__(self, store, peers: ControlPeers | None = None) -> None:
        self.store = store
        # Who may name a call with a tag (the daemon shares one among its volumes).
        self.peers = peers if peers is not None else ControlPeers()
        self.known: dict[int, dict | None] = {}  # key -> description (None: not recorded)
        self.groups: dict[str, int] = {}      # cgroup directory name -> key
        self.namespaces: dict[str, int] = {}  # "pid:[inode]" -> key
        self.sessions: dict[int, int] = {}    # session id -> key
        self._pids: dict[int, int] = {}
        self.proc_reads = 0  # processes looked up in /proc (once each while cached)

    # ------------------------------------------------------------ calls

    def intern(self, desc: object) -> int:
        """The key of a call description from outside (checked; recorded in
        the store the first time this daemon sees it). InvalidArgument if bad."""
        checked = check_call(desc)
        if checked["step"] is None:
            checked["step"] = self.store.get_step()
        key = call_key(checked)
        if key not in self.known or self.known[key] is None:
            self.store.put_call(key, checked)
            if len(self.known) >= MAX_KNOWN:
                self.known.clear()
            self.known[key] = checked
        return key

    def intern_tag(self, desc: object) -> int:
        """The key a `user.vfsd.call` tag names: a call description, or
        {"key": HEX} for a call recorded already (`call_record`: one too
        large for an xattr). InvalidArgument if bad or not recorded."""
        if isinstance(desc, dict) and set(desc) == {"key"}:
            text = desc["key"]
            if not isinstance(text, str) or len(text) != 16:
                raise errors.InvalidArgument("'key' is the hex key call_record answered")
            try:
                key = int(text, 16)
            except ValueError:
                raise errors.InvalidArgument("'key' is the hex key call_record answered") \
                    from None
            if self.known.get(key) is None and self.store.get_call(key) is None:
                raise errors.InvalidArgument(f"no call {text} is recorded")
            return key
        return self.intern(desc)

    def begin(self, desc: object, *, cgroup: str | None = None, pidns: str | None = None,
              session: int | None = None) -> int:
        """Attribute requests of the processes in `cgroup` (a directory name),
        pid namespace `pidns` ("pid:[N]") or `session` to the call, from now on."""
        if len(self.groups) + len(self.namespaces) + len(self.sessions) >= MAX_ACTIVE:
            raise errors.InvalidArgument(
                f"{MAX_ACTIVE} tool calls are registered already; end some first")
        key = self.intern(desc)
        if cgroup is not None:
            self.groups[cgroup] = key
        if pidns is not None:
            self.namespaces[pidns] = key
        if session is not None:
            self.sessions[session] = key
        self._pids.clear()
        return key

    def end(self, key: int) -> bool:
        """Stop attributing to `key`; False if it was not registered."""
        found = False
        for table in (self.groups, self.namespaces, self.sessions):
            for name in [n for n, k in table.items() if k == key]:
                del table[name]
                found = True
        self._pids.clear()
        return found

    def describe(self, key: int) -> dict | None:
        """What documents show for a call key (see `calls.describe`)."""
        if key in (NO_CALL, UNKNOWN_CALL):
            return describe(key, None)
        desc = self.known.get(key)
        if desc is None and key not in self.known:
            desc = self.store.get_call(key)
            if len(self.known) >= MAX_KNOWN:
                self.known.clear()
            self.known[key] = desc
        return describe(key, desc)

    def name(self, key: int) -> str | None:
        """`tool:id` of a call key, for log lines; None for no tool call."""
        d = self.describe(key)
        if d is None:
            return None
        if "tool" in d:
            return f"{d['tool']}:{d['id']}"
        return "unknown" if d.get("unknown") else f"call-{d['key']}"

    def may_tag(self, pid: int) -> str | None:
        """Why the thread `pid` may not name a tool call with `user.vfsd.call`
        (None: it may). Only the file tools, in a process that reached the
        control socket, name calls; a process inside a registered call (an
        `execute` command) is that call's whatever it says."""
        if self.of_pid(pid) != NO_CALL:
            return "the process runs inside a tool call, which its changes are attributed to"
        if not self.peers.holds(pid):
            return "only a process that holds a control connection may name a tool call"
        return None

    # -------------------------------------------------------- processes

    def of_pid(self, pid: int) -> int:
        """The call a process's requests belong to (NO_CALL for none)."""
        if not (self.groups or self.namespaces or self.sessions) or pid <= 0:
            return NO_CALL
        key = self._pids.get(pid)
        if key is None:
            key = self._lookup(pid)
            if len(self._pids) >= MAX_PIDS:
                self._pids.clear()
            self._pids[pid] = key
        return key

    def status(self) -> dict:
        return {"active_calls": len(self.groups) + len(self.namespaces) + len(self.sessions),
                "cached_pids": len(self._pids), "proc_reads": self.proc_reads}

    def name_of_pid(self, pid: int) -> str | None:
        return self.name(self.of_pid(pid))

    def _lookup(self, pid: int) -> int:
        self.proc_reads += 1
        if self.groups:
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cgroup", "rb") as f:
                    text = f.read().decode(errors="replace")
                for line in text.splitlines():
                    path = line.split(":", 2)[-1]
                    for part in reversed(path.split("/")):
                        key = self.groups.get(part)
                        if key is not None:
                            return key
        if self.namespaces:
            with contextlib.suppress(OSError):
                key = self.namespaces.get(os.readlink(f"/proc/{pid}/ns/pid"))
                if key is not None:
                    return key
        if self.sessions:
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
                # pid (comm) state ppid pgrp session ...: comm may hold spaces
                session = int(stat[stat.rindex(b")") + 2:].split()[3])
                key = self.sessions.get(session)
                if key is not None:
                    return key
        return NO_CALL

