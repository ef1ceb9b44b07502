"""The shared protocol on its own (workspace_protocol): being sans-IO, it is driven
here with bytes alone, no socket and no server."""

import os
import random

import pytest

from workspace_protocol import mux
from workspace_protocol import websocket as wire


def _naive_mask(data, key):
    return bytes(byte ^ key[index % 4] for index, byte in enumerate(data))


def test_masking_matches_the_definition_at_any_offset_and_length():
    generator = random.Random(7)
    for _ in range(3000):
        length, offset = generator.randrange(0, 70), generator.randrange(0, 9)
        buffer = bytearray(os.urandom(offset + length + 3))
        original, key = bytes(buffer), os.urandom(4)
        view = memoryview(buffer)  # a reader holds views of its buffer while it unmasks
        wire.mask_in_place(buffer, offset, length, key)
        view.release()
        assert (
            bytes(buffer)
            == original[:offset] + _naive_mask(original[offset : offset + length], key) + original[offset + length :]
        )


def _frames(messages, masked):
    """Each (opcode, payload, fragments) as frames, fragmented, with a ping between fragments."""
    out = bytearray()
    for opcode, payload, fragments in messages:
        size = max(1, -(-len(payload) // fragments))
        pieces = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
        for index, piece in enumerate(pieces):
            frame = wire.encode(opcode if index == 0 else wire.OP_CONTINUATION, piece, masked)
            if index < len(pieces) - 1:
                frame[0] &= 0x7F  # not the last fragment
                out += frame + wire.encode(wire.OP_PING, b"p", masked)
            else:
                out += frame
    return bytes(out)


@pytest.mark.parametrize("masked", [True, False])
def test_the_reader_takes_frames_however_the_bytes_are_cut(masked):
    generator = random.Random(11)
    messages = [
        (
            wire.OP_BINARY,
            os.urandom(generator.choice([0, 1, 3, 125, 126, 70_000, 600_000])),
            generator.choice([1, 1, 3]),
        )
        for _ in range(30)
    ]
    messages.append((wire.OP_TEXT, "héllo".encode(), 2))
    data = _frames(messages, masked)
    reader, received, position = wire.FrameReader(expects_mask=masked), [], 0
    while position < len(data):
        room = reader.space()
        count = min(len(room), generator.randrange(1, 200_000), len(data) - position)
        room[:count] = data[position : position + count]
        reader.filled(count)
        position += count
        while (event := reader.next_event()) is not None:
            if isinstance(event, wire.Message):
                received.append(event.data if isinstance(event.data, str) else bytes(event.data))
    expected = [payload for _, payload, _ in messages[:-1]] + ["héllo"]
    assert received == expected


def test_a_reader_grows_its_buffer_for_bulk_bytes_and_gives_it_back_when_idle():
    reader = wire.FrameReader(expects_mask=False)
    assert reader.capacity == wire.IDLE_RECEIVE_BYTES  # thousands of idle agents: a few KiB each
    bulk = b"".join(bytes(wire.encode(wire.OP_BINARY, os.urandom(60_000), masked=False)) for _ in range(8))
    received, position = [], 0
    while position < len(bulk):  # reads as a socket gives them: as much as the room offered
        room = reader.space()
        count = min(len(room), len(bulk) - position)
        room[:count] = bulk[position : position + count]
        reader.filled(count)
        position += count
        while (event := reader.next_event()) is not None:
            received.append(len(event.data))
    assert received == [60_000] * 8
    assert reader.capacity >= wire.RECEIVE_BYTES  # it grew: large reads while the bytes came in bulk
    reader.trim()
    reader.feed(bytes(wire.encode(wire.OP_BINARY, b"ping", masked=False)))
    assert bytes(reader.next_event().data) == b"ping"
    assert reader.capacity == wire.IDLE_RECEIVE_BYTES  # back to an idle connection's


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("length", [0, 125, 126, 65_536, 600_000])
def test_a_frame_built_around_its_payload_reads_as_the_same_message(masked, length):
    """What the agent sends of an app's answer: the head and the stream's header
    written into the room before the received bytes, the payload never copied."""
    payload, prefix = os.urandom(length), mux.HEADER.pack(mux.DATA, 7)
    buffer = bytearray(wire.ROOM_BEFORE) + payload
    frame = wire.frame_around(wire.OP_BINARY, buffer, wire.ROOM_BEFORE, length, masked, prefix)
    assert frame.obj is buffer  # a view of the buffer, not a copy
    reader = wire.FrameReader(expects_mask=masked)
    reader.feed(bytes(frame))
    assert bytes(reader.next_event().data) == prefix + payload
    with pytest.raises(ValueError):
        wire.frame_around(wire.OP_BINARY, bytearray(4) + payload, 4, length, masked, prefix)


@pytest.mark.parametrize(
    "frame, expects_mask, code",
    [
        (bytes([0xC2, 0x00]), False, wire.PROTOCOL_ERROR),  # a reserved bit
        (bytes(wire.encode(wire.OP_BINARY, b"x", masked=True)), False, wire.PROTOCOL_ERROR),  # masked to a client
        (bytes(wire.encode(wire.OP_BINARY, b"x", masked=False)), True, wire.PROTOCOL_ERROR),  # unmasked to a server
        (wire.frame_head(wire.OP_BINARY, 2_000_000), False, wire.TOO_LARGE),
        (bytes(wire.encode(wire.OP_TEXT, b"\xff\xfe", masked=False)), False, wire.INVALID_DATA),
        (bytes(wire.encode(0x3, b"", masked=False)), False, wire.PROTOCOL_ERROR),  # an unknown opcode
    ],
)
def test_a_frame_that_breaks_the_rules_is_a_violation_with_its_close_code(frame, expects_mask, code):
    reader = wire.FrameReader(expects_mask=expects_mask, max_message_size=1_000_000)
    reader.feed(frame)
    with pytest.raises(wire.Violation) as violation:
        reader.next_event()
    assert violation.value.code == code


def test_a_server_that_agreed_to_unmasked_frames_takes_both():
    reader = wire.FrameReader(expects_mask=None)
    reader.feed(bytes(wire.encode(wire.OP_BINARY, b"one", masked=True)) + wire.encode(wire.OP_BINARY, b"two", False))
    assert [bytes(reader.next_event().data) for _ in range(2)] == [b"one", b"two"]


def test_too_many_fragments_are_refused():
    data = b"".join(bytes([wire.OP_BINARY if i == 0 else 0, 0]) for i in range(wire.MAX_FRAGMENTS + 2))
    reader = wire.FrameReader(expects_mask=False)
    reader.feed(data)
    with pytest.raises(wire.Violation) as violation:
        reader.next_event()
    assert violation.value.code == wire.TOO_LARGE


def test_the_upgrade_answer_is_read_with_the_first_frames_after_it():
    key = wire.new_key()
    answer = wire.upgrade_answer(key, [wire.UNMASKED_HEADER]) + b"\x82\x01x"
    assert wire.upgrade_answered(answer[:20], key) is None
    fields, rest = wire.upgrade_answered(answer, key)
    assert fields["workspace-agent-frames"] == "unmasked" and rest == b"\x82\x01x"
    with pytest.raises(wire.HandshakeRefused) as refused:
        wire.upgrade_answered(b"HTTP/1.1 401 Unauthorized\r\n\r\n", key)
    assert refused.value.status_code == 401


def _events(connection, *frames):
    return [event for frame in frames for event in connection.receive(frame)]


def test_the_multiplexer_state_windows_opens_and_unknown_frames():
    agent = mux.Connection(opens=False, accepts=True)
    [opened] = _events(agent, mux.frame(mux.OPEN, 1, b'{"kind": "app"}'))
    stream = opened.stream
    assert isinstance(opened, mux.Opened) and stream.meta == {"kind": "app"}
    # Data within the window is kept; past it, the stream is closed on the sender.
    _events(agent, mux.frame(mux.DATA, 1, b"x" * mux.MAX_DATA))
    assert stream.buffered == mux.MAX_DATA
    events = _events(agent, *[mux.frame(mux.DATA, 1, b"y" * mux.MAX_DATA) for _ in range(8)])
    assert stream.closed_reason == mux.PAST_THE_WINDOW
    assert any(isinstance(event, mux.Reply) and event.frame[0] == mux.CLOSE for event in events)
    # Consuming grants the window back in batches.
    other = _events(agent, mux.frame(mux.OPEN, 3, b"{}"))[0].stream
    _events(agent, *[mux.frame(mux.DATA, 3, b"z" * mux.MAX_DATA) for _ in range(2)])
    assert other.take()[1] is None and other.take()[1] == mux.frame(mux.WINDOW, 3, mux.COUNT.pack(2 * mux.MAX_DATA))
    # This side does not open; frames of streams it does not know, and unknown types, are ignored.
    platform = mux.Connection(opens=True, accepts=False)
    [refused] = _events(platform, mux.frame(mux.OPEN, 2, b"{}"))
    assert isinstance(refused, mux.Reply) and refused.frame[0] == mux.CLOSE
    assert _events(platform, mux.frame(mux.DATA, 99, b"?"), mux.frame(200, 0, b"")) == []
    [broken] = _events(platform, b"\x01")
    assert isinstance(broken, mux.Broken)
    [pong] = _events(platform, mux.frame(mux.PING, 0, b"42"))
    assert pong.frame == mux.frame(mux.PONG, 0, b"42")


def test_a_refused_upgrade_says_the_servers_retry_after():
    busy = b"HTTP/1.1 503 SERVICE UNAVAILABLE\r\nRetry-After: 5\r\nContent-Length: 0\r\n\r\n"
    with pytest.raises(wire.HandshakeRefused) as refused:
        wire.upgrade_answered(busy, wire.new_key())
    assert (refused.value.status_code, refused.value.retry_after) == (503, 5)
    with pytest.raises(wire.HandshakeRefused) as refused:
        wire.upgrade_answered(b"HTTP/1.1 401 UNAUTHORIZED\r\n\r\n", wire.new_key())
    assert (refused.value.status_code, refused.value.retry_after) == (401, None)
