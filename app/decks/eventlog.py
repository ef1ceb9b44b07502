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
- A log restored from a backup (app.backup, app.decks.backup) has a mark beside it,
  `restored.json`: the highest seq and the length the log had when the backup copied
  it. Clients may hold seqs handed out after that copy and lost with the host, so the
  next seq starts above every seq the log could have reached from there: its room
  left under the cap, counted in the shortest line an event can take (`seq_floor`).
- A torn trailing line (a copy taken mid-write, a killed worker) is skipped by
  readers, and the next append starts on a fresh line instead of gluing onto it.
- Reads start where the log's sparse index (events.idx, app.decks.logindex) says
  their cursor lies, so a page costs what it holds, not the log's size.
- A log grows to its cap (DECKS_MAX_LOG_BYTES) at most: an event that does not fit
  is refused (507, LogFull) and takes no seq.
"""

import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass

import gevent
from gevent.event import AsyncResult
from prometheus_client import Counter, Histogram

from app.common.failures import ApiError
from app.common.offload import blocking
from app.common.timeutil import utc_timestamp
from app.decks import logindex

log = logging.getLogger("bundle.decks.eventlog")
_TAIL_BLOCK = 64 * 1024
_FIRST_READ, _MAX_READ = 8 * 1024, 256 * 1024  # a forward read's blocks: growing, overshooting little
RESTORED_MARK = "restored.json"  # beside a restored log: what it held when it was backed up
# No event's line is shorter: {"seq":1,"ts":"2026-11-29T00:00:00.000Z"} and its newline take 43 bytes.
SHORTEST_LINE = 40
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # DECKS_MAX_LOG_BYTES' default, for a log opened without a cap

APPENDS = Counter("bundle_decks_appends_total", "Events appended to sessions' logs (stored and fsynced)")
# A batch of appends (group commit) is fsynced once: one observation per batch.
FSYNC_SECONDS = Histogram(
    "bundle_decks_fsync_duration_seconds",
    "Time of the fdatasync that makes a batch of appended events durable",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


class LogFull(ApiError):
    """507: the append would take the log past its cap (DECKS_MAX_LOG_BYTES). Not 413:
    the request is fine, the session has no room left; a smaller request may fit."""

    def __init__(self, limit):
        super().__init__(
            507,
            f"this session's event log has reached its limit of {limit} bytes: "
            "nothing was stored; start a new session to go on",
        )


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
    start: int  # file offset where this batch's bytes begin
    identity: FileIdentity  # the file right after the batch
    placed: list  # per event asked for: its stored record, or None when it did not fit
    fsync_seconds: float | None = None  # how long the batch's fdatasync took (None: nothing written)


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
        yield pos + cut + 1, buffer[cut + 1 : -1]
        buffer = buffer[: cut + 1]


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
        if offset and (
            known is None
            or (known.dev, known.ino) != (st.st_dev, st.st_ino)
            or st.st_size < offset
            or _last_seq_before(fd, offset) != after
        ):
            offset = 0
        data = _pread_all(fd, st.st_size - offset, offset)
    finally:
        os.close(fd)
    cut = data.rfind(b"\n") + 1
    events = [e for e in map(parse_line, data[:cut].split(b"\n")) if e and e["seq"] > after]
    return FileIdentity.of(st), events, offset + cut


def _read_from(fd, start, end, after, limit, expected):
    """The events with seq > `after` (at most `limit`) among the complete lines of
    [`start`, `end`), reading forward only until it has them; None when the line at
    `start` is not a line start holding event `expected` (the index disagrees with the
    log). Blocks grow from small, so a read of one event reads little."""
    if expected is not None and start and os.pread(fd, 1, start - 1) != b"\n":
        return None
    events, pos, rest, block = [], start, b"", _FIRST_READ
    while pos < end:
        chunk = os.pread(fd, min(block, end - pos), pos)
        if not chunk:
            break
        pos += len(chunk)
        block = min(block * 2, _MAX_READ)
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()  # a line still open (or the torn trailing fragment at the end)
        for line in lines:
            event = parse_line(line) if line.strip() else None
            if expected is not None:
                if event is None or event["seq"] != expected:
                    return None
                expected = None
            if event is not None and event["seq"] > after:
                events.append(event)
                if limit is not None and len(events) >= limit:
                    return events
    return None if expected is not None else events


def _locked(fd):
    fcntl.flock(fd, fcntl.LOCK_EX)  # released when `fd` is closed


def read_events(path, after=0, limit=None):
    """The events with seq > `after` (at most `limit`), read from where the log's index
    (app.decks.logindex) says they begin: the cost is what is returned plus at most one
    index step, however long the log. An index that is missing, behind or wrong is
    brought up to date under the log's lock first."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:

        def attempt(size, lagging_ok=False):
            found = logindex.locate(path, size, after, lagging_ok)
            return None if found is None else _read_from(fd, found[0], size, after, limit, found[1])

        events = attempt(os.fstat(fd).st_size)
        if events is not None:
            return events
        _locked(fd)
        size = os.fstat(fd).st_size
        try:
            for rebuild in (False, True):  # a second try only when the index disagreed with the log
                logindex.update(fd, path, _last_newline_end(fd, size), parse_line, rebuild=rebuild)
                events = attempt(size, lagging_ok=True)
                if events is not None:
                    return events
        except OSError as exc:  # the index cannot be written (permissions, disk full): the log still reads
            log.warning("the index of %s cannot be updated: %s", path, exc)
        log.warning("the index of %s cannot be used: reading the whole log", path)
        return _read_from(fd, 0, size, after, limit, None)
    finally:
        os.close(fd)


def _mark_path(log_path) -> str:
    return os.path.join(os.path.dirname(os.fspath(log_path)), RESTORED_MARK)


def mark_restored(log_path, highest_seq: int, length: int, snapshot: str) -> None:
    """Record beside a log restored from a backup what it held when it was copied."""
    mark = {"highest_seq": highest_seq, "bytes": length, "snapshot": snapshot, "restored": utc_timestamp()}
    with open(_mark_path(log_path), "w", encoding="utf-8") as f:
        json.dump(mark, f)
        f.flush()
        os.fsync(f.fileno())


def seq_floor(log_path, max_bytes=None) -> int:
    """The seq every new event of a restored log must pass (0 for a log never restored):
    above any seq it could have handed out after its backup, which grew it from
    `bytes` to the cap at most, one shortest line an event."""
    try:
        with open(_mark_path(log_path), "rb") as f:
            mark = json.load(f)
        highest, length = int(mark["highest_seq"]), int(mark["bytes"])
    except FileNotFoundError:
        return 0
    except (ValueError, KeyError, TypeError):
        log.error("%s beside %s is unreadable: its seqs continue from the log alone", RESTORED_MARK, log_path)
        return 0
    room = max(0, (max_bytes or DEFAULT_MAX_BYTES) - length)
    return highest + room // SHORTEST_LINE + 1


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


def commit(path, events, state, max_bytes=None):
    """Append `events` (dicts without seq) as one batch; runs in a threadpool thread,
    one at a time per session in this process. An event that would take the log past
    `max_bytes` is not written and takes no seq (a later, smaller one may still fit).
    The index is brought up to date under the same lock. The file is closed after its
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
            state.high_seq = max(state.high_seq, file_seq, seq_floor(path, max_bytes))
        stored, placed, lines = [], [], [b"\n"] if not ends_with_newline else []
        size = st.st_size + sum(map(len, lines))  # the log's size once these lines are written
        timestamp = utc_timestamp("milliseconds")
        for event in events:
            record = {"seq": state.high_seq + 1, "ts": timestamp, **event}
            line = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
            if max_bytes is not None and size + len(line) > max_bytes:
                placed.append(None)
                continue
            state.high_seq += 1
            size += len(line)
            stored.append(record)
            placed.append(record)
            lines.append(line)
        if not stored:
            return CommitResult([], st.st_size, before, placed)
        data = b"".join(lines)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            synced = time.perf_counter()
            os.fdatasync(fd)
            fsync_seconds = time.perf_counter() - synced
        except BaseException:
            state.identity = None  # unknown bytes may be on disk: rescan next time
            raise
        state.identity = FileIdentity.of(os.fstat(fd))
        try:
            logindex.update(fd, path, size, parse_line)
        except Exception:  # the events are stored: say so; a read finds the index behind and mends it
            log.exception("the index of %s was not updated", path)
        start = st.st_size + (1 if not ends_with_newline else 0)
        return CommitResult(stored, start, state.identity, placed, fsync_seconds)
    finally:
        os.close(fd)


class SessionLog:
    """One session's log in this process: the group-commit writer and the live feed."""

    def __init__(self, path, max_bytes=None):
        self.path = path
        self.max_bytes = max_bytes  # the log's cap (DECKS_MAX_LOG_BYTES); None: no cap
        self._state = SeqState()
        self._pending = []
        self._writer = None
        self.feed = None  # a LiveFeed while anyone in this process listens

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
                    outcome = blocking(commit, self.path, [e for e, _ in batch], self._state, self.max_bytes)
                except Exception as exc:  # every poster of the batch learns of it
                    log.exception("append to %s failed", self.path)
                    for _, result in batch:
                        result.set_exception(exc)
                    continue
                # Counted here in the greenlet, not in the threadpool: prometheus_client's locks are gevent's.
                if outcome.fsync_seconds is not None:
                    FSYNC_SECONDS.observe(outcome.fsync_seconds)
                    APPENDS.inc(len(outcome.events))
                for (_, result), stored in zip(batch, outcome.placed):
                    if stored is None:
                        result.set_exception(LogFull(self.max_bytes))
                    else:
                        result.set(stored)
                if self.feed is not None and outcome.events:
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
