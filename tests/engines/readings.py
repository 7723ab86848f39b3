"""What a real engine says about itself, read with prometheus_client's parser (not kvgate's), in
the fields of a `/admin/backends` row: the reference the gateway's view is checked against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

Series = dict[str, list[tuple[dict[str, str], float]]]
FIELDS = ("kv_total_blocks", "kv_free_blocks", "kv_usage", "block_size", "running", "waiting")


async def scrape(http: aiohttp.ClientSession, url: str) -> Series:
    """Every sample of the engine's /metrics, by sample name."""
    async with http.get(url + "/metrics") as resp:
        assert resp.status == 200, resp.status
        text = await resp.text()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return series


def value(series: Series, name: str) -> float:
    """The sum of a series' samples (one per model or engine); 0 when absent."""
    return sum(v for _, v in series.get(name, ()))


def vllm_row(series: Series) -> dict[str, Any]:
    """vLLM V1: usage is `1 - free / (num_gpu_blocks - 1)` (one null block is kept out of the
    pool); the capacity and block size are `vllm:cache_config_info` labels."""
    [(labels, _)] = series["vllm:cache_config_info"]
    blocks = int(labels["num_gpu_blocks"])
    usage = value(series, "vllm:kv_cache_usage_perc")
    return {
        "kv_total_blocks": blocks,
        "kv_free_blocks": round((1 - usage) * (blocks - 1)),
        "kv_usage": usage,
        "block_size": int(labels["block_size"]),
        "running": int(value(series, "vllm:num_requests_running")),
        "waiting": int(value(series, "vllm:num_requests_waiting")),
    }


async def llamacpp_row(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """llama.cpp: the capacity is the slots' contexts summed, in tokens; the used part the
    processing slots' `n_past` where /slots reports it, else the KV cells in use that /metrics
    reports (`llamacpp:kv_cache_tokens`, the builds that write no `n_past`); running and
    waiting are /metrics' processing and deferred counts."""
    series = await scrape(http, url)
    async with http.get(url + "/slots") as resp:
        assert resp.status == 200, resp.status
        slots = orjson.loads(await resp.read())
    total = sum(int(slot["n_ctx"]) for slot in slots)
    busy = [slot for slot in slots if slot["is_processing"]]
    if all("n_past" in slot for slot in busy):
        used = sum(int(slot["n_past"]) for slot in busy)
    else:
        used = int(value(series, "llamacpp:kv_cache_tokens"))
    return {
        "kv_total_blocks": total,
        "kv_free_blocks": total - used,
        "kv_usage": used / total,
        "block_size": 1,
        "running": int(value(series, "llamacpp:requests_processing")),
        "waiting": int(value(series, "llamacpp:requests_deferred")),
    }


async def admin_row(http: aiohttp.ClientSession, gateway: str) -> Mapping[str, Any]:
    """The gateway's one backend row of /admin/backends."""
    async with http.get(gateway + "/admin/backends") as resp:
        assert resp.status == 200, resp.status
        [row] = orjson.loads(await resp.read())["backends"]
    assert isinstance(row, dict)
    return row


def agrees(row: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    """The row's KV and load fields are the engine's (usage to 1e-9)."""
    for field in FIELDS:
        got, want = row.get(field), expected[field]
        if field == "kv_usage":
            if got is None or abs(got - want) > 1e-9:
                return False
        elif got != want:
            return False
    return True


def events(stream: bytes) -> list[Any]:
    """The JSON of every `data:` event of an SSE stream, and "[DONE]" as the string."""
    out: list[Any] = []
    for line in stream.splitlines():
        if line.startswith(b"data: "):
            data = line[6:]
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out
