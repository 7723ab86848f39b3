"""`kvgate cache shadow-report`: precision per similarity band of shadow mode's would-be hits.

    kvgate cache shadow-report (--redis URL [--prefix P] | --gateway URL) [--json]

Reads the records `cache.semantic: shadow` kept (gateway/cache/shadow.py): straight from the
shared Redis store, or from a running gateway's `GET /admin/cache/shadow` (the in-memory store
lives in that process). Prints one row per band: the would-be hits, those whose second answer is
known, how many agreed, and the precision. Exit codes: 0 done, 1 the gateway did not answer, 2 bad
usage or a wrong or unreachable Redis, each in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict
from typing import Any

import orjson

from gateway.cache.shadow import decoded, render, report

DEFAULT_PREFIX = "kvgate:cache:"


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `shadow-report` to the `kvgate cache` actions."""
    text = "precision per similarity band of the semantic hits shadow mode recorded"
    sub = actions.add_parser("shadow-report", help=text, description=text)
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("--redis", metavar="URL", help="the cache's Redis")
    where.add_argument("--gateway", metavar="URL",
                       help="a running gateway (its /admin/cache/shadow), any store")
    sub.add_argument("--prefix", default=DEFAULT_PREFIX,
                     help=f"the gateways' cache.key_prefix (default {DEFAULT_PREFIX})")
    sub.add_argument("--json", action="store_true", help="the bands as JSON lines")
    sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        records = asyncio.run(_records(args))
    except Exception as exc:  # the store or the gateway did not answer
        where = args.redis or args.gateway
        print(f"kvgate cache shadow-report: cannot read {where}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2 if args.redis else 1
    rows = report(records)
    if args.json:
        for band in rows:
            sys.stdout.write(orjson.dumps({**asdict(band), "precision": band.precision}
                                          ).decode() + "\n")
    else:
        sys.stdout.write(render(rows))
    return 0


async def _records(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.gateway:
        import aiohttp

        async with aiohttp.ClientSession() as http, \
                http.get(args.gateway.rstrip("/") + "/admin/cache/shadow") as resp:
            resp.raise_for_status()
            body = orjson.loads(await resp.read())
        return [record for record in body.get("records", []) if isinstance(record, dict)]
    from gateway.cache.redis_store import RedisStore

    store = RedisStore.from_url(args.redis, prefix=args.prefix, ttl_s=None)
    try:
        raw = await store.shadow_records()
    finally:
        await store.close()
    return [record for record in map(decoded, raw) if record is not None]
