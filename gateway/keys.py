"""Typed keys for the app-wide objects `create_app` stores on the application.

They live in their own module so handlers, middleware and the app factory share them without
importing each other. A request's own state is never stored on the aiohttp request: the
completion path passes its `Exchange` (gateway/exchange.py) down explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from aiohttp import web

from gateway.auth import KeyRing
from gateway.cache.cache import ResponseCache
from gateway.config import Settings
from gateway.proxy import Proxy
from gateway.telemetry import Telemetry
from routing.fleet import Fleet
from routing.model_select import SmallModelRoute
from routing.policy import Router

SETTINGS = web.AppKey("settings", Settings)
FLEET = web.AppKey("fleet", Fleet)
ROUTER = web.AppKey("router", Router)
PROXY = web.AppKey("proxy", Proxy)  # set by the upstream-client cleanup context
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")  # monotonic seconds
STARTED_AT = web.AppKey("started_at", int)  # wall-clock start, the `created` of /v1/models
TELEMETRY = web.AppKey("telemetry", Telemetry)
# The API keys and their rate limits (gateway/auth.py); empty when auth is off.
KEYRING = web.AppKey("keyring", KeyRing)
# Small-model routing aliases (routing/model_select.py), by alias.
MODEL_ROUTES: web.AppKey[Mapping[str, SmallModelRoute]] = web.AppKey("model_routes")
# The response cache (gateway/cache); absent when `cache.enabled` is false.
CACHE = web.AppKey("cache", ResponseCache)


class ScrapeSource(Protocol):
    """What keeps the Fleet's snapshots current: the Poller, or a worker's reader of the host's
    scrapes (gateway/workers/feed.py)."""

    def running(self) -> AbstractAsyncContextManager[object]: ...

    async def first_round(self, timeout_s: float) -> bool: ...


# Set before start-up to replace the app's own poller (gateway/workers/worker.py).
SCRAPE_SOURCE: web.AppKey[Callable[[Fleet], ScrapeSource]] = web.AppKey("scrape_source")
