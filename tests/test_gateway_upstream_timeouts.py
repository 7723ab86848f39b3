"""The per-attempt and per-stream clocks, against loopback upstreams that hang, stall or flood:
a backend that sends nothing within the first-byte timeout is left (its connection closed) and
the request served by another; a stream that falls silent ends with an error event and [DONE]
and its upstream is closed; a client that stops reading is cut off and its upstream aborted, as
a client disconnect, never a fault of the backend."""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

import orjson
import pytest

from gateway.proxy import Outcome
from tests.upstreams import (
    GOOD_JSON,
    GOOD_STREAM,
    admin_rows,
    chat,
    events_of,
    gateway_over,
    metric_lines,
    no_inflight,
    post,
)
from tests.waiting import until

ENDED_WITHIN_S = 10.0  # generous: the clocks under test are half a second


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not streamed"])
async def test_a_backend_that_hangs_before_its_headers_is_left_and_the_other_serves(
    stream: bool,
) -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(2, on_done=outcomes.append, first_byte_timeout_s=0.5) as (
            url, (hung, good), client):
        hung.mode = "hang"
        while not any(o.attempts == 2 for o in outcomes):
            assert len(outcomes) < 2, "the hanging backend was never tried"
            status, body, headers = await post(client, url, chat(stream))
            assert (status, headers["x-kvgate-backend"]) == (200, "u1")
            if stream:
                assert events_of(body)[-1] == b"[DONE]"
            else:
                assert orjson.loads(body) == GOOD_JSON
        await until(lambda: hung.closed == 1, "the hung attempt's connection closed upstream")
        assert hung.calls == 1
        assert await metric_lines(client, url, "kvgate_retries_total") == {
            '{reason="timeout"}': 1.0}
        await until(lambda: no_inflight(client, url), "in-flight counts back to zero")


async def test_a_stream_that_stalls_ends_with_an_error_event_and_done_and_is_closed_upstream(
) -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(1, on_done=outcomes.append, stream_idle_timeout_s=0.5) as (
            url, (upstream,), client):
        upstream.mode = "stall"
        async with asyncio.timeout(ENDED_WITHIN_S):
            status, body, _ = await post(client, url, chat(True))
        assert status == 200
        events = events_of(body)
        assert events[:2] == [e.removeprefix(b"data: ").rstrip(b"\n") for e in GOOD_STREAM[:2]]
        error = orjson.loads(events[2])["error"]
        assert error["code"] == "upstream_stream_idle" and "u0" in error["message"]
        assert events[3:] == [b"[DONE]"]
        await until(lambda: upstream.closed == 1, "the stalled stream's connection closed")
        (row,) = await admin_rows(client, url)
        assert row["consecutive_failures"] == 1  # a failure of the backend's
        await until(lambda: no_inflight(client, url), "in-flight counts back to zero")
    (outcome,) = outcomes
    assert outcome.error is not None and "stalled" in outcome.error
    assert not outcome.client_disconnected


async def test_a_client_that_stops_reading_is_cut_off_and_its_upstream_aborted() -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(1, on_done=outcomes.append, client_write_timeout_s=0.5,
                            stream_idle_timeout_s=30) as (url, (upstream,), client):
        upstream.mode = "flood"
        reader = await _reader_that_never_reads(url)
        try:
            await until(lambda: upstream.closed == 1, "the flooding stream's connection closed",
                        timeout_s=ENDED_WITHIN_S)
            await until(lambda: len(outcomes) == 1, "the request recorded")
        finally:
            reader.close()
        (row,) = await admin_rows(client, url)
        assert row["consecutive_failures"] == 0  # never the backend's fault
        await until(lambda: no_inflight(client, url), "in-flight counts back to zero")
    (outcome,) = outcomes
    assert outcome.client_disconnected and outcome.status == 499


async def _reader_that_never_reads(url: str) -> socket.socket:
    """A client that sends a stream request and reads nothing of the answer, with a small
    receive buffer so that the gateway's writes soon block."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (parts.hostname, parts.port))
    body = orjson.dumps(chat(True))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    await loop.sock_sendall(sock, head.encode() + body)
    return sock
