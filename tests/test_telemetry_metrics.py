"""Metrics recorded per request, read back through /metrics' Prometheus text."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry import (
    BackendGauges,
    RequestOutcome,
    RequestTiming,
    Telemetry,
    TelemetrySettings,
)
from gateway.telemetry.labels import OTHER

Samples = list[tuple[str, dict[str, str], float]]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry(TelemetrySettings(access_log_sample_rate=0.0))
    yield t
    t.shutdown()


def scrape(telemetry: Telemetry) -> tuple[dict[str, str], Samples]:
    """Family types by name, and every sample, parsed with prometheus_client's parser."""
    types: dict[str, str] = {}
    samples: Samples = []
    for family in text_string_to_metric_families(telemetry.render_prometheus().decode()):
        types[family.name] = family.type
        samples.extend((s.name, dict(s.labels), s.value) for s in family.samples)
    return types, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for sample, sample_labels, value in samples
        if sample == name and labels.items() <= sample_labels.items()
    )


def timing(arrival: float, queue: float = 0.0, upstream: float = 0.05) -> RequestTiming:
    t = RequestTiming(arrival=arrival, cache_start=arrival, cache_end=arrival + 0.0005)
    t.queue_start = arrival + 0.001
    t.queue_end = t.queue_start + queue
    t.route_start = t.route_end = t.queue_end
    t.dispatch = t.queue_end + 0.0001
    t.first_byte = t.dispatch + upstream
    t.end = t.first_byte + 0.5
    return t


def outcome(**fields: object) -> RequestOutcome:
    base: dict[str, object] = dict(
        request_id="r", operation="chat", request_model="m", status=200, stream=True,
        response_model="m", backend="b0", policy="kv", cache="miss", input_tokens=30,
        output_tokens=11, admission="admitted",
    )  # fmt: skip
    base.update(fields)
    return RequestOutcome(**base)  # type: ignore[arg-type]


def test_histogram_counts_equal_the_number_of_recorded_requests(telemetry: Telemetry) -> None:
    rng = random.Random(7)
    streamed, plain, failed = rng.randint(20, 40), rng.randint(5, 15), rng.randint(1, 5)
    for i in range(streamed):
        telemetry.request_finished(timing(i, queue=rng.random()), outcome())
    for i in range(plain):
        telemetry.request_finished(timing(i), outcome(stream=False))
    for i in range(failed):
        telemetry.request_finished(timing(i), outcome(status=502, error_type="upstream_error"))
    _, samples = scrape(telemetry)
    assert total(samples, "gen_ai_server_time_to_first_token_seconds_count") == streamed
    assert total(samples, "gen_ai_server_time_per_output_token_seconds_count") == streamed
    assert total(samples, "gen_ai_server_request_duration_seconds_count") == (
        streamed + plain + failed
    )
    assert total(
        samples, "gen_ai_server_request_duration_seconds_count", error_type="upstream_error"
    ) == failed
    assert total(samples, "kvgate_queue_time_seconds_count") == streamed + plain + failed
    for token_type in ("input", "output"):
        assert total(
            samples, "gen_ai_client_token_usage_count", gen_ai_token_type=token_type
        ) == (streamed + plain + failed)


def test_ttft_sum_includes_the_queue_time_of_queued_requests(telemetry: Telemetry) -> None:
    waits = [0.2, 1.5, 3.0]
    for i, wait in enumerate(waits):
        telemetry.request_finished(timing(i, queue=wait), outcome(admission="queued"))
    _, samples = scrape(telemetry)
    ttft_sum = total(samples, "gen_ai_server_time_to_first_token_seconds_sum")
    queue_sum = total(samples, "kvgate_queue_time_seconds_sum", kvgate_admission_result="queued")
    assert queue_sum == pytest.approx(sum(waits))
    assert ttft_sum >= queue_sum + 3 * 0.05  # each TTFT also holds its 50 ms upstream
    # The 3 s wait lands past the 2.5 s bucket of the TTFT histogram: the queue is not hidden.
    assert total(samples, "gen_ai_server_time_to_first_token_seconds_bucket", le="2.5") == 2


def test_bucket_boundaries_follow_the_genai_conventions(telemetry: Telemetry) -> None:
    telemetry.request_finished(timing(0), outcome())
    _, samples = scrape(telemetry)

    def bounds(name: str) -> list[str]:
        return [
            labels["le"]
            for sample, labels, _ in samples
            if sample == name and labels.get("gen_ai_token_type", "input") == "input"
        ]

    assert bounds("gen_ai_server_time_to_first_token_seconds_bucket")[:4] == [
        "0.001", "0.005", "0.01", "0.02"]  # fmt: skip
    assert bounds("gen_ai_server_time_to_first_token_seconds_bucket")[-2:] == ["10.0", "+Inf"]
    assert bounds("gen_ai_server_time_per_output_token_seconds_bucket")[-2:] == ["2.5", "+Inf"]
    assert bounds("gen_ai_server_request_duration_seconds_bucket")[-2:] == ["81.92", "+Inf"]
    assert bounds("gen_ai_client_token_usage_bucket")[-2:] == ["67108864.0", "+Inf"]


@pytest.mark.parametrize(
    ("fields", "ttft_count", "duration_labels"),
    [
        pytest.param({"stream": False}, 0, {}, id="non-streamed: duration but no TTFT"),
        pytest.param({"status": 429, "admission": "rejected", "rejection_reason": "queue_full"},
                     0, {"error_type": "429"}, id="rejected: error.type is the status"),
        pytest.param({"error_type": "upstream_reset"}, 0, {"error_type": "upstream_reset"},
                     id="failed mid-stream: our error class, no TTFT"),
        pytest.param({}, 1, {"kvgate_backend": "b0", "kvgate_cache_result": "miss"},
                     id="success: backend and cache result on the histograms"),
    ],
)  # fmt: skip
def test_what_each_kind_of_request_records(
    telemetry: Telemetry,
    fields: dict[str, object],
    ttft_count: int,
    duration_labels: dict[str, str],
) -> None:
    telemetry.request_finished(timing(0), outcome(**fields))
    _, samples = scrape(telemetry)
    assert total(samples, "gen_ai_server_time_to_first_token_seconds_count") == ttft_count
    assert total(samples, "gen_ai_server_request_duration_seconds_count", **duration_labels) == 1


def test_admissions_and_rejections_are_counted_by_result_and_reason(telemetry: Telemetry) -> None:
    decisions: list[tuple[str, str | None]] = [
        ("admitted", None), ("admitted", None), ("admitted", None), ("queued", None),
        ("queued", None), ("rejected", "queue_full"), ("rejected", "queue_full"),
        ("rejected", "timeout"),
    ]  # fmt: skip
    for i, (result, reason) in enumerate(decisions):
        telemetry.request_finished(
            timing(i), outcome(admission=result, rejection_reason=reason)
        )
    telemetry.request_finished(timing(9), outcome(admission=None, cache="exact", backend=None))
    _, samples = scrape(telemetry)
    name = "kvgate_admission_decisions_total"
    assert total(samples, name, kvgate_admission_result="admitted") == 3
    assert total(samples, name, kvgate_admission_result="queued") == 2
    assert total(samples, name, kvgate_admission_reason="queue_full") == 2
    assert total(samples, name, kvgate_admission_reason="timeout") == 1
    assert total(samples, name) == len(decisions)


def test_routing_decisions_by_policy_and_backend(telemetry: Telemetry) -> None:
    for backend, policy in [("b0", "kv"), ("b1", "kv"), ("b1", "kv"), ("b0", "round_robin")]:
        telemetry.request_finished(timing(0), outcome(backend=backend, policy=policy))
    telemetry.request_finished(timing(0), outcome(backend=None, policy=None, cache="exact"))
    _, samples = scrape(telemetry)
    name = "kvgate_routing_decisions_total"
    assert total(samples, name, kvgate_backend="b1", kvgate_routing_policy="kv") == 2
    assert total(samples, name, kvgate_backend="b0", kvgate_routing_policy="kv") == 1
    assert total(samples, name, kvgate_routing_policy="round_robin") == 1
    assert total(samples, name) == 4


@pytest.mark.parametrize(
    ("cache", "lookups", "saved"),
    [
        pytest.param("exact", {("exact", "hit"): 1}, {"exact": 41},
                     id="exact hit: one lookup, its tokens saved"),
        pytest.param("semantic", {("exact", "miss"): 1, ("semantic", "hit"): 1},
                     {"semantic": 41}, id="semantic hit: exact missed first"),
        pytest.param("miss", {("exact", "miss"): 1, ("semantic", "miss"): 1}, {},
                     id="miss: every tier missed, nothing saved"),
        pytest.param("bypass", {}, {}, id="bypass: no lookup at all"),
    ],
)  # fmt: skip
def test_cache_lookups_by_tier_and_result(
    telemetry: Telemetry,
    cache: str,
    lookups: dict[tuple[str, str], int],
    saved: dict[str, int],
) -> None:
    telemetry.request_finished(timing(0), outcome(cache=cache, input_tokens=30, output_tokens=11))
    _, samples = scrape(telemetry)
    got = {
        (labels["kvgate_cache_tier"], labels["kvgate_cache_lookup"]): value
        for name, labels, value in samples
        if name == "kvgate_cache_lookups_total"
    }
    assert got == lookups
    got_saved = {
        labels["kvgate_cache_tier"]: value
        for name, labels, value in samples
        if name == "kvgate_cache_tokens_saved_total"
    }
    assert got_saved == saved


def test_small_model_routing_share_is_countable(telemetry: Telemetry) -> None:
    for choice in [True, True, True, False, None]:
        telemetry.request_finished(timing(0), outcome(small_model=choice))
    _, samples = scrape(telemetry)
    name = "kvgate_small_model_decisions_total"
    small = total(samples, name, kvgate_small_model_chosen="true")
    assert small / total(samples, name) == pytest.approx(0.75)


def test_label_values_are_bounded() -> None:
    telemetry = Telemetry(TelemetrySettings(max_label_values=3, access_log_sample_rate=0.0))
    try:
        for i in range(10):
            telemetry.request_finished(timing(i), outcome(request_model=f"model-{i}"))
        telemetry.request_finished(timing(0), outcome(request_model="model-0"))
        _, samples = scrape(telemetry)
    finally:
        telemetry.shutdown()
    models = {
        labels["gen_ai_request_model"]
        for name, labels, _ in samples
        if name == "gen_ai_server_request_duration_seconds_count"
    }
    assert models == {"model-0", "model-1", "model-2", OTHER}
    name = "gen_ai_server_request_duration_seconds_count"
    assert total(samples, name, gen_ai_request_model="model-0") == 2
    assert total(samples, name, gen_ai_request_model=OTHER) == 7


def test_overlong_label_values_read_as_other(telemetry: Telemetry) -> None:
    telemetry.request_finished(timing(0), outcome(request_model="x" * 500))
    _, samples = scrape(telemetry)
    assert total(
        samples, "gen_ai_server_request_duration_seconds_count", gen_ai_request_model=OTHER
    ) == 1


def test_request_ids_and_prompts_never_become_labels(telemetry: Telemetry) -> None:
    telemetry.request_finished(
        timing(0), outcome(request_id="req-123", tenant="acme", prompt="secret prompt")
    )
    text = telemetry.render_prometheus().decode()
    assert "req-123" not in text and "acme" not in text and "secret prompt" not in text


def test_backend_gauges_come_from_the_registered_callback(telemetry: Telemetry) -> None:
    _, before = scrape(telemetry)
    assert not [name for name, _, _ in before if name.startswith("kvgate_backend_")]
    telemetry.register_backend_gauges(lambda: [
        BackendGauges("b0", healthy=True, kv_usage=0.25, kv_free_blocks=1204, running=37,
                      waiting=2, poll_age_s=0.084, inflight=39, reserved_blocks=310),
        BackendGauges("b1", healthy=False),
    ])  # fmt: skip
    types, samples = scrape(telemetry)
    expected = {
        "kvgate_backend_healthy": {"b0": 1.0, "b1": 0.0},
        "kvgate_backend_kv_usage_ratio": {"b0": 0.25},
        "kvgate_backend_kv_free_blocks": {"b0": 1204},
        "kvgate_backend_running": {"b0": 37},
        "kvgate_backend_waiting": {"b0": 2},
        "kvgate_backend_poll_age_seconds": {"b0": 0.084},
        "kvgate_backend_inflight": {"b0": 39},
        "kvgate_backend_reserved_blocks": {"b0": 310},
    }
    for family, by_backend in expected.items():
        assert types[family] == "gauge"
        got = {labels["kvgate_backend"]: v for name, labels, v in samples if name == family}
        assert got == by_backend, family  # b1 reports nothing: no invented values


def test_registering_backend_gauges_again_replaces_the_source(telemetry: Telemetry) -> None:
    telemetry.register_backend_gauges(lambda: [BackendGauges("old", healthy=True)])
    telemetry.register_backend_gauges(lambda: [BackendGauges("new", healthy=True)])
    _, samples = scrape(telemetry)
    assert {labels["kvgate_backend"] for name, labels, _ in samples
            if name == "kvgate_backend_healthy"} == {"new"}  # fmt: skip


def test_queue_depth_is_read_at_scrape_time(telemetry: Telemetry) -> None:
    depth = [3]
    telemetry.register_queue_depth(lambda: depth[0])
    _, first = scrape(telemetry)
    depth[0] = 8
    _, second = scrape(telemetry)
    assert total(first, "kvgate_queue_depth") == 3
    assert total(second, "kvgate_queue_depth") == 8


def test_poll_errors_by_backend_and_error(telemetry: Telemetry) -> None:
    for backend, error in [("b0", "timeout"), ("b0", "timeout"), ("b1", "connect")]:
        telemetry.poll_error(backend, error)
    _, samples = scrape(telemetry)
    name = "kvgate_backend_poll_errors_total"
    assert total(samples, name, kvgate_backend="b0", kvgate_poll_error="timeout") == 2
    assert total(samples, name, kvgate_backend="b1", kvgate_poll_error="connect") == 1


def test_every_family_is_exposed_with_its_prometheus_type(telemetry: Telemetry) -> None:
    telemetry.register_backend_gauges(lambda: [BackendGauges("b0", healthy=True, kv_usage=0.5)])
    telemetry.register_queue_depth(lambda: 0)
    telemetry.request_finished(timing(0), outcome(small_model=True))
    telemetry.request_finished(timing(1), outcome(cache="exact", backend=None, policy=None))
    telemetry.poll_error("b0", "timeout")
    types, _ = scrape(telemetry)
    # prometheus_client names counter families without their _total suffix.
    assert types == {
        "gen_ai_server_time_to_first_token_seconds": "histogram",
        "gen_ai_server_time_per_output_token_seconds": "histogram",
        "gen_ai_server_request_duration_seconds": "histogram",
        "gen_ai_client_token_usage": "histogram",
        "kvgate_queue_time_seconds": "histogram",
        "kvgate_admission_decisions": "counter",
        "kvgate_routing_decisions": "counter",
        "kvgate_cache_lookups": "counter",
        "kvgate_cache_tokens_saved": "counter",
        "kvgate_small_model_decisions": "counter",
        "kvgate_backend_poll_errors": "counter",
        "kvgate_backend_healthy": "gauge",
        "kvgate_backend_kv_usage_ratio": "gauge",
        "kvgate_queue_depth": "gauge",
    }
