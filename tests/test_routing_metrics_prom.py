"""The Prometheus text parser: which lines it reads, and how it reads labels and values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.metrics.prom import parse_labels, parse_samples

PAYLOAD = """\
x_total{b="2",a="1"} 3
# HELP quiet A family declared with no samples.
# TYPE quiet gauge
# HELP x_created When x started.
# TYPE x_created gauge
x_created{a="1",b="2"} 1.765432089541016e+09
y 1.8432e+06
y_bucket{le="1.0"} 4
yy 9
big 5.173653504e+010
nan_gauge{engine="0"} NaN
inf_gauge +Inf
stamped 7 1700000000000
empty{} 2
spaced{ a = "1" , b="2" ,} 6
"""


@pytest.mark.parametrize(
    ("name", "labels", "value"),
    [
        pytest.param("x_total", {"a": "1", "b": "2"}, 3.0,
                     id="labels in any order, a sample on line 1"),
        pytest.param("y", {}, 1_843_200.0, id="exponent notation"),
        pytest.param("big", {}, 51_736_535_040.0, id="three-digit exponent"),
        pytest.param("stamped", {}, 7.0, id="a timestamp after the value is ignored"),
        pytest.param("empty", {}, 2.0, id="empty braces"),
        pytest.param("spaced", {"a": "1", "b": "2"}, 6.0, id="blanks and a trailing comma"),
        pytest.param("inf_gauge", {}, math.inf, id="+Inf"),
    ],
)
def test_a_wanted_series_reads_as_labels_and_value(
    name: str, labels: dict[str, str], value: float
) -> None:
    samples = parse_samples(PAYLOAD, {name})
    assert [(dict(s.labels), s.value) for s in samples[name]] == [(labels, value)]


def test_nan_is_kept_as_nan_for_the_format_parsers_to_refuse() -> None:
    (sample,) = parse_samples(PAYLOAD, {"nan_gauge"})["nan_gauge"]
    assert math.isnan(sample.value) and sample.labels == {"engine": "0"}


@pytest.mark.parametrize(
    ("wanted", "value"),
    [
        pytest.param("y", 1_843_200.0, id="histogram buckets and longer names are not read for it"),
        pytest.param("x_total", 3.0, id="its _created series is not read for it"),
    ],
)
def test_only_the_named_series_are_read(wanted: str, value: float) -> None:
    samples = parse_samples(PAYLOAD, {wanted})
    assert set(samples) == {wanted}
    assert [s.value for s in samples[wanted]] == [value]


def test_a_family_without_samples_is_absent() -> None:
    assert parse_samples(PAYLOAD, {"quiet", "never_mentioned"}) == {}


def test_a_sample_with_a_non_numeric_value_is_skipped_and_the_rest_is_read() -> None:
    text = 'load{a="1"} 0.5\nload{a="2"} oops\nload{a="3"} 0.25\n'
    assert [s.labels["a"] for s in parse_samples(text, {"load"})["load"]] == ["1", "3"]


def test_crlf_line_endings_read_the_same() -> None:
    text = "# TYPE load gauge\r\nload{a=\"1\"} 0.5\r\nother 2\r\n"
    (sample,) = parse_samples(text, {"load"})["load"]
    assert sample.value == 0.5 and sample.labels == {"a": "1"}


def test_several_prefixes_in_one_request() -> None:
    text = "vllm:a 1\nsglang:b 2\ntgi_c 3\n"
    samples = parse_samples(text, {"vllm:a", "sglang:b", "tgi_c"})
    assert {name: s[0].value for name, s in samples.items()} == {
        "vllm:a": 1.0, "sglang:b": 2.0, "tgi_c": 3.0
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('a="1",b="2"', {"a": "1", "b": "2"}, id="plain"),
        pytest.param(r'path="a\"b"', {"path": 'a"b'}, id="escaped quote"),
        pytest.param(r'path="a\\b"', {"path": "a\\b"}, id="escaped backslash"),
        pytest.param(r'msg="two\nlines"', {"msg": "two\nlines"}, id="escaped newline"),
        pytest.param('adapters="sql-lora,chat-lora",x=""',
                     {"adapters": "sql-lora,chat-lora", "x": ""},
                     id="commas inside a value, an empty value"),
        pytest.param('expr="{a}"', {"expr": "{a}"}, id="braces inside a value"),
    ],
)
def test_label_values_unescape(text: str, expected: dict[str, str]) -> None:
    assert parse_labels(text) == expected


def test_a_closing_brace_inside_a_label_value_does_not_end_the_labels() -> None:
    text = 'series{expr="up}",le="0.5"} 4\n'
    (sample,) = parse_samples(text, {"series"})["series"]
    assert sample.labels == {"expr": "up}", "le": "0.5"} and sample.value == 4.0


# The reader against a plain line-by-line reading of generated payloads.

_NAMES = ("x", "x_bucket", "xy", "x_total", "x_created", "load", "load_info", "y:z")
_LABEL_VALUES = st.sampled_from(["0", "a b", 'q\\"uote', "br}ace", "{a}", "", "m/n-1"])
_VALUES = st.sampled_from(["1", "0.5", "-2", "1.8432e+06", "5.173653504e+010", "NaN", "+Inf",
                           "7 1700000000000", "oops"])


@st.composite
def _family(draw: st.DrawFn, name: str) -> list[str]:
    """The lines of one family: optional HELP/TYPE, then its samples (a counter's `_created`
    lines interleaved with its `_total` ones, as older clients write them)."""
    lines = [f"# HELP {name} Some help.", f"# TYPE {name} gauge"] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 3))):
        keys = draw(st.lists(st.sampled_from(["a", "engine", "le", "model_name"]), unique=True,
                             max_size=3))
        labels = ",".join(f'{k}="{draw(_LABEL_VALUES)}"' for k in keys)
        empty_braces: bool = draw(st.booleans())
        braces = f"{{{labels}}}" if keys or empty_braces else ""
        lines.append(f"{name}{braces} {draw(_VALUES)}")
        if name.endswith("_total") and draw(st.booleans()):
            lines.append(f"{name[:-6]}_created{braces} 1.7e+09")
    return lines


@st.composite
def _payloads(draw: st.DrawFn) -> tuple[str, list[str], list[str]]:
    names = draw(st.permutations(_NAMES))
    present = [n for n in names if draw(st.booleans()) and not n.endswith("_created")]
    lines = [line for name in present for line in draw(_family(name))]
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    wanted = draw(st.lists(st.sampled_from(_NAMES), unique=True))
    split = draw(st.integers(0, len(wanted)))
    return newline.join(lines) + newline, wanted[:split], wanted[split:]


def _reference(text: str, wanted: set[str]) -> dict[str, list[tuple[dict[str, str], str]]]:
    """Every sample line, one at a time: name, labels between the first `{` and the last `}`,
    the first word after them."""
    out: dict[str, list[tuple[dict[str, str], str]]] = {}
    for line in text.replace("\r", "").split("\n"):
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        blank = line.find(" ")
        if 0 <= brace < blank:
            name, close = line[:brace], line.rfind("}")
            labels, rest = dict(parse_labels(line[brace + 1 : close])), line[close + 1 :]
        else:
            name, labels, rest = line[:blank], {}, line[blank:]
        value = rest.split()[0]
        if name in wanted and value != "oops":
            out.setdefault(name, []).append((labels, value))
    return out


@settings(max_examples=300, deadline=None)
@given(_payloads())
def test_the_reader_reads_what_a_line_by_line_reading_reads(
    payload: tuple[str, list[str], list[str]],
) -> None:
    text, head, tail = payload
    got = parse_samples(text, head, tail)
    expected = _reference(text, {*head, *tail})
    assert {name: [(dict(s.labels), repr(s.value)) for s in samples]  # repr: NaN == NaN
            for name, samples in got.items()} == {
        name: [(labels, repr(float(value.split()[0]))) for labels, value in samples]
        for name, samples in expected.items()}
