"""Runs edge-tts in a process of its own, so its asyncio never meets gevent's loop.

    echo '{"action": "voices"}' | python -m app.audio.edge_runner
    echo '{"action": "speak", "text": "…", "voice": "en-US-AriaNeural",
           "rate": "+0%", "pitch": "+0Hz", "volume": "+0%"}' | python -m app.audio.edge_runner

The request comes on stdin (the text never appears in a command line); MP3 bytes or
the voices as JSON go to stdout; a failure is one line on stderr and exit code 2.
"""

import asyncio
import json
import sys

import edge_tts


async def _speak(request, out):
    communicate = edge_tts.Communicate(
        request["text"], request["voice"], rate=request["rate"], pitch=request["pitch"], volume=request["volume"]
    )
    async for chunk in communicate.stream():
        if chunk["type"] == "audio":
            out.write(chunk["data"])


async def _voices(out):
    voices = await edge_tts.list_voices()
    out.write(
        json.dumps(
            [
                {
                    "id": v["ShortName"],
                    "name": v.get("FriendlyName") or v["ShortName"],
                    "locale": v["Locale"],
                    "gender": v.get("Gender", "unknown").lower(),
                }
                for v in voices
            ]
        ).encode()
    )


def main():
    request = json.loads(sys.stdin.read())
    out = sys.stdout.buffer
    try:
        if request["action"] == "voices":
            asyncio.run(_voices(out))
        else:
            asyncio.run(_speak(request, out))
    except Exception as exc:  # one line for the service, whatever edge-tts raised
        sys.stderr.write(f"{type(exc).__name__}: {exc}".splitlines()[0][:300] + "\n")
        return 2
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
