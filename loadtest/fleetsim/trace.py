"""Recorded traces for `kvgate simulate --trace`: one JSON object per line, one request each.

A trace gives lengths, not text; requests are written as the workloads write theirs
(loadtest/workloads.py): a group's shared prefix is one shared message, the rest is unique text,
so the gateway's prefix chains and the engines' prefix caches see exactly the sharing the trace
records.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence

from loadtest.workloads import (
    FILLER_WORDS,
    SYSTEM,
    USER,
    Limits,
    Segment,
    UniqueTags,
    WorkItem,
    prompt_tokens,
    segment,
    shared_offset,
    shared_tag,
)


def load_trace(lines: Iterator[str] | Sequence[str], *, limits: Limits | None = None,
               default_max_tokens: int = 1024) -> tuple[WorkItem, ...]:
    """Requests from a JSONL trace, one object per line (blank lines skipped):

        {"arrival_s": 0.42, "prompt_tokens": 7310, "output_tokens": 96,
         "prefix_group": "doc-7", "prefix_tokens": 6000, "max_tokens": 256}

    `arrival_s` (seconds from the start, >= 0), `prompt_tokens` and `output_tokens` (>= 1) are
    required. Requests of one `prefix_group` share their first `prefix_tokens` prompt tokens
    (default: as many as the group's shortest prompt leaves room for, with a unique question
    after it). `max_tokens` (the client's cap) defaults to the larger of `output_tokens` and
    `default_max_tokens`; the cap, and then the output, are cut to the context left. Prompt
    tokens count the chat template, as a server's usage does (a prompt too short for the
    template and a unique tag is lengthened to the shortest possible). ValueError names the line
    of a malformed record."""
    limits = limits or Limits()
    records: list[tuple[int, float, int, int, str | None, int | None, int]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        records.append(_trace_record(number, line, default_max_tokens))
    shortest: dict[str, int] = {}
    for _, _, prompt, _, group, _, _ in records:
        if group is not None:
            shortest[group] = min(prompt, shortest.get(group, prompt))
    groups = {g: i for i, g in enumerate(sorted(shortest))}
    tags = UniqueTags(0)
    rng = random.Random("kvgate-trace")
    user_overhead = prompt_tokens([Segment(USER, "", 0, 0)])
    overhead = prompt_tokens([Segment(SYSTEM, "", 0, 0), Segment(USER, "", 0, 0)])
    items: list[WorkItem] = []
    for number, arrival, prompt, output, group, shared, cap in records:
        segments: list[Segment] = []
        if group is None:
            segments.append(segment(USER, tags.unique(), rng.randrange(FILLER_WORDS),
                                     prompt - user_overhead))
        else:
            k = groups[group]
            limit = shortest[group] - overhead - 4  # room for a unique tag and one word
            size = min(shared if shared is not None else limit, max(limit, 2))
            segments.append(segment(SYSTEM, shared_tag("t", k), shared_offset("t", k), size))
            segments.append(segment(USER, tags.unique(), rng.randrange(FILLER_WORDS),
                                     prompt - overhead - segments[0].tokens))
        room = limits.max_context - prompt_tokens(segments)
        if room < 1:
            raise ValueError(f"trace line {number}: prompt_tokens {prompt} leaves no room for "
                             f"a reply in the {limits.max_context}-token context")
        max_tokens = min(cap, room)
        items.append(WorkItem(arrival, "trace", tuple(segments), min(output, max_tokens),
                              max_tokens, group, session=len(items)))
    items.sort(key=lambda item: item.arrival_s)
    return tuple(items)


def _trace_record(number: int, line: str, default_max_tokens: int
                  ) -> tuple[int, float, int, int, str | None, int | None, int]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"trace line {number}: not JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"trace line {number}: expected a JSON object")

    def number_field(key: str, *, required: bool, integer: bool, low: float) -> float | None:
        value = data.get(key)
        if value is None:
            if required:
                raise ValueError(f"trace line {number}: missing {key!r}")
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                integer and not float(value).is_integer()) or not value >= low:
            kind = "an integer" if integer else "a number"
            raise ValueError(f"trace line {number}: {key!r} must be {kind} >= {low:g}, "
                             f"got {value!r}")
        return float(value)

    arrival = number_field("arrival_s", required=True, integer=False, low=0.0)
    prompt = number_field("prompt_tokens", required=True, integer=True, low=1)
    output = number_field("output_tokens", required=True, integer=True, low=1)
    shared = number_field("prefix_tokens", required=False, integer=True, low=1)
    cap = number_field("max_tokens", required=False, integer=True, low=1)
    group = data.get("prefix_group")
    if group is not None and not isinstance(group, str | int):
        raise ValueError(f"trace line {number}: 'prefix_group' must be a string or an integer")
    assert arrival is not None and prompt is not None and output is not None  # required above
    max_tokens = int(cap) if cap is not None else max(int(output), default_max_tokens)
    return (number, arrival, int(prompt), int(output), None if group is None else str(group),
            None if shared is None else int(shared), max_tokens)
