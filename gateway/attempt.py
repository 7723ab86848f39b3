"""What the proxy returns: the `Outcome` of one proxied request, the record every later reader
(telemetry, token-budget settlement, the cache's store side, response headers) takes it from;
and what it hands the relay and gets back from each attempt (`UpstreamCall`; `Relayed`, or a
`Retry` with its reason when the attempt failed before the client saw a byte).

The proxy never calls back. `Proxy.forward` returns a `Forwarded` (the response or the error the
client gets, and the `Outcome`); when the client hangs up, the cancellation it re-raises is a
`ClientGone` carrying the `Outcome`, so even that path reports what happened.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.carry import LineTap
from gateway.errors import GatewayError

CLIENT_CLOSED = 499  # the status an Outcome records when the client hung up (nginx's convention)

# Why an attempt is tried again: the label of kvgate_retries_total.
RETRY_CONNECT = "connect"
RETRY_RESET = "reset"
RETRY_TIMEOUT = "timeout"
RETRY_5XX = "status_5xx"
RETRY_429 = "status_429"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one proxied request: admission, its attempts, the last one's answer."""

    request_id: str
    model: str  # the real model it was sent to
    backend_id: str | None  # the last attempt's backend; None when none was placed
    policy: str | None  # the routing policy that placed it
    status: int  # the status the client got (CLIENT_CLOSED when it hung up)
    stream: bool
    attempts: int  # 0 when admission refused it or the client left while it was queued
    ttft_s: float | None  # arrival to the first text token (streams only)
    duration_s: float
    finish_reason: str | None
    usage: dict[str, Any] | None  # the answer's usage object, if it carried one
    error: str | None  # what went wrong, if anything
    tenant: str
    client_disconnected: bool = False
    admission: str | None = None  # "admitted" | "queued" | "rejected"
    rejection_reason: str | None = None  # the Dispatcher's code when admission refused
    route: str | None = None  # the x-kvgate-route value of the last attempt
    answer: dict[str, Any] | None = None  # a whole 200 JSON answer, decoded (once)

    @property
    def whole(self) -> bool:
        """The client got a whole answer: status 200 and nothing went wrong."""
        return self.status == 200 and self.error is None


@dataclass(frozen=True, slots=True)
class Forwarded:
    """The proxy's answer: what the client gets (a response, or an error to raise) and what
    happened."""

    reply: web.StreamResponse | GatewayError
    outcome: Outcome


class ClientGone(asyncio.CancelledError):
    """The client hung up (the handler was cancelled) while the proxy had the request."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One client request, ready to send to any backend that serves `model`."""

    path: str  # "/v1/chat/completions" or "/v1/completions"
    body: bytes | bytearray  # the client's bytes, or re-encoded (alias, stream usage asked)
    model: str  # the real model name
    stream: bool
    # The gateway added `stream_options.include_usage` the client did not ask for: the usage-only
    # event is dropped from the relayed stream (gateway/sse.py).
    strip_usage: bool = False
    choices: int = 1  # the body's `n`: usage and text events count every choice's tokens
    tap: LineTap | None = None


@dataclass(frozen=True, slots=True)
class Relayed:
    """An attempt that answered the client (with whatever status)."""

    response: web.StreamResponse
    status: int  # CLIENT_CLOSED when the client left mid-stream
    error: str | None = None
    usage: dict[str, Any] | None = None
    answer: dict[str, Any] | None = None  # a whole 200 JSON answer, decoded
    client_disconnected: bool = False


@dataclass(frozen=True, slots=True)
class Retry:
    """An attempt failed before the client saw a byte; retry elsewhere or report `failure`."""

    failure: GatewayError | web.Response
    reason: str  # one of the RETRY_* above: the label it is counted under
