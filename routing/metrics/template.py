"""A payload that differs from an earlier one only in its sample values, read without a parse.

A busy backend's hot answer (routing/poller.py: `/metrics?name[]=...` for the load gauges alone,
a few hundred bytes) changes at every scrape, but only in its numbers: the same lines, names,
labels and comments, in the same order. Reading it the general way (cut the groups, decode them,
match every line, look its labels up, then the format's whole snapshot) costs the poller more
than taking the numbers out of it (docs/design.md has the measured saving).

`ValueTemplate.of(payload, samples, names)` keeps the structure of a payload that the general
reader has parsed into `samples`: its text with the values left out (the skeleton, compiled into
one pattern), and for each value, the name and labels of the sample it gave. `samples_of(other)`
then gives the samples of `names` in `other` when its skeleton is the same, with its values;
None when the skeleton differs or a value is not a number, and the caller reads the payload the
general way. The caller re-makes the snapshot from those (routing/metrics `rebuilt`).

Why that is the general reader's answer: everything the reader decides (which lines form a
name's group, which of them are the name's samples, their labels, which names an older name
stands in for) depends on the text without the values; the values only give each sample's value
(or drop a sample whose value is not a number, which the template refuses instead). `of` refuses
a payload (returns None) where that does not hold or cannot be checked: a line of a series not
in `names` (whose value the snapshot might read), a name without samples, a mapping that does
not give back exactly the reader's samples (a name with two runs of lines, a timestamp), or a
payload over `MAX_PAYLOAD`.

A value is the last word of a line that does not start with `#` (a sample line without a
timestamp: what prometheus_client writes); anything else is part of the skeleton, so any change
there, a timestamp included, is a changed skeleton.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping

from routing.metrics.prom import (
    NO_LABELS,
    SAMPLE_LINE,
    Sample,
    Samples,
    new_sample,
    parse_labels,
)
from routing.metrics.scan import SMALL_PAYLOAD

__all__ = ["MAX_PAYLOAD", "ValueTemplate"]

# Splits a payload into [text, line up to its value, value, text, ...]; a value is followed by
# the line end (CRLF's CR stays with the text after it).
_SPLIT = re.compile(rb"(?m)^(?!#)([^\n]*[ \t])([^ \t\r\n]+)(?=\r?$)")
_VALUE = rb"([^ \t\r\n]+)"
# Templates are for small payloads (a filtered answer): a whole payload is mostly series not read,
# for which there is no template, and splitting it costs more than a template would save.
MAX_PAYLOAD = SMALL_PAYLOAD
Slot = tuple[str, Mapping[str, str]]  # the sample a value belongs to: name, labels


class ValueTemplate:
    """The structure of one parsed payload (see the module docstring). Read-only once built."""

    __slots__ = ("_pattern", "_slots", "_names", "_series")

    def __init__(
        self, skeleton: list[bytes], slots: tuple[Slot, ...], names: tuple[str, ...]
    ) -> None:
        # The skeleton's text, literally, with a word in place of each value: one match tells
        # whether a payload has the same skeleton and gives its values. A value is followed by
        # a line end or the payload's end, never by a word, so the words are those `_SPLIT`
        # would cut out of the payload.
        self._pattern = re.compile(_VALUE.join(map(re.escape, skeleton)))
        self._slots = slots
        self._names = names
        # (name, labels) of each sample, by name in `names` order
        self._series = [slot for name in names for slot in slots if slot[0] == name]

    @classmethod
    def of(
        cls, payload: bytes, samples: Samples, names: Collection[str]
    ) -> ValueTemplate | None:
        """The template of `payload`, whose samples the general reader found to be `samples`:
        `samples_of` reads those of `names` (each must have samples) from the values. None when
        the values alone cannot give the reader's samples back."""
        names = tuple(dict.fromkeys(names))
        if len(payload) > MAX_PAYLOAD or not names or any(not samples.get(name) for name in names):
            return None
        parts = _SPLIT.split(payload)
        texts, prefixes, values = parts[0::3], parts[1::3], parts[2::3]
        # The text before each value (what lies between values, then the line up to it), and
        # after the last one.
        skeleton = [*map(bytes.__add__, texts, prefixes), texts[-1]]
        slots: list[Slot] = []
        for prefix, raw in zip(prefixes, values, strict=True):
            line = SAMPLE_LINE.match((prefix + raw).decode("utf-8", "replace"))
            if line is None or line.group(3).encode() != raw:
                return None  # not a sample line whose value is its last word
            name, raw_labels = line.group(1), line.group(2)
            if name not in names:
                return None  # a value of another series, which the snapshot may depend on
            slots.append((name, parse_labels(raw_labels) if raw_labels else NO_LABELS))
        template = cls(skeleton, tuple(slots), names)
        again = template.samples_of(payload)
        if again is None or any(not _same(again[name], samples[name]) for name in names):
            return None
        return template

    def same_series(self, samples: Samples) -> bool:
        """Whether `samples` hold the series of the template's names with the same labels, in
        the same order (as another payload's reading would)."""
        return self._series == [
            (name, sample.labels) for name in self._names for sample in samples.get(name) or ()
        ]

    def samples_of(self, payload: bytes) -> Samples | None:
        """The samples of the template's names in `payload`, when it differs from the
        template's payload only in its values."""
        match = self._pattern.fullmatch(payload)
        if match is None:
            return None
        values = match.groups()
        out: Samples = {name: [] for name in self._names}
        try:
            for (name, labels), raw in zip(self._slots, values, strict=True):
                out[name].append(new_sample((labels, float(raw))))
        except ValueError:
            return None
        return out


def _same(a: list[Sample], b: list[Sample]) -> bool:
    """Equal samples, NaN equal to NaN."""
    return len(a) == len(b) and all(
        x.labels == y.labels
        and (x.value == y.value or (math.isnan(x.value) and math.isnan(y.value)))
        for x, y in zip(a, b, strict=True)
    )
