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
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gateway import redact
from gateway.cli import UsageError
from gateway.config import Settings, load_settings
from gateway.connections import FD_HEADROOM, raise_fd_limit
from gateway.lifecycle import configure_logging, run_on_uvloop, serve_until_signalled, serving

__all__ = ["LOG_LEVELS", "configure_logging", "run_on_uvloop", "running_gateway",
           "serve_until_signalled"]

LOG_LEVELS = ("debug", "info", "warning", "error")


@asynccontextmanager
async def running_gateway(settings: Settings, **app_options: Any) -> AsyncIterator[str]:
    """The gateway serving on `settings.server` (port 0: a free port), yielding its base URL
    (`http://host:port`, no /v1). `app_options` go to `create_app` (clock, rng, on_done)."""
    async with serving(settings, **app_options) as gateway:
        yield gateway.url


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
        "--workers", type=_workers, metavar="N",
        help="worker processes on the one port (default 1; auto: one per core available)",
    )
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
    if getattr(args, "workers", None) is not None:
        server["workers"] = args.workers
    overrides: dict[str, Any] = {"server": server} if server else {}
    if args.backend:
        overrides["backends"] = [{"url": url} for url in args.backend]
    if args.redis is not None:
        overrides["cache"] = {"enabled": True, "store": "redis", "redis_url": args.redis}
    return overrides


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of workers: {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError("at least 1 worker")
    return count


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

    workers = server.worker_count()
    try:
        if workers > 1:
            from gateway.workers.supervisor import Supervisor

            supervisor = Supervisor(settings, workers, args.log_level)
            code = 0

            async def supervise() -> None:
                nonlocal code
                code = await supervisor.run(ready)

            run_on_uvloop(supervise)
            return code
        run_on_uvloop(lambda: serve_until_signalled(settings, ready))
    except OSError as exc:
        where = f"{settings.server.host}:{settings.server.port}"
        print(f"kvgate serve: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
