"""The audio service's test helpers: the running service with its calls (`Audio`),
started with a seeded local sound library and a counting wrapper around espeak-ng."""

import http.client
import shutil
import stat

import requests

from app.audio.seed import seed

ORIGIN = "https://audio.test.example"
APP = {"X-App-Request": "1"}


class Audio:
    """The running service plus helpers to call it."""

    def __init__(self, service, engine_log=None, down_flag=None):
        self.service, self.engine_log, self.down_flag = service, engine_log, down_flag
        self.slow_flag = down_flag.with_name("engine.slow") if down_flag else None
        self.hold_flag = down_flag.with_name("engine.hold") if down_flag else None
        self.url = service.base_url + "/api/audio"

    def get(self, path, headers=None, **kwargs):
        return requests.get(self.url + path, headers={**APP, **(headers or {})}, timeout=30, **kwargs)

    def speech(self, body, headers=None, **kwargs):
        return requests.post(self.url + "/speech", json=body, headers={**APP, **(headers or {})}, timeout=30, **kwargs)

    def probes_run(self):
        """How many times the engine was started for a probe (no voice chosen)."""
        if not self.engine_log.exists():
            return 0
        return sum(1 for line in self.engine_log.read_text().splitlines() if line.strip() == "--stdout")


# The voice whose syntheses wait while engine.hold exists (others do not).
HELD_VOICE = "en-gb"


def counting_engine(directory):
    """A wrapper that logs each start of espeak-ng, fails while engine.down exists,
    synthesizes 5 s late while engine.slow exists, and holds a synthesis in voice
    HELD_VOICE while engine.hold exists (until the test removes it)."""
    log, down, slow = directory / "engine.log", directory / "engine.down", directory / "engine.slow"
    hold = directory / "engine.hold"
    script = directory / "espeak-wrapper"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {log}
if [ -e {down} ]; then echo "the engine is down" >&2; exit 1; fi
case "$*" in *-v*) [ -e {slow} ] && sleep 5;; esac
case "$*" in *"-v {HELD_VOICE} "*) while [ -e {hold} ]; do sleep 0.05; done;; esac
exec {shutil.which("espeak-ng")} "$@"
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log, down


def start_audio(starter, data_dir, env=None, engine=True):
    """The audio service; its per-address speech limits are out of the way of tests that
    are not about them (they all call from one address) unless `env` sets them."""
    seed(str(data_dir / "soundlib"))
    script, log, down = counting_engine(data_dir)
    service = starter(
        "audio",
        data_dir=data_dir,
        env={
            "AUDIO_PUBLIC_ORIGIN": ORIGIN,
            "AUDIO_SPEECH_PER_MINUTE": "100000",
            "AUDIO_SPEECH_CONCURRENT_PER_ADDRESS": "64",
            **({"AUDIO_ESPEAK_BINARY": str(script)} if engine else {}),
            **(env or {}),
        },
    )
    return Audio(service, log, down)


def raw(audio, method, path, headers, body=None, chunks=None):
    """A request exactly as written (no normalisation of the path or headers)."""
    connection = http.client.HTTPConnection("127.0.0.1", audio.service.port, timeout=30)
    if chunks is not None:
        connection.putrequest(method, "/api/audio" + path, skip_accept_encoding=True)
        for name, value in {**headers, "Transfer-Encoding": "chunked"}.items():
            connection.putheader(name, value)
        connection.endheaders()
        for chunk in chunks:
            connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        connection.send(b"0\r\n\r\n")
    else:
        connection.request(method, "/api/audio" + path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, response.read(), response
