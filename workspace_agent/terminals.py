"""The agent's terminals: a real PTY running the user's shell ($SHELL, else /bin/sh)
as a login shell. A shell outlives its browser tab: reopening a stream with the same
reconnect id within `keep_seconds` re-attaches to it and first replays its last
64 KiB of output."""

import asyncio
import fcntl
import logging
import os
import signal
import struct
import subprocess
import termios
import time

from workspace_agent.connection import StreamClosed

REPLAY_BYTES = 64 * 1024
READ_BYTES = 64 * 1024

log = logging.getLogger("workspace-agent")


def set_window_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _new_session_on_the_pty():
    # In the child, its stdin already the PTY: a session of its own whose controlling
    # terminal is the PTY (job control, ^C, SIGHUP when the PTY closes).
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def _ready(fd, writing=False):
    """Wait until `fd` can be read (or written)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if writing else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        remove(fd)


class PtySession:
    """A shell on a PTY, attached to at most one stream at a time."""

    def __init__(self, key, rows, cols, on_end):
        self.key, self.on_end = key, on_end
        master, slave = os.openpty()
        set_window_size(master, rows, cols)
        shell = os.environ.get("SHELL") or "/bin/sh"
        self.process = subprocess.Popen(
            [shell, "-l"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
            preexec_fn=_new_session_on_the_pty,
            cwd=os.path.expanduser("~"),
            env={**os.environ, "TERM": "xterm-256color"},
        )
        os.close(slave)
        os.set_blocking(master, False)
        self.fd = master
        self.replay = bytearray()
        self.stream = None
        self.detached_at = time.monotonic()
        self._writing = asyncio.Lock()  # the replay and live output reach a stream in order
        self._reaping = None
        self.output = asyncio.ensure_future(self._pump_output())

    async def _pump_output(self):
        while True:
            await _ready(self.fd)
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                data = b""  # EIO: the shell and its children are gone
            if not data:
                break
            self.replay += data
            del self.replay[:-REPLAY_BYTES]
            await self._send(data)
        self._ended()

    async def _send(self, data):
        async with self._writing:
            stream = self.stream
            if stream is not None:
                try:
                    await stream.write(data)
                except StreamClosed:
                    self._detach(stream)

    def _ended(self):
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.write_eof()
            stream.close("the shell exited")
        self.kill()
        self.on_end(self)

    async def attach(self, stream, rows, cols):
        """Serve `stream` until it ends: replay, then live output down, input up."""
        previous = self.stream
        if previous is not None:
            previous.close("another terminal attached to this session")
        try:
            async with self._writing:
                self.stream = stream
                stream.on_resize = self.resize
                self.resize(*(stream.unheard_size or (rows, cols)))  # resized while the shell started
                stream.unheard_size = None
                if self.replay:
                    await stream.write(bytes(self.replay))
            while True:
                data = await stream.read()
                if not data:
                    break
                await self._write_input(data)
        finally:
            self._detach(stream)

    async def _write_input(self, data):
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                await _ready(self.fd, writing=True)

    def _detach(self, stream):
        if self.stream is stream:
            self.stream = None
            self.detached_at = time.monotonic()

    def resize(self, rows, cols):
        try:
            set_window_size(self.fd, max(1, min(rows, 1000)), max(1, min(cols, 1000)))
        except OSError:
            pass

    def kill(self):
        """End the shell (SIGHUP to its session); idempotent."""
        if self._reaping is not None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGHUP)
            except OSError:
                pass
        self._reaping = asyncio.ensure_future(self._reap())

    async def _reap(self):
        await asyncio.get_running_loop().run_in_executor(None, self._wait_for_exit)
        # The output's last bytes, then the fd, closed once and here on the loop, after
        # the pump stopped watching it (it ends by itself at the EIO that follows the exit).
        await asyncio.wait([self.output], timeout=5)
        self.output.cancel()
        try:
            os.close(self.fd)
        except OSError:
            pass

    def _wait_for_exit(self):  # in a thread: Popen.wait blocks
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Terminals:
    """The agent's shells by reconnect id; a detached one is ended after `keep_seconds`."""

    def __init__(self, keep_seconds):
        self.keep_seconds = keep_seconds
        self.sessions = {}

    async def serve(self, stream):
        meta = stream.meta
        key = str(meta.get("reconnect") or "")[:64] or os.urandom(8).hex()
        rows, cols = int(meta.get("rows") or 24), int(meta.get("cols") or 80)
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = PtySession(key, rows, cols, self._forget)
        await session.attach(stream, rows, cols)

    def _forget(self, session):
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]

    async def reap_detached(self):
        while True:
            await asyncio.sleep(min(10.0, self.keep_seconds))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.stream is None and now - session.detached_at > self.keep_seconds:
                    log.info("ending terminal session %s: detached for %.0f s", session.key, now - session.detached_at)
                    self._forget(session)
                    session.kill()

    def kill_all(self):
        for session in list(self.sessions.values()):
            session.kill()
