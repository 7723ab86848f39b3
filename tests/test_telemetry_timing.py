"""RequestTiming: TTFT counts from arrival with the queue inside; its parts; server-timing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.telemetry import RequestTiming, server_timing


def queued_miss() -> RequestTiming:
    """Arrival at 100 s; 0.4 ms cache, 12.3 ms queue, 0.1 ms route, 85 ms upstream."""
    return RequestTiming(
        arrival=100.0,
        cache_start=100.0002,
        cache_end=100.0006,
        queue_start=100.0007,
        queue_end=100.0130,
        route_start=100.0130,
        route_end=100.0131,
        dispatch=100.0132,
        first_byte=100.0982,
        end=101.0982,
    )


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        pytest.param(
            queued_miss(),
            {"queue": 12.3, "cache": 0.4, "route": 0.1, "connect": None, "upstream": 85.0,
             "ttft": 98.2, "duration": 1098.2},
            id="queued miss: TTFT counts from arrival and holds the queue",
        ),
        pytest.param(
            RequestTiming(arrival=5.0, dispatch=5.001, connected=5.004, first_byte=5.050, end=5.5),
            {"queue": None, "cache": None, "route": None, "connect": 3.0, "upstream": 46.0,
             "ttft": 50.0, "duration": 500.0},
            id="with a connect mark, upstream starts at the connection",
        ),
        pytest.param(
            RequestTiming(arrival=1.0, cache_start=1.0, cache_end=1.002, first_byte=1.003,
                          end=1.004),
            {"queue": None, "cache": 2.0, "route": None, "connect": None, "upstream": None,
             "ttft": 3.0, "duration": 4.0},
            id="cache hit: no upstream part, TTFT still from arrival",
        ),
        pytest.param(
            RequestTiming(arrival=1.0, queue_start=1.001, queue_end=1.501, end=1.502),
            {"queue": 500.0, "cache": None, "route": None, "connect": None, "upstream": None,
             "ttft": None, "duration": 502.0},
            id="rejected after waiting: a queue figure, no TTFT",
        ),
    ],
)  # fmt: skip
def test_derived_figures(timing: RequestTiming, expected: dict[str, float | None]) -> None:
    got = {
        "queue": timing.queue_s,
        "cache": timing.cache_s,
        "route": timing.route_s,
        "connect": timing.connect_s,
        "upstream": timing.upstream_s,
        "ttft": timing.ttft_s,
        "duration": timing.duration_s,
    }
    for name, want in expected.items():
        value = got[name]
        if want is None:
            assert value is None, name
        else:
            assert value is not None and math.isclose(value * 1000, want, abs_tol=1e-6), name


@pytest.mark.parametrize(
    ("output_tokens", "expected"),
    [
        pytest.param(None, None, id="unknown token count gives no TPOT"),
        pytest.param(1, None, id="one token has no inter-token time"),
        pytest.param(2, 1.0, id="two tokens: the whole decode time"),
        pytest.param(11, 0.1, id="eleven tokens: decode time over ten gaps"),
    ],
)
def test_tpot_is_decode_time_over_tokens_after_the_first(
    output_tokens: int | None, expected: float | None
) -> None:
    timing = RequestTiming(arrival=0.0, first_byte=0.5, end=1.5)
    tpot = timing.tpot_s(output_tokens)
    if expected is None:
        assert tpot is None
    else:
        assert tpot is not None and math.isclose(tpot, expected)


def test_tpot_needs_both_first_byte_and_end() -> None:
    assert RequestTiming(arrival=0.0, first_byte=0.5).tpot_s(10) is None


@st.composite
def ordered_timings(draw: st.DrawFn) -> RequestTiming:
    """Marks in path order with arbitrary gaps, some phases skipped."""
    gaps = draw(st.lists(st.floats(0.0, 5.0), min_size=10, max_size=10))
    marks = [100.0]
    for gap in gaps:
        marks.append(marks[-1] + gap)
    cache, queue, route, connect = (draw(st.booleans()) for _ in range(4))
    return RequestTiming(
        arrival=marks[0],
        cache_start=marks[1] if cache else None,
        cache_end=marks[2] if cache else None,
        queue_start=marks[3] if queue else None,
        queue_end=marks[4] if queue else None,
        route_start=marks[5] if route else None,
        route_end=marks[6] if route else None,
        dispatch=marks[7],
        connected=marks[8] if connect else None,
        first_byte=marks[9],
        end=marks[10],
    )


@given(ordered_timings())
def test_ttft_is_at_least_the_queue_and_its_parts_add_up(timing: RequestTiming) -> None:
    ttft = timing.ttft_s
    gateway = timing.gateway_s
    assert ttft is not None and gateway is not None and gateway >= 0.0
    if timing.queue_s is not None:
        assert ttft >= timing.queue_s
    parts = [timing.cache_s, timing.queue_s, timing.route_s, timing.connect_s, timing.upstream_s]
    assert math.isclose(sum(p for p in parts if p is not None) + gateway, ttft, abs_tol=1e-6)
    duration = timing.duration_s
    assert duration is not None and duration >= ttft


def test_server_timing_lists_the_parts_in_path_order_in_milliseconds() -> None:
    assert server_timing(queued_miss()) == (
        "queue;dur=12.3, cache;dur=0.4, route;dur=0.1, upstream;dur=85.0, gateway;dur=0.4,"
        " ttft;dur=98.2, total;dur=1098.2"
    )


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        pytest.param(RequestTiming(arrival=1.0), "", id="nothing known yet gives an empty value"),
        pytest.param(
            RequestTiming(arrival=1.0, dispatch=1.01, first_byte=1.05),
            "upstream;dur=40.0, gateway;dur=10.0, ttft;dur=50.0",
            id="before the end: no total, unset phases left out",
        ),
        pytest.param(
            RequestTiming(arrival=1.0, queue_start=1.0, queue_end=1.2, end=1.25),
            "queue;dur=200.0, total;dur=250.0",
            id="rejected: queue and total only",
        ),
    ],
)
def test_server_timing_leaves_out_unknown_parts(timing: RequestTiming, expected: str) -> None:
    assert server_timing(timing) == expected
