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

# Modules that define sub-commands, in the order `kvgate --help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "gateway.serve",
    "gateway.demo",
    "gateway.top",
    "loadtest.sim.cli",
    "loadtest.simulate_cli",
)


class UsageError(Exception):
    """A problem with the command line or the config: exit code 2, one line on stderr."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate",
        description="KV-cache-aware, OpenAI-compatible gateway for LLM inference fleets.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except UsageError as exc:
        print(f"kvgate {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return code


if __name__ == "__main__":
    # Run as `python -m gateway.cli`, this file is `__main__`; commands raise the UsageError of
    # `gateway.cli`, so dispatch through that module, not this copy of it.
    sys.exit(importlib.import_module("gateway.cli").main())
