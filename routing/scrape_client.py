"""A lean HTTP/1.1 GET client for scraping backends, one keep-alive connection per backend.

Why not aiohttp: the poller sends one GET per backend per poll interval, and a general client's
per-request machinery (URL objects, header multidicts, cookie and redirect handling, response
objects, stream readers, a task per request) costs more CPU than everything else the poller does
(docs/design.md has the measured difference and its command). Here a scrape is one write of a
pre-built request, usually one read, and one callback: no task, no future.

Contract
- `http://host[:port][/base]` URLs only; anything else (https, user info in the URL) goes through
  `SessionClient`, the same interface over an aiohttp session (routing/scrape_session.py:
  `client_for` picks).
- `fetch(path, timeout, done)` sends `GET <base><path> HTTP/1.1` with Host,
  `Accept-Encoding: identity` (a gzipped payload would cost the backend and the gateway CPU to
  save loopback-cheap bytes), `Connection: keep-alive` and, for a backend with an API key of its
  own, `Authorization: Bearer <key>`, and later calls `done` exactly once,
  never from inside `fetch`, with the body of a 200 or a `ScrapeError`. `get` is the same as a
  coroutine. Bodies are framed by Content-Length, chunked transfer coding or, when the server
  gives neither, the end of the connection (routing/http_response.py).
- Every failure is a `ScrapeError`: `ScrapeConnectError` when the connection cannot be made or is
  lost before the answer is complete (refused, reset, closed), `ScrapeTimeout` when `timeout`
  (connect, request and body together) runs out; the base class for everything else: a status
  other than 200 (`status` is set; the body is read and dropped so that the connection stays
  usable), a body over `max_body` bytes (default 8 MiB, far above any metrics payload: anything
  that big is broken and must not fill the gateway's memory), a malformed answer. The class name
  is the poller's error label, so the set is small and fixed.
- A connection is reused while the server keeps it open; it is dropped after a failure, a
  timeout (a late answer must not be read as the next one's), `Connection: close`, or an
  HTTP/1.0 answer without keep-alive, and the next request opens a new one. A request sent on a
  reused connection that the server had already closed (the keep-alive race: no byte of an
  answer came back) is sent once more on a new connection, within the same timeout.
- One request at a time per client (the poller never overlaps two scrapes of one backend).
  `close` abandons a request in flight: its `done` is never called.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol, cast
from urllib.parse import urlsplit

from routing.http_response import ResponseReader, ScrapeError, whole_ok_body

__all__ = [
    "MAX_BODY_BYTES",
    "Done",
    "KeepAliveClient",
    "ScrapeClient",
    "ScrapeConnectError",
    "ScrapeError",
    "ScrapeTimeout",
    "get",
]

MAX_BODY_BYTES = 8 * 1024 * 1024
_TIMER_SLACK = 0.001  # libuv's timers tick in milliseconds

Done = Callable[[bytes | ScrapeError], None]


class ScrapeConnectError(ScrapeError):
    """The connection could not be made, or was lost before the answer was complete."""


class ScrapeTimeout(ScrapeError):
    """The request did not complete within its timeout."""


class ScrapeClient(Protocol):
    """What the poller needs from an HTTP client: one backend's GETs."""

    def fetch(self, path: str, timeout: float, done: Done) -> None:
        """Starts `GET <base URL><path>`; `done` later gets the body of a 200 or a ScrapeError."""
        ...

    async def close(self) -> None: ...


async def get(client: ScrapeClient, path: str, timeout: float) -> bytes:
    """`client.fetch` as a coroutine: the body, or the ScrapeError raised. Cancelling the
    awaiting task does not stop the request: `close` the client for that."""
    future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def done(result: bytes | ScrapeError) -> None:
        if future.done():  # the awaiting task was cancelled
            return
        if isinstance(result, ScrapeError):
            future.set_exception(result)
        else:
            future.set_result(result)

    client.fetch(path, timeout, done)
    return await future


class KeepAliveClient:
    """One backend's keep-alive connection (see the module docstring)."""

    def __init__(self, base_url: str, *, max_body: int = MAX_BODY_BYTES,
                 api_key: str | None = None) -> None:
        if not self.supports(base_url):
            raise ValueError(f"not a plain http URL: {base_url!r}")
        parts = urlsplit(base_url)
        assert parts.hostname is not None  # supports() checked it
        self._host = parts.hostname
        self._port = parts.port or 80
        self._netloc = parts.netloc
        self._base_path = parts.path.rstrip("/")
        self._max_body = max_body
        self._auth = "" if api_key is None else f"Authorization: Bearer {api_key}\r\n"
        self._requests: dict[str, bytes] = {}  # path -> the request's bytes, built once
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        # The request in flight, kept to send it again on a new connection.
        self._request = b""
        self._deadline = 0.0  # loop time
        self._done: Done | None = None
        self.connections_opened = 0  # keep-alive at work, for tests and benchmarks

    @staticmethod
    def supports(base_url: str) -> bool:
        try:
            parts = urlsplit(base_url)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            return False
        return parts.scheme == "http" and bool(parts.hostname) and "@" not in parts.netloc

    def fetch(self, path: str, timeout: float, done: Done) -> None:
        conn = self._conn
        # A reusable connection has no exchange in flight, and none is being opened.
        if conn is None or not conn.reusable:
            if self._connecting is not None or (conn is not None and conn.busy):
                raise RuntimeError("a request is already in flight on this client")
        request = self._requests.get(path)
        if request is None:
            request = self._requests[path] = self._build(path)
        loop = conn.loop if conn is not None else asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._request, self._deadline, self._done = request, deadline, done
        if conn is not None and conn.reusable:
            # A stale connection (closed by the server while idle) is retried once, on a new one.
            conn.send(request, deadline, self._max_body, done, self._retry)
        else:
            self._connecting = loop.create_task(self._connect_and_send())

    async def close(self) -> None:
        self._done = None
        task, self._connecting = self._connecting, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    def _build(self, path: str) -> bytes:
        target = self._base_path + path
        if not target.startswith("/") or any(c in target for c in " \r\n"):
            raise ValueError(f"bad request path {target!r}")
        return (
            f"GET {target} HTTP/1.1\r\nHost: {self._netloc}\r\n"
            "User-Agent: kvgate-poller\r\nAccept: text/plain, */*\r\n"
            f"Accept-Encoding: identity\r\nConnection: keep-alive\r\n{self._auth}\r\n"
        ).encode("latin-1")

    def _retry(self) -> None:
        self._connecting = asyncio.get_running_loop().create_task(self._connect_and_send())

    def _fail(self, error: ScrapeError, cause: BaseException) -> None:
        error.__cause__ = cause
        done, self._done = self._done, None
        if done is not None:
            done(error)

    async def _connect_and_send(self) -> None:
        loop = asyncio.get_running_loop()
        old, self._conn = self._conn, None
        try:
            if old is not None:
                await old.close()
            async with asyncio.timeout_at(self._deadline):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), self._host, self._port
                )
        except TimeoutError as exc:
            self._connecting = None
            self._fail(ScrapeTimeout(f"connecting to {self._netloc} timed out"), exc)
            return
        except OSError as exc:
            self._connecting = None
            self._fail(ScrapeConnectError(f"cannot connect to {self._netloc}: {exc}"), exc)
            return
        self._connecting = None
        self.connections_opened += 1
        self._conn = conn
        done, self._done = self._done, None
        if done is None:  # closed while connecting
            await conn.close()
            return
        conn.send(self._request, self._deadline, self._max_body, done, None)


Retry = Callable[[], None]


class _Connection(asyncio.Protocol):
    """One TCP connection and the exchange in progress on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._transport: asyncio.Transport | None = None
        self._reader: ResponseReader | None = None
        self._done: Done | None = None
        self._retry: Retry | None = None
        self._max_body = 0
        # The deadline timer, armed when a request is sent and none is pending, and not cancelled
        # when the answer comes: creating and cancelling one per request costs more than letting
        # one fire now and then, find nothing late, and re-arm for the request then in flight.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline = 0.0  # of the request in flight
        self._answered = False  # a byte of the current answer has arrived
        self._lost = loop.create_future()
        self.reusable = False

    @property
    def busy(self) -> bool:
        return self._done is not None

    def send(
        self, request: bytes, deadline: float, max_body: int, done: Done, retry: Retry | None
    ) -> None:
        """Writes `request`; `done` gets the answer, or `retry` is called instead when the
        connection turns out to have been closed before any byte of an answer came."""
        assert self._transport is not None and self.reusable
        self.reusable = False  # until this answer is complete and the server keeps it open
        self._answered = False
        self._max_body = max_body
        self._done, self._retry = done, retry
        self._deadline = deadline
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)
        self._transport.write(request)

    async def close(self) -> None:
        """Closes the connection (abandoning an exchange in flight: its `done` is not called)
        and waits until the loop has let go of its socket."""
        self.reusable = False
        self._done = self._retry = None
        if self._timer is not None:
            self._timer.cancel()
        if self._transport is None:
            return
        self._transport.close()
        await asyncio.shield(self._lost)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports (kvgate serve runs on uvloop) do
        # not subclass asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)
        self.reusable = True

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:
            if self._done is None:
                self._end(None, keep=False)  # unasked-for bytes: the stream cannot be trusted
                return
            self._answered = True
            body = whole_ok_body(data, self._max_body)  # the common case, in a few steps
            if body is not None:
                self._end(body, keep=True)
                return
            reader = self._reader = ResponseReader(self._max_body)
        try:
            complete = reader.feed(data)
        except ScrapeError as exc:
            self._end(exc, keep=False)
            return
        if complete:
            self._answer(reader)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        reader = self._reader
        if reader is not None and reader.ends_at_close:
            try:
                reader.finish()
            except ScrapeError as error:
                self._end(error, keep=False)
            else:
                self._answer(reader)
        elif self._done is not None:
            retry = self._retry if not self._answered else None
            if retry is not None:
                self._done = self._retry = None
                retry()
            else:
                why = f": {exc}" if exc is not None else " by the server"
                self._end(ScrapeConnectError(f"connection closed{why}"), keep=False)
        if not self._lost.done():
            self._lost.set_result(None)

    def _answer(self, reader: ResponseReader) -> None:
        keep = reader.keep_alive and not reader.trailing
        if reader.status == 200:
            self._end(reader.body(), keep)
        else:
            reason = f"HTTP {reader.status} {reader.reason}".rstrip()
            self._end(ScrapeError(reason, status=reader.status), keep)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self.loop.call_at(when, self._check_deadline), when

    def _check_deadline(self) -> None:
        self._timer = None
        if self._done is None:
            return  # idle: the next request arms a timer
        if self.loop.time() >= self._deadline - _TIMER_SLACK:
            self._end(ScrapeTimeout("no complete answer within the timeout"), keep=False)
        else:  # armed for an earlier request: now for this one's deadline
            self._arm(self._deadline)

    def _end(self, result: bytes | ScrapeError | None, keep: bool) -> None:
        """Ends the exchange: the connection is kept for the next one or dropped, then the
        caller is told (last, so that it may send the next request from its callback)."""
        done = self._done
        self._done = self._retry = self._reader = None
        transport = self._transport
        if keep and transport is not None and not transport.is_closing():
            self.reusable = True
        else:
            self.reusable = False
            if transport is not None:
                transport.abort()
        if done is not None and result is not None:
            done(result)
