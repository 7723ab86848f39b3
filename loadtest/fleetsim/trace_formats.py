"""Readers of the trace formats `kvgate simulate --trace` replays, one record per request.

- `jsonl`: kvgate's own, one JSON object per line (loadtest/fleetsim/trace.py documents it).
- `azure`: the Azure LLM inference trace CSV (Azure/AzurePublicDataset), columns
  `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is a date and time such as
  `2023-11-16 18:15:46.6805900` (the 2023 files: seven fractional digits, no zone) or
  `2024-05-10 00:00:00.009930+00:00` (the 2024 week-long files: a UTC offset).
- `mooncake`: the Mooncake JSONL (kvcache-ai/Mooncake), `{"timestamp": ms, "input_length",
  "output_length", "hash_ids": [...]}`, each hash id one 512-token block of prompt.
- `burstgpt`: BurstGPT's CSV (HPMLL/BurstGPT), columns `Timestamp,Model,Request tokens,Response
  tokens,Total tokens,Log Type` (later releases add columns, which are ignored); Timestamp in
  seconds. A row with 0 response tokens is a failed request.

Every reader streams: it yields records as it reads lines, and holds nothing else. Arrival times
of the public formats are seconds from the file's first record (a later record that is earlier
comes out negative; the loader shifts the origin); kvgate's JSONL gives its own. A malformed
record raises ValueError naming its line (physical line of the file, from 1). `detect` tells the
format from the first non-blank line: a CSV header, or the keys of the first JSON record.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

FORMATS: tuple[str, ...] = ("jsonl", "azure", "mooncake", "burstgpt")
MOONCAKE_BLOCK_TOKENS = 512  # the tokens one Mooncake hash id stands for

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


@dataclass(frozen=True, slots=True)
class Record:
    """One request as a trace records it. `output_tokens` 0: the request got no reply."""

    line: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()  # Mooncake: the prompt's block hash ids, in order
    group: str | None = None  # JSONL: requests sharing a prefix
    prefix_tokens: int | None = None  # JSONL: how much of it they share
    max_tokens: int | None = None  # JSONL: the client's cap


def detect(line: str, number: int = 1) -> str:
    """The format of a trace whose first non-blank line (line `number`) is `line`."""
    text = line.strip().lstrip("\ufeff")
    if text.startswith("["):
        raise ValueError(f"trace line {number}: expected a JSON object")
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"trace line {number}: not JSON: {exc.msg}") from exc
        if isinstance(data, dict) and "arrival_s" in data:
            return "jsonl"
        if isinstance(data, dict) and ("hash_ids" in data or "input_length" in data):
            return "mooncake"
        raise ValueError(f"trace line {number}: a JSON record with neither 'arrival_s' (kvgate's "
                         "JSONL) nor 'input_length' and 'hash_ids' (Mooncake)")
    columns = {c.strip() for c in next(csv.reader([text]), [])}
    if set(AZURE_COLUMNS) <= columns:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= columns:
        return "burstgpt"
    raise ValueError(
        f"trace line {number}: not a known trace format (a JSON record, or a CSV header with "
        f"{','.join(AZURE_COLUMNS)} (Azure) or {','.join(BURSTGPT_COLUMNS)} (BurstGPT)); "
        f"got {text[:60]!r}")


def read_records(lines: Iterable[str], fmt: str = "auto") -> tuple[str, Iterator[Record]]:
    """The trace's format (`fmt`, or detected when "auto") and its records, read lazily."""
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    source = iter(lines)
    head: list[str] = []
    for line in source:
        head.append(line)
        if line.strip():
            break
    if not head or not head[-1].strip():
        return ("jsonl" if fmt == "auto" else fmt), iter(())
    name = detect(head[-1], len(head)) if fmt == "auto" else fmt
    return name, _READERS[name](chain(head, source))


def _integer(value: Any, what: str, number: int, low: int) -> int:
    """A token count or time as an integer >= low: an int, a float or a decimal string of one."""
    if type(value) is int and value >= low:  # the common cases first
        return value
    if type(value) is str and value.isdigit():
        n = int(value)
        if n >= low:
            return n
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed: float = int(text)
        except ValueError:
            try:
                parsed = float(text)
            except ValueError:
                parsed = float("nan")
        value = parsed
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            float(value).is_integer() and value >= low):
        raise ValueError(f"trace line {number}: {what} must be an integer >= {low}, "
                         f"got {value!r}")
    return int(value)


def _seconds(value: Any, what: str, number: int) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):  # a string that is no number: refused below
            value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"trace line {number}: {what} must be a number >= 0, got {value!r}")
    return float(value)


# JSONL (kvgate's own)

def _jsonl(lines: Iterable[str]) -> Iterator[Record]:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield _jsonl_record(number, _json_object(number, line))


def _json_object(number: int, line: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"trace line {number}: not JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"trace line {number}: expected a JSON object")
    return data


def _jsonl_record(number: int, data: dict[str, Any]) -> Record:
    def field(key: str, *, required: bool, integer: bool, low: float) -> float | None:
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

    arrival = field("arrival_s", required=True, integer=False, low=0.0)
    prompt = field("prompt_tokens", required=True, integer=True, low=1)
    output = field("output_tokens", required=True, integer=True, low=1)
    shared = field("prefix_tokens", required=False, integer=True, low=1)
    cap = field("max_tokens", required=False, integer=True, low=1)
    group = data.get("prefix_group")
    if group is not None and not isinstance(group, str | int):
        raise ValueError(f"trace line {number}: 'prefix_group' must be a string or an integer")
    assert arrival is not None and prompt is not None and output is not None  # required above
    return Record(number, arrival, int(prompt), int(output), (),
                  None if group is None else str(group),
                  None if shared is None else int(shared), None if cap is None else int(cap))


# Mooncake

def _mooncake(lines: Iterable[str]) -> Iterator[Record]:
    origin: float | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        data = _json_object(number, line)
        for key in ("timestamp", "input_length", "output_length"):
            if key not in data:
                raise ValueError(f"trace line {number}: missing {key!r}")
        at = _seconds(data["timestamp"], "'timestamp'", number) / 1000.0
        prompt = _integer(data["input_length"], "'input_length'", number, 0)
        output = _integer(data["output_length"], "'output_length'", number, 0)
        ids = data.get("hash_ids", [])
        if not isinstance(ids, list):
            raise ValueError(f"trace line {number}: 'hash_ids' must be a list of integers")
        if set(map(type, ids)) <= {int} and (not ids or min(ids) >= 0):
            blocks = tuple(ids)
        else:
            blocks = tuple(_integer(h, "each hash id", number, 0) for h in ids)
        origin = at if origin is None else origin
        yield Record(number, at - origin, prompt, output, blocks)


# CSV: Azure and BurstGPT

def _csv_rows(lines: Iterable[str], columns: tuple[str, ...], name: str
              ) -> Iterator[tuple[int, list[str]]]:
    """(line number, the named columns' cells) of every data row after the header."""
    reader = csv.reader(lines)
    header: list[str] = []
    for header in reader:
        if any(cell.strip() for cell in header):
            break
    names = [cell.strip().lstrip("\ufeff") for cell in header]
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"trace line {reader.line_num}: not {name} header (expected the "
                         f"columns {','.join(columns)}; missing {','.join(missing)})")
    index = [names.index(c) for c in columns]
    width = max(index) + 1
    for row in reader:
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) < width:
            raise ValueError(f"trace line {reader.line_num}: {len(row)} columns, the header "
                             f"has {len(names)}")
        yield reader.line_num, [row[i] for i in index]


_TIMESTAMP = re.compile(
    r"\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9})\d*)?"
    r"\s*(Z|[+-]\d{2}:?\d{2})?\s*")


@functools.lru_cache(maxsize=4096)
def _day(year: str, month: str, day: str) -> int:
    return datetime.date(int(year), int(month), int(day)).toordinal()


def timestamp_ns(text: str, number: int = 1) -> int:
    """An Azure TIMESTAMP as integer nanoseconds since 0001-01-01 (UTC when it has an offset;
    as written when it has none): exact, so arrivals a few hundred nanoseconds apart stay apart."""
    m = _TIMESTAMP.fullmatch(text)
    if m is None:
        raise ValueError(f"trace line {number}: TIMESTAMP must be a date and time such as "
                         f"2023-11-16 18:15:46.6805900, got {text!r}")
    year, month, day, h, mi, sec, fraction, zone = m.groups()
    hour, minute, second = int(h), int(mi), int(sec)
    try:
        days = _day(year, month, day)
    except ValueError as exc:
        raise ValueError(f"trace line {number}: TIMESTAMP {text.strip()!r}: {exc}") from exc
    if hour > 23 or minute > 59 or second > 60:
        raise ValueError(f"trace line {number}: TIMESTAMP {text.strip()!r}: no such time")
    seconds = days * 86_400 + hour * 3600 + minute * 60 + second
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    nanos = int(fraction.ljust(9, "0")) if fraction else 0
    return seconds * 1_000_000_000 + nanos


def _azure(lines: Iterable[str]) -> Iterator[Record]:
    origin: int | None = None
    for number, (stamp, context, generated) in _csv_rows(lines, AZURE_COLUMNS, "an Azure trace"):
        ns = timestamp_ns(stamp, number)
        origin = ns if origin is None else origin
        yield Record(number, (ns - origin) / 1e9, _integer(context, "ContextTokens", number, 0),
                     _integer(generated, "GeneratedTokens", number, 0))


def _burstgpt(lines: Iterable[str]) -> Iterator[Record]:
    origin: float | None = None
    for number, (stamp, request, response) in _csv_rows(lines, BURSTGPT_COLUMNS, "a BurstGPT"):
        at = _seconds(stamp, "Timestamp", number)
        origin = at if origin is None else origin
        yield Record(number, at - origin, _integer(request, "Request tokens", number, 0),
                     _integer(response, "Response tokens", number, 0))


_READERS: dict[str, Callable[[Iterable[str]], Iterator[Record]]] = {
    "jsonl": _jsonl, "azure": _azure, "mooncake": _mooncake, "burstgpt": _burstgpt}
