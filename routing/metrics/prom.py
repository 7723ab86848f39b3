"""Prometheus text exposition (format 0.0.4) → the samples of a few named series.

A backend's /metrics payload is mostly histogram buckets and process counters that routing never
reads (vLLM: ~500 lines, TGI: ~2,000), and it is scraped several times a second per backend. So
the reader never walks the payload line by line in Python: for each wanted sample name it jumps
with `bytes.find` (C speed, on the payload as it came off the wire, undecoded) to the first line
that starts with the name, then takes that line and the lines right after it while they are
samples of the same series: the name's group. Only the groups are decoded and parsed. (A small
payload, such as a filtered answer of ~3 KB, is cut into the same groups by one regex pass
instead: routing/metrics/scan.py.)

That rests on the format's rule that all lines of one metric form a single group: the first group
of a name is all of it, and nothing after it has to be searched. Servers write their families in
a stable order, so callers list the names they want in payload order and each search starts where
the previous group ended (wrapping around to the top when a name is not after it): the payload is
crossed about once, whatever the number of names. Names a server writes at the very end, after
its histograms, are searched for from the bottom up. A name the payload does not hold costs one
full search; names only older server versions write are therefore searched for only once the
current names turn out to be missing (`read_older`).

Two steps: `read_groups` cuts the groups' text out of the payload, `parse_groups` reads their
samples. Equal groups give equal samples.

Line syntax: label order is free, label values may hold escaped quotes and `}`, values are
Go/Python floats (`1.8432e+06`, `5.173653504e+010`, `NaN`, `+Inf`), an optional timestamp is
ignored, CRLF line ends read the same, and a family declared with HELP/TYPE but no samples simply
yields no samples. A counter's `_created` lines may sit between its `_total` lines (older clients
interleave them). A sample whose value is not a number is skipped rather than failing the payload:
a partial update is better than none, and the format parsers report a payload with none of their
series as unrecognised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from functools import lru_cache, partial
from types import MappingProxyType
from typing import NamedTuple

# The value is `"` (non-quote-or-backslash run, then any escaped character and another run)* `"`:
# unrolled so that the regex engine takes each run in one step, not one branch per character.
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPE = re.compile(r"\\(.)")
# A sample line: name, the labels (up to the line's last `}`, so a `}` in a value is kept), the
# first word after them (a timestamp after it is ignored).
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+([^ \t\r\n]+)", re.M)
_UNESCAPED = {"n": "\n"}


class MetricsError(ValueError):
    """A payload that is not (or not enough of) the metrics format it was read as."""


class Sample(NamedTuple):
    labels: Mapping[str, str]
    value: float


Samples = dict[str, list[Sample]]
# Sample((labels, value)) without NamedTuple's Python-level __new__: the reader's inner loop.
new_sample: Callable[[tuple[Mapping[str, str], float]], Sample] = partial(tuple.__new__, Sample)
NO_LABELS: Mapping[str, str] = MappingProxyType({})


Groups = dict[str, bytes]  # sample name -> its group of lines, as the payload holds them


def parse_samples(payload: bytes | str, names: Iterable[str], tail: Sequence[str] = ()) -> Samples:
    """The samples of every series in `names` and `tail` that `payload` holds, by sample name,
    in payload order (`read_groups`, then `parse_groups`)."""
    if isinstance(payload, str):
        payload = payload.encode()
    return parse_groups(read_groups(payload, names, tail))


def read_groups(payload: bytes, names: Iterable[str], tail: Sequence[str] = ()) -> Groups:
    """The group of lines of every series in `names` and `tail` that `payload` holds.

    Bytes, not text: the payload is searched as it came off the wire, and only the groups are
    decoded (by `parse_groups`). Names are full sample names (`vllm:num_preemptions_total`, not
    the family name). `names` are searched for from the top, best listed in the order the
    payload holds them; `tail` names, the ones a server writes near the end of its payload, from
    the bottom up (list them in payload order too). Any order finds the same groups, only slower.
    """
    out: Groups = {}
    cursor = 0
    for name in names:
        terms = _search_terms(name)
        begin = _find_forward(payload, terms, cursor)
        if begin >= 0:
            cursor = _group_end(payload, terms, begin)
            out[name] = payload[begin:cursor]
    cursor = len(payload)
    for name in reversed(tail):
        terms = _search_terms(name)
        begin = _find_backward(payload, terms, cursor)
        if begin >= 0:
            out[name] = payload[begin : _group_end(payload, terms, begin)]
            cursor = begin
    return out


def parse_groups(groups: Mapping[str, bytes], names: Container[str] | None = None) -> Samples:
    """The samples of each group (UTF-8, undecodable bytes replaced), or of those of `names`;
    a group without a sample that has a numeric value is left out. A group holds only its
    name's lines (and maybe `_created` siblings): a regex pass over it costs less than a Python
    loop over its lines."""
    out: Samples = {}
    for name, group in groups.items():
        if names is not None and name not in names:
            continue
        samples: list[Sample] = []
        lines = SAMPLE_LINE.findall(group.decode("utf-8", "replace"))
        for line_name, raw_labels, raw_value in lines:
            if line_name != name:
                continue  # a `_created` sibling
            try:
                value = float(raw_value)
            except ValueError:
                continue
            labels = parse_labels(raw_labels) if raw_labels else NO_LABELS
            samples.append(new_sample((labels, value)))
        if samples:
            out[name] = samples
    return out


def read_older(payload: bytes, groups: Groups, renamed: Iterable[tuple[str, str]]) -> Groups:
    """`groups` completed, for each (current name, older name) pair whose current name is
    missing, with the older name's group: a current payload costs no search for names only
    older server versions write."""
    older = [old for new, old in renamed if new not in groups and old not in groups]
    if older:
        groups.update(read_groups(payload, dict.fromkeys(older)))
    return groups


class _Terms(NamedTuple):
    """How one sample name is searched for in a payload."""

    needle: bytes  # "\n" + name: a line that starts with the name (or a longer one: `x_bucket`)
    size: int
    starts: tuple[bytes, ...]  # what a sample line of the name starts with
    sibling: bytes | None  # `x_created` for `x_total` and back: lines that may interleave


@lru_cache(maxsize=256)
def _search_terms(name: str) -> _Terms:
    if not name or not name.isascii():
        raise ValueError(f"not a sample name: {name!r}")
    sibling = sibling_of(name)
    return _Terms(
        ("\n" + name).encode(),
        len(name),
        tuple((name + end).encode() for end in ("{", " ", "\t")),
        None if sibling is None else sibling.encode(),
    )


def sibling_of(name: str) -> str | None:
    """The sample name whose lines may interleave with `name`'s: a counter's `x_created` for
    `x_total` and back; None for other names."""
    if name.endswith("_total"):
        return name[: -len("_total")] + "_created"
    if name.endswith("_created"):
        return name[: -len("_created")] + "_total"
    return None


def _find_forward(payload: bytes, terms: _Terms, cursor: int) -> int:
    """The start of the first sample line of the name at or after `cursor` (a line start),
    else from the top; -1 when there is none."""
    if cursor:
        found = _first_line(payload, terms, cursor, len(payload))
        if found >= 0:
            return found
        return _first_line(payload, terms, 0, cursor + terms.size + 1)
    return _first_line(payload, terms, 0, len(payload))


def _find_backward(payload: bytes, terms: _Terms, cursor: int) -> int:
    """The start of the group of the name's last sample line before `cursor` (a line start),
    else after it; -1 when there is none."""
    needle, size, starts, sibling = terms
    pos = payload.rfind(needle, 0, cursor + size)
    while pos >= 0 and not payload.startswith(starts, pos + 1):
        pos = payload.rfind(needle, 0, pos + size)
    if pos >= 0:
        begin = pos + 1
    elif payload.startswith(starts):
        begin = 0
    else:
        return _first_line(payload, terms, cursor, len(payload)) if cursor < len(payload) else -1
    while begin:  # back to the group's first line
        previous = payload.rfind(b"\n", 0, begin - 1) + 1
        if not (payload.startswith(starts, previous)
                or (sibling is not None and payload.startswith(sibling, previous))):
            break
        begin = previous
    return begin


def _first_line(payload: bytes, terms: _Terms, start: int, stop: int) -> int:
    """The first line start at or after `start` (a line start) where a sample of the name
    begins, looking for the needle up to `stop`; -1 when there is none."""
    needle, _, starts, _ = terms
    if start == 0 and payload.startswith(starts):
        return 0
    pos = payload.find(needle, start - 1 if start else 0, stop)
    while pos >= 0 and not payload.startswith(starts, pos + 1):
        pos = payload.find(needle, pos + 1, stop)
    return pos + 1 if pos >= 0 else -1


def _group_end(payload: bytes, terms: _Terms, begin: int) -> int:
    """The start of the first line after the group whose first line starts at `begin`."""
    _, _, starts, sibling = terms
    pos = begin
    while payload.startswith(starts, pos) or (
        sibling is not None and payload.startswith(sibling, pos)
    ):
        pos = payload.find(b"\n", pos) + 1
        if pos == 0:
            return len(payload)
    return pos


@lru_cache(maxsize=4096)
def parse_labels(text: str) -> Mapping[str, str]:
    """`a="1",b="x\\"y"` → {"a": "1", "b": 'x"y'}. Text between well-formed pairs is ignored.

    Cached: a server writes the same label sets scrape after scrape (vLLM's cache config alone is
    22 labels), so most calls are a lookup. The result is shared, hence read-only.
    """
    pairs = _LABEL_PAIR.findall(text)
    if "\\" in text:
        pairs = [(name, _ESCAPE.sub(_unescape, value)) for name, value in pairs]
    return MappingProxyType(dict(pairs))


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPED.get(match.group(1), match.group(1))


# Reading series: helpers the format parsers share.


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def total(series: Sequence[Sample] | None) -> float | None:
    """The sum of a series' finite values; None when there are none (absent, or all NaN) or
    when their sum overflows."""
    if not series:
        return None
    if len(series) == 1:  # the usual case, one engine
        value = series[0].value
        return value if math.isfinite(value) else None
    values = [s.value for s in series if math.isfinite(s.value)]
    if not values:
        return None
    try:
        return math.fsum(values)
    except OverflowError:  # finite values whose sum is not: no figure, as for NaN
        return None


def count(series: Sequence[Sample] | None) -> int | None:
    """A summed gauge or counter of things (requests, preemptions) as an int."""
    if series is not None and len(series) == 1:  # the usual case, one engine: `total`, inlined
        value = series[0].value
        if not math.isfinite(value):
            return None
    else:
        summed = total(series)
        if summed is None:
            return None
        value = summed
    rounded = round(value)
    return rounded if rounded > 0 else 0


def by_label(series: Sequence[Sample] | None, label: str) -> dict[str, Sample]:
    """One sample per value of `label` ("" when absent): the first one, which keeps a single
    reading when several ranks of one engine repeat the same figure."""
    out: dict[str, Sample] = {}
    for sample in series or ():
        out.setdefault(sample.labels.get(label, ""), sample)
    return out


def unit_fraction(value: float | None) -> float | None:
    """A usage fraction clamped into [0, 1]; NaN or absent is None."""
    if value is None or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, value))


def int_label(sample: Sample, label: str) -> int | None:
    """An integer carried in a label (`num_gpu_blocks="27313"`); None for "None", "" or junk."""
    raw = sample.labels.get(label)
    if raw is None:
        return None
    try:
        return int(float(raw))
    except (ValueError, OverflowError):
        return None
