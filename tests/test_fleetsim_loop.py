"""The fleet simulation's event loop: conservation, determinism, identical schedules across
policies, staleness and gateway replicas. Small fleets, a few simulated seconds."""

from __future__ import annotations

import json
import math

import pytest

from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.experiment import Contender, Experiment, run_experiment
from loadtest.fleetsim.loop import RunOutcome, SimConfig, simulate
from loadtest.fleetsim.results import Slo, summarize
from loadtest.fleetsim.trace import load_trace
from loadtest.workloads import WorkItem, schedule, workload
from routing.dispatch import DispatchConfig
from routing.policies import policy_names

FLEET = parse_fleet("2xllama-3-8b-h100,1xllama-3-8b-l40s")
DURATION = 6.0
SEEDS = (0, 1, 2)  # a comparison of two configurations holds on each of these schedules


def _items(name: str = "mixed", rate: float = 12.0, seed: int = 0) -> tuple[WorkItem, ...]:
    return schedule(workload(name), rate=rate, duration_s=DURATION, seed=seed)


def _run(items: tuple[WorkItem, ...], **config: object) -> RunOutcome:
    return simulate(items, FLEET, SimConfig(**config), duration_s=DURATION)  # type: ignore[arg-type]


def _check_conservation(items: tuple[WorkItem, ...], out: RunOutcome) -> None:
    assert len(out.requests) == len(items)
    for item, r in zip(items, out.requests, strict=True):
        assert r.arrival_s == item.arrival_s
        if r.rejected is None:
            assert r.backend is not None
            assert r.output_tokens == item.output_tokens  # the reply ran to its natural end
            assert r.arrival_s <= r.first_token_s <= r.end_s <= out.makespan_s
        else:
            assert r.output_tokens == 0 and math.isnan(r.first_token_s)
    completed = sum(1 for r in out.requests if r.rejected is None)
    assert sum(b.requests for b in out.backends) == completed
    assert sum(b.output_tokens for b in out.backends) == sum(r.output_tokens
                                                             for r in out.requests)


@pytest.mark.parametrize("policy", policy_names())
@pytest.mark.parametrize("admission", [False, True], ids=["bare", "admission"])
def test_every_request_completes_or_is_rejected_exactly_once(policy: str,
                                                             admission: bool) -> None:
    items = _items()
    _check_conservation(items, _run(items, policy=policy, admission=admission))


def test_an_overloaded_gateway_queue_rejects_and_still_conserves_requests() -> None:
    # 300 long requests within one second: more KV than the fleet holds. With no scrape after
    # the first, the gateway's ledger alone tells it so: admission queues the surplus in the
    # gateway, where a short queue overflows and a short timeout expires. (SLO admission off:
    # it would refuse most of them first, for the TPOT their prefills would cost.)
    items = load_trace(json.dumps({"arrival_s": i / 300, "prompt_tokens": 6000,
                                   "output_tokens": 300}) for i in range(300))
    tight = DispatchConfig(queue_max_depth=4, queue_timeout_s=0.5, slo_admission=False)
    out = _run(items, policy="cost", admission=True, dispatch=tight, scrape_interval_s=100.0,
               max_snapshot_age_s=1000.0)
    codes = {r.rejected for r in out.requests}
    assert {"queue_full", "queue_timeout"} <= codes
    assert out.peak_queue == 4
    _check_conservation(items, out)


def test_the_same_seed_gives_identical_results() -> None:
    items = _items()
    a = _run(items, policy="power_of_two", seed=5)
    b = _run(items, policy="power_of_two", seed=5)
    c = _run(items, policy="power_of_two", seed=6)
    assert a == b
    assert summarize(a, Slo()) == summarize(b, Slo())
    assert [r.backend for r in a.requests] != [r.backend for r in c.requests]


def test_every_policy_replays_the_identical_schedule_and_json_is_reproducible() -> None:
    experiment = Experiment(
        fleet=FLEET, contenders=(Contender("round_robin", False), Contender("cost", True)),
        workload=workload("chat"), rates=(10.0,), duration_s=4.0, seeds=(1,))
    report = run_experiment(experiment)
    runs = report.points[0].runs
    seen = [[(r.arrival_s, r.kind, r.prompt_tokens) for r in run.outcome.requests]
            for run in runs]
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0]
    again = run_experiment(experiment)
    assert json.dumps(report.as_json()) == json.dumps(again.as_json())


def test_a_longer_scrape_interval_changes_the_decisions() -> None:
    items = _items("chat", rate=25.0)
    fresh = _run(items, policy="kv_util", scrape_interval_s=0.05, max_snapshot_age_s=10.0)
    stale = _run(items, policy="kv_util", scrape_interval_s=3.0, max_snapshot_age_s=10.0)
    assert [r.backend for r in fresh.requests] != [r.backend for r in stale.requests]


def test_gateway_replicas_each_keep_their_own_ledger() -> None:
    items = _items("chat", rate=25.0)
    one = _run(items, policy="least_request", replicas=1)
    two = _run(items, policy="least_request", replicas=2)
    _check_conservation(items, two)
    # least_request counts only the replica's own in-flight requests: a second replica that
    # cannot see the first one's dispatches places requests differently.
    assert [r.backend for r in one.requests] != [r.backend for r in two.requests]


def test_round_robin_spreads_requests_evenly_over_the_backends() -> None:
    out = _run(_items("chat", rate=30.0), policy="round_robin")
    counts = [b.requests for b in out.backends]
    assert max(counts) - min(counts) <= 1


def test_summary_figures_follow_their_definitions() -> None:
    items = _items("chat", rate=8.0)
    out = _run(items, policy="least_request")
    s = summarize(out, Slo(ttft_s=1.0, tpot_s=0.05))
    done = [r for r in out.requests if r.rejected is None]
    assert s.completed == len(done) and s.requests == len(items)
    ttfts = sorted(r.ttft_s for r in done)
    assert s.ttft_p50_s == ttfts[math.ceil(0.5 * len(ttfts)) - 1]
    assert s.ttft_p99_s == ttfts[math.ceil(0.99 * len(ttfts)) - 1]
    good = [r for r in done if r.ttft_s <= 1.0 and (r.tpot_s is None or r.tpot_s <= 0.05)]
    assert s.goodput_rps == pytest.approx(len(good) / DURATION)
    hits = sum(b.prefix_hits_tokens for b in out.backends)
    queries = sum(b.prefix_queries_tokens for b in out.backends)
    assert s.prefix_hit_rate == pytest.approx(hits / queries)
    assert s.load_imbalance is not None and s.load_imbalance >= 1.0


def test_every_dispatched_request_records_what_the_gateway_predicted_for_it() -> None:
    out = _run(_items("chat", rate=8.0), policy="cost")
    done = [r for r in out.requests if r.rejected is None]
    assert done and all(r.predicted_ttft_s > 0.0 and r.predicted_tpot_s > 0.0 for r in done)
    # Predictions are of time from dispatch: the gateway queue is not in them.
    assert all(math.isfinite(r.predicted_ttft_s) for r in done)


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed {s}" for s in SEEDS])
def test_past_the_fleets_slo_capacity_slo_admission_sheds_the_excess_and_raises_goodput(
        seed: int) -> None:
    # Mixed traffic at about this fleet's saturated throughput, past what it serves within the
    # SLOs: without SLO admission every admitted reply slows down together; with it the gateway
    # refuses the surplus (429 over_slo) and more requests meet both SLOs than when all are let
    # in. A property of every schedule, so it holds seed by seed.
    items = schedule(workload("mixed"), rate=30.0, duration_s=20.0, seed=seed)

    def run(slo_admission: bool) -> RunOutcome:
        config = DispatchConfig(slo_admission=slo_admission)
        return simulate(items, FLEET, SimConfig(policy="cost", admission=True, dispatch=config),
                        duration_s=20.0)

    gated, open_door = run(True), run(False)
    for out in (gated, open_door):
        _check_conservation(items, out)
    assert {r.rejected for r in gated.requests} == {None, "over_slo"}
    assert {r.rejected for r in open_door.requests} == {None}
    assert summarize(gated, Slo()).goodput_rps > summarize(open_door, Slo()).goodput_rps


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed {s}" for s in SEEDS])
def test_on_a_mixed_fleet_long_prompts_go_to_the_slower_backend_and_the_typical_reply_is_faster(
        seed: int) -> None:
    # Chat at ~85% of two H100s and an L40S. By their own latency, long prompts prefer the H100s'
    # fast prefill; offloaded (routing/scheduling/offload.py), the L40S takes the longest ones
    # instead, the H100s' decodes run free of them, and the median TPOT and TTFT both fall, seed
    # by seed.
    items = schedule(workload("chat"), rate=50.0, duration_s=20.0, seed=seed)

    def run(offload: bool) -> RunOutcome:
        return simulate(items, FLEET, SimConfig(policy="cost", admission=True,
                                                offload_long_prompts=offload), duration_s=20.0)

    def mean_prompt(out: RunOutcome, backends: set[str]) -> float:
        sizes = [r.prompt_tokens for r in out.requests if r.backend in backends]
        return sum(sizes) / len(sizes)

    on, off = run(True), run(False)
    for out in (on, off):
        _check_conservation(items, out)
    fast, slow = {"b0", "b1"}, {"b2"}
    assert mean_prompt(on, slow) > 1.5 * mean_prompt(on, fast)
    assert mean_prompt(off, slow) < mean_prompt(off, fast)
    assert summarize(on, Slo()).tpot_p50_s < summarize(off, Slo()).tpot_p50_s
    assert summarize(on, Slo()).ttft_p50_s < summarize(off, Slo()).ttft_p50_s
