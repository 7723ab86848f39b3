"""What the proxy returns: the `Outcome` of one proxied request, the record every later reader
(telemetry, token-budget settlement, the cache's store side, response headers) takes it from.

The proxy never calls back. `Proxy.forward` returns a `Forwarded` (the response or the error the
client gets, and the `Outcome`); when the client hangs up, the cancellation it re-raises is a
`ClientGone` carrying the `Outcome`, so even that path reports what happened.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.errors import GatewayError

CLIENT_CLOSED = 499  # the status an Outcome records when the client hung up (nginx's convention)


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
