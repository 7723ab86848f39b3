"""The `kvgate` command line: one sub-command per module.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>` as the parser default. Exit codes: 0 success, 2 bad usage or config
(with one line on stderr naming the problem), 1 any other failure.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Sub-commands and the modules that define them, in the order `kvgate --help` lists them.
COMMANDS: dict[str, str] = {
    "serve": "gateway.serve",
    "demo": "gateway.demo",
    "top": "gateway.top",
    "cache": "gateway.cache.admin",
    "sim": "loadtest.sim.cli",
    "simulate": "loadtest.simulate_cli",
    "plan": "gateway.plan_cli",
    "route-eval": "gateway.route_eval",
}
COMMAND_MODULES: tuple[str, ...] = tuple(COMMANDS.values())


class UsageError(Exception):
    """A problem with the command line: exit code 2, one line on stderr (as for a bad config,
    `gateway.config.ConfigError`)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command, or only of `command` when it names one: a command then
    imports only its own module (`kvgate simulate` and `kvgate top` need no aiohttp server,
    OpenTelemetry or pydantic models, ~1.5 s of imports on a small machine)."""
    parser = argparse.ArgumentParser(
        prog="kvgate",
        description="KV-cache-aware, OpenAI-compatible gateway for LLM inference fleets.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list[0] if args_list else None)
    args = parser.parse_args(args_list)
    try:
        code: int = args.func(args)
    except UsageError as exc:
        print(f"kvgate {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        if not _is_config_error(exc):
            raise
        print(f"kvgate {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


def _is_config_error(exc: Exception) -> bool:
    """Whether `exc` is `gateway.config.ConfigError`. Looked up, not imported: a command that
    loads no config keeps its start free of pydantic, and only a loaded module raises its error."""
    config = sys.modules.get("gateway.config")
    return config is not None and isinstance(exc, config.ConfigError)


if __name__ == "__main__":
    # Run as `python -m gateway.cli`, this file is `__main__`; commands raise the UsageError of
    # `gateway.cli`, so dispatch through that module, not this copy of it.
    sys.exit(importlib.import_module("gateway.cli").main())
