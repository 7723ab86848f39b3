"""The headers a completion response carries about its exchange, set in one place.

`x-request-id`; `openai-processing-ms` (arrival to now); `x-kvgate-cache` (`bypass`, `miss` or
the tier that answered); `x-kvgate-model-reason` when small-model routing chose; `server-timing`
with the parts of TTFT known now (gateway/telemetry/timing.py); `x-kvgate-queue-ms` (the time
spent waiting in the gateway's admission queue, server-timing's `queue` part) and
`x-kvgate-route` (policy, predicted TTFT and its parts, why) once a backend was chosen.

A whole answer gets them when it is complete (`stamp`, from the completion path), so every part
is there (`ttft`, `total`). A stream's headers leave before its first token: the proxy and the
cache's replay call `prepare_stream`, and its `server-timing` holds the parts known by then,
`queue`, `cache`, `route` and `connect`. An error raised on the path carries them too
(`stamp_error`).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from types import MappingProxyType

from aiohttp import web

from gateway.errors import GatewayError
from gateway.exchange import Exchange
from gateway.telemetry import server_timing

CACHE_HEADER = "x-kvgate-cache"


def headers_of(ex: Exchange, now: float, route: str | None) -> dict[str, str]:
    timing = ex.timing
    headers = {
        "x-request-id": ex.request_id,
        "openai-processing-ms": str(int((now - timing.arrival) * 1000.0)),
        CACHE_HEADER: ex.cache,
    }
    if ex.model_reason is not None:
        headers["x-kvgate-model-reason"] = ex.model_reason
    value = server_timing(timing)
    if value:
        headers["server-timing"] = value
    queued = timing.queue_s
    if queued is not None:
        headers["x-kvgate-queue-ms"] = f"{queued * 1000.0:.1f}"
    if route is not None:
        headers["x-kvgate-route"] = route
    return headers


def stamp(headers: MutableMapping[str, str], ex: Exchange, now: float,
          route: str | None = None) -> None:
    """The exchange's headers on a response; a cache tier the response names itself stays."""
    for name, value in headers_of(ex, now, route).items():
        if name != CACHE_HEADER or name not in headers:
            headers[name] = value


async def prepare_stream(request: web.Request, response: web.StreamResponse, ex: Exchange,
                         now: float, route: str | None = None) -> None:
    """Sends a stream's status and headers, the exchange's among them."""
    stamp(response.headers, ex, now, route)
    await response.prepare(request)


def stamp_error(error: GatewayError, ex: Exchange, now: float,
                  route: str | None = None) -> None:
    """Adds the exchange's headers to those of `error` (its own win: Retry-After, the queue
    wait of a refusal)."""
    error.headers = MappingProxyType({**headers_of(ex, now, route), **error.headers})
