"""One streamed chat timed as its client sees it: the load tools' shared measurement.

TTFT runs from sending the request to the first event carrying text; TPOT is the time from there
to the end over the text events after the first (one token each on vLLM's defaults).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp

_TEXT = b'"content":"'
_EMPTY = b'"content":""'


@dataclass(frozen=True, slots=True)
class Streamed:
    status: int
    headers: dict[str, str]
    ttft_s: float | None
    tpot_s: float | None


async def streamed_chat(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Streamed:
    """POSTs `body` (a streaming chat request) to `url`/v1/chat/completions and times it."""
    start = time.perf_counter()
    first: float | None = None
    events = 0
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {") and _TEXT in line.replace(_EMPTY, b""):
                events += 1
                if first is None:
                    first = time.perf_counter()
        end = time.perf_counter()
        headers = dict(resp.headers)
        status = resp.status
    tpot = None if first is None or events < 2 else (end - first) / (events - 1)
    return Streamed(status, headers, None if first is None else first - start, tpot)
