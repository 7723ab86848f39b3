"""`kvgate sim`: one simulated, vLLM-like backend in the foreground.

    kvgate sim --port 8001 [--host 127.0.0.1] [--model NAME] [--preset NAME] [--time-scale X]
               [--metrics-format vllm|vllm-v0|sglang|tgi|llamacpp] [--seed N]
               [--num-gpu-blocks N]
    kvgate sim --describe [--preset NAME]     # the preset's derived figures, then exit

`--port 0` picks a free port; the first line on stdout names the URL it serves on.
`--metrics-format` picks the server whose /metrics the simulator writes
(loadtest/sim/exposition.py); `llamacpp` also answers llama-server's `GET /slots`
(loadtest/sim/slots.py).
`python -m loadtest.sim.cli ...` runs the same command without loading the gateway's other
commands (benchmarks use it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import uvloop

from gateway.cli import UsageError
from loadtest.sim.exposition import FORMATS
from loadtest.sim.launch import serve
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, describe
from loadtest.sim.server import SimSettings

DESCRIPTION = ("A simulated vLLM-like backend: continuous batching over a paged KV cache, modeled "
               "GPU timing, OpenAI-compatible API and the chosen server's /metrics.")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim", help="run one simulated inference backend (vLLM-like, OpenAI-compatible)",
        description=DESCRIPTION)
    _add_arguments(parser)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--model", help="served model name (default: the preset's model)")
    parser.add_argument("--preset", default=DEFAULT_PRESET,
                        help=f"model and GPU preset: {', '.join(PRESETS)} (default "
                             f"{DEFAULT_PRESET})")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                        help="run X times faster than the modeled GPU (default 1)")
    parser.add_argument("--metrics-format", default="vllm",
                        help=f"the server whose /metrics to write: {'|'.join(FORMATS)} "
                             "(default vllm); llamacpp also serves llama-server's /slots")
    parser.add_argument("--seed", type=int, default=0, help="seed of the output lengths")
    parser.add_argument("--num-gpu-blocks", type=int, metavar="N",
                        help="KV cache blocks (default: derived from the preset)")
    parser.add_argument("--describe", action="store_true",
                        help="print the preset's derived figures and exit")
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """`kvgate sim` on its own, with the same arguments and exit codes."""
    parser = argparse.ArgumentParser(prog="kvgate sim", description=DESCRIPTION)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        print(f"kvgate sim: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def run(args: argparse.Namespace) -> int:
    settings = SimSettings(preset=args.preset, model=args.model, time_scale=args.time_scale,
                           metrics_format=args.metrics_format, seed=args.seed,
                           num_gpu_blocks=args.num_gpu_blocks)
    try:
        settings.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.describe:
        print(describe(PRESETS[settings.preset]))
        return 0
    if not 0 <= args.port <= 65535:
        raise UsageError(f"port must be in 0..65535, got {args.port}")

    def ready(url: str) -> None:
        print(f"kvgate sim: {settings.model or PRESETS[settings.preset].model_name} "
              f"(preset {settings.preset}, {settings.metrics_format} metrics, time scale "
              f"{settings.time_scale:g}) on {url}", flush=True)

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(settings, args.host, args.port, ready))
    except OSError as exc:  # the port is taken, the address is not local, ...
        print(f"kvgate sim: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
