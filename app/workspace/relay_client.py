"""A relay client: reach a workspace agent through the platform's relay (relay.py),
for a machine that cannot reach the workspace directly.

    WORKSPACE_SESSION_TOKEN=<session token> python -m app.workspace.relay_client \\
        --url <WORKSPACE_ACCESS_URL> --agent <agent id> (app <slug> <path> | pty)

`app` does one HTTP GET of <path> on the agent's app <slug> and prints the body (the
status goes to stderr and the exit status is 1 when it is not 2xx); `pty` attaches
stdin and stdout to a new shell on the agent (raw mode when stdin is a terminal) until
the shell exits. The token is a signed-in user's who may manage the workspace, read
from the environment only (a command line is visible in ps). Exit status 2: the
relay session could not be set up (the reason on stderr).

The client plays the platform's part of the multiplex protocol (mux.py) over the
relay: it opens the streams, the agent serves them.
"""
from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import http.client  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import termios  # noqa: E402
import tty  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
import uuid  # noqa: E402

import gevent  # noqa: E402
from gevent.socket import wait_read  # noqa: E402

from app.workspace.agent import DIAL_TIMEOUT_S, MESSAGE_LIMIT, TOKEN_HEADER, relay_url  # noqa: E402
from app.workspace.mux import StreamClosed, relay_mux  # noqa: E402
from app.workspace.websocket import HandshakeRefused, connect_frames  # noqa: E402

JOIN_TIMEOUT_S = 30.0  # the platform gives an invited agent 20 s to join
ANSWER_TIMEOUT_S = 120.0  # an app silent this long is given up (as the apps proxy does)
KEEPALIVE_S = 30.0  # a terminal pings the agent: the relay closes a pair idle for 300 s


class RelayError(Exception):
    """The relay session or the request through it failed; `str()` says why."""


class Session:
    """One relay session from this client to `agent_id`, the agent joined."""

    def __init__(self, access_url, token, agent_id, timeout=JOIN_TIMEOUT_S):
        url = relay_url(access_url, agent_id, "client", str(uuid.uuid4()))
        try:
            transport = connect_frames(url, {TOKEN_HEADER: token}, timeout=DIAL_TIMEOUT_S,
                                       max_message_size=MESSAGE_LIMIT)
        except HandshakeRefused as exc:
            raise RelayError(_refusal(url, token, exc.status_code)) from None
        except OSError as exc:
            raise RelayError(f"could not reach the platform: {exc}") from None
        self.mux = relay_mux(transport, opens=True, peer="agent", me="client")
        self.reader = gevent.spawn(self.mux.run)
        gevent.wait([self.mux.ready, self.reader], count=1, timeout=timeout)
        if not self.mux.ready.is_set():
            self.close()
            raise RelayError(f"the agent did not join: {self.mux.closed_reason or f'no answer within {timeout} s'}")

    def open(self, meta, data=b""):
        try:
            return self.mux.open(meta, data)
        except StreamClosed as exc:
            raise RelayError(str(exc)) from None

    def close(self):
        self.mux.close("the client is done")
        self.reader.join(5)


def _refusal(url, token, status):
    """Why the relay refused the upgrade: the same URL, asked without the upgrade,
    answers with the platform's JSON error (its checks come before the upgrade's)."""
    why = f"the relay refused the session (HTTP {status})"
    request = urllib.request.Request(url.replace("ws", "http", 1), headers={TOKEN_HEADER: token})
    try:
        urllib.request.urlopen(request, timeout=DIAL_TIMEOUT_S).close()
    except urllib.error.HTTPError as error:
        try:
            body = json.load(error)
            return f"{why}: {body['message']}" + (f" ({body['detail']})" if body.get("detail") else "")
        except (ValueError, KeyError, TypeError, OSError):
            pass
    except OSError:
        pass
    return why


class _Received:
    """What http.client parses a response from: bytes already received."""

    def __init__(self, data):
        self.data = data

    def makefile(self, mode):
        return io.BytesIO(self.data)


def fetch(session, slug, path, timeout=ANSWER_TIMEOUT_S):
    """One GET of `path` on app `slug` through `session`: (status, reason, body)."""
    head = f"GET /{path.lstrip('/')} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    stream = session.open({"kind": "app", "slug": slug}, head.encode())
    received = bytearray()
    try:
        while True:
            data = stream.read(timeout)
            if data is None:
                raise RelayError(f"the app sent nothing for {timeout} s")
            if not data:
                break
            received += data
    except StreamClosed as exc:
        raise RelayError(str(exc)) from None
    finally:
        stream.close()
    response = http.client.HTTPResponse(_Received(bytes(received)))
    try:
        response.begin()
        return response.status, response.reason, response.read()
    except (http.client.HTTPException, ValueError) as exc:
        raise RelayError(f"the app's answer is not HTTP: {exc!r}") from None


def attach(session, stdin=0, stdout=1):
    """A new shell on the agent, attached to `stdin`/`stdout` until it exits."""
    terminal = os.isatty(stdin)
    rows, cols = os.get_terminal_size(stdin)[::-1] if terminal else (24, 80)
    stream = session.open({"kind": "pty", "reconnect": str(uuid.uuid4()), "rows": rows, "cols": cols})

    def upward():  # stdin's end does not end the shell: its own exit does
        while True:
            wait_read(stdin)
            data = os.read(stdin, 4096)
            if not data:
                return
            stream.write(data)

    saved = termios.tcgetattr(stdin) if terminal else None
    if terminal:
        tty.setraw(stdin)
        gevent.signal_handler(signal.SIGWINCH, lambda: stream.resize(*os.get_terminal_size(stdin)[::-1]))
    helpers = [gevent.spawn(upward), gevent.spawn(session.mux.keepalive, KEEPALIVE_S)]
    try:
        while True:
            data = stream.read()
            if not data:
                break
            os.write(stdout, data)
    except StreamClosed:
        pass
    finally:
        gevent.killall(helpers)
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m app.workspace.relay_client", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("WORKSPACE_ACCESS_URL"),
                        help="the platform's address (WORKSPACE_ACCESS_URL)")
    parser.add_argument("--agent", required=True, help="the agent's id")
    commands = parser.add_subparsers(dest="command", required=True)
    app = commands.add_parser("app", help="GET a path of one of the agent's apps; print the body")
    app.add_argument("slug")
    app.add_argument("path")
    commands.add_parser("pty", help="a shell on the agent, on this terminal")
    args = parser.parse_args(argv)
    token = os.environ.get("WORKSPACE_SESSION_TOKEN")
    if not args.url or not token:
        parser.error("--url (or WORKSPACE_ACCESS_URL) and WORKSPACE_SESSION_TOKEN in the environment are required")
    try:
        session = Session(args.url, token, args.agent)
        try:
            if args.command == "pty":
                attach(session)
                return 0
            status, reason, body = fetch(session, args.slug, args.path)
        finally:
            session.close()
    except RelayError as exc:
        print(f"relay_client: {exc}", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(body)
    sys.stdout.flush()
    if not 200 <= status < 300:
        print(f"relay_client: HTTP {status} {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
