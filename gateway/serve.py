"""`kvgate serve`: the gateway in the foreground, and `running_gateway` for tests and the demo.

    kvgate serve --config FILE [--host H] [--port P]
    kvgate serve --backend URL [--backend URL ...] [--host H] [--port P] [--redis URL]

With `--backend` (repeatable) each backend's models are discovered from its /v1/models; given with
`--config` the flags replace the file's backends. Flags override `KVGATE_*` variables, which
override the file (see gateway/config.py). `--redis URL` turns the response cache on with its
entries in that Redis (shared by every gateway replica pointed at it). Runs on uvloop until SIGTERM
(a graceful drain, gateway/lifecycle.py) or SIGINT (the same without the grace).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import uvloop

from gateway import redact
from gateway.cli import UsageError
from gateway.config import Settings, load_settings
from gateway.connections import FD_HEADROOM, raise_fd_limit
from gateway.gc_policy import serving_gc
from gateway.lifecycle import serving
from gateway.logsink import configure_access_log
from gateway.telemetry.accesslog import LOGGER_NAME as ACCESS_LOGGER

LOG_LEVELS = ("debug", "info", "warning", "error")


@asynccontextmanager
async def running_gateway(settings: Settings, **app_options: Any) -> AsyncIterator[str]:
    """The gateway serving on `settings.server` (port 0: a free port), yielding its base URL
    (`http://host:port`, no /v1). `app_options` go to `create_app` (clock, rng, on_done)."""
    async with serving(settings, **app_options) as gateway:
        yield gateway.url


async def serve_until_signalled(settings: Settings, on_ready: Callable[[str], None]) -> None:
    """Serve until SIGTERM or SIGINT, then drain (gateway/lifecycle.py) and shut down: SIGTERM
    with the drain grace first, SIGINT (an operator's Ctrl-C) without it."""
    stopped: asyncio.Future[signal.Signals] = asyncio.get_running_loop().create_future()
    loop = asyncio.get_running_loop()

    def stop(sig: signal.Signals) -> None:
        if not stopped.done():
            stopped.set_result(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    server = settings.server
    try:
        async with serving(settings) as gateway:
            on_ready(gateway.url)
            with serving_gc():  # gateway/gc_policy.py: start-up's objects frozen
                sig = await stopped
                grace = server.drain_grace_s if sig == signal.SIGTERM else 0.0
                await gateway.drain(grace, server.shutdown_timeout_s)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def run_on_uvloop(main: Callable[[], Any]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def configure_logging(level: str, secrets: Iterable[str] = ()) -> None:
    """Diagnostics to stderr; the JSON access log (one line per request) to stdout. Neither ever
    shows a secret (gateway/redact.py)."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    configure_access_log(level)
    redact.install(secrets, (logging.getLogger(), logging.getLogger(ACCESS_LOGGER)))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the gateway",
        description="The OpenAI-compatible gateway in front of a fleet of inference servers.",
        epilog="Environment: KVGATE_<SECTION>__<FIELD>=value overrides the config file, e.g. "
        "KVGATE_SERVER__PORT=8080, KVGATE_ROUTING__POLICY=round_robin, "
        "KVGATE_BACKENDS__0__WEIGHT=2; a value starting with [ or { is read as a list or mapping. "
        "Flags override both.",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML config file")
    parser.add_argument(
        "--backend",
        action="append",
        metavar="URL",
        help="a backend's base URL (repeatable); its models are discovered from /v1/models",
    )
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default 8000; 0: any free port)")
    parser.add_argument(
        "--redis", metavar="URL",
        help="turn the response cache on, stored in this Redis (redis://host:port/db)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="logging level (default info)"
    )
    parser.set_defaults(func=run)


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `kvgate serve`'s flags set, as `load_settings` overrides."""
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    overrides: dict[str, Any] = {"server": server} if server else {}
    if args.backend:
        overrides["backends"] = [{"url": url} for url in args.backend]
    if args.redis is not None:
        overrides["cache"] = {"enabled": True, "store": "redis", "redis_url": args.redis}
    return overrides


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, overrides=overrides_of(args))
    if not settings.backends:
        raise UsageError("no backends: pass --backend URL or a --config file with backends")
    configure_logging(args.log_level, redact.secrets_of(settings))
    server = settings.server
    raised = raise_fd_limit(server.max_connections + server.max_upstream_connections + FD_HEADROOM)
    if raised is not None:
        logging.getLogger("kvgate.gateway").info("%s", raised)

    def ready(url: str) -> None:
        ids = ", ".join(spec.id for spec in settings.backend_specs())
        print(f"kvgate serve: {url}/v1 in front of {ids}", flush=True)

    try:
        run_on_uvloop(lambda: serve_until_signalled(settings, ready))
    except OSError as exc:
        where = f"{settings.server.host}:{settings.server.port}"
        print(f"kvgate serve: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
