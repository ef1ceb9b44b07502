"""A job worker's record among the holders of the commands it runs (presence.Presence,
on a real Redis) is made again at each beat: a Redis failover may lose it (replication
is asynchronous), and another worker's sweep would then fail a command that runs. A
command released is never recorded again."""

import uuid

from app.common import redis_client
from app.notebook.worker.presence import Presence, _holders_key


def test_a_beat_records_again_the_holder_of_a_running_command_and_not_of_a_finished_one(redis_server):
    client = redis_client.for_url(redis_server.new_url())
    presence = Presence(client)
    running, finished = uuid.uuid4().hex, uuid.uuid4().hex
    with presence.holding(finished):
        pass
    with presence.holding(running):
        client.delete(_holders_key(running))  # what a failover may lose
        assert presence.orphaned([running]) == []  # this worker's own: never judged orphaned
        other = Presence(client)
        other.space = "another host"  # else it takes this process for a predecessor of its own
        assert other.orphaned([running]) == []  # no holder recorded: judged at the next sweep only
        assert presence.beat()
        assert client.hkeys(_holders_key(running)) == [presence.id.encode()]
        assert other.orphaned([running]) == []  # recorded again: alive
        client.delete(_holders_key(running))
        other.orphaned([running])
        assert other.orphaned([running]) == [running]  # two sweeps with no record: orphaned
    assert presence.beat()
    assert client.exists(_holders_key(running), _holders_key(finished)) == 0
