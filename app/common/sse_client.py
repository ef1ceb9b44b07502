"""The client side of server-sent events, written once: a sans-IO parser (bytes in,
in whatever pieces they arrive; records out), used for our own streams by command-line
tools and tests, and for the model providers' streams by the wizard and the notebook.
Also the reconnect delays (ReconnectBackoff)."""

import json
from collections.abc import Iterable, Iterator
from typing import Any

import requests


class Record:
    def __init__(self, record_id: str | None, event: str | None, data: str | None, comment: str | None) -> None:
        self.id, self.event, self.data, self.comment = record_id, event, data, comment

    def json(self) -> Any:
        assert self.data is not None, "a comment has no data"
        return json.loads(self.data)


class SseParser:
    """`feed(bytes)` returns the records those bytes completed; `end()` the last one
    when the stream stopped without the blank line that closes a record. Lines end
    with LF or CRLF; data lines of one record are joined by newlines; a record with
    no data is not one (SSE's rule); comments are records only when asked for."""

    def __init__(self, include_comments: bool = False) -> None:
        self.include_comments = include_comments
        self._pending = b""
        self._id: str | None = None
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[Record]:
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        records = []
        for line in lines:
            record = self._line(line.rstrip(b"\r").decode("utf-8", errors="replace"))
            if record is not None:
                records.append(record)
        return records

    def end(self) -> list[Record]:
        records = self.feed(b"\n") if self._pending else []
        if self._data:
            records.append(self._dispatch())
        return records

    def _line(self, line: str) -> Record | None:
        if not line:
            if self._data:
                return self._dispatch()
            self._reset()
            return None
        if line.startswith(":"):
            return Record(None, None, None, line[1:].strip()) if self.include_comments else None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> Record:
        record = Record(self._id, self._event, "\n".join(self._data), None)
        self._reset()
        return record

    def _reset(self) -> None:
        self._id, self._event, self._data = None, None, []


def records(chunks: Iterable[bytes], include_comments: bool = False) -> Iterator[Record]:
    """The records of a stream given as an iterable of byte chunks, as they complete."""
    parser = SseParser(include_comments)
    for chunk in chunks:
        yield from parser.feed(chunk)
    yield from parser.end()


def iter_records(response: requests.Response, include_comments: bool = False) -> Iterator[Record]:
    """Records of a streaming `requests` response as they arrive (comments too, if asked).
    Lines are read one by one so that a record is handed over the moment it ends."""
    lines = (line + b"\n" for line in response.iter_lines(chunk_size=1, decode_unicode=False))
    return records(lines, include_comments)


class ReconnectBackoff:
    """Reconnect delays: 1 s, doubling, up to 30 s; back to 1 s after a success."""

    def __init__(self, first: float = 1.0, ceiling: float = 30.0) -> None:
        self.first, self.ceiling = first, ceiling
        self.current = first

    def next_delay(self) -> float:
        delay = self.current
        self.current = min(self.current * 2, self.ceiling)
        return delay

    def reset(self) -> None:
        self.current = self.first
