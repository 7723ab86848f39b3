"""A payload that differs from a parsed one only in its numbers (routing/metrics/template.py) reads
exactly as the general reader reads it, or is left to it; and a vLLM snapshot re-made from new
load values (`vllm.rebuild`) is the one `build` makes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from loadtest.bench_parse import fixture_registry
from routing.metrics import Reading, read_metrics, rebuilt, snapshot_of, vllm
from routing.metrics.prom import Sample, Samples, parse_groups
from routing.metrics.query import SAMPLE_NAMES, completed, slow_groups
from routing.metrics.template import ValueTemplate
from routing.state import BackendSnapshot
from tests.paths import FIXTURES

LOAD = (vllm.KV_USAGE, vllm.WAITING, vllm.RUNNING)  # in the order vLLM registers them
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
Engine = tuple[float, float, float]  # KV usage, waiting, running


def full_reading(fixture: str = "vllm-v1.prom") -> Reading:
    registry = fixture_registry((FIXTURES / fixture).read_text(), "same")
    return read_metrics(generate_latest(registry.restricted_registry(SAMPLE_NAMES["vllm"])))


SLOW = slow_groups("vllm", full_reading().groups)


def hot_answer(engines: list[Engine], model: str = MODEL, help_text: str = "load") -> bytes:
    """prometheus_client's answer for the load gauges of one vLLM server, one series per
    engine, as vLLM labels them."""
    registry = CollectorRegistry()
    gauges = [Gauge(name, help_text, ["engine", "model_name"], registry=registry)
              for name in LOAD]
    for engine, values in enumerate(engines):
        for gauge, value in zip(gauges, values, strict=True):
            gauge.labels(engine=str(engine), model_name=model).set(value)
    return generate_latest(registry)


def general(payload: bytes) -> tuple[Reading, Samples]:
    """The hot answer's reading, completed with the slow groups, and all its samples."""
    reading = completed(read_metrics(payload), SLOW)
    return reading, parse_groups(reading.groups)


def template_of(payload: bytes) -> ValueTemplate:
    _, samples = general(payload)
    template = ValueTemplate.of(payload, samples, LOAD)
    assert template is not None
    return template


def same(a: list[Sample], b: list[Sample]) -> bool:
    return len(a) == len(b) and all(
        x.labels == y.labels and (x.value == y.value or math.isnan(x.value) and math.isnan(y.value))
        for x, y in zip(a, b, strict=True))


def reads_as_general(template: ValueTemplate, payload: bytes) -> None:
    got = template.samples_of(payload)
    assert got is not None
    _, want = general(payload)
    assert list(got) == list(LOAD)
    for name in LOAD:
        assert same(got[name], want[name]), name


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20).map(float),
    st.sampled_from([0.0, 1.0, 0.5, 1e-9, 1.8432e06, 5.173653504e10]),
)
engines = st.lists(st.tuples(values, values, values), min_size=1, max_size=3)


def test_a_hot_answer_with_other_numbers_reads_as_the_general_reader_reads_it() -> None:
    template = template_of(hot_answer([(0.42, 3.0, 24.0)]))
    reads_as_general(template, hot_answer([(0.07, 0.0, 1.0)]))
    reads_as_general(template, hot_answer([(float("nan"), 1e30, -2.0)]))


@settings(max_examples=200, deadline=None)
@given(first=engines, data=st.data(),
       model=st.text(min_size=1, max_size=20), help_text=st.text(max_size=20))
def test_any_numbers_any_labels_read_as_the_general_reader_reads_them(
    first: list[Engine], data: st.DataObject, model: str, help_text: str,
) -> None:
    # Labels with quotes, backslashes, newlines and braces; every float prometheus_client
    # writes (NaN, +Inf, exponents); one to three engines.
    then = data.draw(st.lists(st.tuples(values, values, values),
                              min_size=len(first), max_size=len(first)))
    template = template_of(hot_answer(first, model, help_text))
    reads_as_general(template, hot_answer(then, model, help_text))


@pytest.mark.parametrize("other", [
    pytest.param(hot_answer([(0.1, 1.0, 2.0)], model="other/model"), id="another label value"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0), (0.2, 0.0, 3.0)]), id="another engine"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0)], help_text="other"), id="another HELP text"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0)]).replace(b"\n", b"\r\n"), id="CRLF line ends"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0)]).split(b"# HELP vllm:num_requests_running")[0],
                 id="a series fewer"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0)]) + b"vllm:num_requests_running 2.0\n",
                 id="a line more"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0)]).replace(b"} 2.0\n", b"} 2.0 1700000000\n"),
                 id="a timestamp"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0)]).replace(b"} 2.0\n", b"} many\n"),
                 id="a value that is not a number"),
    pytest.param(b"", id="empty"),
])
def test_a_payload_that_differs_in_more_than_its_numbers_is_left_to_the_general_reader(
    other: bytes,
) -> None:
    template = template_of(hot_answer([(0.42, 3.0, 24.0)]))
    assert template.samples_of(other) is None


def with_line(payload: bytes, after: bytes, line: bytes) -> bytes:
    head, _, tail = payload.partition(after)
    return head + after + line + tail


@pytest.mark.parametrize("payload", [
    pytest.param(hot_answer([(0.1, 1.0, 2.0)]).replace(b"} 2.0\n", b"} 2.0 1700000000\n"),
                 id="a sample with a timestamp"),
    pytest.param(hot_answer([(0.1, 1.0, 2.0)]) + b"process_cpu_seconds_total 812.5\n",
                 id="a line of a series not read"),
    pytest.param(with_line(hot_answer([(0.1, 1.0, 2.0)]),
                           b"# TYPE vllm:num_requests_waiting gauge\n",
                           b'vllm:num_requests_running{engine="1"} 4.0\n'),
                 id="a name in two runs of lines"),
])
def test_no_template_where_the_numbers_alone_cannot_give_the_samples_back(
    payload: bytes,
) -> None:
    _, samples = general(payload)
    assert ValueTemplate.of(payload, samples, LOAD) is None


def test_no_template_for_a_name_without_samples() -> None:
    payload = hot_answer([(0.1, 1.0, 2.0)])
    _, samples = general(payload)
    assert ValueTemplate.of(payload, samples, (*LOAD, vllm.KV_USAGE_OLD)) is None


def test_same_series_compares_names_and_labels_not_numbers() -> None:
    template = template_of(hot_answer([(0.42, 3.0, 24.0)]))
    assert template.same_series(general(hot_answer([(0.9, 0.0, 1.0)]))[1])
    assert not template.same_series(general(hot_answer([(0.9, 0.0, 1.0)], "other"))[1])
    assert not template.same_series(general(hot_answer([(0.9, 0.0, 1.0)] * 2))[1])


# vllm.rebuild: the snapshot of new load values is build's.


def snapshot(reading: Reading) -> BackendSnapshot:
    return snapshot_of(reading, taken_at=7.0)


@settings(max_examples=200, deadline=None)
@given(first=engines, data=st.data(), fmt=st.sampled_from([None, "vllm", "vllm-v0"]),
       fixture=st.sampled_from(["vllm-v1.prom", "vllm-v0.prom"]))
def test_a_snapshot_rebuilt_from_new_load_values_is_the_one_build_makes(
    first: list[Engine], data: st.DataObject, fmt: str | None, fixture: str,
) -> None:
    then = data.draw(st.lists(st.tuples(values, values, values),
                              min_size=len(first), max_size=len(first)))
    slow = slow_groups("vllm", full_reading(fixture).groups)
    before = completed(read_metrics(hot_answer(first), format=fmt), slow)
    after = completed(read_metrics(hot_answer(then), format=fmt), slow)
    load = {name: series for name, series in parse_groups(after.groups).items() if name in LOAD}
    got = rebuilt(before.family, snapshot_of(before, taken_at=1.0), load, before.groups,
                  taken_at=7.0)
    assert got == snapshot(after)


def test_a_simulator_s_snapshot_is_rebuilt_without_the_reserved_block() -> None:
    # llm-d-inference-sim: a cache config with only block_size and num_gpu_blocks.
    config = b'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n'
    slow = {vllm.CACHE_CONFIG: config}
    before = completed(read_metrics(hot_answer([(0.5, 0.0, 1.0)])), slow)
    after = completed(read_metrics(hot_answer([(0.25, 2.0, 3.0)])), slow)
    load = {name: series for name, series in parse_groups(after.groups).items() if name in LOAD}
    got = rebuilt("vllm", snapshot(before), load, before.groups, taken_at=7.0)
    assert got == snapshot(after)
    assert got is not None and got.kv_free_blocks == 750 and got.kv_total_blocks == 1000


def test_formats_without_a_rebuild_say_so() -> None:
    any_snapshot = BackendSnapshot(taken_at=0.0, format="sglang")
    assert rebuilt("sglang", any_snapshot, {}, {}, taken_at=1.0) is None
