"""The Prometheus text renderer: OpenTelemetry names, units and kinds → exposition format."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.prometheus import PrometheusReader, format_value, metric_name


@pytest.fixture
def provider_and_reader() -> Iterator[tuple[MeterProvider, PrometheusReader]]:
    reader = PrometheusReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    yield provider, reader
    provider.shutdown()


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        pytest.param("gen_ai.server.request.duration", "s", "histogram",
                     "gen_ai_server_request_duration_seconds",
                     id="dots → underscores, s → seconds"),
        pytest.param("gen_ai.client.token.usage", "{token}", "histogram",
                     "gen_ai_client_token_usage", id="annotation units add no suffix"),
        pytest.param("kvgate.routing.decisions", "{request}", "counter",
                     "kvgate_routing_decisions_total", id="counters end in _total"),
        pytest.param("http.server.duration", "ms", "counter",
                     "http_server_duration_milliseconds_total", id="unit suffix before _total"),
        pytest.param("kvgate.backend.kv_usage", "1", "gauge", "kvgate_backend_kv_usage_ratio",
                     id="a unit-1 gauge is a ratio"),
        pytest.param("kvgate.hits", "1", "counter", "kvgate_hits_total",
                     id="a unit-1 counter gets no ratio suffix"),
        pytest.param("queue_time_seconds", "s", "gauge", "queue_time_seconds",
                     id="a suffix already present is not repeated"),
        pytest.param("requests_total", "", "counter", "requests_total",
                     id="_total already present is not repeated"),
        pytest.param("net.io", "By", "counter", "net_io_bytes_total", id="By → bytes"),
        pytest.param("throughput", "{token}/s", "gauge", "throughput_per_second",
                     id="rates read per_second"),
        pytest.param("a-b c", None, "gauge", "a_b_c", id="other invalid characters become _"),
        pytest.param("9lives", None, "gauge", "_9lives", id="a leading digit is prefixed"),
    ],
)  # fmt: skip
def test_metric_name(name: str, unit: str | None, kind: str, expected: str) -> None:
    assert metric_name(name, unit, kind) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(3, "3", id="ints as ints"),
        pytest.param(0.25, "0.25", id="floats round-trip"),
        pytest.param(float("inf"), "+Inf", id="+Inf"),
        pytest.param(float("-inf"), "-Inf", id="-Inf"),
        pytest.param(float("nan"), "NaN", id="NaN"),
    ],
)
def test_format_value(value: float, expected: str) -> None:
    assert format_value(value) == expected


def test_nothing_recorded_renders_an_empty_body(
    provider_and_reader: tuple[MeterProvider, PrometheusReader],
) -> None:
    _, reader = provider_and_reader
    assert reader.render() == b""


def test_histogram_buckets_are_cumulative_and_end_in_inf(
    provider_and_reader: tuple[MeterProvider, PrometheusReader],
) -> None:
    provider, reader = provider_and_reader
    histogram = provider.get_meter("t").create_histogram(
        "lat", unit="s", description="latency", explicit_bucket_boundaries_advisory=[1.0, 2.0, 4.0]
    )
    values = [0.5, 0.5, 1.5, 3.0, 9.0]
    for value in values:
        histogram.record(value, {"route": "a"})
    text = reader.render().decode()
    assert "# HELP lat_seconds latency\n# TYPE lat_seconds histogram\n" in text
    (family,) = text_string_to_metric_families(text)
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name == "lat_seconds_bucket"}
    assert buckets == {"1.0": 2, "2.0": 3, "4.0": 4, "+Inf": 5}
    count = [s.value for s in family.samples if s.name == "lat_seconds_count"]
    total = [s.value for s in family.samples if s.name == "lat_seconds_sum"]
    assert count == [len(values)] and total == [pytest.approx(sum(values))]


def test_label_values_are_escaped_and_parse_back_unchanged(
    provider_and_reader: tuple[MeterProvider, PrometheusReader],
) -> None:
    provider, reader = provider_and_reader
    counter = provider.get_meter("t").create_counter("c", description='line\nwith \\ "quotes"')
    nasty = 'a "quoted" \\ back\nslash'
    counter.add(2, {"model.name": nasty, "flag": True})
    (family,) = text_string_to_metric_families(reader.render().decode())
    assert family.documentation == 'line\nwith \\ "quotes"'
    (sample,) = family.samples
    assert sample.name == "c_total"
    assert sample.labels == {"model_name": nasty, "flag": "true"}
    assert sample.value == 2


def test_up_down_counters_and_observable_gauges_are_gauges(
    provider_and_reader: tuple[MeterProvider, PrometheusReader],
) -> None:
    provider, reader = provider_and_reader
    meter = provider.get_meter("t")
    meter.create_up_down_counter("inflight", unit="{request}").add(-3)

    def observe(options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(0.5, {"b": "x"})

    meter.create_observable_gauge("usage", callbacks=[observe], unit="1")
    families = {f.name: f for f in text_string_to_metric_families(reader.render().decode())}
    assert {name: f.type for name, f in families.items()} == {
        "inflight": "gauge", "usage_ratio": "gauge"}  # fmt: skip
    assert [s.value for s in families["inflight"].samples] == [-3]
    assert [(s.labels, s.value) for s in families["usage_ratio"].samples] == [({"b": "x"}, 0.5)]


def test_counters_stay_cumulative_across_scrapes(
    provider_and_reader: tuple[MeterProvider, PrometheusReader],
) -> None:
    provider, reader = provider_and_reader
    counter = provider.get_meter("t").create_counter("n")
    counter.add(2)
    reader.render()
    counter.add(3)
    (family,) = text_string_to_metric_families(reader.render().decode())
    assert [s.value for s in family.samples] == [5]
