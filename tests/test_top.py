"""`kvgate top`: Prometheus text parsing, last-minute percentiles from successive histogram
scrapes, the figures it shows, and `kvgate top --once` against a live gateway under load."""

from __future__ import annotations

import asyncio
import math
import re
import sys
from collections.abc import AsyncIterator

import aiohttp
import aiohttp.web
import pytest
from rich.console import Console

from gateway.config import Settings
from gateway.serve import running_gateway
from gateway.telemetry import RequestOutcome, RequestTiming, Telemetry, TelemetrySettings
from gateway.top import Frame, kv_bar, render
from gateway.topstats import (
    EMPTY,
    Histogram,
    Sample,
    Scrape,
    ScrapeWindow,
    histogram_delta,
    parse_exposition,
    quantile,
    scrape_of,
)
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.mark.parametrize(
    ("line", "sample"),
    [
        pytest.param("up 1", Sample("up", {}, 1.0), id="no labels"),
        pytest.param('a_total{b="x",c="y"} 2.5', Sample("a_total", {"b": "x", "c": "y"}, 2.5),
                     id="labels"),
        pytest.param(r'a{b="say \"hi\"\\n",c="line\nbreak"} 3',
                     Sample("a", {"b": 'say "hi"\\n', "c": "line\nbreak"}, 3.0),
                     id="escaped quote, backslash and newline"),
        pytest.param('h_bucket{le="+Inf"} 7', Sample("h_bucket", {"le": "+Inf"}, 7.0),
                     id="+Inf label"),
        pytest.param("g -Inf 1700000000", Sample("g", {}, -math.inf), id="timestamp ignored"),
    ],
)
def test_exposition_lines_parse_to_samples(line: str, sample: Sample) -> None:
    assert parse_exposition(line) == [sample]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("# HELP x y\n# TYPE x counter\n\n", id="comments and blanks"),
        pytest.param('x{a="1" 2', id="unclosed braces"),
        pytest.param("x notanumber", id="bad value"),
        pytest.param("lonely", id="no value"),
    ],
)
def test_comments_and_malformed_lines_are_skipped(text: str) -> None:
    assert parse_exposition(text) == []


def hist(*buckets: tuple[float, float], total: float = 1.0) -> Histogram:
    return Histogram(tuple(buckets), buckets[-1][1], total)


TEN = hist((0.1, 0.0), (0.2, 10.0), (0.5, 10.0), (math.inf, 10.0))


@pytest.mark.parametrize(
    ("q", "h", "expected"),
    [
        pytest.param(0.5, TEN, 0.15, id="linear inside the bucket holding the rank"),
        pytest.param(0.99, TEN, 0.199, id="high quantile in the same bucket"),
        pytest.param(0.5, hist((0.1, 4.0), (math.inf, 4.0)), 0.05,
                     id="first bucket interpolates from zero"),
        pytest.param(0.9, hist((0.1, 1.0), (1.0, 1.0), (math.inf, 10.0)), 1.0,
                     id="a rank in +Inf reads as the highest finite bound"),
        pytest.param(0.5, hist((0.1, 0.0), (math.inf, 0.0)), None, id="no observations"),
        pytest.param(0.5, hist((0.001, 9.0), (math.inf, 9.0), total=0.0), 0.0,
                     id="observations summing to 0 were all 0, not half a bucket"),
        pytest.param(0.5, EMPTY, None, id="no buckets"),
    ],
)
def test_quantiles_read_from_buckets_like_histogram_quantile(
    q: float, h: Histogram, expected: float | None
) -> None:
    result = quantile(q, h)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


def test_the_window_histogram_is_the_bucket_difference_between_two_scrapes() -> None:
    old = Histogram(((0.1, 5.0), (1.0, 8.0), (math.inf, 8.0)), 8.0, 2.0)
    new = Histogram(((0.1, 5.0), (1.0, 18.0), (math.inf, 20.0)), 20.0, 12.0)
    delta = histogram_delta(new, old)
    assert delta == Histogram(((0.1, 0.0), (1.0, 10.0), (math.inf, 12.0)), 12.0, 10.0)
    # The old requests were all fast; the last minute's were not.
    assert quantile(0.5, new) == pytest.approx(0.1 + 0.9 * 5.0 / 13.0)
    assert quantile(0.5, delta) == pytest.approx(0.1 + 0.9 * 6.0 / 10.0)


def test_a_histogram_that_went_down_means_a_restart_and_is_taken_whole() -> None:
    old = Histogram(((1.0, 50.0), (math.inf, 50.0)), 50.0, 9.0)
    new = Histogram(((1.0, 3.0), (math.inf, 3.0)), 3.0, 1.0)
    assert histogram_delta(new, old) == new


def scrape(at: float, requests: float) -> Scrape:
    return Scrape(at, EMPTY, EMPTY, EMPTY, requests, 0.0, 0.0, 0.0, 0.0, None)


def test_the_window_spans_at_most_the_last_minute() -> None:
    window = ScrapeWindow(60.0)
    first = window.add(scrape(0.0, 0.0))
    assert first.seconds is None and first.requests == 0.0  # one scrape: since start
    for t in range(1, 100):
        stats = window.add(scrape(float(t), float(t * 2)))
    assert stats.seconds == 60.0
    assert stats.requests == 120.0  # two per second over the last 60 s


def recorded(telemetry: Telemetry, **fields: object) -> None:
    timing = RequestTiming(arrival=0.0, dispatch=0.01, first_byte=0.2, end=1.0)
    base: dict[str, object] = dict(request_id="r", operation="chat", request_model=MODEL,
                                   status=200, stream=True, input_tokens=10, output_tokens=9)
    telemetry.request_finished(timing, RequestOutcome(**{**base, **fields}))  # type: ignore[arg-type]


def test_hit_rate_and_small_model_share_come_from_the_gateways_own_counters() -> None:
    telemetry = Telemetry(TelemetrySettings(access_log_sample_rate=0.0))
    try:
        for cache, small in [("exact", None), ("semantic", None), ("miss", True),
                             ("miss", False), ("miss", False), ("bypass", None)]:
            recorded(telemetry, cache=cache, small_model=small)
        stats = ScrapeWindow().add(scrape_of(parse_exposition(
            telemetry.render_prometheus().decode()), at=1.0))
    finally:
        telemetry.shutdown()
    assert stats.requests == 6
    assert stats.cache_hit_rate == pytest.approx(2 / 5)  # "bypass" never looked
    assert stats.small_model_share == pytest.approx(1 / 3)
    assert stats.ttft.count == 6 and quantile(0.5, stats.ttft) == pytest.approx(0.175)


def test_refusals_are_counted_by_reason_over_the_window() -> None:
    telemetry = Telemetry(TelemetrySettings(access_log_sample_rate=0.0))
    refuse = {"status": 429, "admission": "rejected", "output_tokens": None}
    try:
        recorded(telemetry, **refuse, rejection_reason="over_slo")
        recorded(telemetry)  # admitted: not a refusal
        first = scrape_of(parse_exposition(telemetry.render_prometheus().decode()), at=1.0)
        recorded(telemetry, **refuse, rejection_reason="over_slo")
        recorded(telemetry, **refuse, rejection_reason="over_slo")
        recorded(telemetry, **{**refuse, "status": 503}, rejection_reason="queue_timeout")
        window = ScrapeWindow()
        window.add(first)
        stats = window.add(scrape_of(parse_exposition(
            telemetry.render_prometheus().decode()), at=2.0))
    finally:
        telemetry.shutdown()
    assert dict(first.refused) == {"over_slo": 1}
    assert dict(stats.refused) == {"over_slo": 2, "queue_timeout": 1}  # this window's alone
    assert "refused 3 (over_slo 2, queue_timeout 1)" in text_of(Frame("http://gw", (), stats))


def text_of(frame: Frame, width: int = 120) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render(frame))
    console.file.close()
    return console.export_text()


@pytest.mark.parametrize(
    ("usage", "bar"),
    [
        pytest.param(0.0, "░" * 24, id="empty"),
        pytest.param(0.5, "█" * 12 + "░" * 12, id="half"),
        pytest.param(1.0, "█" * 24, id="full"),
        pytest.param(None, "???", id="not reported"),
    ],
)
def test_the_kv_bar_is_proportional_to_usage(usage: float | None, bar: str) -> None:
    console = Console(width=40, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(kv_bar(usage))
    console.file.close()
    assert console.export_text().strip() == bar


def test_a_frame_shows_every_backend_and_marks_the_unhealthy_and_unscraped() -> None:
    rows = [
        {"id": "b0", "healthy": True, "kv_usage": 0.25, "kv_free_blocks": 75, "running": 3,
         "waiting": 1, "inflight": 4, "last_poll_age_ms": 80.0, "stale": False,
         "speed_scale": 3.617, "speed_replies": 29},
        {"id": "b1", "healthy": False, "kv_usage": None, "kv_free_blocks": None,
         "running": None, "waiting": None, "inflight": 0, "last_poll_age_ms": None,
         "stale": True},
    ]
    stats = ScrapeWindow().add(scrape(0.0, 0.0))
    text = text_of(Frame("http://gw", rows, stats))
    b0 = next(line for line in text.splitlines() if " b0 " in line)
    b1 = next(line for line in text.splitlines() if " b1 " in line)
    assert "up" in b0 and "█" * 6 + "░" * 18 in b0 and "25.0%" in b0 and "80 ms ago" in b0
    assert "3.62x/29" in b0  # the learned speed, over the replies it rests on
    assert "down stale" in b1 and "never" in b1
    assert "since the gateway started" in text


def test_an_unreadable_gateway_shows_the_error() -> None:
    text = text_of(Frame("http://gw", (), None, "cannot read http://gw: ConnectError"))
    assert "cannot read http://gw: ConnectError" in text


async def top_once(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "top", "--once", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, ANSI.sub("", out.decode()), err.decode()


@pytest.fixture
async def loaded_gateway() -> AsyncIterator[tuple[str, int]]:
    """A gateway over two small simulators that has served a few streamed requests."""
    async with running_sim(time_scale=50, seed=1, num_gpu_blocks=200) as a, \
            running_sim(time_scale=50, seed=2, num_gpu_blocks=200) as b:
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": a, "id": "sim0"}, {"url": b, "id": "sim1"}],
            "telemetry": {"access_log_sample_rate": 0.0},
        })
        async with running_gateway(settings) as url, aiohttp.ClientSession() as http:
            async def one(i: int) -> None:
                body = {"model": MODEL, "max_tokens": 8, "stream": True,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": f"question {i}"}]}
                async with http.post(url + "/v1/chat/completions", json=body) as response:
                    assert response.status == 200
                    await response.read()

            count = 12
            await asyncio.gather(*(one(i) for i in range(count)))
            yield url, count


async def test_top_once_renders_the_fleet_and_the_request_figures(
    loaded_gateway: tuple[str, int],
) -> None:
    url, count = loaded_gateway
    code, out, err = await top_once("--url", url, "--width", "120", "--color", "always")
    assert code == 0, err
    lines = out.splitlines()
    assert all(len(line) <= 120 for line in lines)
    assert f"kvgate top {url}" in lines[0]
    assert f"requests {count}" in out and "queue 0 waiting" in out
    ttft = next(line for line in lines if "TTFT" in line)
    assert ttft.split()[-1] == str(count)  # the count column: every streamed request
    assert re.search(r"TTFT\s+│\s+\d+(\.\d)? ms", ttft)
    for backend in ("sim0", "sim1"):
        row = next(line for line in lines if f" {backend} " in line)
        assert " up " in row and "ago" in row and ("░" in row or "█" in row)


async def test_piped_without_a_width_no_column_is_cut(loaded_gateway: tuple[str, int]) -> None:
    url, _ = loaded_gateway
    code, out, err = await top_once("--url", url)  # stdout is a pipe, not a terminal
    assert code == 0, err
    assert "…" not in out  # rich marks a cut cell with an ellipsis
    assert f"kvgate top {url}" in out.splitlines()[0]


async def test_top_once_waits_for_a_gateway_slower_than_its_refresh_period(
    loaded_gateway: tuple[str, int],
) -> None:
    """One frame alone waits for a busy gateway: every answer here comes 1.5 s late, past the
    live view's 1 s per read."""
    url, _ = loaded_gateway
    async with aiohttp.ClientSession() as http:
        async def late(request: aiohttp.web.Request) -> aiohttp.web.Response:
            await asyncio.sleep(1.5)
            async with http.get(url + request.path_qs) as upstream:
                return aiohttp.web.Response(body=await upstream.read(), status=upstream.status,
                                            content_type=upstream.content_type)

        app = aiohttp.web.Application()
        app.router.add_get("/{path:.*}", late)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            code, out, err = await top_once("--url", f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()
    assert code == 0, err
    assert "sim0" in out and "sim1" in out


async def test_top_once_fails_with_one_line_when_the_gateway_is_unreachable() -> None:
    async with running_sim(time_scale=50) as sim:  # a live port that is not a gateway
        code, out, err = await top_once("--url", sim)
    assert code == 1 and out == ""
    assert err.startswith(f"kvgate top: cannot read {sim}") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--interval", "0"], "--interval must be > 0", id="interval"),
        pytest.param(["--width", "10"], "--width must be at least 40", id="width"),
    ],
)
async def test_bad_options_exit_2_naming_the_option(args: list[str], message: str) -> None:
    code, _, err = await top_once("--url", "http://127.0.0.1:9", *args)
    assert code == 2 and message in err


def test_each_alias_shows_its_classifier_scores_by_band_over_the_window() -> None:
    telemetry = Telemetry(TelemetrySettings(access_log_sample_rate=0.0))
    try:
        telemetry.small_model_scored("auto", "hard", 0.97)  # before the window
        first = scrape_of(parse_exposition(telemetry.render_prometheus().decode()), at=1.0)
        for alias, verdict, value in [("auto", "easy", 0.03), ("auto", "easy", 0.15),
                                      ("auto", "easy", 0.45), ("auto", "hard", 0.91),
                                      ("strict", "hard", 0.3)]:
            telemetry.small_model_scored(alias, verdict, value)
        window = ScrapeWindow()
        window.add(first)
        stats = window.add(scrape_of(parse_exposition(
            telemetry.render_prometheus().decode()), at=2.0))
    finally:
        telemetry.shutdown()
    auto, strict = stats.scores["auto"], stats.scores["strict"]
    assert auto.bands == (2.0, 0.0, 1.0, 0.0, 1.0) and auto.scored == 4
    assert auto.easy_share == pytest.approx(0.75)
    assert strict.bands == (0.0, 1.0, 0.0, 0.0, 0.0) and strict.easy_share == 0.0
    text = text_of(Frame("http://gw", (), stats))
    assert "small-model scores" in text and "0.2–0.4" in text and "≥0.8" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("auto"))
    cells = [cell for cell in row.split() if cell != "│"]
    assert cells[1:] == ["4", "2", "0", "1", "0", "1", "75.0%"]


def test_no_small_model_alias_no_score_table() -> None:
    stats = ScrapeWindow().add(scrape(0.0, 0.0))
    assert not stats.scores
    assert "small-model scores" not in text_of(Frame("http://gw", (), stats))
