"""A load loop of reads and writes on every service, through a deployment's public
address, counted while an operation runs on the deployment (a restart, a reload, a
killed master, a rolling upgrade); then every acknowledged write is looked for, and
the streams held meanwhile are checked to hold every event exactly once.

    loop = LoadLoop(open_client, credentials)
    with loop.running():
        ...                      # the operation
    print(loop.summary())        # requests, failures by kind, longest wait, per service
    assert loop.failures() == {} and loop.missing_writes() == {}
    assert loop.stream_faults() == []

`open_client(service)` answers `(requests.Session, base_url)` for a service's public
address (the Session carries the Host header and the TLS server name). Each service has
one client thread that alternates a read and a write (paced: 4 requests a second, under
nginx's per-address limits; a steady load, not a flood), and two streams are held: a
deck session's events (resumed by Last-Event-ID, as the review page does) and the
wizard's change events (each (re)connection and each event re-query the collection, as
the wizard's pages do).

A write counts as acknowledged when its answer is a success with what it made; one
that failed may or may not have happened, so only acknowledged ones are looked for.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import requests

from app.common.sse_client import iter_records
from devtools.waiting import wait_for

# Generous: a request that waits in a socket's queue during a restart must not be cut
# short by the client; the longest wait is reported, not bounded.
REQUEST_TIMEOUT = 120
SPEECH_EVERY = 2.5
# Each client's read and write take this long at least, together: 4 requests a second
# per service, under the per-address limits nginx sets (decks' writes: 5 a second).
CYCLE_SECONDS = 0.5
OpenClient = Callable[[str], tuple[requests.Session, str]]


def p99(seconds: list[float]) -> float:
    """The 99th percentile of `seconds` sorted shortest first (nan when there is none)."""
    return seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))] if seconds else float("nan")


class Unexpected(Exception):
    """An answer the loop did not expect (its status and the start of its body)."""


@dataclass
class Tally:
    """What one service's requests came to."""

    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    failed_at: list[tuple[str, float]] = field(default_factory=list)  # each failure: (kind, time.monotonic())
    longest: float = 0.0
    acknowledged: list[object] = field(default_factory=list)
    # Each acknowledged write: (time.monotonic() when it was sent, seconds to its answer).
    writes: list[tuple[float, float]] = field(default_factory=list)

    def count(self, seconds: float, failure: str | None = None, example: str = "") -> None:
        self.requests += 1
        self.longest = max(self.longest, seconds)
        if failure:
            self.failures[failure] += 1
            self.failed_at.append((failure, time.monotonic()))
            if len(self.examples) < 5:
                self.examples.append(f"{failure}: {example}"[:300])


def _kind(error: Exception) -> str:
    if isinstance(error, requests.Timeout):
        return "timeout"
    if isinstance(error, requests.ConnectionError):
        return "connection"
    return "unexpected answer"


def _expect(answer: requests.Response, *statuses: int) -> requests.Response:
    if answer.status_code not in statuses:
        kind = "5xx" if answer.status_code >= 500 else "unexpected answer"
        raise Unexpected(f"{kind}|{answer.request.method} {answer.url} -> {answer.status_code} {answer.text[:200]}")
    return answer


class Workload:
    """One service's read, write, and the check that its acknowledged writes are there."""

    service = ""

    def __init__(self, open_client: OpenClient, credentials: dict[str, str]) -> None:
        self.http, self.base = open_client(self.service)
        self.http.headers.update(self.headers(credentials))

    def headers(self, credentials: dict[str, str]) -> dict[str, str]:
        return {}

    def get(self, path: str, **kwargs: object) -> requests.Response:
        return self.http.get(self.base + path, timeout=REQUEST_TIMEOUT, **kwargs)  # type: ignore[arg-type]

    def post(self, path: str, body: object) -> requests.Response:
        return self.http.post(self.base + path, json=body, timeout=REQUEST_TIMEOUT)

    def read(self) -> None:
        raise NotImplementedError

    def write(self) -> object | None:
        """Make one thing; answers what identifies it once acknowledged (None: nothing kept)."""
        raise NotImplementedError

    def missing(self, acknowledged: list[object]) -> list[object]:
        """The acknowledged writes that cannot be found."""
        return []


class Decks(Workload):
    service = "decks"

    def __init__(self, open_client: OpenClient, credentials: dict[str, str]) -> None:
        super().__init__(open_client, credentials)
        deck = _expect(self.get("/api/decks"), 200).json()[0]["id"]
        made = _expect(self.post("/api/sessions", {"deck_id": deck, "title": "load loop"}), 201)
        self.session = made.json()["id"]

    def read(self) -> None:
        _expect(self.get(f"/api/sessions/{self.session}"), 200)

    def write(self) -> object:
        answer = _expect(
            self.post(f"/api/sessions/{self.session}/events", {"type": "note", "slide": 0, "text": "x"}), 201
        )
        return answer.json()["seq"]

    def missing(self, acknowledged: list[object]) -> list[object]:
        stored, after = set(), 0
        while True:
            page = _expect(self.get(f"/api/sessions/{self.session}/events", params={"after": after}), 200).json()
            stored |= {event["seq"] for event in page["events"]}
            if not page["has_more"]:
                return [seq for seq in acknowledged if seq not in stored]
            after = page["next_after"]


class Wizard(Workload):
    service = "wizard"
    collection = "/api/collections/blueprints"

    def read(self) -> None:
        _expect(self.get("/api/me"), 200)

    def write(self) -> object:
        body = {"title": f"load {uuid.uuid4().hex[:8]}", "is_public": True}
        return _expect(self.post(self.collection, body), 201).json()["id"]

    def rows(self) -> list[object]:
        return [row["id"] for row in _expect(self.get(self.collection), 200).json()]

    def missing(self, acknowledged: list[object]) -> list[object]:
        stored = set(self.rows())
        return [row for row in acknowledged if row not in stored]


class Notebook(Workload):
    service = "notebook"

    def headers(self, credentials: dict[str, str]) -> dict[str, str]:
        return {"Authorization": f"Bearer {credentials['notebook_password']}"}

    def read(self) -> None:
        _expect(self.get("/api/notebooks"), 200)

    def write(self) -> object:
        body = {"name": f"load loop {uuid.uuid4().hex}", "description": ""}
        return _expect(self.post("/api/notebooks", body), 201).json()["id"]

    def missing(self, acknowledged: list[object]) -> list[object]:
        stored = {notebook["id"] for notebook in _expect(self.get("/api/notebooks"), 200).json()}
        return [key for key in acknowledged if key not in stored]


class Workspace(Workload):
    """Its write is a sign-in: the session token it answers is a row the platform keeps."""

    service = "workspace"

    def headers(self, credentials: dict[str, str]) -> dict[str, str]:
        self.account = {
            "email": credentials["workspace_owner_email"],
            "password": credentials["workspace_owner_password"],
        }
        return {}

    def read(self) -> None:
        _expect(self.get("/api/v2/buildinfo"), 200)

    def write(self) -> object:
        answer = _expect(self.post("/api/v2/users/login", self.account), 201)
        self.http.cookies.clear()  # each sign-in stands alone: its token is checked by header
        return answer.json()["session_token"]

    def missing(self, acknowledged: list[object]) -> list[object]:
        def signed_in(token: object) -> bool:
            while True:  # one request per token: paced by the answers' Retry-After if limited
                answer = self.http.get(
                    self.base + "/api/v2/users/me",
                    headers={"Workspace-Session-Token": str(token)},
                    timeout=REQUEST_TIMEOUT,
                )
                if answer.status_code != 429:
                    return answer.status_code == 200
                time.sleep(float(answer.headers.get("Retry-After", "1")))

        return [token for token in acknowledged if not signed_in(token)]


class Audio(Workload):
    """It keeps nothing: its 'write' is a synthesis, checked by its answer only."""

    service = "audio"
    last_speech = 0.0

    def headers(self, credentials: dict[str, str]) -> dict[str, str]:
        return {"X-App-Request": "1"}  # what the service's own pages send

    def read(self) -> None:
        voices = _expect(self.get("/api/audio/voices", params={"locale": "en"}), 200).json()["voices"]
        self.voice = voices[0]["id"]

    def write(self) -> None:
        # A synthesis every SPEECH_EVERY seconds at most (the service allows 30 a minute
        # from one address), its capabilities in between.
        if time.monotonic() - self.last_speech < SPEECH_EVERY:
            _expect(self.get("/api/audio/capabilities"), 200)
            return None
        self.last_speech = time.monotonic()
        _expect(self.post("/api/audio/speech", {"text": "Load loop.", "voiceId": self.voice}), 200)
        return None


WORKLOADS: dict[str, type[Workload]] = {w.service: w for w in (Workspace, Decks, Notebook, Audio, Wizard)}


class _Follower(threading.Thread):
    """A held stream that reconnects whenever it ends, as a browser's EventSource does."""

    def __init__(self, name: str, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.stop, self.reconnects = stop, 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.follow()
            except Exception as error:  # a cut stream: counted, then resumed
                self.errors.append(f"{type(error).__name__}: {error}"[:200])
            self.reconnects += 1
            self.stop.wait(0.5)  # EventSource's reconnection delay, not a wait for a condition

    def follow(self) -> None:
        raise NotImplementedError


class DeckStream(_Follower):
    """A session's events, resumed after the last one seen (Last-Event-ID)."""

    def __init__(self, decks: Decks, stop: threading.Event) -> None:
        super().__init__("deck stream", stop)
        self.decks = decks
        self.seen: list[object] = []

    def follow(self) -> None:
        headers = {"Last-Event-ID": str(self.seen[-1])} if self.seen else {}
        path = f"/api/sessions/{self.decks.session}/stream"
        with self.decks.http.get(self.decks.base + path, headers=headers, stream=True, timeout=(30, 60)) as answer:
            _expect(answer, 200)
            for record in iter_records(answer):
                if self.stop.is_set():
                    return
                if record.data:
                    self.seen.append(record.json()["seq"])


class WizardPage(_Follower):
    """The wizard's change events; the page re-queries the collection on each (re)connection
    and each event, so what it shows is the collection's latest answer."""

    def __init__(self, wizard: Wizard, stop: threading.Event) -> None:
        super().__init__("wizard page", stop)
        self.wizard = wizard
        self.shown: list[object] = []

    def follow(self) -> None:
        with self.wizard.http.get(self.wizard.base + "/api/events", stream=True, timeout=(30, 60)) as answer:
            _expect(answer, 200)
            self.shown = self.wizard.rows()
            for record in iter_records(answer):
                if self.stop.is_set():
                    return
                if record.data:
                    self.shown = self.wizard.rows()


class LoadLoop:
    def __init__(self, open_client: OpenClient, credentials: dict[str, str], services: list[str] | None = None) -> None:
        self.workloads = [WORKLOADS[name](open_client, credentials) for name in services or WORKLOADS]
        self.tallies = {w.service: Tally() for w in self.workloads}
        # The loop's clients stop with the block; the streams only once they were checked
        # (they catch up on the last writes first).
        self.stop, self.streams_stop = threading.Event(), threading.Event()
        self.followers: list[_Follower] = []
        for workload in self.workloads:
            if isinstance(workload, Decks):
                self.followers.append(DeckStream(workload, self.streams_stop))
            if isinstance(workload, Wizard):
                self.followers.append(WizardPage(workload, self.streams_stop))
        self.started = self.ended = 0.0

    def _drive(self, workload: Workload) -> None:
        tally = self.tallies[workload.service]
        while not self.stop.is_set():
            cycle = time.monotonic()
            for operation in (workload.read, workload.write):
                started = time.monotonic()
                try:
                    made = operation()
                except Exception as error:  # counted, by kind
                    failure, _, example = str(error).partition("|") if isinstance(error, Unexpected) else ("", "", "")
                    tally.count(time.monotonic() - started, failure or _kind(error), example or repr(error))
                    continue
                tally.count(time.monotonic() - started)
                if made is not None:
                    tally.acknowledged.append(made)
                    tally.writes.append((started, time.monotonic() - started))
            self.stop.wait(CYCLE_SECONDS - (time.monotonic() - cycle))  # pacing, not a wait for a condition

    @contextlib.contextmanager
    def running(self) -> Iterator[LoadLoop]:
        """The loop runs while the block does; it waits for every service to have
        answered once before the block starts, so the operation meets a live load."""
        drivers = [threading.Thread(target=self._drive, args=(w,), daemon=True) for w in self.workloads]
        self.started = time.monotonic()
        for thread in [*drivers, *self.followers]:
            thread.start()
        try:
            wait_for(lambda: all(t.requests >= 2 for t in self.tallies.values()), "every service to answer the loop")
            yield self
        finally:
            self.ended = time.monotonic()
            self.stop.set()
            for thread in drivers:
                thread.join(REQUEST_TIMEOUT + 10)

    def failures(self) -> dict[str, dict[str, int]]:
        return {name: dict(t.failures) for name, t in self.tallies.items() if t.failures}

    def missing_writes(self, among: dict[str, list[object]] | None = None) -> dict[str, list[object]]:
        """The acknowledged writes (or those of `among`, by service) that cannot be found."""
        wanted = among if among is not None else {name: t.acknowledged for name, t in self.tallies.items()}
        found = {w.service: w.missing(list(wanted.get(w.service, []))) for w in self.workloads}
        return {name: missing for name, missing in found.items() if missing}

    def stream_faults(self, timeout: float = 60.0) -> list[str]:
        """What the held streams got wrong: a deck event missed or seen twice, a wizard
        row the page does not show or shows twice (each after the stream caught up)."""
        faults: list[str] = []
        for follower in self.followers:
            if isinstance(follower, DeckStream):
                wanted = list(self.tallies["decks"].acknowledged)
                faults += self._caught_up(follower, "deck stream", lambda f=follower: f.seen, wanted, timeout)
            if isinstance(follower, WizardPage):
                wanted = list(self.tallies["wizard"].acknowledged)
                faults += self._caught_up(follower, "wizard page", lambda f=follower: f.shown, wanted, timeout)
        self.streams_stop.set()
        return faults

    @staticmethod
    def _caught_up(
        follower: _Follower, name: str, held: Callable[[], list[object]], wanted: list[object], timeout: float
    ) -> list[str]:
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: set(wanted) <= set(held()), f"the {name} to hold every write", timeout)
        seen = held()
        faults = [f"{name}: {item!r} seen {seen.count(item)} times" for item in set(seen) if seen.count(item) > 1]
        faults += [f"{name}: {item!r} never seen" for item in wanted if item not in seen]
        return faults[:20]

    def write_latencies(self, start: float, end: float) -> list[float]:
        """The seconds of every acknowledged write sent between `start` and `end`
        (time.monotonic()), all services together, shortest first."""
        return sorted(s for t in self.tallies.values() for sent, s in t.writes if start <= sent <= end)

    def acknowledged_before(self, moment: float) -> dict[str, list[object]]:
        """Each service's writes acknowledged before `moment` (time.monotonic())."""
        return {
            name: [made for made, (sent, seconds) in zip(t.acknowledged, t.writes) if sent + seconds < moment]
            for name, t in self.tallies.items()
        }

    def summary(self) -> str:
        lines = [f"load loop: {self.ended - self.started:.1f} s"]
        for name, tally in self.tallies.items():
            failures = ", ".join(f"{kind} {n}" for kind, n in tally.failures.items()) or "none"
            lines.append(
                f"  {name:9} {tally.requests:5} requests, {len(tally.acknowledged):4} writes acknowledged,"
                f" failures: {failures}, longest wait {tally.longest:.2f} s"
            )
            lines += [f"      {example}" for example in tally.examples]
        for follower in self.followers:
            lines.append(f"  {follower.name}: {follower.reconnects} reconnections")
        return "\n".join(lines)
