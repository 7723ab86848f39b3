"""Prometheus text exposition (format 0.0.4) → the samples of a few named series.

A backend's /metrics payload is mostly histogram buckets and process counters that routing never
reads (vLLM: ~500 lines, TGI: ~2,000). So the parser is told which sample names it wants and
pulls just those lines out with one compiled regex that runs in C; everything else, including
`_bucket`, `_created` and comment lines, is skipped without a Python-level loop. Label order is
free, label values may hold escaped quotes and `}`, values are Go/Python floats (`1.8432e+06`,
`5.173653504e+010`, `NaN`, `+Inf`), an optional timestamp is ignored, and a family declared with
HELP/TYPE but no samples simply yields no samples. A sample whose value is not a number is
skipped rather than failing the payload: a partial update is better than none, and the format
parsers report a payload with none of their series as unrecognised.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType
from typing import NamedTuple

# The value is `"` (non-quote-or-backslash run, then any escaped character and another run)* `"`:
# unrolled so that the regex engine takes each run in one step, not one branch per character.
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n"}


class MetricsError(ValueError):
    """A payload that is not (or not enough of) the metrics format it was read as."""


class Sample(NamedTuple):
    labels: Mapping[str, str]
    value: float


Samples = dict[str, list[Sample]]
_NO_LABELS: Mapping[str, str] = MappingProxyType({})


def parse_samples(text: str, names: Iterable[str]) -> Samples:
    """The samples of every series in `names` that `text` holds, by sample name, in text order.

    `names` are full sample names (`vllm:num_preemptions_total`, not the family name).
    """
    pattern, first_line, prefix = _pattern(frozenset(names))
    found = pattern.findall(text)  # anchored on the newline before a line: misses line 1
    if text.startswith(prefix) and (head := first_line.match(text)) is not None:
        found.insert(0, head.groups(""))
    out: Samples = {}
    for suffix, raw_labels, raw_value in found:
        try:
            value = float(raw_value)
        except ValueError:
            continue
        labels = parse_labels(raw_labels) if raw_labels else _NO_LABELS
        out.setdefault(prefix + suffix, []).append(Sample(labels, value))
    return out


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


@lru_cache(maxsize=64)
def _pattern(names: frozenset[str]) -> tuple[re.Pattern[str], re.Pattern[str], str]:
    """One regex for a set of names. Their common prefix (`vllm:`) is a literal after the newline,
    which lets the regex engine reject most lines after a character or two; the alternatives are
    longest first so that a name never matches as the prefix of a longer one."""
    if not names:
        raise ValueError("no sample names given")
    prefix = os.path.commonprefix(sorted(names))
    suffixes = sorted((name[len(prefix):] for name in names), key=len, reverse=True)
    alternatives = "|".join(re.escape(suffix) for suffix in suffixes)
    # Group 2 is greedy up to the last `}` on the line, so a `}` inside a label value is kept.
    line = re.escape(prefix) + "(" + alternatives + r")(?:\{(.*)\})?[ \t]+([^ \t\n]+)"
    return re.compile("\n" + line), re.compile(line), prefix


# Reading series: helpers the format parsers share.


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def total(series: Sequence[Sample] | None) -> float | None:
    """The sum of a series' finite values; None when there are none (absent, or all NaN)."""
    if not series:
        return None
    values = [s.value for s in series if math.isfinite(s.value)]
    return math.fsum(values) if values else None


def count(series: Sequence[Sample] | None) -> int | None:
    """A summed gauge or counter of things (requests, preemptions) as an int."""
    value = total(series)
    return None if value is None else max(0, round(value))


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
