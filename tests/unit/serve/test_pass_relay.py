"""PassRelay, the streaming sink of the common case, fed engine bytes as socket reads arrive.

The client side is a recording transport: what the tests check is exactly what a client would
receive, write by write, whatever way the engine's bytes were split into reads.
"""

from __future__ import annotations

import itertools
import json

import pytest

from narwhal.serve.router.request import relay as R

ENGINE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
               b"transfer-encoding: chunked\r\n\r\n")
CLIENT_HEAD = b"HTTP/1.1 200 OK\r\nx-request-id: r1\r\ntransfer-encoding: chunked\r\n\r\n"
TERMINATOR = b"0\r\n\r\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def _event(k: int) -> bytes:
    return _chunk(b"data: " + json.dumps({"choices": [{"text": f" tok{k}"}]}).encode() + b"\n\n")


DONE = _chunk(b"data: [DONE]\n\n")
BODY = b"".join(_event(k) for k in range(4)) + DONE + TERMINATOR


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


class Client:
    """The client connection as the relay sees it: an open transport it writes to."""

    def __init__(self) -> None:
        self.closed = False
        self.transport = Transport()

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    @property
    def writes(self) -> list[bytes]:
        return self.transport.writes

    @property
    def received(self) -> bytes:
        return b"".join(self.transport.writes)


def _relay(client: Client) -> tuple[R.PassRelay, list[R.DecodeRelay]]:
    ended: list[R.DecodeRelay] = []
    relay = R.PassRelay(ended.append, 5.0, 5.0, client, CLIENT_HEAD)  # type: ignore[arg-type]
    relay.on_start(200)
    return relay, ended


def _feed(relay: R.PassRelay, reads: list[bytes]) -> None:
    """Deliver reads as the upstream connection does: `complete` on the one holding the end."""
    for i, data in enumerate(reads):
        relay.on_raw(data, i == len(reads) - 1)


@pytest.mark.parametrize("cuts", [
    (),  # head and body in one read
    (len(ENGINE_HEAD),),  # the head alone first, as engines usually send it
    (10, len(ENGINE_HEAD) + 7, len(ENGINE_HEAD) + 300),  # reads that split the head and a chunk
    (len(ENGINE_HEAD), len(ENGINE_HEAD) + len(BODY) - len(TERMINATOR)),  # [DONE], then the end
    (len(ENGINE_HEAD), len(ENGINE_HEAD) + len(BODY) - len(TERMINATOR) - len(DONE),
     len(ENGINE_HEAD) + len(BODY) - len(TERMINATOR)),  # the last token, [DONE], the end apart
    tuple(range(len(ENGINE_HEAD), len(ENGINE_HEAD) + len(BODY), 3)),  # three bytes at a time
])
def test_the_client_receives_the_engine_body_unchanged_however_the_reads_fall(
        cuts: tuple[int, ...]) -> None:
    raw = ENGINE_HEAD + BODY
    edges = [0, *cuts, len(raw)]
    reads = [raw[a:b] for a, b in itertools.pairwise(edges) if b > a]
    client = Client()
    relay, ended = _relay(client)
    _feed(relay, reads)
    assert client.received == CLIENT_HEAD + BODY
    assert ended == [relay] and relay.result == R.OK
    assert relay.events == 5  # four tokens and [DONE]
    assert relay.reusable()


def test_a_done_chunk_arriving_before_the_terminator_goes_out_with_it_in_one_write() -> None:
    client = Client()
    relay, _ = _relay(client)
    relay.on_raw(ENGINE_HEAD, False)
    relay.on_raw(_event(0), False)
    relay.on_raw(_event(1) + DONE, False)
    assert client.writes == [CLIENT_HEAD + _event(0)]  # the token before [DONE] went out at once
    relay.on_raw(TERMINATOR, True)
    assert client.writes == [CLIENT_HEAD + _event(0), _event(1) + DONE + TERMINATOR]
    assert relay.result == R.OK


def test_an_engine_that_dies_after_done_still_delivers_it_then_the_error_event() -> None:
    client = Client()
    relay, ended = _relay(client)
    relay.on_raw(ENGINE_HEAD + _event(0) + DONE, False)
    relay.on_fail("engine closed the connection", False, False)
    assert ended == [relay] and relay.result == R.FAILED_MID and relay.clean()
    # the router decides first whether the stream is continued; not continued, it is owed
    assert relay.owe_break()
    tail = client.received.split(_event(0), 1)[1]
    assert tail.startswith(DONE)
    error = tail[len(DONE):]
    assert b'"code":"engine_failed"' in error and error.endswith(TERMINATOR)
    assert relay.reusable()


def test_a_stream_that_goes_silent_after_done_flushes_it_before_the_timeout_event() -> None:
    client = Client()
    relay, _ = _relay(client)
    relay.on_raw(ENGINE_HEAD + DONE, False)
    relay.expire()
    relay.owe_break()
    assert client.received.startswith(CLIENT_HEAD + DONE)
    assert b'"code":"engine_timeout"' in client.received
    assert client.received.endswith(TERMINATOR)
    assert relay.result == R.TIMEOUT_MID


def test_a_client_gone_while_done_is_held_gets_nothing_more() -> None:
    client = Client()
    relay, _ = _relay(client)
    relay.on_raw(ENGINE_HEAD + _event(0) + DONE, False)
    sent = list(client.writes)
    client.closed = True
    relay.client_gone()
    relay.on_raw(TERMINATOR, True)  # late bytes after the end change nothing
    assert client.writes == sent
    assert relay.result == R.CLIENT_GONE


def test_a_break_in_the_middle_of_a_chunk_marks_the_client_connection_unusable() -> None:
    client = Client()
    relay, _ = _relay(client)
    relay.on_raw(ENGINE_HEAD + _event(0)[:20], False)
    relay.on_fail("engine closed the connection", False, False)
    assert not relay.clean()  # nor can a continuation add to it
    assert not relay.owe_break()
    assert client.received == CLIENT_HEAD + _event(0)[:20]  # no event spliced into a chunk
    assert not relay.reusable() and relay.result == R.FAILED_MID


def test_a_continued_stream_s_events_follow_what_was_held_in_the_client_s_framing() -> None:
    client = Client()
    relay, _ = _relay(client)
    relay.on_raw(ENGINE_HEAD + _event(0), False)
    relay.on_fail("engine closed the connection", False, False)
    relay.broken = None  # continued: no error event
    relay.write_events(b"data: {\"n\": 1}\n\n", False)
    relay.write_events(b"", True)
    assert client.received == (CLIENT_HEAD + _event(0) + _chunk(b'data: {"n": 1}\n\n')
                               + TERMINATOR)
    assert relay.reusable()


def test_a_stream_that_opens_with_an_error_event_is_kept_for_the_router_never_streamed() -> None:
    """vLLM answers a decode leg whose KV it could not pull with 200 and an error event."""
    client = Client()
    relay, ended = _relay(client)
    error = b'data: {"error": {"message": "Internal server error", "code": 500}}\n\n'
    relay.on_raw(ENGINE_HEAD + _chunk(error) + DONE + TERMINATOR, True)
    assert client.writes == []
    assert relay.result == R.ENGINE_STATUS and relay.status == R.ERROR_FIRST_STATUS
    assert relay.error_first and ended == [relay]


def test_an_engine_error_status_is_kept_for_the_router_and_never_streamed() -> None:
    client = Client()
    ended: list[R.DecodeRelay] = []
    relay = R.PassRelay(ended.append, 5.0, 5.0, client, CLIENT_HEAD)  # type: ignore[arg-type]
    relay.on_start(503)
    body = b'{"error":{"message":"busy"}}'
    relay.on_raw(b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n"
                 + _chunk(body) + TERMINATOR, True)
    assert client.writes == []
    assert relay.result == R.ENGINE_STATUS and b"".join(relay.body) == body


class _Verbatim:
    """A rewriter that passes the continuing engine's events on unchanged."""

    def feed(self, payload: bytes) -> bytes:
        return payload


def _continuing(client: Client) -> tuple[R.ContinueRelay, list[R.DecodeRelay]]:
    """A stream broken after one event, continued by a second leg."""
    relay, _ = _relay(client)
    relay.on_raw(ENGINE_HEAD + _event(0), False)
    relay.on_fail("engine closed the connection", False, False)
    relay.broken = None  # continued: no error event
    ended: list[R.DecodeRelay] = []
    cont = R.ContinueRelay(ended.append, 5.0, 5.0, relay, _Verbatim())
    cont.on_start(200)
    return cont, ended


def test_a_continuation_s_done_waits_for_its_engine_s_end_so_a_client_leaving_on_it_is_served(
        ) -> None:
    """A client that closes on `[DONE]` must not outrun the end of the leg: the router would
    settle a whole answer as client_gone (the real tier saw it)."""
    client = Client()
    cont, ended = _continuing(client)
    cont.on_body(b"data: {\"n\": 1}\n\n")
    cont.on_body(b"data: [DONE]\n\n")
    assert b"[DONE]" not in client.received  # held until the engine's response ends
    cont.on_complete()
    assert client.received.endswith(_chunk(b"data: [DONE]\n\n") + TERMINATOR)
    assert ended == [cont] and cont.result == R.OK


def test_a_continuation_that_breaks_after_done_still_delivers_it() -> None:
    client = Client()
    cont, ended = _continuing(client)
    cont.on_body(b"data: {\"n\": 1}\n\ndata: [DONE]\n\n")
    cont.on_fail("engine closed the connection", False, False)
    assert ended == [cont] and cont.result == R.FAILED_MID
    assert cont.owe_break()  # not continued again: the router settles it with its error event
    done = _chunk(b'data: {"n": 1}\n\ndata: [DONE]\n\n')
    assert done in client.received
    assert client.received.split(done, 1)[1].endswith(TERMINATOR)  # then the error event
