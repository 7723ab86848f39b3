"""A GroupCache spares parsing again the groups of a payload that did not change since the last
one, and never changes what a payload reads as."""

from __future__ import annotations

import pytest

from routing.metrics import GroupCache, read_metrics, snapshot_of
from routing.metrics.prom import parse_groups
from tests.paths import FIXTURES

VLLM_V1 = (FIXTURES / "vllm-v1.prom").read_bytes()
LABELS = b'{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
RUNNING = b"vllm:num_requests_running" + LABELS + b" 24.0"
USAGE = b"vllm:kv_cache_usage_perc" + LABELS + b" 0.421682776801406"


def with_running(n: int, usage: float = 0.42) -> bytes:
    return VLLM_V1.replace(RUNNING, RUNNING[:-4] + f"{n}.0".encode()).replace(
        USAGE, USAGE[: -len(b"0.421682776801406")] + str(usage).encode())


def test_unchanged_groups_keep_their_samples_and_changed_ones_are_parsed_again() -> None:
    cache = GroupCache()
    first = parse_groups(read_metrics(with_running(1)).groups, cache)
    second = parse_groups(read_metrics(with_running(2)).groups, cache)
    assert second["vllm:cache_config_info"] is first["vllm:cache_config_info"]
    assert second["vllm:num_requests_running"] is not first["vllm:num_requests_running"]
    assert second["vllm:num_requests_running"][0].value == 2.0


@pytest.mark.parametrize("sequence", [
    [with_running(1), with_running(2), with_running(2), with_running(3, usage=0.9)],
    [VLLM_V1, (FIXTURES / "sglang.prom").read_bytes(), VLLM_V1],
    [VLLM_V1, (FIXTURES / "vllm-v0.prom").read_bytes(), with_running(5)],
], ids=["a busy vLLM", "another server behind the same URL", "a vLLM downgrade and back"])
def test_snapshots_are_the_same_with_or_without_the_cache(sequence: list[bytes]) -> None:
    cache = GroupCache()
    for payload in sequence:
        reading = read_metrics(payload)
        assert snapshot_of(reading, taken_at=1.0, cache=cache) == snapshot_of(
            reading, taken_at=1.0)
