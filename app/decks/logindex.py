"""The sparse index of a session's event log, `events.idx` beside `events.jsonl`: where
in the log the events past a cursor begin, so that a read costs what it returns (plus
at most one index step), not the size of the log.

Format: a 16-byte header (MAGIC, then `covered`: the log offset up to which the index
is complete, always just past a newline), then 16-byte entries (seq, offset of that
event's line) in log order, one at least every STEP bytes of log.

The log stays the only source of truth. The index is derived data, written only by
whoever holds the log's lock (the writer after each batch; a reader that finds it
missing or behind), and never trusted blindly: a read checks that the line where it
starts is the event the entry names, at a line start, and since seqs only grow along
the log, no event past the cursor can lie before a checked entry. An index that is
missing, torn, ahead of its log (an older copy restored), or that disagrees with it
is rebuilt from the log, written aside and renamed over it, so a reader never sees a
half-built one. A backup of the log alone restores fine: its index is rebuilt.
"""

import logging
import os
import struct

log = logging.getLogger("bundle.decks.eventlog")

MAGIC = b"DKIDX1\n\x00"
HEADER = struct.Struct(">8sQ")
ENTRY = struct.Struct(">QQ")
STEP = 64 * 1024
_SCAN_BLOCK = 1024 * 1024


def index_path(log_path) -> str:
    return os.path.splitext(os.fspath(log_path))[0] + ".idx"


def _header(ifd):
    """`covered` of the index open as `ifd`, or None when it has no valid header."""
    raw = os.pread(ifd, HEADER.size, 0)
    if len(raw) < HEADER.size:
        return None
    magic, covered = HEADER.unpack(raw)
    return covered if magic == MAGIC else None


def _entry(ifd, number):
    raw = os.pread(ifd, ENTRY.size, HEADER.size + number * ENTRY.size)
    return ENTRY.unpack(raw) if len(raw) == ENTRY.size else None


def _entry_count(ifd):
    return max(0, (os.fstat(ifd).st_size - HEADER.size) // ENTRY.size)


def locate(log_path, log_size: int, after: int, lagging_ok: bool = False):
    """(offset, seq the index says begins there, or None) from which to read the events
    past `after`; None when the index is missing or unreadable, claims more log than
    there is, or is more than a step behind (unless `lagging_ok`): the caller then brings
    it up to date under the log's lock (`update`). A binary search: a few small reads."""
    try:
        ifd = os.open(index_path(log_path), os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        covered = _header(ifd)
        if covered is None or covered > log_size or (log_size - covered > STEP and not lagging_ok):
            return None
        # The last entry whose seq is at most after + 1: every later event follows it.
        low, high, found = 0, _entry_count(ifd) - 1, (0, None)
        while low <= high:
            middle = (low + high) // 2
            entry = _entry(ifd, middle)
            if entry is None:
                return None
            seq, offset = entry
            if seq <= after + 1:
                found, low = (offset, seq), middle + 1
            else:
                high = middle - 1
        return found if found[0] < max(covered, 1) else None  # an entry past `covered` is not ours
    finally:
        os.close(ifd)


def _line_starts_at(log_fd, offset):
    return offset == 0 or os.pread(log_fd, 1, offset - 1) == b"\n"


def _events_between(log_fd, start, end, parse):
    """(offset, seq) of each event line in [start, end); `start` is a line start and
    `end` just past a newline."""
    pos, rest, rest_at = start, b"", start
    while pos < end:
        chunk = os.pread(log_fd, min(_SCAN_BLOCK, end - pos), pos)
        if not chunk:
            return
        pos += len(chunk)
        data, at = rest + chunk, rest_at
        lines = data.split(b"\n")
        rest = lines.pop()
        for line in lines:
            event = parse(line) if line.strip() else None
            if event is not None:
                yield at, event["seq"]
            at += len(line) + 1
        rest_at = at


def _sparse(events, last_offset):
    """Of the (offset, seq) pairs, those that start a new step after `last_offset`."""
    for offset, seq in events:
        if last_offset is None or offset >= last_offset + STEP:
            last_offset = offset
            yield seq, offset


def _trusted(ifd, log_fd, complete_end, parse):
    """(covered, offset of the last entry or None) when the index agrees with the log
    as far as can be checked cheaply, else None."""
    covered = _header(ifd)
    size = os.fstat(ifd).st_size
    if (
        covered is None
        or (size - HEADER.size) % ENTRY.size
        or covered > complete_end
        or not _line_starts_at(log_fd, covered)
    ):
        return None
    count = _entry_count(ifd)
    if not count:
        return covered, None
    entry = _entry(ifd, count - 1)
    if entry is None:
        return None
    seq, offset = entry
    if offset >= covered or not _line_starts_at(log_fd, offset):
        return None
    event = parse(_line_at(log_fd, offset))
    return (covered, offset) if event is not None and event["seq"] == seq else None


def _line_at(log_fd, offset):
    """The line that starts at `offset` (without its newline), read in growing blocks."""
    data, size = b"", 4096
    while True:
        chunk = os.pread(log_fd, size, offset + len(data))
        data += chunk
        end = data.find(b"\n")
        if end >= 0 or not chunk:
            return data[:end] if end >= 0 else data
        size = min(size * 2, _SCAN_BLOCK)


def update(log_fd, log_path, complete_end: int, parse, rebuild: bool = False) -> None:
    """Bring the index up to `complete_end` (just past the log's last complete line):
    extend it with what was appended since, or rebuild it when it cannot be trusted
    (or `rebuild`). The caller holds the log's lock; `parse` is the line parser."""
    path = index_path(log_path)
    try:
        ifd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        ifd = None
    try:
        state = None if ifd is None or rebuild else _trusted(ifd, log_fd, complete_end, parse)
        if state is None:
            _rebuild(log_fd, path, complete_end, parse)
            return
        assert ifd is not None  # (state is None without an index: rebuilt above)
        covered, last_offset = state
        if covered == complete_end:
            return
        entries = b"".join(
            ENTRY.pack(*entry) for entry in _sparse(_events_between(log_fd, covered, complete_end, parse), last_offset)
        )
        # Entries first, then the header that covers them (a reader may be reading).
        os.pwrite(ifd, entries, os.fstat(ifd).st_size)
        os.pwrite(ifd, HEADER.pack(MAGIC, complete_end), 0)
    finally:
        if ifd is not None:
            os.close(ifd)


def _rebuild(log_fd, path, complete_end, parse):
    if complete_end > STEP:
        log.info("rebuilding the index %s from its log (%d bytes)", path, complete_end)
    entries = _sparse(_events_between(log_fd, 0, complete_end, parse), None)
    data = HEADER.pack(MAGIC, complete_end) + b"".join(ENTRY.pack(*entry) for entry in entries)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as f:
        f.write(data)
    os.replace(temporary, path)
