"""Client connections as the gateway accepts them: head and body deadlines, a cap on how many are
open, and malformed requests answered in OpenAI's error shape with one log line.

aiohttp's server has no header timeout of its own, so `GuardedHandler` (its `RequestHandler`,
the protocol of one connection) adds the deadlines around the parser:

- the whole request head must have arrived within `header_timeout_s` of the connection opening,
  or, on a keep-alive connection, of the first byte of the next request (the idle time between
  requests is `keepalive_timeout_s`'s, aiohttp's own); else the connection is closed, so a
  client sending its head a byte at a time is cut off;
- the whole body within `body_timeout_s` of its head; else the connection is closed.

Beyond `max_connections` open connections a new one is answered 503 `too_many_connections`
(OpenAI-shaped, `Connection: close`) and closed at once. `ConnectionBook` counts what happened,
for the metrics (gateway/telemetry/connections.py).

A request aiohttp cannot parse (bad framing, a bad Content-Length or chunk size, a broken header)
is answered 400 with OpenAI's body and logged in one line naming the kind of fault, never its
raw bytes (aiohttp's own log holds a traceback quoting the offending header line).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from gateway.errors import error_body

log = logging.getLogger("kvgate.connections")

FD_HEADROOM = 256  # listening sockets, log files, Redis, the poller's scrapes
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)

# The kind of fault of a request aiohttp could not parse, most specific first: what the client
# and the log are told (aiohttp's own messages quote the raw bytes).
_FAULTS: tuple[tuple[type[Exception], str], ...] = (
    (http_exceptions.ContentLengthError, "bad Content-Length"),
    (http_exceptions.ContentEncodingError, "a body that does not decode as its Content-Encoding"),
    (http_exceptions.TransferEncodingError, "bad Transfer-Encoding"),
    (http_exceptions.DecompressSizeError, "a body that decompresses too large"),
    (http_exceptions.LineTooLong, "a request line or header too long"),
    (http_exceptions.InvalidHeader, "an invalid header"),
    (http_exceptions.BadHttpMethod, "an unknown method (not HTTP?)"),
    (http_exceptions.InvalidURLError, "an invalid URL"),
    (http_exceptions.BadStatusLine, "a bad request line"),
)
# aiohttp's C parser raises a bare BadHttpMessage for most faults: its message names the part.
_HINTS = (("content-length", "bad Content-Length"), ("chunk", "malformed chunked framing"),
          ("transfer-encoding", "bad Transfer-Encoding"), ("header", "an invalid header"))


@dataclass(frozen=True, slots=True)
class ClientLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


@dataclass(slots=True)
class ConnectionBook:
    """What the gateway's client connections did, since start."""

    open: int = 0
    refused: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    malformed: int = 0


def fault_of(exc: BaseException | None) -> str:
    """The kind of parsing fault, in words that quote nothing the client sent."""
    for kind, words in _FAULTS:
        if isinstance(exc, kind):
            return words
    text = str(exc).lower()
    for hint, words in _HINTS:
        if hint in text:
            return words
    return "malformed framing"


class GuardedHandler(RequestHandler):
    """aiohttp's protocol for one client connection, with the deadlines and the cap."""

    def __init__(self, manager: web.Server, *, limits: ClientLimits, book: ConnectionBook,
                 **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._book = book
        self._refused = False
        self._awaiting_head = True  # the next bytes begin a request head
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body: Any = None  # the payload being received (aiohttp's StreamReader)

    @property
    def busy(self) -> bool:
        """A request is being handled on this connection."""
        return bool(self._request_in_progress)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._book.open >= self._limits.max_connections:
            self._book.refused += 1
            self._refused = True
            self._force_close = True
            body = error_body("the gateway has too many open connections; retry shortly",
                              type_="service_unavailable", code="too_many_connections")
            assert isinstance(transport, asyncio.Transport)
            transport.write(_REFUSED % (len(body), body))
            transport.close()
            return
        self._book.open += 1
        super().connection_made(transport)
        self._arm_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._book.open -= 1
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head and self._head_timer is None and data:
            self._arm_head()
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:  # a head arrived (or a parse error)
            self._cancel_head()
            payload = self._messages[-1][1] if self._messages else None
            if payload is not None and not payload.is_eof():
                self._awaiting_head = False
                self._body = payload
                self._body_timer = self._loop.call_later(
                    self._limits.body_timeout_s, self._body_timed_out)
        if self._body is not None and self._body.is_eof():
            self._end_body()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse, or to an error its handler let
        escape: OpenAI's body, one log line, the connection closed after it."""
        peer = _peer(self.transport)
        if status < 500:
            self._book.malformed += 1
            fault = fault_of(exc)
            log.info("malformed request from %s: %s (%d)", peer, fault, status)
            body = error_body(f"malformed HTTP request: {fault}", type_="invalid_request_error",
                              code="bad_request")
        elif status == 504:
            body = error_body("the request timed out", type_="server_error", code="timeout")
        else:
            log.error("error handling a request from %s: %s", peer, type(exc).__name__)
            body = error_body("internal error", type_="server_error", code="internal_error")
        if request.writer.output_size > 0:
            raise ConnectionError("the response had begun; the connection is closed instead")
        response = web.Response(status=status, body=body, content_type="application/json")
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """One line, no traceback: aiohttp's tracebacks quote what the client sent."""
        exc = kw.get("exc_info")
        if isinstance(exc, RequestPayloadError | ConnectionError):
            log.debug("client connection from %s closed: %s", _peer(self.transport),
                      type(exc).__name__)
            return
        name = type(exc).__name__ if isinstance(exc, BaseException) else "error"
        log.error("client connection from %s: unhandled %s", _peer(self.transport), name)

    def _arm_head(self) -> None:
        self._cancel_head()
        self._head_timer = self._loop.call_later(self._limits.header_timeout_s,
                                                 self._head_timed_out)

    def _cancel_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _end_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._body = None
        self._awaiting_head = True

    def _cancel_timers(self) -> None:
        self._cancel_head()
        self._end_body()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._request_in_progress:  # a pipelined head lags: close after the current answer
            self.close()
            return
        self._book.header_timeouts += 1
        log.debug("client %s: no whole request head within %g s; closed",
                  _peer(self.transport), self._limits.header_timeout_s)
        self.force_close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self._body is None or self._body.is_eof():
            return
        self._book.body_timeouts += 1
        log.debug("client %s: no whole request body within %g s; closed",
                  _peer(self.transport), self._limits.body_timeout_s)
        self.force_close()


class GuardedFactory:
    """The protocol factory for `loop.create_server`: one `GuardedHandler` per connection, all
    registered with aiohttp's `web.Server` (which the runner shuts down)."""

    def __init__(self, server: web.Server, limits: ClientLimits, book: ConnectionBook,
                 **handler_options: Any) -> None:
        self.server = server
        self.limits = limits
        self.book = book
        self._options = handler_options

    def __call__(self) -> GuardedHandler:
        return GuardedHandler(self.server, limits=self.limits, book=self.book,
                              loop=asyncio.get_running_loop(), **self._options)

    def close_idle(self) -> None:
        """Idle connections close now; busy ones after their answer."""
        for conn in self.server.connections:
            if isinstance(conn, GuardedHandler) and not conn.busy:
                conn.force_close()
            else:
                conn.close()


def raise_fd_limit(needed: int) -> str | None:
    """Raises this process's soft limit of open files to its hard limit when it is below
    `needed`; what was done, for a log line (None when nothing was needed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    if hard != resource.RLIM_INFINITY and hard < needed:
        return (f"open files limit raised from {soft} to its hard limit {shown}, still below "
                f"the {needed} that max_connections needs; raise the hard limit (ulimit -Hn)")
    return f"open files limit raised from {soft} to {shown} (max_connections needs {needed})"


def _peer(transport: asyncio.BaseTransport | None) -> str:
    if transport is None:
        return "a closed connection"
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
