"""The change counter (app/common/change_counter.py): one value for every process of
a host (a mapped file) or of every host (Redis); unknown, never stale, when Redis is
down."""

import subprocess
import sys

import redis

from app.common.change_counter import FileChangeCounter, RedisChangeCounter
from devtools.services import free_port
from tests.support.shared import ROOT


def test_a_file_generation_is_one_value_for_every_process_of_the_host(tmp_path):
    path = str(tmp_path / "access.generation")
    here = FileChangeCounter(path)
    assert here.current() == 0
    bump = "import sys; from app.common.change_counter import FileChangeCounter; FileChangeCounter(sys.argv[1]).bump()"
    for _ in range(3):
        subprocess.run([sys.executable, "-c", bump, path], cwd=ROOT, check=True, timeout=60)
    assert here.current() == 3  # read through the map made before the others wrote
    here.bump()
    assert FileChangeCounter(path).current() == 4


def test_a_redis_generation_and_a_redis_that_is_down(redis_server):
    url = redis_server.new_url()
    counter = RedisChangeCounter(redis.Redis.from_url(url), "bundle:test:generation")
    other_host = RedisChangeCounter(redis.Redis.from_url(url), "bundle:test:generation")
    assert counter.current() == 0
    counter.bump()
    assert other_host.current() == 1
    down = RedisChangeCounter(redis.Redis(port=free_port(), socket_connect_timeout=1), "bundle:test:generation")
    assert down.current() is None  # matches nothing kept: the caller checks again
