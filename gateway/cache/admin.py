"""`kvgate cache`: the response cache's admin commands, straight against its Redis.

    kvgate cache stats  --redis URL [--json]
    kvgate cache ls     --redis URL [--limit N] [--json]
    kvgate cache show   --redis URL ID
    kvgate cache rm     --redis URL ID [ID ...]
    kvgate cache flush  --redis URL --yes
    kvgate cache export --redis URL [FILE]          (JSON lines; stdout by default)
    kvgate cache import --redis URL FILE [--ttl S]  (FILE may be - for stdin)
    kvgate cache eval   [--data FILE] [--embedder NAME]  (gateway/cache/eval_cli.py; no Redis)
    kvgate cache shadow-report (--redis URL | --gateway URL)  (gateway/cache/shadow_cli.py)

An ID may be any unique prefix of at least 6 characters (`ls` shows 16). `--prefix` names the key
prefix the gateways were configured with (`cache.key_prefix`). Exit codes: 0 done, 1 an ID not
found, 2 bad usage or a wrong or unreachable Redis, each in one line (a malformed import line
names its line number, and then nothing is imported).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import sys
import time
from collections.abc import Callable, Coroutine, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import orjson

from gateway.cache import eval_cli, shadow_cli
from gateway.cache.answer import CachedAnswer
from gateway.cache.redis_store import RedisStore
from gateway.cache.store import Entry
from gateway.cache.vectors import decode_vector, encode_vector
from gateway.cli import UsageError

DEFAULT_PREFIX = "kvgate:cache:"
MIN_ID_PREFIX = 6
QUERY_WIDTH = 60


class NotFound(Exception):
    """An ID that matches no entry: exit code 1."""


def entry_json(entry: Entry) -> dict[str, Any]:
    """An entry as export writes it (and `show` prints it)."""
    return {
        "id": entry.id,
        "namespace": entry.namespace,
        "model": entry.model,
        "query": entry.query,
        "created": entry.created,
        "answer": orjson.loads(entry.answer),
        "vector": None if entry.vector is None
        else base64.b64encode(encode_vector(entry.vector)).decode(),
    }


def entry_from_json(line: str, number: int) -> Entry:
    """The entry of one export line; UsageError naming the line when it is not one."""
    try:
        data = orjson.loads(line)
        answer = orjson.dumps(data["answer"])
        CachedAnswer.from_bytes(answer)  # only replayable answers go in
        vector = data.get("vector")
        created = float(data["created"])
        if not math.isfinite(created):  # Redis refuses a NaN score: it would fail mid-import
            raise ValueError(f"created is not a finite number: {data['created']!r}")
        return Entry(
            id=_text(data["id"]), namespace=_text(data["namespace"]), model=_text(data["model"]),
            query=str(data.get("query") or ""), created=created, answer=answer,
            vector=None if vector is None else decode_vector(base64.b64decode(vector)))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"import line {number}: not a cache entry ({type(exc).__name__}: {exc})"
                         ) from exc


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


async def resolve(store: RedisStore, given: str) -> Entry:
    """The entry whose id is `given` or starts with it (a unique prefix)."""
    entry = await store.get(given)
    if entry is not None:
        return entry
    if len(given) < MIN_ID_PREFIX:
        raise UsageError(f"an ID prefix needs at least {MIN_ID_PREFIX} characters: {given!r}")
    matches = [e for e in await store.entries() if e.id.startswith(given)]
    if not matches:
        raise NotFound(f"no cache entry {given!r}")
    if len(matches) > 1:
        raise UsageError(f"{given!r} matches {len(matches)} entries; give more of the ID")
    return matches[0]


async def stats(store: RedisStore, args: argparse.Namespace, out: TextIO) -> None:
    counters = await store.counters()
    lookups = counters["exact"] + counters["semantic"] + counters["miss"]
    hits = counters["exact"] + counters["semantic"]
    report = {"entries": await store.count(), **counters,
              "hit_rate": round(hits / lookups, 4) if lookups else None}
    if args.json:
        out.write(orjson.dumps(report).decode() + "\n")
        return
    rate = "-" if report["hit_rate"] is None else f"{100 * hits / lookups:.1f}%"
    out.write(f"entries   {report['entries']}\n"
              f"lookups   {lookups}: {counters['exact']} exact, {counters['semantic']} semantic,"
              f" {counters['miss']} missed (hit rate {rate})\n"
              f"stored    {counters['store']}\n")


async def ls(store: RedisStore, args: argparse.Namespace, out: TextIO) -> None:
    entries = await store.entries(args.limit)
    if args.json:
        for entry in entries:
            row = {"id": entry.id, "model": entry.model, "query": entry.query,
                   "created": entry.created}
            out.write(orjson.dumps(row).decode() + "\n")
        return
    now = time.time()
    out.write(f"{'ID':16}  {'AGE':>7}  {'MODEL':24}  QUERY\n")
    for entry in entries:
        query = " ".join(entry.query.split())
        if len(query) > QUERY_WIDTH:
            query = query[:QUERY_WIDTH - 1] + "…"
        out.write(f"{entry.id[:16]:16}  {_age(now - entry.created):>7}  {entry.model[:24]:24}"
                  f"  {query or '-'}\n")


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


async def show(store: RedisStore, args: argparse.Namespace, out: TextIO) -> None:
    entry = await resolve(store, args.id)
    shown = entry_json(entry)
    shown["created"] = datetime.fromtimestamp(entry.created, UTC).isoformat()
    shown["vector"] = None if entry.vector is None else f"{len(entry.vector)} entries"
    out.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode() + "\n")


async def rm(store: RedisStore, args: argparse.Namespace, out: TextIO) -> None:
    entries = [await resolve(store, given) for given in args.ids]
    removed = 0  # what was deleted: two IDs may name one entry
    for entry in entries:
        removed += await store.delete(entry.id)
    out.write(f"removed {_entries(removed)}\n")


async def flush(store: RedisStore, args: argparse.Namespace, out: TextIO) -> None:
    if not args.yes:
        raise UsageError("flush removes every cache entry under the prefix: add --yes")
    out.write(f"removed {_entries(await store.flush())}\n")


async def export(store: RedisStore, args: argparse.Namespace, out: TextIO) -> None:
    entries = await store.entries()
    lines = (orjson.dumps(entry_json(entry)).decode() + "\n" for entry in entries)
    if args.file is None or args.file == "-":
        out.writelines(lines)
        return
    try:
        with Path(args.file).open("w", encoding="utf-8") as file:
            file.writelines(lines)
    except OSError as exc:  # not a Redis failure: _run would report it as one
        raise UsageError(f"cannot write {args.file}: {exc.strerror or exc}") from exc
    out.write(f"exported {len(entries)} entries to {args.file}\n")


async def import_(store: RedisStore, args: argparse.Namespace, out: TextIO) -> None:
    """Every line is checked before anything is written. An entry created longer than --ttl ago
    has outlived its lifetime: it is skipped, not revived (the listing drops such ids too)."""
    entries = list(_read_entries(args.file))
    oldest = time.time() - args.ttl
    fresh = [entry for entry in entries if entry.created >= oldest]
    for entry in fresh:
        await store.put(entry)
    skipped = len(entries) - len(fresh)
    note = f"; skipped {skipped} created over --ttl ({args.ttl:g} s) ago" if skipped else ""
    out.write(f"imported {_entries(len(fresh))}{note}\n")


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"


def _read_entries(name: str) -> Iterable[Entry]:
    if name == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from exc
    return [entry_from_json(line, number)
            for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


Action = Callable[[RedisStore, argparse.Namespace, TextIO], Coroutine[Any, Any, None]]
ACTIONS: dict[str, tuple[Action, str]] = {
    "stats": (stats, "entries, lookups by result and the hit rate"),
    "ls": (ls, "the newest entries"),
    "show": (show, "one entry, whole"),
    "rm": (rm, "remove entries"),
    "flush": (flush, "remove every entry and the counters"),
    "export": (export, "every entry as JSON lines"),
    "import": (import_, "entries from JSON lines (an export)"),
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cache", help="inspect and manage the response cache in Redis",
        description="The response cache's admin commands, straight against its Redis.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, (_, text) in ACTIONS.items():
        sub = actions.add_parser(name, help=text, description=text)
        sub.add_argument("--redis", required=True, metavar="URL",
                         help="the cache's Redis, e.g. redis://127.0.0.1:6379/0")
        sub.add_argument("--prefix", default=DEFAULT_PREFIX,
                         help=f"the gateways' cache.key_prefix (default {DEFAULT_PREFIX})")
        if name in ("stats", "ls"):
            sub.add_argument("--json", action="store_true", help="JSON lines")
        if name == "ls":
            sub.add_argument("--limit", type=int, default=50, help="entries (default 50)")
        if name == "show":
            sub.add_argument("id", metavar="ID")
        if name == "rm":
            sub.add_argument("ids", nargs="+", metavar="ID")
        if name == "flush":
            sub.add_argument("--yes", action="store_true", help="really remove everything")
        if name == "export":
            sub.add_argument("file", nargs="?", metavar="FILE", help="default: stdout")
        if name == "import":
            sub.add_argument("file", metavar="FILE", help="an export's JSON lines; - for stdin")
            sub.add_argument("--ttl", type=float, default=3600.0, metavar="S",
                             help="lifetime of the imported entries (default 3600 s)")
    eval_cli.register(actions)  # no Redis: the embedder and guard on labelled pairs
    shadow_cli.register(actions)  # Redis or a running gateway
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    action, _ = ACTIONS[args.action]
    if getattr(args, "limit", 1) < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    ttl = getattr(args, "ttl", None)
    if ttl is not None and not ttl > 0:
        raise UsageError(f"--ttl must be > 0, got {ttl}")
    return asyncio.run(_run(action, args, ttl))


async def _run(action: Action, args: argparse.Namespace, ttl: float | None) -> int:
    import redis.exceptions

    try:
        store = RedisStore.from_url(args.redis, prefix=args.prefix, ttl_s=ttl)
    except ValueError as exc:
        raise UsageError(f"--redis {args.redis!r}: {exc}") from exc
    try:
        await action(store, args, sys.stdout)
    except NotFound as exc:
        print(f"kvgate cache {args.action}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `kvgate cache export | head`: the reader has what it wanted
        return 0
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        print(f"kvgate cache {args.action}: cannot reach Redis at {args.redis}: {exc}",
              file=sys.stderr)
        return 2
    except redis.exceptions.RedisError as exc:  # something answers there, but not as Redis
        print(f"kvgate cache {args.action}: the server at {args.redis} does not answer as Redis "
              f"does: {exc}", file=sys.stderr)
        return 2
    finally:
        await store.close()
    return 0
