"""The append-only event log of a review session, `events.jsonl`.

This is the irreplaceable data, so every rule here is about never losing or
reusing a sequence number:

- One line per event, written whole with one `write` and fsynced before the
  poster gets its 201.
- Appends are serialized per session across greenlets (one writer greenlet per
  session in each process) and across processes (`flock` on the log itself).
- Group commit: posters that arrive while a batch is being written wait for the
  next batch, which is written and fsynced once for all of them.
- The highest `seq` is cached per process but revalidated under the lock before
  every append by the file's identity (device, inode, size, mtime). When the file
  changed behind our back (another worker, or a restore of an older or newer
  copy) its tail is re-read, and the next seq is one past the larger of the file's
  highest seq and the highest seq this process ever handed out, so a restore never
  makes an append reuse a seq.
- A torn trailing line (a copy taken mid-write, a killed worker) is skipped by
  readers, and the next append starts on a fresh line instead of gluing onto it.
"""
import fcntl
import json
import logging
import os
from dataclasses import dataclass

import gevent
from gevent.event import AsyncResult

from app.common.offload import blocking
from app.common.timeutil import utc_timestamp

log = logging.getLogger("bundle.decks.eventlog")
_TAIL_BLOCK = 64 * 1024


@dataclass
class FileIdentity:
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st):
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class CommitResult:
    events: list
    start: int          # file offset where this batch's bytes begin
    identity: FileIdentity  # the file right after the batch


def parse_line(line):
    """The event of one complete line, or None for a line that is not an event."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if isinstance(event, dict) and isinstance(event.get("seq"), int):
        return event
    return None


def _last_newline_end(fd, size):
    """Offset just past the last newline of the file (0 when it has none)."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def _lines_backwards(fd, end):
    """(offset, bytes) of each line before `end`, last line first; `end` must be
    just past a newline (or 0). Reads only as far back as the caller iterates."""
    pos, buffer = end, b""
    while buffer or pos > 0:
        cut = buffer.rfind(b"\n", 0, len(buffer) - 1) if buffer else -1
        if cut == -1 and pos > 0:
            start = max(0, pos - _TAIL_BLOCK)
            buffer = os.pread(fd, pos - start, start) + buffer
            pos = start
            continue
        yield pos + cut + 1, buffer[cut + 1:-1]
        buffer = buffer[:cut + 1]


def _events_backwards(fd, end):
    for offset, line in _lines_backwards(fd, end):
        event = parse_line(line) if line.strip() else None
        if event:
            yield offset, event


def scan_tail(fd, size):
    """(highest seq among complete lines, offset just past the last complete line),
    reading backwards from the end only as far as the last event. A torn trailing
    fragment, however long, is not a complete line."""
    complete_end = _last_newline_end(fd, size)
    last = next(_events_backwards(fd, complete_end), None)
    return (last[1]["seq"] if last else 0), complete_end


def _last_seq_before(fd, end):
    """The seq of the last event among the complete lines before `end` (0 when there
    is none), or None when `end` is not just past a newline."""
    if end == 0:
        return 0
    if os.pread(fd, 1, end - 1) != b"\n":
        return None
    last = next(_events_backwards(fd, end), None)
    return last[1]["seq"] if last else 0


def _pread_all(fd, size, offset):
    chunks = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 30), offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_new_events(path, known=None, offset=0, after=0):
    """What a reader that follows the log finds new: (identity of the file now, its
    events with seq > `after` among complete lines, offset just past its last
    complete line); (None, [], 0) when there is no log.

    The reader read the file `known` up to `offset`, the last event there being
    `after`. It goes on from `offset` only when the file is still that one: same
    device and inode, not shorter, and the line that ends at `offset` still holds
    event `after`. Otherwise (a restore rewrote or replaced the file) it is read
    whole, and only events past `after` are kept. A torn trailing line is left for
    a later read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None, [], 0
    try:
        st = os.fstat(fd)
        if offset and (known is None or (known.dev, known.ino) != (st.st_dev, st.st_ino)
                       or st.st_size < offset or _last_seq_before(fd, offset) != after):
            offset = 0
        data = _pread_all(fd, st.st_size - offset, offset)
    finally:
        os.close(fd)
    cut = data.rfind(b"\n") + 1
    events = [e for e in map(parse_line, data[:cut].split(b"\n")) if e and e["seq"] > after]
    return FileIdentity.of(st), events, offset + cut


def read_events(path, after=0, limit=None):
    """The events with seq > `after` (at most `limit`). Seqs only grow along the
    file, so the start is found reading backwards from the end: a cursor near the
    end (a reconnecting stream) costs what follows it, not the whole log."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        end = _last_newline_end(fd, os.fstat(fd).st_size)
        start = 0
        if after > 0:
            for offset, event in _events_backwards(fd, end):
                if event["seq"] <= after:
                    start = offset
                    break
        data = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    selected = [e for e in map(parse_line, data.split(b"\n")) if e and e["seq"] > after]
    return selected if limit is None else selected[:limit]


class SeqState:
    """What this process knows of a log: its identity after our last write and the
    highest seq it has ever seen or handed out."""

    def __init__(self):
        self.identity = None
        self.high_seq = 0


def _open_locked(path):
    """Open the log and take its lock, making sure the lock is on the file that is
    at `path` now (a restore may rename another file over it while we wait)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == (st.st_dev, st.st_ino):
            return fd, st
        os.close(fd)


def commit(path, events, state):
    """Append `events` (dicts without seq) as one batch; runs in a threadpool thread,
    one at a time per session in this process. The file is closed after its
    fdatasync: that close is what tells the other workers' feeds (inotify's
    CLOSE_WRITE, app.decks.logwatch) to read the batch."""
    fd, st = _open_locked(path)
    try:
        before = FileIdentity.of(st)
        if before == state.identity:
            ends_with_newline = True  # we wrote the last bytes, and they ended a line
        else:
            file_seq, complete_end = scan_tail(fd, st.st_size)
            ends_with_newline = complete_end == st.st_size
            state.high_seq = max(state.high_seq, file_seq)
        stored, lines = [], [b"\n"] if not ends_with_newline else []
        timestamp = utc_timestamp("milliseconds")
        for event in events:
            state.high_seq += 1
            record = {"seq": state.high_seq, "ts": timestamp, **event}
            stored.append(record)
            lines.append(json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
        data = b"".join(lines)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
        except BaseException:
            state.identity = None  # unknown bytes may be on disk: rescan next time
            raise
        state.identity = FileIdentity.of(os.fstat(fd))
        return CommitResult(stored, st.st_size + (1 if not ends_with_newline else 0), state.identity)
    finally:
        os.close(fd)


class SessionLog:
    """One session's log in this process: the group-commit writer and the live feed."""

    def __init__(self, path):
        self.path = path
        self._state = SeqState()
        self._pending = []
        self._writer = None
        self.feed = None          # a LiveFeed while anyone in this process listens

    def append(self, event):
        """Store `event` durably and return it with its `seq` and `ts`."""
        result = AsyncResult()
        self._pending.append((event, result))
        if self._writer is None:
            self._writer = gevent.spawn(self._write_batches)
        return result.get()

    def _write_batches(self):
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    outcome = blocking(commit, self.path, [e for e, _ in batch], self._state)
                except Exception as exc:  # every poster of the batch learns of it
                    log.exception("append to %s failed", self.path)
                    for _, result in batch:
                        result.set_exception(exc)
                    continue
                for (_, result), stored in zip(batch, outcome.events):
                    result.set(stored)
                if self.feed is not None:
                    self.feed.committed(outcome)
        finally:
            self._writer = None


def last_seq_in_file(path):
    """The highest seq among the complete lines of the log (0 when there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    try:
        return scan_tail(fd, os.fstat(fd).st_size)[0]
    finally:
        os.close(fd)
