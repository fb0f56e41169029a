"""`.vfsd/accesslog`: one line per filesystem operation, while someone reads it.

Nothing is recorded while nobody has the file open (the request path checks
one flag, see `tracer`). Each open handle is a reader with its own bounded
buffer: lines arrive as requests finish, and a read returns what has
arrived, waiting up to a second for the first line (then it returns `#`, a
keep-alive line, so a pending read never holds the mount for long and an
unmount never waits on it). A reader that falls behind, or stops reading
with the file still open, never slows the filesystem down: lines that do not
fit its buffer are dropped and counted, and its next read starts with
`# dropped N lines`.

A line is space-separated, every field free of spaces:

    2025-01-15 08:26:11.003330 write notes/a.txt 4096 0.000021 pid=4242 call=execute:call_7 OK

date, time, operation, path relative to the mount root (`a -> b` for a
rename, `-` when it has none; spaces and unusual characters escaped as
`\\xNN`), bytes read or written, seconds the request took, the requesting
process (`-` for requests that carry none, such as read and write; they
show the process that last opened the file), the tool call it belongs to
(`tool:id`, `-` outside any tool call) and the result (`OK` or an errno
name). `vfsd profile` reads these lines.
"""

from __future__ import annotations

import errno
import re
import time
from collections import deque

import pyfuse3
import trio

#: readers at once (ENFILE beyond): each one costs a buffer and a FUSE task while it waits
MAX_READERS = 8
#: bytes of lines buffered per reader before lines are dropped
BUFFER_BYTES = 1 << 20
#: seconds a read waits for the first line before it answers a keep-alive `#`
WAIT_S = 1.0

_UNSAFE = re.compile(r"[^\x21-\x7e]|\\")


def escape(text: str) -> str:
    """`text` with spaces, control characters, backslashes and non-ASCII as `\\xNN` (UTF-8)."""
    if not _UNSAFE.search(text):
        return text
    out = []
    for ch in text:
        if ch == "\\" or not "\x21" <= ch <= "\x7e":
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape"))
        else:
            out.append(ch)
    return "".join(out)


def result_name(err: int | None) -> str:
    """`OK`, or the errno's name (`ENOENT`)."""
    if err is None:
        return "OK"
    return errno.errorcode.get(err, str(err))


class _Reader:
    __slots__ = ("lines", "size", "dropped", "wake")

    def __init__(self) -> None:
        self.lines: deque[bytes] = deque()
        self.size = 0
        self.dropped = 0
        self.wake = trio.Event()


class AccessLog:
    """The readers of `.vfsd/accesslog` and the lines waiting for each."""

    def __init__(self) -> None:
        self.readers: dict[int, _Reader] = {}
        self.on_change = None  # called when the first reader comes or the last goes
        self._second = -1
        self._stamp = ""

    def open(self, fh: int) -> None:
        if len(self.readers) >= MAX_READERS:
            raise pyfuse3.FUSEError(errno.ENFILE)
        self.readers[fh] = _Reader()
        if len(self.readers) == 1 and self.on_change is not None:
            self.on_change()

    def release(self, fh: int) -> bool:
        """Forget a reader; False if `fh` was not one."""
        reader = self.readers.pop(fh, None)
        if reader is None:
            return False
        reader.wake.set()
        if not self.readers and self.on_change is not None:
            self.on_change()
        return True

    def stamp(self, wall: float) -> str:
        """`YYYY-MM-DD HH:MM:SS.ffffff` of a wall-clock time (strftime once a second)."""
        second = int(wall)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._stamp}.{int((wall - second) * 1e6):06d}"

    def publish(self, line: str) -> None:
        """Hand one line (with its newline) to every reader that has room for it."""
        data = line.encode("utf-8", "surrogateescape")
        for reader in self.readers.values():
            if reader.size + len(data) > BUFFER_BYTES:
                reader.dropped += 1
                continue
            reader.lines.append(data)
            reader.size += len(data)
            reader.wake.set()

    async def read(self, fh: int, size: int) -> bytes:
        """Up to `size` bytes of whole lines (a line longer than `size` is cut)."""
        reader = self.readers.get(fh)
        if reader is None:
            return b""
        if not reader.lines and not reader.dropped:
            with trio.move_on_after(WAIT_S):
                await reader.wake.wait()
            if self.readers.get(fh) is not reader:
                return b""  # released meanwhile
        reader.wake = trio.Event()
        out = bytearray()
        if reader.dropped:
            out += b"# dropped %d lines: the reader fell behind\n" % reader.dropped
            reader.dropped = 0
        while reader.lines and len(out) + len(reader.lines[0]) <= size:
            line = reader.lines.popleft()
            reader.size -= len(line)
            out += line
        if not out and reader.lines:
            # One line longer than the reader's buffer: give it in pieces.
            line = reader.lines.popleft()
            out += line[:size]
            reader.lines.appendleft(line[size:])
            reader.size -= size
        if not out:
            out += b"#\n"
        return bytes(out[:size])
