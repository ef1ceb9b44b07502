"""The two references of bench/fanout.py, each a broadcaster as small as it can be:
`GET /stream` is an SSE stream that sends every message published after it opened,
and `POST /publish` hands its body (one JSON object) to every open stream.

- `floor`: a few lines of Flask, served as our services are (gunicorn's gevent
  worker): a queue per stream, and the event serialized once per publish. What a
  stream of ours costs beyond it is our own code.
- `starlette_app`: the same in Starlette on uvicorn (asyncio), what a FastAPI user
  would pick.
- `floor_redis`: the floor spread over several gunicorn workers: a publish is one
  Redis PUBLISH (BENCH_REDIS_URL), and each worker's one subscriber greenlet hands
  what it hears to that worker's queues. Its stream answers `/api/events` too, so that
  nginx's wizard site (the SSE location of production) proxies it as it proxies ours.

Never imported by the services; the bench starts each in a process of its own.
"""

import asyncio
import json
import os

import gevent
import redis
from flask import Flask, Response, request
from gevent.queue import Queue
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

OPEN = b": stream open\n\n"

# --------------------------------------------------------------------------- the floor

floor = Flask(__name__)
_floor_queues = set()


def _queue_stream(queues):
    """A stream of what is put on a queue of its own, registered in `queues` while it lasts."""
    queue = Queue()
    queues.add(queue)

    def records():
        try:
            yield OPEN
            while True:
                yield queue.get()
        finally:
            queues.discard(queue)

    return Response(records(), mimetype="text/event-stream")


@floor.get("/stream")
def floor_stream():
    return _queue_stream(_floor_queues)


@floor.post("/publish")
def floor_publish():
    record = b"data: " + json.dumps(request.get_json(), separators=(",", ":")).encode() + b"\n\n"
    for queue in list(_floor_queues):
        queue.put(record)
    return {"streams": len(_floor_queues)}


# --------------------------------------------------------------------------- Starlette

_starlette_queues = set()


async def starlette_stream(request):
    queue = asyncio.Queue()
    _starlette_queues.add(queue)

    async def records():
        try:
            yield OPEN
            while True:
                yield await queue.get()
        finally:
            _starlette_queues.discard(queue)

    return StreamingResponse(records(), media_type="text/event-stream")


async def starlette_publish(request):
    body = await request.json()
    record = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    for queue in list(_starlette_queues):
        queue.put_nowait(record)
    return PlainTextResponse(json.dumps({"streams": len(_starlette_queues)}), media_type="application/json")


starlette_app = Starlette(
    routes=[Route("/stream", starlette_stream), Route("/publish", starlette_publish, methods=["POST"])]
)


# --------------------------------------------------------------------------- the floor on Redis

floor_redis = Flask(__name__ + ".redis")
_redis_queues = set()
_redis_reader = None
REDIS_CHANNEL = "bench:fanout"


def _redis():
    return redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])


def _read_redis():
    """This worker's one subscriber: each message to every queue of this worker."""
    pubsub = _redis().pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(REDIS_CHANNEL)
    for message in pubsub.listen():
        record = message["data"]
        for queue in list(_redis_queues):
            queue.put(record)


@floor_redis.get("/stream")
@floor_redis.get("/api/events")
def floor_redis_stream():
    global _redis_reader
    if _redis_reader is None:  # started with the worker's first stream
        _redis_reader = gevent.spawn(_read_redis)
    return _queue_stream(_redis_queues)


_publisher = None


@floor_redis.post("/publish")
def floor_redis_publish():
    global _publisher
    if _publisher is None:
        _publisher = _redis()
    record = b"data: " + json.dumps(request.get_json(), separators=(",", ":")).encode() + b"\n\n"
    return {"subscribers": _publisher.publish(REDIS_CHANNEL, record)}
