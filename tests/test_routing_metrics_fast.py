"""The one-pass scan of small payloads (routing/metrics/scan.py) reads exactly what the general
reader reads, or leaves the payload to it: same groups, hence the same snapshot."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from loadtest.bench_parse import fixture_registry
from routing.metrics import Reading, llamacpp, scan, sglang, snapshot_of, tgi, trtllm, vllm
from routing.metrics.prom import (
    Groups,
    MetricsError,
    Sample,
    count,
    parse_groups,
    read_groups,
    read_older,
    total,
)
from routing.metrics.scan import SMALL_PAYLOAD, SeriesReader
from routing.state import BackendSnapshot
from tests.paths import FIXTURES

FORMATS = {"vllm": vllm, "sglang": sglang, "tgi": tgi, "trtllm": trtllm, "llamacpp": llamacpp}
READERS = {name: module.READER for name, module in FORMATS.items()}


def general(reader: SeriesReader, payload: bytes) -> Groups:
    """What the format read before the scan existed."""
    groups = read_groups(payload, reader.names, reader.tail)
    return read_older(payload, groups, reader.renamed) if reader.renamed else groups


def filtered_answer(fixture: str, names: tuple[str, ...]) -> bytes:
    """prometheus_client's answer to `/metrics?name[]=...` over the fixture's families."""
    registry = fixture_registry((FIXTURES / fixture).read_text(), "same")
    return generate_latest(registry.restricted_registry(names))


PAYLOADS = {
    **{path.name: path.read_bytes() for path in sorted(FIXTURES.glob("*.prom"))},
    "vllm-v1 name[]": filtered_answer("vllm-v1.prom", vllm.SAMPLE_NAMES),
    "vllm-v0 name[]": filtered_answer("vllm-v0.prom", vllm.SAMPLE_NAMES),
    "sglang name[]": filtered_answer("sglang.prom", sglang.SAMPLE_NAMES),
}


def snapshot(fmt: str, groups: Groups) -> BackendSnapshot | str:
    try:
        return snapshot_of(Reading(fmt, fmt, groups), taken_at=1.0, max_batch_total_tokens=4096)
    except MetricsError as exc:
        return str(exc)


@pytest.mark.parametrize("fmt", list(READERS))
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_the_scan_reads_every_fixture_as_the_general_reader_does(payload: str, fmt: str) -> None:
    reader, text = READERS[fmt], PAYLOADS[payload]
    groups = reader.scan(text)
    assert groups is not None  # well-formed payloads: the scan never gives up
    assert groups == general(reader, text)
    assert snapshot(fmt, groups) == snapshot(fmt, general(reader, text))


def test_a_filtered_answer_is_small_enough_to_be_scanned() -> None:
    assert len(PAYLOADS["vllm-v1 name[]"]) <= SMALL_PAYLOAD < len(PAYLOADS["vllm-v1.prom"])


def test_a_small_payload_is_read_without_the_general_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object) -> Groups:
        raise AssertionError("read_groups called")

    monkeypatch.setattr(scan, "read_groups", refuse)
    groups = READERS["vllm"].read(PAYLOADS["vllm-v1 name[]"])
    assert set(groups) == {*vllm.NAMES, *vllm.TAIL}


AMBIGUOUS = {
    "two runs of one name": b"a_total 1\nb 2\na_total 3\n",
    "a _created line after a counter's group": b"a_total{x=\"1\"} 1\na_created{x=\"1\"} 9\n",
    "interleaved _created lines": b"a_total 1\na_created 9\na_total 2\na_created 9\n",
}


@pytest.mark.parametrize("text", list(AMBIGUOUS.values()), ids=list(AMBIGUOUS))
def test_the_scan_leaves_ambiguous_payloads_to_the_general_reader(text: bytes) -> None:
    reader = SeriesReader(("a_total", "b"))
    assert reader.scan(text) is None
    assert reader.read(text) == general(reader, text)


@pytest.mark.parametrize(("names", "tail", "renamed"), [
    pytest.param(("a",), ("b_total",), (), id="a tail name with a _created sibling"),
    pytest.param(("a_total", "a_created"), (), (), id="a name that is another's sibling"),
    pytest.param(("a", "b"), (), (("a", "b"),), id="an older name that is also a current one"),
])
def test_names_the_scan_cannot_tell_apart_are_never_scanned(
    names: tuple[str, ...], tail: tuple[str, ...], renamed: tuple[tuple[str, str], ...]
) -> None:
    reader = SeriesReader(names, tail, renamed)
    text = b"a 1\nb 2\n"
    assert reader.scan(text) is None and reader.read(text) == general(reader, text)


def test_an_older_name_is_read_only_where_its_current_name_is_missing() -> None:
    reader = SeriesReader(("new_a", "new_b"), (), (("new_a", "old_a"), ("new_b", "old_b")))
    text = b"old_a 1\nnew_a 2\nold_b 3\n"
    assert reader.scan(text) == {"new_a": b"new_a 2\n", "old_b": b"old_b 3\n"}
    assert reader.scan(text) == general(reader, text)


# Synthetic payloads: families of wanted and unwanted names in any order, names that extend a
# wanted one (`x_bucket`, `xx`), `_created` siblings, label values with escaped quotes,
# backslashes, newlines and `}`, odd values, CRLF line ends, no final line end.

NAMES = ("load", "load_total", "jobs", "cfg_info", "old_load")
OTHERS = ("load_created", "load_bucket", "loadx", "jobs_sum", "noise", "cfg")
LABEL_VALUE = st.text(alphabet=st.sampled_from(['a', 'Z', '0', '"', '\\', '\n', '}', '{', ',',
                                                '=', ' ']), max_size=6)
VALUE = st.sampled_from(["1", "0.5", "1.8432e+06", "5.173653504e+010", "NaN", "+Inf", "-1",
                         "oops", "7 1700000000000"])


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def sample_lines(draw: st.DrawFn, name: str) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        labels = draw(st.dictionaries(st.sampled_from(["engine", "le", "model_name", "x"]),
                                      LABEL_VALUE, max_size=3))
        body = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        empty_braces = draw(st.booleans())
        braces = f"{{{body}}}" if labels or empty_braces else ""
        lines.append(f"{name}{braces}{draw(st.sampled_from([' ', chr(9)]))}{draw(VALUE)}")
    return lines


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    names = draw(st.lists(st.sampled_from(NAMES + OTHERS), min_size=1, max_size=8))
    families = []
    for name in names:
        comment = [f"# HELP {name} Help with {name} in it.", f"# TYPE {name} gauge"]
        families.append((comment if draw(st.booleans()) else []) + draw(sample_lines(name)))
    lines = [line for family in families for line in family]
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = end.join(lines) + (end if draw(st.booleans()) else "")
    return text.encode()


SYNTHETIC_READERS = [
    SeriesReader(("load", "jobs"), ("cfg_info",)),
    SeriesReader(("load_total", "jobs"), (), (("load_total", "old_load"),)),
    SeriesReader(("jobs", "load"), ("cfg_info",), (("jobs", "old_load"), ("load", "old_load"))),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads(), st.sampled_from(range(len(SYNTHETIC_READERS))))
def test_the_scan_reads_synthetic_payloads_as_the_general_reader_does(
    text: bytes, which: int
) -> None:
    reader = SYNTHETIC_READERS[which]
    groups = reader.scan(text)
    expected = general(reader, text)
    assert groups is None or groups == expected
    assert reader.read(text) == expected


def runs(text: bytes, name: str) -> int:
    """How many separate runs of sample lines `name` has in `text`."""
    starts = (name + "{", name + " ", name + "\t")
    count, inside = 0, False
    for line in text.decode().replace("\r\n", "\n").split("\n"):
        mine = line.startswith(starts)
        count += mine and not inside
        inside = mine
    return count


@settings(max_examples=100, deadline=None)
@given(payloads())
def test_the_scan_gives_up_only_on_two_runs_or_an_interleaved_sibling(text: bytes) -> None:
    reader = SYNTHETIC_READERS[0]  # load, jobs, cfg_info: no siblings among them
    twice = any(runs(text, name) > 1 for name in ("load", "jobs", "cfg_info"))
    assert (reader.scan(text) is None) == twice



# The vLLM snapshot's fast paths: one engine's KV figures, a one-sample count, and the cache
# config and LoRA adapters read through a memo of their groups.

FRACTIONS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from([0.0, -0.0, 1.0, 0.421682776801406, 1e-300]))


@settings(max_examples=200, deadline=None)
@given(value=FRACTIONS, engine=st.sampled_from([None, "0", "1"]),
       config_engine=st.sampled_from(["", "0", "1"]),
       blocks=st.one_of(st.none(), st.integers(-2, 70000)), reserved=st.sampled_from([0, 1]))
def test_one_engine_kv_figures_are_the_general_computation(
    value: float, engine: str | None, config_engine: str, blocks: int | None, reserved: int
) -> None:
    labels = {} if engine is None else {"engine": engine}
    series = [Sample(labels, value)]
    config = vllm.CacheConfig({config_engine: blocks}, 16, simulator=False)
    fast = vllm.kv_figures(series, config, reserved)
    general_figures = vllm.kv_figures_any(series, config.blocks, reserved)
    assert repr(fast) == repr(general_figures)  # repr: NaN and -0.0 compare as themselves


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=3))
def test_a_count_of_one_sample_is_the_count_of_its_total(values: list[float]) -> None:
    series = [Sample({}, v) for v in values]
    summed = total(series)
    expected = None if summed is None else max(0, round(summed))
    assert count(series) == expected


@pytest.mark.parametrize("payload", ["vllm-v1.prom", "vllm-v1 name[]", "vllm-v0.prom"])
def test_the_memoised_cache_config_is_the_one_its_samples_give(payload: str) -> None:
    groups = READERS["vllm"].read(PAYLOADS[payload])
    group = groups[vllm.CACHE_CONFIG]
    config = vllm.cache_config_of(group)
    assert config == vllm.cache_config(parse_groups(groups).get(vllm.CACHE_CONFIG))
    assert vllm.cache_config_of(bytes(bytearray(group))) is config  # equal bytes: no parse


def test_a_payload_without_cache_config_has_no_capacity() -> None:
    config = vllm.cache_config_of(None)
    assert (dict(config.blocks), config.block_size, config.simulator) == ({}, None, False)


def test_a_sum_that_overflows_is_no_figure() -> None:
    series = [Sample({}, 8.988465674311579e307), Sample({}, 8.98846567431158e307)]
    assert total(series) is None and count(series) is None


@pytest.mark.parametrize(("success", "simulator"), [
    pytest.param(b'vllm:request_success_total{finished_reason="stop"} 3\n', False, id="vLLM"),
    pytest.param(b'vllm:request_success_total{finish_reason="stop"} 3\n', True,
                 id="the simulator's label"),
    pytest.param(b'vllm:request_success_total{x="finish_reason"} 3\n', False,
                 id="the name inside a value is no label"),
    pytest.param(b'vllm:request_success_total{finish_reason="stop"} oops\n', False,
                 id="a sample without a number does not count"),
])
def test_the_success_counter_tells_the_simulator_by_its_label(
    success: bytes, simulator: bool
) -> None:
    payload = b'vllm:num_requests_running{engine="0"} 1\n' + success
    assert vllm.is_simulator(vllm.read(payload)) is simulator
