"""Host-side commands of the deck review service.

    python -m app.decks tail <session-id> [--after N] [--url URL] [--format json|text]

`tail` prints a session's events as they arrive and, unlike the spec's tail,
reconnects by itself: backoff from 1 s to a 30 s ceiling, resuming after the last
event it printed, so a service restart loses nothing and repeats nothing.
"""

import json
import sys
import time

import requests

from app.common.cli import CommandLine
from app.common.sse_client import ReconnectBackoff, iter_records

DEFAULT_URL = "http://127.0.0.1:7081"


def _print_event(event, fmt, out):
    if fmt == "json":
        out.write(json.dumps(event, ensure_ascii=False) + "\n")
    else:
        slide = f" slide {event['slide'] + 1}" if isinstance(event.get("slide"), int) else ""
        detail = event.get("text") or event.get("value") or event.get("file") or event.get("task_seq", "")
        out.write(f"#{event['seq']} {event['ts']} {event['type']}{slide}: {detail}\n")
    out.flush()


def tail(url, session_id, after, fmt, out=sys.stdout, err=sys.stderr, sleep=time.sleep, max_connects=None):
    """Follow the stream until interrupted (or `max_connects` connections, for tests)."""
    backoff, cursor, connects = ReconnectBackoff(), after, 0
    while max_connects is None or connects < max_connects:
        connects += 1
        try:
            with requests.get(
                f"{url}/api/sessions/{session_id}/stream", params={"after": cursor}, stream=True, timeout=(10, 60)
            ) as response:
                if response.status_code == 404:
                    err.write(f"error: session {session_id} does not exist\n")
                    return 2
                response.raise_for_status()
                err.write(f"connected, after seq {cursor}\n")
                for record in iter_records(response):
                    event = record.json()
                    if event["seq"] > cursor:
                        cursor = event["seq"]
                        _print_event(event, fmt, out)
                    backoff.reset()
            reason = "the stream ended"
        except requests.RequestException as exc:
            reason = f"{type(exc).__name__}"
        delay = backoff.next_delay()
        err.write(f"{reason}; reconnecting in {delay:.0f} s\n")
        sleep(delay)
    return 0


def _tail_arguments(parser):
    parser.add_argument("session_id")
    parser.add_argument("--after", type=int, default=0, help="start after this seq (default 0: all)")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"service base URL (default {DEFAULT_URL})")
    parser.add_argument("--format", choices=("json", "text"), default="text")


commands = CommandLine("python -m app.decks", __doc__, interrupted=130)
commands.add(
    "tail",
    "print a session's events as they arrive",
    lambda args, streams: tail(
        args.url.rstrip("/"), args.session_id, args.after, args.format, streams.out, streams.err
    ),
    _tail_arguments,
)


def main(argv=None):
    return commands.main(argv)
