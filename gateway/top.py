"""`kvgate top`: a live terminal view of a running gateway.

    kvgate top [--url http://127.0.0.1:8000] [--interval 1] [--once] [--admin-key KEY]
               [--width COLUMNS] [--color auto|always|never]

Every `--interval` seconds it reads GET /admin/backends (each backend's KV usage, running and
waiting sequences, the gateway's in-flight count, its learned speed, the scrape's age) and
GET /metrics (the gateway queue; requests refused, by reason (`over_slo`, `queue_full`, ...);
TTFT, TPOT and queue-time percentiles, cache hit rate and small-model share over the last
minute, and each small-model routing alias's classifier scores by band with the share it judged
easy, from the difference between scrapes: gateway/topstats.py). `--once` renders one frame,
whose figures cover everything since the gateway started, and exits: 0, or 1 when the gateway
cannot be read. Needs `rich` (the `top` extra), imported only here.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from gateway.cli import UsageError
from gateway.topstats import (
    SCORE_BANDS,
    AliasScores,
    ScrapeWindow,
    WindowStats,
    parse_exposition,
    quantile,
    scrape_of,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

DEFAULT_URL = "http://127.0.0.1:8000"
PIPED_WIDTH = 160  # columns when the output is not a terminal
ONCE_TIMEOUT_S = 10.0  # --once: how long each read of the gateway may take
WINDOW_S = 60.0
BAR_WIDTH = 24
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class Frame:
    """What one refresh shows."""

    url: str
    backends: Sequence[dict[str, Any]]
    stats: WindowStats | None
    error: str | None = None


class Unreadable(Exception):
    """The gateway answered, but not with what `top` reads."""


class Source:
    """Reads the gateway's admin view and metrics, and keeps the last minute of scrapes."""

    def __init__(
        self, client: httpx.Client, url: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._url = url.rstrip("/")
        self._clock = clock
        self._window = ScrapeWindow(WINDOW_S)

    def frame(self) -> Frame:
        try:
            admin = self._get("/admin/backends")
            metrics = self._get("/metrics")
            backends = admin.json()["backends"]
        except (httpx.HTTPError, Unreadable, ValueError, KeyError, TypeError) as exc:
            return Frame(self._url, (), None, f"cannot read {self._url}: {_describe(exc)}")
        stats = self._window.add(scrape_of(parse_exposition(metrics.text), self._clock()))
        return Frame(self._url, backends, stats)

    def _get(self, path: str) -> httpx.Response:
        response = self._client.get(self._url + path)
        status = response.status_code
        if status == 401:
            raise Unreadable(f"GET {path} answered 401: pass the admin key with --admin-key")
        if status != 200:
            raise Unreadable(f"GET {path} answered HTTP {status}")
        return response


def _describe(exc: BaseException) -> str:
    """One line: the first of the exception's text."""
    if isinstance(exc, Unreadable):
        return str(exc)
    text = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1.0:
        return f"{seconds * 1000.0:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000.0:.1f} ms"
    return f"{seconds:.2f} s"


def percent(fraction: float | None) -> str:
    return "–" if fraction is None else f"{fraction * 100.0:.1f}%"


def number(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.0f}"
    return str(value)


def speed(scale: object, replies: object) -> str:
    """The learned speed: step times as a multiple of the reference profile's, with the replies
    it rests on; "–" before any measurement."""
    if not isinstance(scale, int | float):
        return "–"
    return f"{scale:.2f}x/{replies}" if isinstance(replies, int) else f"{scale:.2f}x"


def render(frame: Frame) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    stats = frame.stats
    window = "since the gateway started"
    if stats is not None and stats.seconds is not None:
        window = f"last {stats.seconds:.0f} s"
    title = Text.assemble(
        ("kvgate top ", "bold"), frame.url, "  ·  ", window, "  ·  ", time.strftime("%H:%M:%S")
    )
    if frame.error is not None:
        return Group(title, Text(frame.error, style="bold red"))
    assert stats is not None
    parts = [title, _gateway_table(stats)]
    if stats.scores:
        parts.append(_scores_table(stats.scores))
    return Group(*parts, _backend_table(frame.backends))


def band_names() -> list[str]:
    """"<0.2", "0.2–0.4", ..., "≥0.8": the score bands' column names."""
    bounds = [f"{bound:g}" for bound in SCORE_BANDS]
    return ([f"<{bounds[0]}"] + [f"{a}–{b}" for a, b in zip(bounds, bounds[1:], strict=False)]
            + [f"≥{bounds[-1]}"])


def _scores_table(scores: Mapping[str, AliasScores]) -> RenderableType:
    from rich.table import Table

    table = Table(title="small-model scores (the probability a prompt is hard)",
                  title_justify="left", show_edge=False)
    table.add_column("alias")
    for name in ("scored", *band_names(), "scored easy"):
        table.add_column(name, justify="right")
    for alias in sorted(scores):
        figures = scores[alias]
        table.add_row(alias, number(figures.scored), *(number(n) for n in figures.bands),
                      percent(figures.easy_share))
    return table


def _gateway_table(stats: WindowStats) -> RenderableType:
    from rich.table import Table

    table = Table(title="gateway", title_justify="left", expand=False, show_edge=False)
    for name in ("", "p50", "p90", "p99", "count"):
        table.add_column(name, justify="left" if not name else "right")
    for name, hist in (("TTFT", stats.ttft), ("TPOT", stats.tpot), ("queue time", stats.queue)):
        table.add_row(
            name, *(duration(quantile(q, hist)) for q in QUANTILES), number(hist.count)
        )
    rate = ""
    if stats.seconds:
        rate = f" ({stats.requests / stats.seconds:.1f}/s)"
    summary = Table.grid(padding=(0, 3))
    summary.add_row(
        f"queue {number(stats.queue_depth)} waiting",
        f"requests {number(stats.requests)}{rate}",
        f"refused {refused(stats.refused)}",
        f"cache hit rate {percent(stats.cache_hit_rate)}",
        f"small-model share {percent(stats.small_model_share)}",
    )
    outer = Table.grid()
    outer.add_row(summary)
    outer.add_row(table)
    return outer


def refused(by_reason: Mapping[str, float]) -> str:
    """Requests refused in the window, with the reasons, most first: "12 (over_slo 11,
    queue_full 1)"; "0" when none."""
    total = sum(by_reason.values())
    if not total:
        return "0"
    reasons = ", ".join(f"{reason} {number(n)}" for reason, n in
                        sorted(by_reason.items(), key=lambda rn: (-rn[1], rn[0])))
    return f"{number(total)} ({reasons})"


def kv_bar(usage: float | None, width: int = BAR_WIDTH) -> RenderableType:
    from rich.text import Text

    if usage is None:
        return Text("?" * 3, style="dim")
    filled = round(min(max(usage, 0.0), 1.0) * width)
    style = "green" if usage < 0.7 else "yellow" if usage < 0.9 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def _backend_table(rows: Sequence[dict[str, Any]]) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="backends", title_justify="left", show_edge=False)
    table.add_column("backend")
    table.add_column("health")
    table.add_column("KV cache")
    for name in ("KV", "free", "running", "waiting", "inflight", "speed", "scraped"):
        table.add_column(name, justify="right")
    for row in rows:
        healthy = bool(row.get("healthy"))
        health = Text("up" if healthy else "down", style="green" if healthy else "bold red")
        if row.get("stale"):
            health.append(" stale", style="yellow")
        age = row.get("last_poll_age_ms")
        table.add_row(
            str(row.get("id")),
            health,
            kv_bar(row.get("kv_usage")),
            percent(row.get("kv_usage")),
            number(row.get("kv_free_blocks")),
            number(row.get("running")),
            number(row.get("waiting")),
            number(row.get("inflight")),
            speed(row.get("speed_scale"), row.get("speed_replies")),
            duration(age / 1000.0) + " ago" if isinstance(age, int | float) else "never",
        )
    return table


def _console(args: argparse.Namespace) -> Console:
    try:
        from rich.console import Console
    except ImportError as exc:
        raise UsageError(
            "kvgate top needs the 'rich' package: pip install 'kvgate[top]'"
        ) from exc
    width = args.width
    if width is None and not sys.stdout.isatty():
        width = PIPED_WIDTH  # piped: every column whole, not the 80 a pipe would be given
    return Console(
        width=width,
        force_terminal=True if args.color == "always" else None,
        no_color=args.color == "never",
        highlight=False,
    )


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0, got {args.interval}")
    if args.width is not None and args.width < 40:
        raise UsageError(f"--width must be at least 40, got {args.width}")
    console = _console(args)
    headers = {"Authorization": f"Bearer {args.admin_key}"} if args.admin_key else {}
    # Live, a read may take one refresh period (the next frame is due then); one frame alone
    # waits longer for a busy gateway.
    timeout = ONCE_TIMEOUT_S if args.once else max(args.interval, 1.0)
    with httpx.Client(headers=headers, timeout=timeout) as client:
        source = Source(client, args.url)
        if args.once:
            frame = source.frame()
            if frame.error is not None:
                print(f"kvgate top: {frame.error}", file=sys.stderr)
                return 1
            console.print(render(frame))
            return 0
        return _live(console, source, args.interval)


def _live(console: Console, source: Source, interval: float) -> int:
    from rich.live import Live

    with Live(console=console, auto_refresh=False, screen=False) as live:
        while True:  # until Ctrl-C (the CLI turns KeyboardInterrupt into exit code 0)
            started = time.monotonic()
            live.update(render(source.frame()), refresh=True)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of a running gateway",
        description="Every backend's KV cache, running and waiting sequences, the gateway queue, "
        "TTFT/TPOT percentiles over the last minute (with --once: since the gateway started), "
        "cache hit rate and small-model share.",
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the gateway (default {DEFAULT_URL})")
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="refresh period (default 1 s)"
    )
    parser.add_argument("--once", action="store_true", help="render one frame and exit")
    parser.add_argument("--admin-key", help="sent as a bearer token, when keys are configured")
    parser.add_argument("--width", type=int,
                        help=f"columns (default: the terminal's; {PIPED_WIDTH} when piped)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.set_defaults(func=run)
