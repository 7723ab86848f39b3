"""One request's timestamps, the figures derived from them, and the `server-timing` header.

Every mark is seconds on one monotonic clock: the one the gateway reads and hands to `Telemetry`
as its `clock`. A mark stays None until the request reaches that point, and a figure that needs a
missing mark is None, never a guess.

TTFT runs from arrival at the gateway to the first content byte sent to the client, queue
included. Its parts, in the order a request meets them, are disjoint:

    arrival ─ cache lookup ─ admission queue ─ routing ─ dispatch ─ connect ─ upstream ─ first byte

`upstream` is the backend's own TTFT (its queue and prefill) plus the relay to the client, measured
from the connection (or from the dispatch when no connect mark was taken). `gateway` is what is
left: parsing, auth, model selection, cost estimate. The queue is the wait for admission.

The record is mutable on purpose: each step of the completion path marks its own times as the
request moves (the cache, the proxy), and the recorder reads it once at the end. Retries before
the first byte stay inside `upstream`: `dispatch` is the first attempt's start.
"""

from __future__ import annotations

from dataclasses import dataclass


def _span(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return end - start


@dataclass(slots=True)
class RequestTiming:
    arrival: float
    cache_start: float | None = None
    cache_end: float | None = None
    queue_start: float | None = None  # entered admission
    queue_end: float | None = None  # admitted, or rejected
    route_start: float | None = None
    route_end: float | None = None
    dispatch: float | None = None  # the first upstream attempt began
    connected: float | None = None  # the upstream connection was ready
    first_byte: float | None = None  # first content byte written to the client
    end: float | None = None  # last byte written, or the request failed

    @property
    def cache_s(self) -> float | None:
        return _span(self.cache_start, self.cache_end)

    @property
    def queue_s(self) -> float | None:
        return _span(self.queue_start, self.queue_end)

    @property
    def route_s(self) -> float | None:
        return _span(self.route_start, self.route_end)

    @property
    def connect_s(self) -> float | None:
        return _span(self.dispatch, self.connected)

    @property
    def upstream_s(self) -> float | None:
        start = self.connected if self.connected is not None else self.dispatch
        return _span(start, self.first_byte)

    @property
    def ttft_s(self) -> float | None:
        return _span(self.arrival, self.first_byte)

    @property
    def duration_s(self) -> float | None:
        return _span(self.arrival, self.end)

    @property
    def gateway_s(self) -> float | None:
        """TTFT less its measured parts; 0 rather than a float-rounding negative."""
        ttft = self.ttft_s
        if ttft is None:
            return None
        rest = ttft
        for part in (self.cache_s, self.queue_s, self.route_s, self.connect_s, self.upstream_s):
            if part is not None:
                rest -= part
        return max(rest, 0.0)

    def tpot_s(self, output_tokens: int | None) -> float | None:
        """(end − first byte) / (output tokens − 1); None below two tokens."""
        if output_tokens is None or output_tokens < 2:
            return None
        decode = _span(self.first_byte, self.end)
        if decode is None:
            return None
        return decode / (output_tokens - 1)


def server_timing(timing: RequestTiming) -> str:
    """The `server-timing` header value: each known part in milliseconds, parts in path order.

    e.g. `queue;dur=12.3, cache;dur=0.4, route;dur=0.1, upstream;dur=85.0, gateway;dur=0.4,
    ttft;dur=98.2`. Parts whose marks are not set yet are left out, so a streaming handler can
    build it when it prepares the response (after setting `first_byte`) and `total` appears only
    once `end` is set.
    """
    # Called for every response: the parts are worked out inline rather than through the
    # properties (the same arithmetic, in the same order, as `gateway_s`).
    t = timing
    cache = None if t.cache_start is None or t.cache_end is None else t.cache_end - t.cache_start
    queue = None if t.queue_start is None or t.queue_end is None else t.queue_end - t.queue_start
    route = None if t.route_start is None or t.route_end is None else t.route_end - t.route_start
    dispatch, connected, first_byte = t.dispatch, t.connected, t.first_byte
    connect = None if dispatch is None or connected is None else connected - dispatch
    upstream_from = connected if connected is not None else dispatch
    upstream = None if upstream_from is None or first_byte is None else first_byte - upstream_from
    ttft = None if first_byte is None else first_byte - t.arrival
    gateway = None
    if ttft is not None:
        rest = ttft
        for part in (cache, queue, route, connect, upstream):
            if part is not None:
                rest -= part
        gateway = max(rest, 0.0)
    total = None if t.end is None else t.end - t.arrival
    parts: list[str] = []
    if queue is not None:
        parts.append(f"queue;dur={queue * 1000.0:.1f}")
    if cache is not None:
        parts.append(f"cache;dur={cache * 1000.0:.1f}")
    if route is not None:
        parts.append(f"route;dur={route * 1000.0:.1f}")
    if connect is not None:
        parts.append(f"connect;dur={connect * 1000.0:.1f}")
    if upstream is not None:
        parts.append(f"upstream;dur={upstream * 1000.0:.1f}")
    if gateway is not None:
        parts.append(f"gateway;dur={gateway * 1000.0:.1f}")
    if ttft is not None:
        parts.append(f"ttft;dur={ttft * 1000.0:.1f}")
    if total is not None:
        parts.append(f"total;dur={total * 1000.0:.1f}")
    return ", ".join(parts)
