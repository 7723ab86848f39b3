"""`kvgate plan`: the roofline plan's figures, its monotonicity, its warnings, the command line,
and a cross-check of its saturated capacity against the simulator's engine."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.cli import main
from loadtest.fleetsim.capacity import preset_capacity
from loadtest.workloads import USER, UniqueTags, WorkItem, prompt_tokens, segment
from routing.physics import (
    H100_SXM,
    L4,
    LLAMA_3_8B,
    LLAMA_3_70B,
    GpuSpec,
    ModelSpec,
    Preset,
)
from routing.plan import Plan, plan


def make(model: ModelSpec = LLAMA_3_8B, gpu: GpuSpec = H100_SXM, **kw: Any) -> Plan:
    args: dict[str, Any] = {"prompt_tokens": 1000, "output_tokens": 250, "rate": None,
                            "tpot_slo_s": 0.05, "ttft_slo_s": 1.0}
    return plan(model, gpu, **(args | kw))


def fixed_requests(prompt: int, output: int) -> Callable[[], Iterator[WorkItem]]:
    """Endless requests of exactly `prompt` rendered prompt tokens and `output` output tokens,
    each with a unique prefix (no prefix-cache hits)."""
    def requests() -> Iterator[WorkItem]:
        tags = UniqueTags(1)
        for n in itertools.count():
            tag = tags.unique()
            overhead = prompt_tokens((segment(USER, tag, 0, 100),)) - 100
            seg = segment(USER, tag, n * 7919, prompt - overhead)
            yield WorkItem(0.0, "fixed", (seg,), output, output, None)
    return requests


def test_kv_per_token_of_llama_3_8b_is_2_x_layers_x_kv_heads_x_head_dim_x_2_bytes() -> None:
    assert make().kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072


def test_70b_does_not_fit_one_h100_nor_two_at_vllms_default_utilization_but_fits_four() -> None:
    """At memory utilization 0.9 two H100s hold 144 GB, which the 141 GB of weights, the
    activation peak and the CUDA graphs overrun; four tensor parallel leave a large KV cache, and
    FP8 weights fit two."""
    with pytest.raises(ValueError, match="weights .* do not fit 1 x H100"):
        make(LLAMA_3_70B)
    with pytest.raises(ValueError, match="leave no room for the KV cache on 2 x H100"):
        make(LLAMA_3_70B, gpus_per_replica=2)
    for p in (make(LLAMA_3_70B, gpus_per_replica=4),
              make(LLAMA_3_70B, gpus_per_replica=2, fp8=True)):
        assert p.sequences_that_fit >= 50
        assert p.saturated.requests_per_s > 0


def test_a_request_larger_than_the_kv_cache_is_an_error() -> None:
    with pytest.raises(ValueError, match="more KV than the replica's cache holds"):
        make(LLAMA_3_70B, gpus_per_replica=2, memory_utilization=1.0, prompt_tokens=50_000,
             output_tokens=100)


@pytest.mark.parametrize(("model", "gpu", "gpus"), [
    (LLAMA_3_8B, H100_SXM, 1), (LLAMA_3_8B, L4, 1), (LLAMA_3_70B, H100_SXM, 4),
], ids=["8b-h100", "8b-l4", "70b-4xh100"])
def test_a_tighter_tpot_slo_never_gives_more_capacity_and_none_exceeds_saturation(
    model: ModelSpec, gpu: GpuSpec, gpus: int,
) -> None:
    slos = [None, 0.2, 0.1, 0.07, 0.05, 0.04, 0.03, 0.02, 0.01, 0.005]
    plans = [make(model, gpu, gpus_per_replica=gpus, tpot_slo_s=s) for s in slos]
    capacities = [p.slo_requests_per_s for p in plans]
    assert capacities == sorted(capacities, reverse=True)
    assert capacities[0] == plans[0].saturated.requests_per_s
    for p in plans:
        assert p.slo_requests_per_s <= p.saturated.requests_per_s
        if p.slo is not None and p.tpot_slo_s is not None:
            assert p.slo.tpot_s <= p.tpot_slo_s


def test_longer_outputs_lower_requests_per_s() -> None:
    rates = [make(output_tokens=n, tpot_slo_s=None).saturated.requests_per_s
             for n in (50, 250, 1000, 4000)]
    assert rates == sorted(rates, reverse=True) and len(set(rates)) == len(rates)


def test_the_saturated_point_is_consistent_with_its_own_formula() -> None:
    s = make().saturated
    assert s.output_tokens_per_s == pytest.approx(s.requests_per_s * 250)
    assert 0 < s.prefill_fraction < 1
    assert s.concurrency <= 256


@pytest.mark.parametrize("rate", [0.5, 17.0, 100.0, 1234.5])
def test_fleet_size_is_ceil_of_rate_over_slo_capacity(rate: float) -> None:
    for gpus, model in ((1, LLAMA_3_8B), (4, LLAMA_3_70B)):
        p = make(model, gpus_per_replica=gpus, rate=rate)
        assert p.fleet is not None and p.slo is not None
        assert p.fleet.replicas == math.ceil(rate / p.slo.requests_per_s)
        assert p.fleet.gpus == p.fleet.replicas * gpus
        assert 0 < p.fleet.load <= 1
        assert p.fleet.requests_per_s_per_replica == pytest.approx(rate / p.fleet.replicas)


def test_no_warning_for_a_plan_that_meets_its_slos() -> None:
    assert make(rate=10.0).warnings == ()


def test_an_impossible_ttft_slo_warns_that_even_an_idle_replica_misses_it() -> None:
    p = make(ttft_slo_s=0.001)
    assert any("over the TTFT SLO" in w for w in p.warnings)


def test_an_impossible_tpot_slo_warns_and_gives_no_capacity_and_no_fleet() -> None:
    p = make(tpot_slo_s=0.001, rate=10.0)
    assert p.slo is None and p.slo_requests_per_s == 0.0 and p.fleet is None
    assert any("even batch 1" in w and "no fleet size" in w for w in p.warnings)


def test_a_request_over_max_model_len_warns() -> None:
    p = make(prompt_tokens=8000, output_tokens=500)
    assert any("max_model_len 8192" in w for w in p.warnings)


def test_plan_matches_the_simulated_saturated_engine_within_25_percent() -> None:
    """The plan's roofline steady state against `preset_capacity`, one saturated simulated engine
    fed the same fixed-size requests (prompt 1000, output 250, llama-3-8b on one H100)."""
    planned = make(tpot_slo_s=None).saturated.requests_per_s
    measured = preset_capacity(Preset("xcheck", LLAMA_3_8B, H100_SXM),
                               fixed_requests(1000, 250), warmup_s=20.0, window_s=60.0)
    assert planned == pytest.approx(measured, rel=0.25), (planned, measured)


def test_fixed_requests_have_the_asked_prompt_length() -> None:
    item = next(fixed_requests(1000, 250)())
    assert len(item.prompt_ids()) == item.prompt_tokens == 1000


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_a_report_with_units_and_the_fleet_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "--model", "llama-3-8b", "--gpu", "h100", "--rate", "100")
    assert code == 0
    for text in ("131,072 bytes", "tokens/s", "requests/s", "TPOT <= 50 ms", "replicas"):
        assert text in out


def test_cli_json_parses_and_custom_specs_equal_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "--json", "--rate", "20")
    known = json.loads(out)
    assert code == 0 and known["replica"]["kv_bytes_per_token"] == 131072
    assert known["fleet"]["replicas"] >= 1
    code, out, _ = run_cli(capsys, "--json", "--rate", "20", "--params-b", "8.03", "--layers",
                           "32", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
                           "--gpu-memory-gb", "80", "--gpu-bandwidth-tbs", "3.35",
                           "--gpu-tflops", "989")
    custom = json.loads(out)["replica"]
    assert code == 0
    for key in ("kv_bytes_per_token", "kv_tokens_capacity", "sequences_that_fit"):
        assert custom[key] == known["replica"][key]
    assert custom["saturated"] == pytest.approx(known["replica"]["saturated"])


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--gpu", "tpu"], "unknown GPU 'tpu'"),
    (["--layers", "32", "--heads", "32"], "missing --params-b, --kv-heads, --head-dim"),
    (["--gpu-tflops", "100"], "missing --gpu-memory-gb, --gpu-bandwidth-tbs"),
    (["--model", "llama-3-8b", "--params-b", "8"], "not both"),
    (["--prompt-tokens", "0"], "--prompt-tokens must be > 0"),
    (["--rate", "-1"], "--rate must be > 0"),
    (["--tpot-slo-ms", "0"], "--tpot-slo-ms must be > 0"),
    (["--memory-utilization", "1.5"], "--memory-utilization must be at most 1"),
    (["--model", "llama-3-70b", "--gpu", "l4"], "do not fit"),
], ids=["unknown model", "unknown gpu", "partial custom model", "partial custom gpu",
        "model and custom flags", "zero prompt", "negative rate", "zero slo",
        "utilization over 1", "weights do not fit"])
def test_cli_bad_usage_exits_2_with_one_line_naming_the_problem(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str,
) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvgate plan: ") and message in err
