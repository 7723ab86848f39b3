"""The routing cycle's stages on their own: the data producer's facts (a backend's side reused
only while its state is unchanged), admission beside the router, and the Router's report of
the filter that narrowed the list."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from routing.policy import Router
from routing.predict import predict
from routing.prefix import PrefixIndex, prefix_chain
from routing.scheduling.admission import ADMITTED, OVERSIZED, UNCHECKED, Admission, AdmissionParams
from routing.scheduling.backends import BackendModels
from routing.scheduling.cycle import CycleState
from routing.scheduling.facts import FactsProducer
from routing.scheduling.filters import HealthyFilter
from routing.scheduling.pickers import MaxScorePicker
from routing.state import BackendSnapshot, BackendSpec, Candidate
from tests.test_routing_scorers import cost


def cand(backend_id: str, *, free: int = 1000, total: int = 1000, running: int = 0,
         inflight: int = 0, healthy: bool = True) -> Candidate:
    snap = BackendSnapshot(taken_at=0.0, format="vllm", kv_total_blocks=total,
                           kv_free_blocks=free, block_size=16, running=running, waiting=0)
    spec = BackendSpec(backend_id, f"http://127.0.0.1/{backend_id}", ("m",))
    return Candidate(spec, healthy, snap, False, inflight, 0)


def producer() -> tuple[FactsProducer, BackendModels]:
    models = BackendModels()
    return FactsProducer(models, PrefixIndex(), high_water=0.9), models


CHAIN = prefix_chain("x" * 1024, model="m")


@pytest.mark.parametrize(
    "change",
    ["nothing", "the time", "a dispatch recorded there", "the candidate view",
     "the model's typical prompt", "the backend's learned speed"],
)
def test_a_reused_backend_side_gives_the_prediction_a_fresh_one_would(change: str) -> None:
    facts, models = producer()
    c, request = cand("a", running=4), cost()
    facts.produce([c], request, CHAIN, 1.0)  # fills the backend's cached side
    now = 1.0
    if change == "the time":
        now = 2.0
    elif change == "a dispatch recorded there":
        models.work_of("a").dispatched(1.0, 800, 900.0, 30_000.0)
    elif change == "the candidate view":
        c = cand("a", running=9)
    elif change == "the model's typical prompt":
        request = replace(request, typical_prompt_tokens=4000.0)
    elif change == "the backend's learned speed":
        state = models.state("a")
        state.estimator.observe_tpot(1000.0, 0.0, 0.2)
        state.learned()
    got = facts.produce([c], request, CHAIN, now).predictions["a"]
    fresh = predict(c, request, 0, models.state("a").profile, high_water=0.9,
                    work=models.work_of("a"), now=now)
    assert got == fresh


def admitted(pool: list[Candidate], params: AdmissionParams, *, committed: int = 0,
             priority: int = 0, prompt: int = 1600, calibrated: bool = True) -> tuple[str, ...]:
    facts, models = producer()
    if calibrated:
        for c in pool:
            state = models.state(c.id)
            state.estimator.observe_tpot(0.0, 0.0, 0.0065)
            state.learned()
    out = Admission(params).admit(facts.produce(pool, cost(prompt=prompt), CHAIN, 0.0),
                                  dict.fromkeys((c.id for c in pool), committed), priority)
    return (out.reason, *(c.id for c in out.pool))


BUSY = cand("busy", running=400, inflight=3)  # many replies decoding: slow per token
IDLE = cand("idle")
STRICT = AdmissionParams(slo_tpot_s=0.001)  # no reply anywhere is within a 1 ms TPOT


@pytest.mark.parametrize(
    ("pool", "params", "kwargs", "expected"),
    [
        ([cand("full", free=50), IDLE], AdmissionParams(), {}, (ADMITTED, "idle")),
        ([cand("a"), cand("b")], AdmissionParams(), {"committed": 850},
         (ADMITTED,)),
        ([cand("a", total=50, free=50)], AdmissionParams(), {}, (OVERSIZED, "a")),
        ([cand("full", free=50), IDLE], AdmissionParams(enabled=False), {},
         (UNCHECKED, "full", "idle")),
        ([BUSY, IDLE], STRICT, {}, (ADMITTED, "idle")),
        ([BUSY], STRICT, {}, (ADMITTED,)),
        ([BUSY], replace(STRICT, exempt_priority=5), {"priority": 2}, (ADMITTED,)),
        ([BUSY], replace(STRICT, exempt_priority=1), {"priority": 1}, (ADMITTED, "busy")),
        ([BUSY], STRICT, {"calibrated": False}, (ADMITTED, "busy")),
    ],
    ids=["a backend the request would push past its high-water mark is not admissible",
         "the committed peaks of the gateway's own requests count against the mark",
         "a request too large for every backend goes to every backend",
         "with admission off every candidate is offered, unchecked",
         "SLO admission: an idle backend is never gated",
         "SLO admission: a busy backend past the TPOT SLO does not take it",
         "a class below the exempt priority is still gated",
         "a class at or above the exempt priority is never gated",
         "a backend whose speed has not been read yet is never gated"],
)
def test_admission_names_the_pool_the_router_may_choose_from(
        pool: list[Candidate], params: AdmissionParams, kwargs: dict[str, int],
        expected: tuple[str, ...]) -> None:
    assert admitted(pool, params, **kwargs) == expected  # type: ignore[arg-type]


class DropFirst:
    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]:
        return candidates[1:]


@pytest.mark.parametrize(
    ("filters", "narrowed"),
    [((), None), ("healthy only", None), ("drop first", "DropFirst"),
     ("drop first, then healthy", "DropFirst")],
    ids=["no filter: nothing narrowed", "a filter that removes nothing did not narrow",
         "the filter that removed candidates is named", "the last one that removed any"],
)
def test_the_decision_names_the_last_filter_that_removed_candidates(
        filters: object, narrowed: str | None) -> None:
    steps = {(): (), "healthy only": (HealthyFilter(),), "drop first": (DropFirst(),),
             "drop first, then healthy": (DropFirst(), HealthyFilter())}[filters]  # type: ignore[index]
    router = Router("t", picker=MaxScorePicker(random.Random(0)), filters=steps)
    decision = router.route(CycleState("m", cost()), [cand("a"), cand("b")])
    assert (type(decision.narrowed_by).__name__ if decision.narrowed_by else None) == narrowed
