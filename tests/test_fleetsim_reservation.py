"""The fleet simulation's reservation workloads: `ignore-eos` replies run to their max_tokens,
`heavy-tail` replies have a long tail; on backends with little KV, round robin preempts while
kvgate's admission (the KV rule alone, SLO admission off, nothing refused) holds every request
back until it fits, on every seed. Reservation misses are reported per request and summed."""

from __future__ import annotations

import pytest

from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.loop import RunOutcome, SimConfig, simulate
from loadtest.fleetsim.results import Slo, summarize
from loadtest.workloads import WorkItem, schedule, workload
from routing.dispatch import DispatchConfig

FLEET = parse_fleet("2xllama-3-8b-l4")  # 2,641 blocks each: a few long replies fill one
DURATION = 20.0
KV_ONLY = DispatchConfig(slo_admission=False, queue_timeout_s=600.0)


def items(name: str, rate: float, seed: int) -> tuple[WorkItem, ...]:
    return schedule(workload(name), rate=rate, duration_s=DURATION, seed=seed)


def run(work: tuple[WorkItem, ...], seed: int, *, policy: str, admission: bool) -> RunOutcome:
    return simulate(work, FLEET, SimConfig(policy, admission=admission, seed=seed,
                                           dispatch=KV_ONLY), duration_s=DURATION)


def preemptions(out: RunOutcome) -> int:
    return sum(b.preemptions for b in out.backends)


def test_ignore_eos_replies_run_to_their_max_tokens() -> None:
    work = items("ignore-eos", 14.0, 0)
    assert work and all(i.ignore_eos and i.output_tokens == i.max_tokens for i in work)
    assert len({i.max_tokens for i in work}) > 10  # caps vary


def test_heavy_tailed_replies_have_a_long_tail_within_their_cap() -> None:
    lengths = sorted(i.output_tokens for i in items("heavy-tail", 30.0, 0))
    assert all(n <= 4096 for n in lengths)
    assert lengths[len(lengths) * 99 // 100] > 10 * lengths[len(lengths) // 2]


@pytest.mark.parametrize("seed", [0, 1, 2], ids=lambda s: f"seed-{s}")
@pytest.mark.parametrize(("name", "rate"), [("ignore-eos", 14.0), ("heavy-tail", 30.0)],
                         ids=["ignore-eos", "heavy-tail"])
def test_admission_holds_back_what_would_be_preempted(name: str, rate: float,
                                                      seed: int) -> None:
    work = items(name, rate, seed)
    bare = run(work, seed, policy="round_robin", admission=False)
    kvgate = run(work, seed, policy="cost", admission=True)
    assert preemptions(bare) > 0
    assert preemptions(kvgate) == 0
    assert all(r.rejected is None for r in kvgate.requests)


def test_reservation_misses_are_counted_per_request_and_summed() -> None:
    out = run(items("heavy-tail", 30.0, 0), 0, policy="cost", admission=True)
    missed = sum(1 for r in out.requests if r.reservation_missed)
    assert 0 < missed < len(out.requests) // 2  # a tail outgrows a p90 reservation, most do not
    assert summarize(out, Slo()).reservation_misses == missed
