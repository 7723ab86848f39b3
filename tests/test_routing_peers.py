"""The peers' policies, each rule as its gateway specifies it: SGLang's cache_aware, Dynamo's KV
router, llm-d's precise prefix scorer, the Inference Extension's default and AIBrix's
least-kv-cache; and each one run by `kvgate simulate`, with and without kvgate's admission."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from gateway.cli import main as kvgate
from loadtest import bench_peers
from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.cache_view import ExactCacheView
from loadtest.fleetsim.experiment import Contender, Experiment, run_experiment
from loadtest.sim.engine import Engine, SimRequest
from loadtest.workloads import workload
from routing.policies import PROFILES, PolicyContext, build_router
from routing.policy import Router, Scored
from routing.prefix import PrefixChain, prefix_chain
from routing.scheduling.peers import (
    CacheAwareParams,
    CacheView,
    DynamoParams,
    SoftmaxPicker,
    dynamo_costs,
    imbalanced,
)
from routing.scheduling.radix import ApproxTree
from routing.state import Candidate
from tests.test_routing_scorers import cand, context_for, cost

PEERS = ("cache_aware", "dynamo_kv", "precise_prefix", "gie_default", "least_kv")
TEXT = "".join(f"shared system prompt line {i}. " for i in range(60))  # ~1.8k characters


def router(name: str, seed: int = 0, view: CacheView | None = None,
           cache_aware: CacheAwareParams | None = None,
           dynamo: DynamoParams | None = None) -> Router:
    return build_router(name, PolicyContext(
        rng=random.Random(seed), cache_view=view, cache_aware=cache_aware or CacheAwareParams(),
        dynamo=dynamo or DynamoParams()))


def route(r: Router, pool: list[Candidate], text: str = TEXT) -> str:
    ctx = context_for(pool, cost(prompt=len(text) // 4), prompt=text)
    decision = r.route(ctx, pool)
    r.dispatched(ctx, decision)
    return decision.backend_id


class FixedView:
    """A cache view that reports fixed cached tokens per backend."""

    def __init__(self, held: Mapping[str, int]) -> None:
        self.held = held
        self.asked: list[tuple[PrefixChain, int]] = []

    def cached_tokens(self, chain: PrefixChain, prompt_chars: int,
                      backend_ids: Sequence[str]) -> Mapping[str, int]:
        self.asked.append((chain, prompt_chars))
        return {b: self.held.get(b, 0) for b in backend_ids}


# cache_aware

@pytest.mark.parametrize(("loads", "expected"), [
    ((0, 65), True), ((0, 64), False), ((140, 205), False), ((10, 90), True), ((0, 0), False)],
    ids=["over both thresholds", "the absolute gap must exceed 64",
         "max must exceed 1.5 x min", "both exceeded at higher loads", "idle"])
def test_cache_aware_imbalance_needs_both_thresholds(loads: tuple[int, int],
                                                     expected: bool) -> None:
    assert imbalanced([float(x) for x in loads], CacheAwareParams()) is expected


def test_cache_aware_follows_the_longest_prefix_match_while_balanced() -> None:
    r = router("cache_aware")
    pool = [cand("a"), cand("b"), cand("c")]
    first = route(r, pool)
    # The same text again, and a longer one that extends it, go where it went, whatever the
    # (balanced) load says.
    loaded = [cand(c.id, inflight=30 if c.id == first else 0) for c in pool]
    assert route(r, loaded) == first
    assert route(r, loaded, TEXT + "and a follow-up question " * 10) == first


def test_cache_aware_sends_unmatched_text_to_the_smallest_tree_it_holds_text_for() -> None:
    r = router("cache_aware")
    pool = [cand("a"), cand("b")]
    first = route(r, pool)
    other = "b" if first == "a" else "a"
    # A worker sent nothing yet is no tenant of the routers' trees: unmatched text stays with
    # the workers the tree knows, as the real routers do at low concurrency.
    assert route(r, pool, "an unrelated prompt, " * 80) == first
    # Once the imbalance rule has sent the other worker text, the smaller tree gets the next
    # unmatched prompt.
    busy = [cand(c.id, inflight=100 if c.id == first else 0) for c in pool]
    assert route(r, busy, "a third prompt, unlike the others, " * 20) == other
    assert route(r, pool, "and a fourth one, unlike any of them, " * 40) == other


def test_cache_aware_picks_any_worker_while_its_tree_is_empty() -> None:
    firsts = {route(router("cache_aware", seed=seed), [cand("a"), cand("b"), cand("c")])
              for seed in range(12)}
    assert len(firsts) > 1, firsts


def test_cache_aware_ignores_a_match_below_the_cache_threshold() -> None:
    def two_tenants(r: Router, pool: list[Candidate]) -> str:
        """TEXT on one worker, a shorter text on the other (sent there by the imbalance rule)."""
        first = route(r, pool)
        busy = [cand(c.id, inflight=100 if c.id == first else 0) for c in pool]
        route(r, busy, "a shorter prompt, unlike the others, " * 20)
        return first

    pool = [cand("a"), cand("b")]
    r = router("cache_aware")
    first = two_tenants(r, pool)
    # Sharing ~1.8k characters of a ~9k one is a match rate of ~0.2 <= 0.3: the smaller tree.
    long = TEXT + "something else entirely. " * 300
    assert route(r, pool, long) != first
    lenient = router("cache_aware", cache_aware=CacheAwareParams(cache_threshold=0.1))
    first = two_tenants(lenient, pool)
    assert route(lenient, pool, long) == first


def test_cache_aware_picks_the_least_loaded_when_imbalanced_whatever_the_match() -> None:
    r = router("cache_aware")
    pool = [cand("a"), cand("b"), cand("c")]
    first = route(r, pool)
    loads = {first: 100, **{c.id: 30 for c in pool if c.id != first}}
    least = next(c.id for c in pool if c.id != first)
    loads[least] = 10
    busy = [cand(c.id, inflight=loads[c.id]) for c in pool]
    assert route(r, busy) == least


def test_the_approximate_tree_evicts_its_least_recent_text() -> None:
    tree = ApproxTree(max_chars=8 * 256)
    a = prefix_chain("a" * 6 * 256, model="m")
    b = prefix_chain("b" * 6 * 256, model="m")
    tree.insert("w", a)
    assert tree.matched_chars("w", a) == 6 * 256 and tree.size_chars("w") == 6 * 256
    tree.insert("w", b)
    assert tree.size_chars("w") == 8 * 256
    assert tree.matched_chars("w", b) == 6 * 256
    # a's leading blocks were its most recent: its tail went first, its head stays.
    assert tree.matched_chars("w", a) == 2 * 256


# dynamo_kv

def test_dynamo_cost_is_uncached_prompt_blocks_plus_active_blocks() -> None:
    pool = [cand("a", free=900, total=1000), cand("b", free=600, total=1000)]
    ctx = context_for(pool, cost(prompt=1600), prompt=TEXT)
    view = FixedView({"a": 0, "b": 1600})
    costs = dynamo_costs(ctx, pool, DynamoParams(), view)
    # a: 1600/16 = 100 prefill blocks + 100 active; b: nothing to prefill + 400 active.
    assert costs == pytest.approx([200.0, 400.0])
    heavy = dynamo_costs(ctx, pool, DynamoParams(overlap_score_weight=4.0), view)
    assert heavy == pytest.approx([500.0, 400.0])


def test_dynamo_kv_picks_the_lowest_cost_and_its_weight_trades_overlap_for_load() -> None:
    pool = [cand("a", free=900, total=1000), cand("b", free=600, total=1000)]
    view = FixedView({"b": 1600})
    ctx = context_for(pool, cost(prompt=1600), prompt=TEXT)
    assert router("dynamo_kv", view=view).route(ctx, pool).backend_id == "a"
    weighted = router("dynamo_kv", view=view, dynamo=DynamoParams(overlap_score_weight=4.0))
    assert weighted.route(ctx, pool).backend_id == "b"
    assert view.asked and view.asked[0][1] == ctx.cost.prompt_chars


def test_dynamo_without_a_view_reads_the_gateways_prefix_index() -> None:
    # b holds the whole prompt by the index (its 7 full blocks of 256 characters: 448 tokens).
    pool = [cand("a", free=900, total=1000), cand("b", free=850, total=1000)]
    chain = prefix_chain(TEXT, model="m")
    ctx = context_for(pool, cost(prompt=448), prompt=TEXT, matched={"b": len(chain.blocks)})
    # a: 448 / 16 = 28 blocks to prefill + 100 active; b: 150 active.
    assert router("dynamo_kv").route(ctx, pool).backend_id == "a"
    weighted = router("dynamo_kv", dynamo=DynamoParams(overlap_score_weight=4.0))
    assert weighted.route(ctx, pool).backend_id == "b"


def test_softmax_temperature_zero_is_the_best_and_above_zero_samples() -> None:
    a, b = cand("a"), cand("b")
    scored = [Scored(a, 1.0), Scored(b, 0.0)]
    greedy = SoftmaxPicker(random.Random(1), 0.0)
    assert {greedy.pick(scored).id for _ in range(50)} == {"a"}
    warm = SoftmaxPicker(random.Random(1), 1.0)
    counts = Counter(warm.pick(scored).id for _ in range(4000))
    # P(a) = e / (e + 1) ~ 0.73.
    assert 0.68 < counts["a"] / 4000 < 0.78


# precise_prefix

def test_precise_prefix_prefers_the_engine_that_holds_the_prefix() -> None:
    pool = [cand("a"), cand("b"), cand("c")]
    ctx = context_for(pool, cost(prompt=1600), prompt=TEXT)
    assert router("precise_prefix", view=FixedView({"b": 1200})).route(
        ctx, pool).backend_id == "b"
    # Its prefix weight (3) outweighs a fuller KV cache (2) but not that and a queue (2 + 2).
    fuller = [cand("a"), cand("b", free=100), cand("c")]
    ctx = context_for(fuller, cost(prompt=1600), prompt=TEXT)
    assert router("precise_prefix", view=FixedView({"b": 1200})).route(
        ctx, fuller).backend_id == "b"
    queued = [cand("a"), cand("b", free=100, waiting=8), cand("c", waiting=8)]
    ctx = context_for(queued, cost(prompt=1600), prompt=TEXT)
    assert router("precise_prefix", view=FixedView({"b": 1200})).route(
        ctx, queued).backend_id == "a"


def test_the_exact_view_reads_what_each_engine_caches() -> None:
    preset = parse_fleet("1").presets[0]
    engines = {"a": Engine(preset, every_token=False), "b": Engine(preset, every_token=False)}
    view = ExactCacheView(engines, model="m", block_chars=256)
    ids = tuple(range(1, 801))
    engines["b"].add(SimRequest("r0", ids, 4, 4))
    while engines["b"].has_work():
        engines["b"].step()
    view.expect(TEXT, lambda: ids)
    chain = prefix_chain(TEXT, model="m")
    held = view.cached_tokens(chain, len(TEXT), ["a", "b"])
    block = engines["b"].block_size
    assert held == {"a": 0, "b": (len(ids) - 1) // block * block}
    assert view.cached_tokens(prefix_chain("other", model="m"), 5, ["a", "b"]) == {}


# gie_default, least_kv

def test_gie_default_is_kv_util_and_least_kv_the_emptiest_cache() -> None:
    assert PROFILES["gie_default"] == PROFILES["kv_util"]
    pool = [cand("a", free=100, waiting=0), cand("b", free=700, waiting=9)]
    assert router("least_kv").route(context_for(pool), pool).backend_id == "b"


# The simulate command runs each, bare and with admission.

def test_simulate_runs_every_peer_with_and_without_admission(
        capsys: pytest.CaptureFixture[str]) -> None:
    for admission, suffix in (("none", ""), ("all", "+adm")):
        args = ["simulate", "--backends", "2", "--policies", ",".join(PEERS), "--admission",
                admission, "--workload", "shared-prefix", "--duration", "4", "--rate", "6",
                "--quiet", "--json", "-"]
        assert kvgate(args) == 0
        doc = json.loads(capsys.readouterr().out)
        labels = [c["label"] for c in doc["config"]["contenders"]]
        assert labels == [f"{p}{suffix}" for p in PEERS]
        for label in labels:
            run = doc["points"][0]["policies"][label]["runs"][0]
            assert run["completed"] + run["rejected"] == run["requests"] > 0
            assert run["prefix_hit_rate"] > 0


def test_the_peers_benchmark_compares_cost_with_the_best_peer_behind_the_same_admission(
) -> None:
    contenders = (Contender("least_kv", True), Contender("gie_default", True),
                  Contender("least_kv", False), bench_peers.KVGATE)
    report = run_experiment(Experiment(fleet=parse_fleet("2"), contenders=contenders,
                                       workload=workload("chat"), rates=(8.0,), duration_s=3.0,
                                       seeds=(0,)))
    point = report.points[0]
    rows = {row[1]: row for row in bench_peers.checks("chat", point)}
    assert set(rows) == {"p99 TTFT", "SLO misses", "median TPOT"}

    def mean(c: Contender, figure: str) -> float:
        value = point.spread_of(c)[figure].mean
        assert value is not None
        return value

    peers = {c.label: mean(c, "ttft_p99_s") for c in contenders[:2]}  # the bare run is no peer
    best = min(peers, key=lambda label: peers[label])
    assert f"x {best} (" in rows["p99 TTFT"][2]
    assert rows["p99 TTFT"][4] == f"{mean(bench_peers.KVGATE, 'ttft_p99_s') / peers[best]:.2f}x"
    assert "gie_default+adm" in rows["median TPOT"][2]
    table = bench_peers.headline_table("chat", report)
    assert [row[0] for row in table.rows] == [c.label for c in contenders]
