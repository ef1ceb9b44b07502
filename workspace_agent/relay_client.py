"""A relay client: reach a workspace agent through the platform's relay, which pairs
this client with the agent in a session and forwards the multiplex protocol between
them without reading it. Here the client opens the streams, the agent serves them.

    WORKSPACE_SESSION_TOKEN=<session token> python3 workspace-agent.pyz relay \\
        --url https://workspace.example.org --agent <agent id> app <slug> <path>
    ... relay --url ... --agent <id> pty

`app` GETs a path of one of the agent's apps and prints the body; `pty` attaches this
terminal to a new shell on the agent. The token is read from the environment only
(a command line is visible in ps). Exit status 2: the relay, the agent or the
session failed (the reason on stderr); 1: the app answered with an error status.
"""

import argparse
import asyncio
import http.client
import io
import json
import os
import signal
import sys
import termios
import tty
import urllib.error
import urllib.request
import uuid

from workspace_agent.agent import relay_url
from workspace_agent.connection import DIAL_TIMEOUT_S, TOKEN_HEADER, StreamClosed, relay_link
from workspace_protocol.websocket import HandshakeRefused

JOIN_TIMEOUT_S = 30.0  # the platform gives an invited agent 20 s to join
ANSWER_TIMEOUT_S = 120.0  # an app silent this long is given up (as the apps proxy does)
KEEPALIVE_S = 30.0  # a terminal pings the agent: the relay closes a pair idle for 300 s


class RelayError(Exception):
    """The relay session or the request through it failed; `str()` says why."""


async def join(access_url, token, agent_id, timeout=JOIN_TIMEOUT_S):
    """A Link to `agent_id` through a new relay session, the agent joined."""
    url = relay_url(access_url, agent_id, "client", str(uuid.uuid4()))
    try:
        link = await relay_link(url, {TOKEN_HEADER: token}, opens=True, peer="agent", me="client")
    except HandshakeRefused as exc:
        loop = asyncio.get_running_loop()
        raise RelayError(await loop.run_in_executor(None, _refusal, url, token, exc.status_code)) from None
    except (OSError, asyncio.TimeoutError) as exc:
        raise RelayError(f"could not reach the platform: {exc}") from None
    await asyncio.wait([link.ready, link.closed], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if not link.ready.done():
        link.close("the client is done")
        why = link.closed.result() if link.closed.done() else f"no answer within {timeout:.0f} s"
        raise RelayError(f"the agent did not join: {why}")
    return link


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


async def fetch(link, slug, path, timeout=ANSWER_TIMEOUT_S):
    """One GET of `path` on app `slug` through `link`: (status, reason, body)."""
    head = f"GET /{path.lstrip('/')} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    try:
        stream = await link.open({"kind": "app", "slug": slug}, head.encode())
        received = bytearray()
        try:
            while True:
                data = await stream.read(timeout)
                if data is None:
                    raise RelayError(f"the app sent nothing for {timeout:.0f} s")
                if not data:
                    break
                received += data
        finally:
            stream.close()
    except StreamClosed as exc:
        raise RelayError(str(exc)) from None
    response = http.client.HTTPResponse(_Received(bytes(received)))
    try:
        response.begin()
        return response.status, response.reason, response.read()
    except (http.client.HTTPException, ValueError) as exc:
        raise RelayError(f"the app's answer is not HTTP: {exc!r}") from None


async def attach(link, stdin=0, stdout=1):
    """A new shell on the agent, attached to `stdin`/`stdout` until it exits."""
    loop = asyncio.get_running_loop()
    terminal = os.isatty(stdin)
    rows, cols = os.get_terminal_size(stdin)[::-1] if terminal else (24, 80)
    stream = await link.open({"kind": "pty", "reconnect": str(uuid.uuid4()), "rows": rows, "cols": cols})
    typed = asyncio.Queue()
    loop.add_reader(stdin, lambda: typed.put_nowait(os.read(stdin, 4096)))

    async def upward():  # stdin's end does not end the shell: its own exit does
        while True:
            data = await typed.get()
            if not data:
                loop.remove_reader(stdin)
                return
            await stream.write(data)

    saved = termios.tcgetattr(stdin) if terminal else None
    if terminal:
        tty.setraw(stdin)
        loop.add_signal_handler(signal.SIGWINCH, lambda: stream.resize(*os.get_terminal_size(stdin)[::-1]))
    helpers = [link.spawn(upward()), link.spawn(link.keepalive(KEEPALIVE_S))]
    try:
        while True:
            data = await stream.read()
            if not data:
                break
            os.write(stdout, data)
    except StreamClosed:
        pass
    finally:
        loop.remove_reader(stdin)
        for helper in helpers:
            helper.cancel()
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)


async def _run(args, token):
    link = await join(args.url, token, args.agent)
    try:
        if args.command == "pty":
            await attach(link)
            return None
        return await fetch(link, args.slug, args.path)
    finally:
        link.close("the client is done")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="workspace-agent relay", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("WORKSPACE_ACCESS_URL"), help="the platform's address (WORKSPACE_ACCESS_URL)"
    )
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
        answer = asyncio.run(_run(args, token))
    except RelayError as exc:
        print(f"relay_client: {exc}", file=sys.stderr)
        return 2
    if answer is None:
        return 0
    status, reason, body = answer
    sys.stdout.buffer.write(body)
    sys.stdout.flush()
    if not 200 <= status < 300:
        print(f"relay_client: HTTP {status} {reason}", file=sys.stderr)
        return 1
    return 0
