"""`kvgate demo`: simulated backends and the gateway, on embedded defaults.

    kvgate demo [--backends N] [--port P] [--time-scale X]

Starts N simulators of the default preset and one of the small-model preset, each `kvgate sim`
in a process of its own on a free loopback port (loadtest/sim/process.py), then the gateway on P
(default 8000), prints how to call it and runs until Ctrl-C or SIGTERM, when everything shuts
down cleanly (exit code 0). The simulators run outside the gateway's event loop so that what a
newcomer sees is the modelled GPUs, not the gateway's work stretching their steps; they still
share the machine's cores, which the banner says. Each is stopped by its PID when the demo ends,
by a signal or by an error. No config file, no environment, no Redis: the response cache is on,
in memory, its exact tier only (the semantic tier is off by default: a near question is not
always the same question; `cache.semantic: shadow` measures it first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack

import orjson

from gateway.backend_settings import BackendSettings
from gateway.cli import UsageError
from gateway.config import CacheSettings, Settings
from gateway.serve import LOG_LEVELS, configure_logging, run_on_uvloop, running_gateway
from gateway.server_settings import ServerSettings
from gateway.small_model_settings import SmallModelRouteSettings
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, SMALL_PRESET
from loadtest.sim.process import SimProcess, sim_process

MAX_BACKENDS = 16
AUTO_MODEL = "auto"  # the small-model routing alias: easy requests go to the small model


def demo_settings(urls: Sequence[str], *, host: str, port: int) -> Settings:
    backends = tuple(BackendSettings(url=url, id=f"sim{i}") for i, url in enumerate(urls))
    route = SmallModelRouteSettings(alias=AUTO_MODEL, large=PRESETS[DEFAULT_PRESET].model_name,
                                    small=PRESETS[SMALL_PRESET].model_name)
    return Settings(server=ServerSettings(host=host, port=port), backends=backends,
                    cache=CacheSettings(enabled=True), small_model=(route,))


def banner(url: str, *, backends: int, time_scale: float, pids: Sequence[int] = (),
           cores: int | None = None) -> str:
    """What `kvgate demo` prints once ready: the fleet, a curl command and a Python snippet."""
    model = PRESETS[DEFAULT_PRESET].model_name
    small = PRESETS[SMALL_PRESET].model_name
    # Temperature 0: a request sampled hotter is not served from the cache (cache.max_temperature).
    body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32,
            "temperature": 0}
    curl = (
        f"curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-d {shlex.quote(orjson.dumps(body).decode())}"
    )
    return "\n".join(
        [
            f"kvgate demo: gateway on {url}/v1",
            f"  backends: {backends} x {model} ({DEFAULT_PRESET}), 1 x {small} ({SMALL_PRESET}),"
            f" time scale {time_scale:g}",
            f"            simulators, each in a process of its own (pids"
            f" {', '.join(map(str, pids)) or '-'}),",
            f"            sharing this machine's {cores or os.cpu_count() or 1} cores with the"
            " gateway",
            f"  state:    curl -s {url}/admin/backends",
            "  cache:    in memory; ask the same question twice at temperature 0 and the",
            "            second answer comes from it (header x-kvgate-cache: exact)",
            f'  routing:  "model": "{AUTO_MODEL}" lets the gateway choose: easy requests go to'
            f" {small},",
            "            the rest to " + model + " (headers x-kvgate-model, x-kvgate-model-reason)",
            "",
            "Try it:",
            f"  {curl} -i",
            "",
            "  # Python: pip install openai first (kvgate does not install it), then",
            "  from openai import OpenAI",
            f'  client = OpenAI(base_url="{url}/v1", api_key="unused")',
            "  for chunk in client.chat.completions.create(",
            f'          model="{model}", messages=[{{"role": "user", "content": "Hello!"}}],',
            "          max_tokens=32, stream=True):",
            '      print(chunk.choices[0].delta.content or "", end="", flush=True)',
            "",
            "Ctrl-C stops it.",
        ]
    )


async def start_simulators(stack: AsyncExitStack, backends: int,
                           time_scale: float) -> list[SimProcess]:
    """The N large simulators and the small one, started side by side; each is stopped when
    `stack` closes (and those still starting when one fails to)."""
    presets = [DEFAULT_PRESET] * backends + [SMALL_PRESET]

    async def start(i: int, preset: str) -> SimProcess:
        return await stack.enter_async_context(
            sim_process(preset=preset, time_scale=time_scale, seed=i))

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(start(i, p)) for i, p in enumerate(presets)]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [t.result() for t in tasks]


async def run_demo(backends: int, host: str, port: int, time_scale: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with AsyncExitStack() as stack:
            sims = await start_simulators(stack, backends, time_scale)
            settings = demo_settings([s.url for s in sims], host=host, port=port)
            url = await stack.enter_async_context(running_gateway(settings))
            print(banner(url, backends=backends, time_scale=time_scale,
                         pids=[s.pid for s in sims]), flush=True)
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="simulated backends (a process each) and a gateway",
        description="Starts simulated backends and the gateway on embedded defaults, prints how "
        "to call it and runs until Ctrl-C.",
    )
    parser.add_argument(
        "--backends", type=int, default=3, metavar="N", help="simulated backends (default 3)"
    )
    parser.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="simulators run X times faster than the modeled GPUs (default 1: real speed)",
    )
    parser.add_argument("--log-level", default="warning", choices=LOG_LEVELS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.backends <= MAX_BACKENDS:
        raise UsageError(f"--backends must be in 1..{MAX_BACKENDS}, got {args.backends}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if not args.time_scale > 0:
        raise UsageError(f"--time-scale must be > 0, got {args.time_scale}")
    configure_logging(args.log_level)
    try:
        run_on_uvloop(lambda: run_demo(args.backends, args.host, args.port, args.time_scale))
    except OSError as exc:
        print(
            f"kvgate demo: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    except RuntimeError as exc:  # a simulator did not start
        print(f"kvgate demo: {exc}", file=sys.stderr)
        return 1
    return 0
