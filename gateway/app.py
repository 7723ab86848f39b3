"""`create_app(settings)`: the one place where the gateway is wired together.

State lives under `web.AppKey`s (gateway/keys.py); the lifetimes of the upstream HTTP client and of
the backend poller are owned by `cleanup_ctx`. Nothing is global: two apps in one process share
nothing. One middleware translates errors into OpenAI bodies and gives every response its
`x-request-id` and `openai-processing-ms` (a completion's come from its exchange,
gateway/headers.py). Run the app with `handler_cancellation=True` (gateway/serve.py does) so
that a client disconnect cancels its handler and the proxy closes the upstream connection at
once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry.sdk.trace import SpanProcessor

from gateway import handlers
from gateway.admission import GATE, build_gate, gate_running
from gateway.attempt import Outcome
from gateway.auth import KeyInfo, KeyRing, auth_middleware
from gateway.body import body_parsing
from gateway.cache.setup import cache_running
from gateway.config import Settings
from gateway.drain import DRAIN, RELAY, Drain, drain_middleware
from gateway.errors import (
    BodyTooLarge,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
)
from gateway.exchange import request_id_of
from gateway.keys import (
    CLOCK,
    FLEET,
    KEYRING,
    MODEL_ROUTES,
    PROXY,
    ROUTER,
    SCRAPE_SOURCE,
    SETTINGS,
    STARTED_AT,
    TELEMETRY,
    ScrapeSource,
)
from gateway.loop_watch import loop_watching
from gateway.observe import Recorder, install_telemetry
from gateway.proxy import Proxy
from gateway.relay import Relay
from gateway.routing_settings import policy_context
from gateway.small_model import small_model_running
from gateway.telemetry import Telemetry
from gateway.telemetry.health import HealthReport
from routing import outlier
from routing.fleet import Fleet, OutlierRules
from routing.policies import build_router
from routing.poller import Poller, full_every_for
from routing.retry_budget import RetryBudget
from routing.state import BackendSpec

log = logging.getLogger("kvgate.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    on_done: Callable[[Outcome], None] | None = None,
    span_processor: SpanProcessor | None = None,
) -> web.Application:
    """The gateway app. `clock` (monotonic seconds), `rng` and `on_done` (called once with the
    proxy's Outcome of each request that reached it, when it ends) are injectable for tests;
    `rng` defaults to one seeded from `settings.routing.seed`. `span_processor` turns tracing
    on without OTLP (tests, benchmarks). Raises TelemetryConfigError when the telemetry
    settings cannot be honoured."""
    telemetry = Telemetry(
        settings.telemetry.to_settings(), clock=clock, span_processor=span_processor
    )
    recorder = Recorder(telemetry, clock=clock, on_done=on_done)
    # The drain inside the error middleware (its 503 is an OpenAI body), before auth.
    middlewares: list[Middleware] = [error_middleware, drain_middleware]
    ring = KeyRing((key.digest(), KeyInfo(key.name, key.tenant or key.name, key.admin, key.rpm,
                                          key.tpm))
                   for key in settings.auth.keys)
    if ring.enabled:  # inside the error middleware: a 401 is an OpenAI body, and recorded
        middlewares.append(auth_middleware(ring, protect_metrics=settings.auth.protect_metrics,
                                           clock=clock))
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        middlewares=middlewares,
    )
    routing = settings.routing
    app[SETTINGS] = settings
    app[DRAIN] = Drain()
    app[KEYRING] = ring
    app[MODEL_ROUTES] = settings.small_model_routes()
    app[CLOCK] = clock
    app[STARTED_AT] = int(time.time())
    health = settings.health
    app[FLEET] = Fleet(
        settings.backend_specs(),
        max_snapshot_age=routing.max_snapshot_age_s,
        rules=OutlierRules(consecutive_failures=health.consecutive_failures,
                           base_ejection_s=health.base_ejection_s,
                           max_ejected_fraction=health.max_ejected_fraction),
    )
    app[ROUTER] = build_router(
        routing.policy, policy_context(routing, settings.slo, settings.advanced, rng))
    app[GATE] = build_gate(settings, app[FLEET], app[ROUTER], clock)
    app.cleanup_ctx.append(gate_running)
    install_telemetry(app, recorder)
    fleet = app[FLEET]
    telemetry.register_backend_health(lambda: health_report(fleet, clock()))
    app.cleanup_ctx.append(_upstream_client)
    app.cleanup_ctx.append(body_parsing)
    app.cleanup_ctx.append(loop_watching)
    app.cleanup_ctx.append(_backend_health)
    if settings.small_model:
        app.cleanup_ctx.append(small_model_running)
    if settings.cache.enabled:
        app.cleanup_ctx.append(cache_running)
    handlers.add_routes(app)
    return app


def health_report(fleet: Fleet, now: float) -> HealthReport:
    """The Fleet's health as the health metrics read it (gateway/telemetry/health.py)."""
    healths = {spec.id: fleet.health(spec.id) for spec in fleet.specs}
    return HealthReport(
        ejected={i: outlier.ejected(h, now) for i, h in healths.items()},
        held={i: now < h.held_until for i, h in healths.items()},
        reachable={i: h.reachable for i, h in healths.items()},
        ejections=dict(fleet.ejection_counts()),
        capped=dict(fleet.capped_counts()),
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turns every error into OpenAI's error body, and stamps the request id and processing time
    on every response that does not carry them yet."""
    clock = request.app[CLOCK]
    arrived = clock()
    try:
        response = await handler(request)
    except GatewayError as exc:
        response = _error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _error_response(_from_http(exc, request))
    except Exception as exc:
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = _error_response(InternalError(f"internal error: {type(exc).__name__}"))
    headers = response.headers
    if not response.prepared and "x-request-id" not in headers:
        headers["x-request-id"] = request_id_of(request.headers)
        headers["openai-processing-ms"] = str(int((clock() - arrived) * 1000.0))
    return response


def _error_response(exc: GatewayError) -> web.Response:
    response = web.Response(
        status=exc.status, body=exc.body(), content_type="application/json", headers=exc.headers
    )
    if exc.closes_connection:
        response.force_close()
    return response


def _from_http(exc: web.HTTPException, request: web.Request) -> GatewayError:
    """aiohttp's own HTTP errors (no route, wrong method, body too large) as ours."""
    if exc.status == 404:
        return RouteNotFound(f"no such endpoint: {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
    if exc.status == 413:
        return BodyTooLarge("the request body is larger than the gateway accepts")
    if exc.status < 500:
        return InvalidRequest(exc.reason)
    return InternalError(exc.reason)


async def _upstream_client(app: web.Application) -> AsyncIterator[None]:
    """One ClientSession for every upstream call, sized for many concurrent streams."""
    server = app[SETTINGS].server
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=server.max_upstream_connections, limit_per_host=0, ttl_dns_cache=300
        ),
        # No total timeout: a stream lasts as long as the generation. The first-byte deadline
        # is the proxy's; this bounds only the TCP connect.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=server.connect_timeout_s),
        # Without Accept-Encoding backends answer uncompressed: nothing to re-inflate per chunk.
        skip_auto_headers=("Accept-Encoding",),
        cookie_jar=aiohttp.DummyCookieJar(),  # a backend's cookies must not leak across clients
    )
    relay = Relay(session=session, fleet=app[FLEET], first_byte_timeout=server.first_byte_timeout_s,
                  clock=app[CLOCK], stream_idle_timeout=server.stream_idle_timeout_s,
                  client_write_timeout=server.client_write_timeout_s,
                  flush_interval_s=server.stream_flush_interval_ms / 1000)
    app[RELAY] = relay
    app[PROXY] = Proxy(relay=relay, gate=app[GATE], clock=app[CLOCK], budget=RetryBudget(),
                       metrics=app[TELEMETRY])
    try:
        yield
    finally:
        await session.close()


async def _backend_health(app: web.Application) -> AsyncIterator[None]:
    """Discovers every backend's models once at start-up (an answer also marks it reachable),
    then runs the poller, which keeps load snapshots current, for the app's lifetime.
    A backend down at start-up gets its models from its metrics labels once it answers."""
    settings = app[SETTINGS]
    fleet = app[FLEET]
    timeout = aiohttp.ClientTimeout(total=settings.server.discovery_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(
            *(_discover(session, fleet, spec, app[CLOCK]) for spec in fleet.specs)
        )
    source = app.get(SCRAPE_SOURCE)
    poller: ScrapeSource = source(fleet) if source is not None else Poller(
        fleet,
        interval=settings.routing.poll_interval_s,
        timeout=settings.routing.scrape_timeout_s,
        group_size=settings.advanced.poll_group_size,
        full_every=full_every_for(
            settings.advanced.full_scrape_interval_s, settings.routing.poll_interval_s),
        clock=app[CLOCK],
        on_error=app[TELEMETRY].poll_error,
    )
    async with poller.running():
        # The listener opens once every backend's capacity is known (or its first scrape has
        # failed), within one poll interval and a scrape timeout: a request that came sooner
        # would be admitted against no reading at all.
        await poller.first_round(settings.routing.poll_interval_s
                                 + settings.routing.scrape_timeout_s)
        yield


async def _discover(
    session: aiohttp.ClientSession, fleet: Fleet, spec: BackendSpec, clock: Callable[[], float]
) -> None:
    try:
        auth = {} if spec.api_key is None else {"Authorization": f"Bearer {spec.api_key}"}
        async with session.get(spec.url + "/v1/models", headers=auth) as resp:
            resp.raise_for_status()
            payload = orjson.loads(await resp.read())
        models = tuple(str(entry["id"]) for entry in payload["data"])
    except aiohttp.ClientConnectorError as exc:
        log.warning("backend %s (%s): model discovery failed: %s", spec.id, spec.url, exc)
        fleet.record_unreachable(spec.id, clock())
        return
    except (aiohttp.ClientResponseError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        # It answered: reachable. Whether it is healthy is for requests' outcomes to say.
        log.warning("backend %s (%s): model discovery failed: %s", spec.id, spec.url, exc)
        fleet.record_success(spec.id, clock())
        return
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("backend %s (%s): model discovery failed: %s", spec.id, spec.url, exc)
        return
    if not spec.models:
        fleet.set_models(spec.id, models)
    fleet.record_success(spec.id, clock())
