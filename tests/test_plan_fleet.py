"""`kvgate plan` for a fleet: the cheapest deployment mix over the known GPUs, its cost and power,
the trace it reads its shape from, and the check that `kvgate simulate` of the proposed fleet
meets the SLOs at the planned rate."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from loadtest.sim.presets import lookup
from routing.fleet_plan import plan_fleet
from routing.physics import GPUS, LLAMA_3_8B, LLAMA_3_70B, ModelSpec

PRICES = {"h100": 2.5, "a100": 1.6, "l40s": 1.0}  # $/GPU-hour, made up for the tests


def fleet(model: ModelSpec = LLAMA_3_8B, **kw: Any) -> Any:
    args: dict[str, Any] = {"rate": 20.0, "prompt_tokens": 1000, "output_tokens": 250,
                            "tpot_slo_s": 0.05, "ttft_slo_s": 1.0}
    return plan_fleet(model, GPUS, **(args | kw))


def write_trace(path: Path, *, rate: float, requests: int, seed: int) -> Path:
    """Poisson arrivals of prompts of 200-2000 tokens and replies of 50-400."""
    rng = random.Random(seed)
    t = 0.0
    with path.open("w", encoding="utf-8") as f:
        for _ in range(requests):
            t += rng.expovariate(rate)
            f.write(json.dumps({"arrival_s": round(t, 4), "prompt_tokens": rng.randint(200, 2000),
                                "output_tokens": rng.randint(50, 400)}) + "\n")
    return path


def test_the_fleet_covers_the_rate_and_each_replica_runs_within_its_planned_share() -> None:
    for rate in (0.5, 20.0, 300.0):
        p = fleet(rate=rate)
        assert p.groups and p.capacity >= rate
        for g in p.groups:
            assert g.candidate.capacity == pytest.approx(
                g.candidate.replica.slo_requests_per_s * 0.8)
            assert g.candidate.replica.slo is not None
            assert g.candidate.replica.slo.tpot_s <= 0.05


def test_with_prices_only_priced_gpus_are_used_and_the_fleet_is_the_cheapest_one() -> None:
    p = fleet(rate=30.0, prices=PRICES)
    assert {g.candidate.gpu_key for g in p.groups} <= set(PRICES)
    assert p.cost_per_hour == sum(g.gpus * PRICES[g.candidate.gpu_key] for g in p.groups)
    for c in p.candidates:  # no homogeneous fleet of any candidate is cheaper
        n = math.ceil(30.0 / c.capacity)
        assert n * c.gpus_per_replica * PRICES[c.gpu_key] >= p.cost_per_hour - 1e-9


def test_a_cheaper_gpu_wins_once_its_price_falls_enough() -> None:
    expensive = fleet(rate=30.0, prices={"h100": 2.5, "l40s": 2.0})
    cheap = fleet(rate=30.0, prices={"h100": 2.5, "l40s": 0.3})
    assert any(g.candidate.gpu_key == "h100" for g in expensive.groups)
    assert all(g.candidate.gpu_key == "l40s" for g in cheap.groups)
    assert cheap.cost_per_hour is not None and expensive.cost_per_hour is not None
    assert cheap.cost_per_hour < expensive.cost_per_hour


def test_cost_and_energy_per_million_output_tokens_follow_from_the_rate() -> None:
    p = fleet(rate=10.0, prices=PRICES, power={"h100": 700, "a100": 400, "l40s": 350})
    tokens_per_hour = 10.0 * 250 * 3600
    assert p.cost_per_million_output_tokens == pytest.approx(
        p.cost_per_hour / (tokens_per_hour / 1e6))
    assert p.power_w == sum(g.gpus * {"h100": 700, "a100": 400, "l40s": 350}[g.candidate.gpu_key]
                            for g in p.groups)
    assert p.kwh_per_million_output_tokens == pytest.approx(
        p.power_w / 1e3 / (tokens_per_hour / 1e6))


def test_70b_needs_tensor_parallel_or_fp8_and_fp8_is_considered_only_when_allowed() -> None:
    bf16 = fleet(LLAMA_3_70B, rate=5.0, prices={"h100": 2.5})
    assert all(g.candidate.gpus_per_replica >= 4 and not g.candidate.fp8 for g in bf16.groups)
    fp8 = fleet(LLAMA_3_70B, rate=5.0, prices={"h100": 2.5}, fp8=(False, True))
    assert fp8.cost_per_hour is not None and bf16.cost_per_hour is not None
    assert fp8.cost_per_hour < bf16.cost_per_hour


def test_every_proposed_deployment_is_a_preset_the_simulator_knows() -> None:
    p = fleet(LLAMA_3_70B, rate=12.0, fp8=(False, True))
    for c in p.candidates:
        preset = lookup(c.name)
        assert preset is not None and preset.num_gpus == c.gpus_per_replica
        assert preset.fp8_weights == c.fp8 and preset.gpu is GPUS[c.gpu_key]


def test_impossible_slos_give_no_fleet_and_say_why() -> None:
    p = fleet(tpot_slo_s=0.001)
    assert p.groups == () and p.gpus == 0 and "no deployment" in p.warnings[0]


@pytest.mark.parametrize(("rate", "prices"), [
    pytest.param(6.0, ["--price", "h100=2.5,a100=1.6,l40s=1.0"], id="priced: the cheapest"),
    pytest.param(25.0, [], id="unpriced: the fewest GPUs"),
])
def test_kvgate_simulate_confirms_the_proposed_fleet_meets_the_slos_at_the_planned_rate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rate: float, prices: list[str],
) -> None:
    """Plan from a trace, then replay the same trace on the proposed fleet under kvgate's
    default routing: at least 95% of the requests meet both SLOs (refusals count as misses), and
    the p99 TTFT and p99 TPOT are within them."""
    trace = write_trace(tmp_path / "t.jsonl", rate=rate, requests=int(100 * rate), seed=3)
    assert main(["plan", "--trace", str(trace), "--json", *prices]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["rate"] == pytest.approx(rate, rel=0.15)
    code = main(["simulate", "--backends", planned["backends"], "--trace", str(trace),
                 "--policies", "cost", "--json", "-", "--quiet", "--slo-ttft", "1",
                 "--slo-tpot", "0.05"])
    assert code == 0
    point = json.loads(capsys.readouterr().out)["points"][0]
    run = point["policies"]["cost+adm"]["runs"][0]
    assert run["goodput_rps"] / point["rate_rps"] >= 0.95, run
    assert run["ttft_p99_s"] <= 1.0 and run["tpot_p99_s"] <= 0.05, run


def test_cli_fleet_report_names_the_fleet_its_cost_and_the_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["plan", "--rate", "20", "--price", "h100=2.5", "--price", "l40s=1",
                 "--power", "h100=700,l40s=350"])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("per million output tokens", "kWh per million", "kvgate simulate --backends",
                 "replicas", "GPUs"):
        assert text in out


@pytest.mark.parametrize(("args", "message"), [
    (["--fleet"], "needs --rate"),
    (["--fleet", "--rate", "5", "--gpu", "h100"], "not --gpu"),
    (["--rate", "5", "--price", "tpu=3"], "--price 'tpu=3'"),
    (["--rate", "5", "--power", "h100=-1"], "--power 'h100=-1'"),
    (["--trace", "/nonexistent/t.jsonl"], "cannot read"),
], ids=["no rate", "one gpu", "unknown gpu price", "negative power", "missing trace"])
def test_cli_fleet_bad_usage_exits_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str,
) -> None:
    code = main(["plan", *args])
    _, err = capsys.readouterr()
    assert code == 2 and message in err
