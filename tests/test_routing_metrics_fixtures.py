"""Every real-format payload in tests/fixtures parses into the values its README lists."""

from __future__ import annotations

from typing import Any

import pytest

from routing.metrics import (
    MetricsError,
    detect_family,
    parse_metrics,
    parse_slots,
    read_metrics,
    snapshot_of,
    with_slots,
)
from routing.state import BackendSnapshot
from tests.paths import FIXTURES

TGI_BUDGET = 131072  # the README's configured max_batch_total_tokens

# file -> (detected family, the fields every parse must produce). kv_free_blocks is checked apart,
# with the README's tolerance.
EXPECTED: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm-v1.prom": ("vllm", dict(
        format="vllm", kv_usage=0.421682776801406, kv_total_blocks=27313, block_size=16,
        running=24, waiting=3, preemptions=17, prefix_cache_hit_rate=0.6,
        models=("meta-llama/Llama-3.1-8B-Instruct", "sql-lora", "chat-lora"),
    )),
    "vllm-v0.prom": ("vllm", dict(
        format="vllm-v0", kv_usage=0.40002746498214775, kv_total_blocks=7282, block_size=16,
        running=12, waiting=5, preemptions=41, prefix_cache_hit_rate=0.35128,
        models=("mistralai/Mistral-7B-Instruct-v0.3",),
    )),
    "sglang.prom": ("sglang", dict(
        format="sglang", kv_usage=0.3000033952398737, kv_total_blocks=29453, block_size=16,
        running=37, waiting=5, preemptions=4, prefix_cache_hit_rate=0.4125,
        models=("Qwen/Qwen2.5-72B-Instruct",),
    )),
    "tgi.prom": ("tgi", dict(
        format="tgi", kv_usage=61440 / TGI_BUDGET, kv_total_blocks=TGI_BUDGET, block_size=1,
        running=32, waiting=6, preemptions=None, prefix_cache_hit_rate=None, models=None,
    )),
    "llamacpp.prom": ("llamacpp", dict(
        format="llamacpp", kv_usage=None, kv_total_blocks=None, kv_free_blocks=None,
        block_size=None, running=2, waiting=1, preemptions=None,
        prefix_cache_hit_rate=120384 / (48213 + 120384), models=None,
    )),
}
FREE_BLOCKS = {  # file -> (expected, tolerance)
    "vllm-v1.prom": (15795, 1),  # round((1-u)*(27313-1)); the naive formula gives 15796
    "vllm-v0.prom": (4369, 0),
    "sglang.prom": (20617, 0),  # 329872 free tokens in pages of 16
    "tgi.prom": (TGI_BUDGET - 61440, 0),
}


def parse(name: str, **kwargs: Any) -> BackendSnapshot:
    return parse_metrics((FIXTURES / name).read_text(), taken_at=12.5, **kwargs)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_is_detected_by_its_series_names(name: str) -> None:
    assert detect_family((FIXTURES / name).read_text()) == EXPECTED[name][0]


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("configured", [False, True], ids=["auto-detected", "configured"])
def test_fixture_parses_into_the_readme_values(name: str, configured: bool) -> None:
    fields = EXPECTED[name][1]
    snapshot = parse(
        name,
        format=fields["format"] if configured else None,
        max_batch_total_tokens=TGI_BUDGET,
    )
    assert snapshot.taken_at == 12.5
    for field, value in fields.items():
        got = getattr(snapshot, field)
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-12), field
        else:
            assert got == value, field
    if name in FREE_BLOCKS:
        expected, tolerance = FREE_BLOCKS[name]
        assert snapshot.kv_free_blocks is not None
        assert abs(snapshot.kv_free_blocks - expected) <= tolerance


def test_vllm_v1_free_blocks_leave_out_the_reserved_null_block() -> None:
    snapshot = parse("vllm-v1.prom")
    assert snapshot.kv_free_blocks == round((1 - 0.421682776801406) * (27313 - 1)) == 15795


def test_tgi_without_a_configured_budget_has_no_kv_figures() -> None:
    snapshot = parse("tgi.prom")
    assert (snapshot.kv_total_blocks, snapshot.kv_free_blocks, snapshot.kv_usage) == (None,) * 3
    assert snapshot.block_size is None
    assert (snapshot.running, snapshot.waiting) == (32, 6)


def test_llamacpp_slots_give_kv_from_processing_slots_only() -> None:
    slots = parse_slots((FIXTURES / "llamacpp-slots.json").read_bytes())
    assert (slots.total_tokens, slots.used_tokens, slots.processing) == (16384, 3097, 2)
    snapshot = with_slots(parse("llamacpp.prom"), slots)
    assert snapshot.kv_total_blocks == 16384
    assert snapshot.kv_free_blocks == 13287
    assert snapshot.kv_usage == pytest.approx(0.18902587890625)
    assert snapshot.block_size == 1
    assert (snapshot.running, snapshot.waiting) == (2, 1)


def test_llamacpp_slots_with_a_unified_kv_cache_share_one_context() -> None:
    # With unified KV (llama-server's default without -np) every slot reports the whole context.
    slots = parse_slots((FIXTURES / "llamacpp-slots.json").read_bytes(), unified=True)
    assert (slots.total_tokens, slots.used_tokens, slots.processing) == (4096, 3097, 2)
    snapshot = with_slots(parse("llamacpp.prom"), slots)
    assert (snapshot.kv_total_blocks, snapshot.kv_free_blocks) == (4096, 999)


@pytest.mark.parametrize(
    ("name", "wrong"),
    [
        pytest.param("vllm-v1.prom", "sglang", id="vLLM read as SGLang"),
        pytest.param("sglang.prom", "vllm", id="SGLang read as vLLM"),
        pytest.param("tgi.prom", "trtllm", id="TGI read as TensorRT-LLM"),
        pytest.param("llamacpp.prom", "tgi", id="llama.cpp read as TGI"),
    ],
)
def test_a_payload_in_another_format_than_configured_is_an_error(name: str, wrong: str) -> None:
    with pytest.raises(MetricsError):
        parse(name, format=wrong)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bytes_and_text_read_the_same(name: str) -> None:
    payload = (FIXTURES / name).read_bytes()
    kwargs: dict[str, Any] = {"taken_at": 1.0, "max_batch_total_tokens": TGI_BUDGET}
    assert parse_metrics(payload, **kwargs) == parse_metrics(payload.decode(), **kwargs)


# (file, a line routing does not read, the same line changed, a line it reads, that one changed)
CHANGES = [
    pytest.param("vllm-v1.prom", b"process_cpu_seconds_total 812.33",
                 b"process_cpu_seconds_total 812.4", b'Llama-3.1-8B-Instruct"} 24.0',
                 b'Llama-3.1-8B-Instruct"} 25.0', id="vLLM: process CPU / running"),
    pytest.param("sglang.prom", b'tp_rank="0"} 2310.5718', b'tp_rank="0"} 2290.1',
                 b'tp_rank="0"} 37.0', b'tp_rank="0"} 38.0', id="SGLang: throughput / running"),
    pytest.param("tgi.prom", b"tgi_request_count 1520", b"tgi_request_count 1521",
                 b"tgi_queue_size 6", b"tgi_queue_size 7", id="TGI: request count / queue"),
]


@pytest.mark.parametrize(("name", "unread", "unread_changed", "read", "read_changed"), CHANGES)
def test_a_reading_changes_with_the_series_read_and_only_with_them(
    name: str, unread: bytes, unread_changed: bytes, read: bytes, read_changed: bytes
) -> None:
    payload = (FIXTURES / name).read_bytes()
    assert payload.count(unread) == 1 and payload.count(read) == 1
    reading = read_metrics(payload)
    assert read_metrics(payload.replace(unread, unread_changed)) == reading
    busier = read_metrics(payload.replace(read, read_changed))
    assert busier != reading
    before = snapshot_of(reading, taken_at=1.0, max_batch_total_tokens=TGI_BUDGET)
    after = snapshot_of(busier, taken_at=1.0, max_batch_total_tokens=TGI_BUDGET)
    assert (after.running or 0) + (after.waiting or 0) == (before.running or 0) + (
        before.waiting or 0) + 1


def _without_tgi_load_gauges() -> bytes:
    """tgi.prom as a router that has not queued or batched a request yet writes it: TGI sets
    those three gauges in its queue and batching task only (backends/v3)."""
    gauges = (b"tgi_queue_size", b"tgi_batch_current_size", b"tgi_batch_current_max_tokens")
    lines = (FIXTURES / "tgi.prom").read_bytes().splitlines(keepends=True)
    kept = [line for line in lines
            if not any(g + b" " in line or line.startswith(g) for g in gauges)]
    assert len(kept) == len(lines) - 9  # HELP, TYPE and the sample of each
    return b"".join(kept)


@pytest.mark.parametrize("payload", [_without_tgi_load_gauges(), b""],
                         ids=["other TGI series only", "empty"])
def test_a_configured_tgi_that_has_not_batched_yet_reads_as_idle(payload: bytes) -> None:
    snapshot = parse_metrics(payload, taken_at=1.0, format="tgi",
                             max_batch_total_tokens=TGI_BUDGET)
    assert (snapshot.running, snapshot.waiting) == (0, 0)
    assert (snapshot.kv_total_blocks, snapshot.kv_free_blocks, snapshot.kv_usage) == (
        TGI_BUDGET, TGI_BUDGET, 0.0)


@pytest.mark.parametrize("payload", [
    pytest.param((FIXTURES / "vllm-v1.prom").read_bytes(), id="vLLM's metrics"),
    pytest.param(b"<!DOCTYPE html>\n<html><body>Not Found</body></html>\n", id="an HTML page"),
    pytest.param(b"# HELP up\nup 1\n", id="other Prometheus series"),
])
def test_a_configured_tgi_without_its_gauges_must_still_be_tgi(payload: bytes) -> None:
    with pytest.raises(MetricsError):
        parse_metrics(payload, taken_at=1.0, format="tgi")


def test_a_tgi_that_has_not_batched_yet_cannot_be_detected() -> None:
    with pytest.raises(MetricsError):
        parse_metrics(_without_tgi_load_gauges(), taken_at=1.0)
