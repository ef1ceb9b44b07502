"""The client side of our SSE streams, for command-line tools and tests: a record
parser over a streaming `requests` response, and the reconnect backoff."""
import json


class Record:
    def __init__(self, record_id, event, data, comment):
        self.id, self.event, self.data, self.comment = record_id, event, data, comment

    def json(self):
        return json.loads(self.data)


def iter_records(response, include_comments=False):
    """Records of an SSE response as they arrive (comments too, if asked)."""
    record_id, event, data = None, None, []
    for raw in response.iter_lines(chunk_size=1, decode_unicode=False):
        line = raw.decode("utf-8")
        if not line:
            if data:
                yield Record(record_id, event, "\n".join(data), None)
            record_id, event, data = None, None, []
        elif line.startswith(":"):
            if include_comments:
                yield Record(None, None, None, line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                record_id = value
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)


class Backoff:
    """Reconnect delays: 1 s, doubling, up to 30 s; back to 1 s after a success."""

    def __init__(self, first=1.0, ceiling=30.0):
        self.first, self.ceiling = first, ceiling
        self.current = first

    def next_delay(self):
        delay = self.current
        self.current = min(self.current * 2, self.ceiling)
        return delay

    def reset(self):
        self.current = self.first
