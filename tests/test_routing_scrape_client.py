"""The scrape client against real loopback servers (aiohttp, and raw sockets for what aiohttp
will not do on purpose), on asyncio's and uvloop's event loops; and its response reader."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web

from routing.http_response import ResponseReader, whole_ok_body
from routing.scrape_client import (
    KeepAliveClient,
    ScrapeClient,
    ScrapeConnectError,
    ScrapeError,
    ScrapeTimeout,
    get,
)
from routing.scrape_session import SessionClient, client_for
from tests.paths import FIXTURES, free_port

PAYLOAD = (FIXTURES / "vllm-v1.prom").read_bytes()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def on_both_loops(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Runs an async test on asyncio's loop and on uvloop's (the gateway serves on uvloop; their
    transports differ), each a fresh loop closed at the end."""

    def run(*args: Any, loop: str, **kwargs: Any) -> None:
        (uvloop.run if loop == "uvloop" else asyncio.run)(test(*args, **kwargs))

    signature = inspect.signature(test)
    loop_param = inspect.Parameter("loop", inspect.Parameter.KEYWORD_ONLY, annotation=str)
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), loop_param]
    )
    run.__name__, run.__doc__ = test.__name__, test.__doc__
    marked: Callable[..., None] = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])(run)
    return marked


class Server:
    """An aiohttp server on 127.0.0.1 that counts the connections its requests came on."""

    def __init__(self) -> None:
        self.peers: set[tuple[str, int]] = set()
        self.headers: list[dict[str, str]] = []
        self.url = ""

    def counted(self, handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            assert request.transport is not None
            self.peers.add(request.transport.get_extra_info("peername"))
            self.headers.append(dict(request.headers))
            return await handler(request)

        return wrapped

    @contextlib.asynccontextmanager
    async def serving(self, routes: dict[str, Handler]) -> AsyncIterator[Server]:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_get(path, self.counted(handler))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()


def body(payload: bytes, status: int = 200, **headers: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=payload, status=status, headers=headers)

    return handler


def chunked(*pieces: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
        await response.write_eof()
        return response

    return handler


def closing(payload: bytes) -> Handler:
    """Answers, then closes the connection (`Connection: close`)."""

    async def handler(request: web.Request) -> web.Response:
        response = web.Response(body=payload)
        response.force_close()
        return response

    return handler


@contextlib.asynccontextmanager
async def client_of(kind: str, url: str, max_body: int = 1 << 20) -> AsyncIterator[ScrapeClient]:
    if kind == "keep-alive":
        client: ScrapeClient = KeepAliveClient(url, max_body=max_body)
        try:
            yield client
        finally:
            await client.close()
    else:
        async with aiohttp.ClientSession() as session:
            client = SessionClient(session, url, max_body=max_body)
            try:
                yield client
            finally:
                await client.close()


BOTH = pytest.mark.parametrize("kind", ["keep-alive", "aiohttp session"])



# Bodies and errors, through either client.


@BOTH
@pytest.mark.parametrize(
    "handler",
    [
        pytest.param(body(PAYLOAD), id="Content-Length"),
        pytest.param(chunked(PAYLOAD[:1000], PAYLOAD[1000:30000], PAYLOAD[30000:]), id="chunked"),
        pytest.param(chunked(PAYLOAD), id="chunked, one chunk"),
    ],
)
@on_both_loops
async def test_the_body_of_a_200_is_returned_whole(kind: str, handler: Handler) -> None:
    async with Server().serving({"/metrics": handler}) as server, client_of(kind, server.url) as c:
        assert await get(c, "/metrics", 5.0) == PAYLOAD


@BOTH
@pytest.mark.parametrize("status", [404, 500, 503])
@on_both_loops
async def test_a_status_other_than_200_is_a_scrape_error_with_the_status(
    kind: str, status: int
) -> None:
    async with (
        Server().serving({"/metrics": body(b"nope", status=status)}) as server,
        client_of(kind, server.url) as c,
    ):
        with pytest.raises(ScrapeError) as error:
            await get(c, "/metrics", 5.0)
    assert type(error.value) is ScrapeError and error.value.status == status


@BOTH
@on_both_loops
async def test_a_refused_connection_is_a_connect_error(kind: str) -> None:
    async with client_of(kind, f"http://127.0.0.1:{free_port()}") as c:
        with pytest.raises(ScrapeConnectError) as error:
            await get(c, "/metrics", 5.0)
    assert error.value.__cause__ is not None  # the foreign exception is kept as the cause


@BOTH
@on_both_loops
async def test_a_hanging_server_is_a_timeout_and_the_next_request_works(kind: str) -> None:
    release = asyncio.Event()
    calls = 0

    async def hang_once(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()
        return web.Response(body=PAYLOAD)

    async with (
        Server().serving({"/metrics": hang_once}) as server,
        client_of(kind, server.url) as c,
    ):
        with pytest.raises(ScrapeTimeout):
            await get(c, "/metrics", 0.1)
        assert await get(c, "/metrics", 5.0) == PAYLOAD
        release.set()


@BOTH
@pytest.mark.parametrize(
    "handler",
    [
        pytest.param(body(b"x" * 5000), id="declared by Content-Length"),
        pytest.param(chunked(*[b"x" * 1000] * 5), id="counted as chunks arrive"),
    ],
)
@on_both_loops
async def test_a_body_over_the_limit_is_an_error(kind: str, handler: Handler) -> None:
    async with (
        Server().serving({"/metrics": handler, "/small": body(b"ok")}) as server,
        client_of(kind, server.url, max_body=4096) as c,
    ):
        with pytest.raises(ScrapeError, match="limit"):
            await get(c, "/metrics", 5.0)
        assert await get(c, "/small", 5.0) == b"ok"  # and the client goes on


# The keep-alive client's connection handling.


@on_both_loops
async def test_scrapes_reuse_one_connection() -> None:
    server = Server()
    async with server.serving({"/metrics": body(PAYLOAD), "/gone": body(b"", status=404)}):
        client = KeepAliveClient(server.url)
        try:
            for _ in range(5):
                assert await get(client, "/metrics", 5.0) == PAYLOAD
            with pytest.raises(ScrapeError):
                await get(client, "/gone", 5.0)  # a 404 answer keeps the connection too
            assert await get(client, "/metrics", 5.0) == PAYLOAD
        finally:
            await client.close()
    assert len(server.peers) == 1 and client.connections_opened == 1


@on_both_loops
async def test_a_connection_the_server_closes_is_replaced() -> None:
    server = Server()
    async with server.serving({"/metrics": closing(PAYLOAD)}):
        client = KeepAliveClient(server.url)
        try:
            for _ in range(3):
                assert await get(client, "/metrics", 5.0) == PAYLOAD
        finally:
            await client.close()
    assert len(server.peers) == 3 and client.connections_opened == 3


@on_both_loops
async def test_the_request_goes_to_the_base_path_and_asks_for_identity_and_keep_alive() -> None:
    server = Server()
    async with server.serving({"/base/metrics": body(b"ok")}):
        client = KeepAliveClient(server.url + "/base/")
        try:
            assert await get(client, "/metrics", 5.0) == b"ok"
        finally:
            await client.close()
    (headers,) = server.headers
    host = server.url.removeprefix("http://")
    assert (headers["Host"], headers["Accept-Encoding"], headers["Connection"]) == (
        host, "identity", "keep-alive"
    )


class RawServer:
    """A loopback TCP server that runs `script(reader, writer, connection number)` on each
    connection: for answers aiohttp will not give (HTTP/1.0, a close in mid-answer)."""

    def __init__(self, script: Callable[[asyncio.StreamReader, asyncio.StreamWriter, int],
                                        Awaitable[None]]) -> None:
        self.script = script
        self.connections = 0
        self.url = ""

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[RawServer]:
        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.script(reader, writer, self.connections)
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()


OK_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@on_both_loops
async def test_a_request_on_a_connection_the_server_dropped_is_sent_once_more() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(OK_ANSWER)
        if n == 1:  # the second request on this connection: dropped unanswered
            await reader.readuntil(b"\r\n\r\n")

    raw = RawServer(script)
    async with raw.serving():
        client = KeepAliveClient(raw.url)
        try:
            assert await get(client, "/metrics", 5.0) == b"ok"
            assert await get(client, "/metrics", 5.0) == b"ok"  # on a second connection
        finally:
            await client.close()
    assert raw.connections == 2


@on_both_loops
async def test_a_connection_lost_in_mid_answer_is_a_connect_error_not_a_retry() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(OK_ANSWER)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    raw = RawServer(script)
    async with raw.serving():
        client = KeepAliveClient(raw.url)
        try:
            assert await get(client, "/metrics", 5.0) == b"ok"
            with pytest.raises(ScrapeConnectError):
                await get(client, "/metrics", 5.0)  # the server did answer: no second try
        finally:
            await client.close()
    assert raw.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nok", id="HTTP/1.0"),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nok", id="no length, close"),
    ],
)
@on_both_loops
async def test_a_body_that_runs_to_the_end_of_the_connection_is_read(answer: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)

    raw = RawServer(script)
    async with raw.serving():
        client = KeepAliveClient(raw.url)
        try:
            assert await get(client, "/metrics", 5.0) == b"ok"
            assert await get(client, "/metrics", 5.0) == b"ok"
        finally:
            await client.close()
    assert raw.connections == 2  # such a connection is never reused


@on_both_loops
async def test_one_request_at_a_time() -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(body=b"ok")

    async with Server().serving({"/metrics": hang}) as server:
        client = KeepAliveClient(server.url)
        try:
            first = asyncio.ensure_future(get(client, "/metrics", 5.0))
            await asyncio.sleep(0)  # let the first request start
            with pytest.raises(RuntimeError, match="in flight"):
                client.fetch("/metrics", 5.0, lambda result: None)
            release.set()
            assert await first == b"ok"
        finally:
            await client.close()


@pytest.mark.parametrize(
    ("url", "with_session", "expected"),
    [
        pytest.param("http://127.0.0.1:8000", False, KeepAliveClient, id="http: keep-alive"),
        pytest.param("http://backend.internal:8000/v", False, KeepAliveClient,
                     id="a host name and a base path: keep-alive"),
        pytest.param("https://127.0.0.1:8443", False, None, id="https: needs a session"),
        pytest.param("http://user:pw@127.0.0.1:8000", False, None,
                     id="credentials in the URL: needs a session"),
        pytest.param("https://127.0.0.1:8443", True, SessionClient, id="https: the session"),
        pytest.param("http://127.0.0.1:8000", True, SessionClient,
                     id="a session given: used for http too"),
    ],
)
@on_both_loops
async def test_which_client_serves_which_url(
    url: str, with_session: bool, expected: type | None
) -> None:
    async with aiohttp.ClientSession() as session:
        client = client_for(url, session if with_session else None)
        assert (None if client is None else type(client)) is expected


# The response reader, fed by hand.


def feed_all(data: bytes, step: int, max_body: int = 1 << 20) -> ResponseReader:
    reader = ResponseReader(max_body)
    done = False
    for i in range(0, len(data), step):
        assert not done, "bytes after the end"
        done = reader.feed(data[i : i + step])
    assert done
    return reader


CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n")


@pytest.mark.parametrize("step", [1, 3, 1000], ids=["byte by byte", "in threes", "at once"])
@pytest.mark.parametrize(
    ("data", "body", "keep_alive"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", True,
                     id="Content-Length"),
        pytest.param(CHUNKED, b"hello, world", True, id="chunked, extensions and trailers"),
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                     b"ok", True, id="an interim 100 first"),
        pytest.param(b"HTTP/1.1 204 No Content\r\n\r\n", b"", True, id="204: no body"),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", b"ok",
                     False, id="Connection: close"),
        pytest.param(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
                     b"ok", True, id="HTTP/1.0 asking for keep-alive"),
    ],
)
def test_the_reader_frames_the_body(data: bytes, body: bytes, keep_alive: bool, step: int) -> None:
    reader = feed_all(data, step)
    assert (reader.body(), reader.keep_alive, reader.trailing) == (body, keep_alive, False)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", id="not HTTP"),
        pytest.param(b"HTTP/1.1 2000 OK\r\n\r\n", id="a bad status"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", id="a bad length"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                     id="a bad chunk size"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX",
                     id="a chunk without its CRLF"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n", id="over the limit"),
    ],
)
def test_the_reader_refuses_what_is_not_a_response(data: bytes) -> None:
    with pytest.raises(ScrapeError):
        ResponseReader(max_body=1000).feed(data)


def test_bytes_after_the_answer_are_flagged() -> None:
    reader = ResponseReader(1000)
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1")
    assert reader.body() == b"ok" and reader.trailing


def test_a_body_to_the_end_of_the_connection_ends_there() -> None:
    reader = ResponseReader(1000)
    assert not reader.feed(b"HTTP/1.1 200 OK\r\n\r\nsome")
    assert not reader.feed(b" more") and reader.ends_at_close
    reader.finish()
    assert reader.body() == b"some more" and not reader.keep_alive


@pytest.mark.parametrize(
    ("data", "body"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", id="plain"),
        pytest.param(b"HTTP/1.1 200 OK\r\nconnection: Keep-Alive\r\ncontent-length: 2\r\n\r\nok",
                     b"ok", id="keep-alive said, any case"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok", None, id="incomplete"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nok", None, id="bytes after"),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", None,
                     id="closing"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", None,
                     id="two lengths"),
        pytest.param(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nok", None, id="not 200"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", None,
                     id="chunked"),
    ],
)
def test_the_fast_path_takes_only_a_whole_plain_200(data: bytes, body: bytes | None) -> None:
    assert whole_ok_body(data, 1000) == body
