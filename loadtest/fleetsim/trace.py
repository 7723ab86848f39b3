"""Recorded traces for `kvgate simulate --trace`: requests with a trace's lengths, arrivals and
prefix sharing.

A trace gives lengths, not text; requests are written as the workloads write theirs
(loadtest/workloads.py), so the gateway's prefix chains and the engines' prefix caches see exactly
the sharing the trace records, and nothing more:

- kvgate's JSONL, one object per line:

      {"arrival_s": 0.42, "prompt_tokens": 7310, "output_tokens": 96,
       "prefix_group": "doc-7", "prefix_tokens": 6000, "max_tokens": 256}

  `arrival_s` (seconds from the start), `prompt_tokens` and `output_tokens` (>= 1) are required.
  Requests of one `prefix_group` share their first `prefix_tokens` prompt tokens (default: as
  many as the group's shortest prompt leaves room for, with a unique question after it) as one
  shared message; the rest is unique text.
- Mooncake: each hash id is one 512-token block of prompt, and block i is a message of its own
  whose text is a function of its hash id alone (a tag naming the id, then filler from an offset
  the id sets): 512 tokens with its chat template, so two requests whose hash ids agree on their
  first k ids agree on their first k x 512 prompt tokens, token for token, and diverge where the
  ids do. A prompt ends where `input_length` says: its last block is cut short (text a prefix of
  the full block's), and tokens beyond its hash ids are unique text.
- Azure and BurstGPT record no sharing: every prompt is unique text.

Prompt tokens count the chat template, as a server's usage does (a prompt too short for the
template and a tag is lengthened to the shortest possible). `max_tokens` (the client's cap) is
the JSONL's, or the larger of the output and `default_max_tokens`; the cap, and then the output,
are cut to the context left. In the public formats a record without a reply (0 output tokens:
BurstGPT's failed requests) and a prompt too long for the fleet's context are skipped and
counted (`TraceInfo`); in kvgate's JSONL both are errors naming the line. The reader streams and
stops early at `limit` requests, or at the first record past `horizon_s` in a public trace (they
are published in time order; kvgate's JSONL need not be, so its later records are still read).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, replace

from loadtest.fleetsim.trace_formats import MOONCAKE_BLOCK_TOKENS, Record, read_records
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

_REPLY_OPEN = prompt_tokens([])  # the reply's opening, after the last message
_MESSAGE = prompt_tokens([Segment(USER, "", 0, 0)]) - _REPLY_OPEN  # a message's template
_UNIQUE_TAG = 3  # words of a UniqueTags tag
_BLOCK_TAG = 3  # words of a block's tag
_UNIQUE_MIN = _MESSAGE + _UNIQUE_TAG + 1  # the shortest unique message
_BLOCK_CONTENT = MOONCAKE_BLOCK_TOKENS - _MESSAGE  # a whole block's tokens inside its template


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """What was read, and what was left out: for the run's summary."""

    format: str
    requests: int  # requests kept
    span_s: float  # first to last arrival, in the trace's own time
    failed: int = 0  # records without a reply (0 output tokens), skipped
    too_long: int = 0  # prompts that leave no room for a reply in the context, skipped
    max_context: int = 0
    rate_scale: float = 1.0  # the timeline was compressed this many times at loading
    stopped: str | None = None  # why reading stopped before the end of the file
    source: str = ""  # the file's name

    @property
    def native_rate_rps(self) -> float:
        """Requests per second of the trace's own timeline."""
        return self.requests / self.span_s if self.span_s > 0 else 0.0

    def as_json(self) -> dict[str, object]:
        return {"source": self.source, "format": self.format, "requests": self.requests,
                "span_s": round(self.span_s, 3),
                "native_rate_rps": round(self.native_rate_rps, 4), "rate_scale": self.rate_scale,
                "skipped_failed": self.failed, "skipped_too_long": self.too_long,
                "stopped": self.stopped}

    def describe(self) -> str:
        skipped = [f"{n} {what}" for n, what in (
            (self.failed, "failed (no reply)"),
            (self.too_long, f"longer than the {self.max_context}-token context (a "
                            "long-context model serves them: --backends 4xllama-3.1-8b-h100)"))
            if n]
        return (f"trace{' ' + self.source if self.source else ''} ({self.format}): "
                f"{self.requests} requests over {self.span_s:.1f} s "
                f"({self.native_rate_rps:.2f} requests/s native)"
                + (f"; skipped {', '.join(skipped)}" if skipped else "")
                + (f"; read up to {self.stopped}" if self.stopped else "")
                + (f"; --rate-scale {self.rate_scale:g}" if self.rate_scale != 1.0 else ""))


@dataclass(frozen=True, slots=True)
class Trace:
    items: tuple[WorkItem, ...]  # sorted by arrival, times already divided by the rate scale
    info: TraceInfo


def load_trace(lines: Iterable[str], *, limits: Limits | None = None,
               default_max_tokens: int = 1024) -> tuple[WorkItem, ...]:
    """The requests of a trace in any format (detected), sorted by arrival."""
    return read_trace(lines, limits=limits, default_max_tokens=default_max_tokens).items


def read_trace(lines: Iterable[str], *, fmt: str = "auto", limits: Limits | None = None,
               limit: int | None = None, horizon_s: float | None = None,
               rate_scale: float = 1.0, default_max_tokens: int = 1024) -> Trace:
    """A trace's requests and what was read (module docstring). `limit`: keep the first `limit`
    requests; `horizon_s`: leave out the records at or past it (trace time, before the rate
    scale); `rate_scale`: divide every arrival time by it. ValueError names the line of a
    malformed record."""
    limits = limits or Limits()
    if not rate_scale > 0:
        raise ValueError("the rate scale must be > 0")
    name, records = read_records(lines, fmt)
    kept: list[Record] = []
    failed = too_long = 0
    stopped: str | None = None
    build = _Builder(name, limits, default_max_tokens, 1.0 / rate_scale)
    items: list[WorkItem] = []
    for record in records:
        if horizon_s is not None and record.arrival_s >= horizon_s:
            stopped = f"{horizon_s:g} s"
            if name == "jsonl":
                continue
            break
        if name == "jsonl":
            kept.append(record)  # two passes: a group's shortest prompt sets its prefix
        elif record.output_tokens < 1:
            failed += 1
            continue
        else:
            item = build.item(record)
            if item is None:
                too_long += 1
                continue
            items.append(item)
        if limit is not None and len(kept) + len(items) >= limit:
            stopped = f"--trace-limit {limit}"
            break
    if name == "jsonl":
        items = build.jsonl(kept)
    items.sort(key=lambda item: item.arrival_s)  # stable: ties keep file order
    if items and items[0].arrival_s < 0:  # a public trace whose first record was not the first
        origin = items[0].arrival_s
        items = [replace(i, arrival_s=i.arrival_s - origin) for i in items]
    span = (items[-1].arrival_s - items[0].arrival_s) * rate_scale if items else 0.0
    return Trace(tuple(items), TraceInfo(name, len(items), span, failed, too_long,
                                         limits.max_context, rate_scale, stopped))


class _Builder:
    """Requests from records, with the text the module docstring describes."""

    def __init__(self, fmt: str, limits: Limits, default_max_tokens: int,
                 time_scale: float) -> None:
        self.fmt = fmt
        self.time_scale = time_scale  # a request's time is its record's times this
        self.kind = "trace" if fmt == "jsonl" else fmt
        self.limits = limits
        self.default_max_tokens = default_max_tokens
        self.tags = UniqueTags(0)
        self.rng = random.Random("kvgate-trace" if fmt == "jsonl" else f"kvgate-trace:{fmt}")
        self.count = 0  # requests made: each its own session number
        self.blocks: dict[int, Segment] = {}  # hash id -> its whole block's message

    def unique(self, tokens: int) -> Segment:
        return segment(USER, self.tags.unique(), self.rng.randrange(FILLER_WORDS), tokens)

    def block(self, hash_id: int, tokens: int = _BLOCK_CONTENT) -> Segment:
        """Block `hash_id`'s message, `tokens` long; a whole block is one object for every
        request (a cut one, usually a prompt's last, is seldom seen twice)."""
        found = self.blocks.get(hash_id) if tokens == _BLOCK_CONTENT else None
        if found is None:
            # Its low digits first: two blocks' text differs from its first word on.
            tag = (f" h{hash_id % 10_000:04d} h{hash_id // 10_000 % 10_000:04d}"
                   f" h{hash_id // 100_000_000 % 10_000:04d}")
            found = Segment(USER, tag, (hash_id * 104_729 + 7919) % FILLER_WORDS, tokens)
            if tokens == _BLOCK_CONTENT:
                self.blocks[hash_id] = found
        return found

    def segments(self, record: Record) -> list[Segment]:
        if not record.blocks:
            return [self.unique(record.prompt_tokens - _MESSAGE - _REPLY_OPEN)]
        budget = record.prompt_tokens - _REPLY_OPEN  # tokens of messages, templates included
        out: list[Segment] = []
        for hash_id in record.blocks:
            size = min(MOONCAKE_BLOCK_TOKENS, budget)
            if size < _MESSAGE + _BLOCK_TAG + 1:
                break
            out.append(self.block(hash_id, size - _MESSAGE))
            budget -= size
        if budget >= _UNIQUE_MIN or not out:
            out.append(self.unique(budget - _MESSAGE))  # beyond the hash ids: unique text
        elif budget > 0:  # a few tokens too few for a message: the last block runs on
            last = out.pop()
            out.append(self.block(record.blocks[len(out)], last.tokens + budget))
        return out

    def finish(self, record: Record, segments: list[Segment], group: str | None,
               cap: int | None) -> WorkItem | None:
        """The request, its cap and output cut to the context left; None if nothing is left."""
        # prompt_tokens(segments), for messages of users and systems alone: a hot path
        prompt = sum(s.tokens for s in segments) + _MESSAGE * len(segments) + _REPLY_OPEN
        room = self.limits.max_context - prompt
        if room < 1:
            return None
        if cap is None:
            cap = max(record.output_tokens, self.default_max_tokens)
        max_tokens = min(cap, room)
        self.count += 1
        return WorkItem(record.arrival_s * self.time_scale, self.kind, tuple(segments),
                        min(record.output_tokens, max_tokens), max_tokens, group,
                        session=self.count - 1)

    def item(self, record: Record) -> WorkItem | None:
        return self.finish(record, self.segments(record), None, None)

    def jsonl(self, records: list[Record]) -> list[WorkItem]:
        shortest: dict[str, int] = {}
        for r in records:
            if r.group is not None:
                shortest[r.group] = min(r.prompt_tokens, shortest.get(r.group, r.prompt_tokens))
        groups = {g: i for i, g in enumerate(sorted(shortest))}
        overhead = prompt_tokens([Segment(SYSTEM, "", 0, 0), Segment(USER, "", 0, 0)])
        items: list[WorkItem] = []
        for r in records:
            segments: list[Segment] = []
            if r.group is None:
                segments.append(self.unique(r.prompt_tokens - _MESSAGE - _REPLY_OPEN))
            else:
                k = groups[r.group]
                room = shortest[r.group] - overhead - 4  # room for a unique tag and one word
                size = min(r.prefix_tokens if r.prefix_tokens is not None else room,
                           max(room, 2))
                segments.append(segment(SYSTEM, shared_tag("t", k), shared_offset("t", k), size))
                segments.append(self.unique(r.prompt_tokens - overhead - segments[0].tokens))
            item = self.finish(r, segments, r.group, r.max_tokens)
            if item is None:
                raise ValueError(f"trace line {r.line}: prompt_tokens {r.prompt_tokens} leaves no "
                                 f"room for a reply in the {self.limits.max_context}-token "
                                 "context")
            items.append(item)
        return items
