"""The Dispatcher: admission, the gateway queue's lifecycle and completion feedback, on a real
Fleet with scraped snapshots and virtual time."""

from __future__ import annotations

import random

import pytest

from routing.dispatch import (
    ADMITTED,
    CANCELLED,
    NO_BACKEND,
    NO_HEALTHY_BACKEND,
    OVER_SLO,
    OVERSIZED,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    QUEUED,
    RETRY,
    TENANT_QUEUE_FULL,
    UNCHECKED,
    Completion,
    Dispatch,
    DispatchConfig,
    Dispatcher,
    Job,
    Pumped,
    Rejection,
    Waiting,
)
from routing.fleet import Fleet
from routing.policies import PolicyContext, build_router
from routing.state import BackendSnapshot, BackendSpec
from routing.ttft import BackendProfile

BLOCK = 16
SHORT = "hello " * 20  # ~30 tokens
LONG = "word " * 4000  # 20,000 characters: ~5,000 tokens, ~313 blocks + output


def make_fleet(**frees: tuple[int, int]) -> Fleet:
    """Backends by id: (total blocks, free blocks), scraped at t=0, serving model m."""
    fleet = Fleet([BackendSpec(b, f"http://127.0.0.1/{b}", ("m",)) for b in frees],
                  max_snapshot_age=100.0)
    for b, (total, free) in frees.items():
        scrape(fleet, b, total, free, at=0.0)
    return fleet


def scrape(fleet: Fleet, backend: str, total: int, free: int, *, at: float,
           running: int = 0) -> None:
    fleet.record_scrape(backend, BackendSnapshot(
        taken_at=at, format="vllm", kv_total_blocks=total, kv_free_blocks=free, block_size=BLOCK,
        running=running, waiting=0))


def dispatcher(fleet: Fleet, policy: str = "cost", **config: object) -> Dispatcher:
    return Dispatcher(fleet, build_router(policy, PolicyContext(rng=random.Random(0))),
                      config=DispatchConfig(**config))  # type: ignore[arg-type]


def job(name: str, prompt: str = SHORT, *, max_tokens: int | None = 64, priority: int = 0,
        tenant: str = "t", session: str | None = None) -> Job:
    return Job(name, "m", prompt, max_tokens=max_tokens, priority=priority, tenant=tenant,
               session=session)


def placed(out: Dispatch | Waiting | Rejection) -> Dispatch:
    assert isinstance(out, Dispatch), out
    return out


# Admission, as a table: what happens to one arriving request.

@pytest.mark.parametrize(
    ("free", "queued_ahead", "max_depth", "outcome"),
    [(1000, 0, 10, "dispatched"), (20, 0, 10, "queued"), (1000, 1, 10, "queued"),
     (20, 2, 2, "429")],
    ids=["a request that fits is dispatched at once",
         "a request that fits nowhere waits in the gateway queue",
         "a request that fits still waits behind queued requests of its class",
         "a full queue rejects at once with Retry-After"],
)
def test_admission(free: int, queued_ahead: int, max_depth: int, outcome: str) -> None:
    fleet = make_fleet(a=(1000, 20))
    d = dispatcher(fleet, queue_max_depth=max_depth)
    for i in range(queued_ahead):
        assert isinstance(d.submit(job(f"q{i}", LONG), 0.0), Waiting)
    scrape(fleet, "a", 1000, free, at=0.5)
    out = d.submit(job("new"), 1.0)
    if outcome == "dispatched":
        assert placed(out).backend_id == "a"
    elif outcome == "queued":
        assert isinstance(out, Waiting)
    else:
        assert isinstance(out, Rejection)
        assert (out.status, out.code) == (429, QUEUE_FULL)
        assert out.retry_after_s is not None and out.retry_after_s >= 1


def test_a_tenant_over_its_share_is_rejected_while_others_still_queue() -> None:
    d = dispatcher(make_fleet(a=(1000, 20)), queue_max_per_tenant=1)
    assert isinstance(d.submit(job("1", tenant="greedy"), 0.0), Waiting)
    out = d.submit(job("2", tenant="greedy"), 0.0)
    assert isinstance(out, Rejection) and (out.status, out.code) == (429, TENANT_QUEUE_FULL)
    assert isinstance(d.submit(job("3", tenant="polite"), 0.0), Waiting)


def test_no_healthy_backend_is_a_503_not_a_queue() -> None:
    fleet = Fleet([BackendSpec("a", "http://127.0.0.1/a", ("m",))])  # never scraped: unhealthy
    out = dispatcher(fleet).submit(job("x"), 0.0)
    assert isinstance(out, Rejection) and (out.status, out.code) == (503, NO_HEALTHY_BACKEND)


def test_a_request_too_large_for_any_high_water_mark_is_sent_anyway() -> None:
    out = placed(dispatcher(make_fleet(a=(100, 100))).submit(job("big", LONG), 0.0))
    assert out.reason == OVERSIZED


def test_with_admission_off_nothing_queues_and_the_policy_alone_decides() -> None:
    d = dispatcher(make_fleet(a=(1000, 10)), admission=False)
    assert placed(d.submit(job("x", LONG), 0.0)).reason == UNCHECKED
    assert d.queue_depth == 0


def test_the_lease_reserves_the_requests_conservative_blocks() -> None:
    fleet = make_fleet(a=(1000, 1000))
    out = placed(dispatcher(fleet).submit(job("x", max_tokens=64), 0.0))
    assert out.lease.blocks == out.cost.reserve_blocks(BLOCK)
    assert fleet.candidate("a", 0.0).reserved_blocks == out.lease.blocks


# The queue's lifecycle.

def test_a_queued_request_leaves_the_queue_as_soon_as_a_completion_frees_capacity() -> None:
    fleet = make_fleet(a=(600, 600))
    d = dispatcher(fleet)
    first = placed(d.submit(job("first", LONG, max_tokens=200), 0.0))
    second = d.submit(job("second", LONG, max_tokens=200), 0.1)
    assert isinstance(second, Waiting)  # ~325 blocks each: both do not fit under 540
    assert d.pump(0.2).dispatched == ()
    d.finish(first, 0.3)
    pumped = d.pump(0.3)
    (dispatched,) = pumped.dispatched
    assert dispatched.waiting is second and dispatched.reason == QUEUED
    assert dispatched.queue_wait_s == pytest.approx(0.2)


def test_a_queued_request_leaves_the_queue_when_a_new_scrape_shows_room() -> None:
    fleet = make_fleet(a=(1000, 50))
    d = dispatcher(fleet)
    waiting = d.submit(job("x"), 0.0)
    assert isinstance(waiting, Waiting)
    scrape(fleet, "a", 1000, 900, at=0.25)
    (dispatched,) = d.pump(0.25).dispatched
    assert dispatched.waiting is waiting


def test_a_queued_request_past_the_timeout_gets_503_with_retry_after() -> None:
    d = dispatcher(make_fleet(a=(1000, 20)), queue_timeout_s=5.0)
    waiting = d.submit(job("x"), 1.0)
    assert d.next_deadline(2.0) == pytest.approx(6.0)
    assert d.pump(5.9).rejected == ()
    (rejected,) = d.pump(6.1).rejected
    assert rejected.waiting is waiting
    assert (rejected.status, rejected.code) == (503, QUEUE_TIMEOUT)
    assert rejected.retry_after_s is not None and rejected.queue_wait_s == pytest.approx(5.1)
    assert d.queue_depth == 0 and d.next_deadline(7.0) is None


def test_a_cancelled_request_leaves_the_queue_without_dispatch() -> None:
    fleet = make_fleet(a=(1000, 20))
    d = dispatcher(fleet)
    waiting = d.submit(job("x"), 0.0)
    assert isinstance(waiting, Waiting)
    assert d.cancel(waiting, 0.5) is True
    assert d.cancel(waiting, 0.6) is False  # once
    scrape(fleet, "a", 1000, 1000, at=1.0)
    pumped = d.pump(1.0)
    assert pumped.dispatched == () and pumped.rejected == ()
    assert d.decision_counts()[("cost", NO_BACKEND, CANCELLED)] == 1


def test_a_higher_priority_class_leaves_the_queue_first() -> None:
    fleet = make_fleet(a=(1000, 20))
    d = dispatcher(fleet)
    low = d.submit(job("low", priority=0), 0.0)
    high = d.submit(job("high", priority=5), 0.1)
    assert isinstance(low, Waiting) and isinstance(high, Waiting)
    scrape(fleet, "a", 1000, 1000, at=1.0)
    order = [p.waiting for p in d.pump(1.0).dispatched]
    assert order == [high, low]


def test_tenants_take_turns_within_a_class() -> None:
    fleet = make_fleet(a=(1000, 20))
    d = dispatcher(fleet)
    for name, tenant in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        assert isinstance(d.submit(job(name, tenant=tenant), 0.0), Waiting)
    scrape(fleet, "a", 1000, 1000, at=1.0)
    assert [p.job.request_id for p in d.pump(1.0).dispatched] == ["a1", "b1", "a2"]


def test_the_head_of_the_queue_is_never_overtaken() -> None:
    fleet = make_fleet(a=(1000, 300))
    d = dispatcher(fleet)
    big = d.submit(job("big", LONG), 0.0)
    small = d.submit(job("small"), 0.1)  # would fit, but waits behind the head
    assert isinstance(big, Waiting) and isinstance(small, Waiting)
    assert d.pump(0.2).dispatched == ()


# Retries and feedback.

def test_a_retry_goes_to_a_backend_not_tried_and_releases_the_first_lease() -> None:
    fleet = make_fleet(a=(1000, 1000), b=(1000, 1000))
    d = dispatcher(fleet)
    first = placed(d.submit(job("x"), 0.0))
    second = d.reroute(first, 0.1)
    assert second is not None and second.backend_id != first.backend_id
    assert second.reason == RETRY and second.attempt == 2
    assert fleet.candidate(first.backend_id, 0.1).inflight == 0
    assert d.reroute(second, 0.2) is None  # nobody left to try
    assert fleet.candidate(second.backend_id, 0.2).inflight == 0


def test_finish_releases_exactly_once() -> None:
    fleet = make_fleet(a=(1000, 1000))
    d = dispatcher(fleet)
    out = placed(d.submit(job("x"), 0.0))
    d.finish(out, 1.0)
    d.finish(out, 1.0)
    assert fleet.candidate("a", 1.0).inflight == 0


def test_completions_calibrate_prompt_tokens_and_learn_output_lengths() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    before = placed(d.submit(job("0", SHORT * 10, max_tokens=None), 0.0)).cost
    for i in range(60):
        out = placed(d.submit(job(str(i), SHORT * 10, max_tokens=None), float(i)))
        d.finish(out, float(i), Completion(prompt_tokens=before.prompt_tokens * 2,
                                           completion_tokens=40, ttft_s=0.05, tpot_s=0.01))
    after = placed(d.submit(job("z", SHORT * 10, max_tokens=None), 99.0)).cost
    assert after.prompt_tokens == pytest.approx(2 * before.prompt_tokens, rel=0.1)
    assert after.output_p50 < before.output_p50 and after.output_p50 == pytest.approx(40, rel=0.2)


def test_completions_teach_the_backends_profile() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    prior = d.profile("a").decode_base_s
    for i in range(50):
        out = placed(d.submit(job(str(i)), float(i)))
        d.finish(out, float(i), Completion(completion_tokens=10, tpot_s=0.05))
    assert d.profile("a").decode_base_s > prior


def test_prompts_sent_to_a_backend_count_as_its_prefill_load_until_they_age_out() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    idle = placed(d.submit(job("0"), 0.0)).prediction
    placed(d.submit(job("long", LONG), 0.0))
    busy = placed(d.submit(job("1"), 0.0)).prediction
    later = placed(d.submit(job("2"), 600.0)).prediction
    assert idle is not None and busy is not None and later is not None
    assert busy.prefill_busy > idle.prefill_busy
    assert busy.predicted_tpot_s > idle.predicted_tpot_s
    assert later.prefill_busy == pytest.approx(0.0, abs=1e-6)


def test_tpot_feedback_is_learned_with_the_prefill_stretch_taken_out() -> None:
    # Same observed TPOT; where prefills were taking time, the bare decode step is faster.
    # (SLO admission off: these TPOTs are at the SLO, and the loaded one would start refusing.)
    quiet = dispatcher(make_fleet(a=(100_000, 100_000)), slo_admission=False)
    loaded = dispatcher(make_fleet(a=(100_000, 100_000)), slo_admission=False)
    for i in range(50):
        t = float(i)
        placed(loaded.submit(job(f"long{i}", LONG), t))
        for d in (quiet, loaded):
            out = placed(d.submit(job(str(i)), t))
            d.finish(out, t, Completion(completion_tokens=10, tpot_s=0.05))
    assert loaded.profile("a").decode_step_s(1) < quiet.profile("a").decode_step_s(1)


def test_a_repeated_prefix_returns_to_the_backend_that_served_it() -> None:
    d = dispatcher(make_fleet(a=(10_000, 10_000), b=(10_000, 10_000), c=(10_000, 10_000)))
    convo = "system: be brief. " * 200
    first = placed(d.submit(job("1", convo), 0.0))
    d.finish(first, 0.5)
    for i in range(5):
        again = placed(d.submit(job(str(i), convo + f" turn {i}"), 1.0 + i))
        assert again.backend_id == first.backend_id
        d.finish(again, 1.5 + i)


def test_decisions_are_counted_by_policy_backend_and_reason() -> None:
    fleet = make_fleet(a=(1000, 1000))
    d = dispatcher(fleet, queue_max_depth=1)
    placed(d.submit(job("1"), 0.0))
    scrape(fleet, "a", 1000, 10, at=0.1)
    d.submit(job("2"), 0.2)
    d.submit(job("3"), 0.2)
    counts = dict(d.decision_counts())
    assert counts == {("cost", "a", ADMITTED): 1, ("cost", NO_BACKEND, QUEUE_FULL): 1}


@pytest.mark.parametrize("policy", ["round_robin", "random", "least_request", "power_of_two",
                                    "kv_util", "prefix_hash", "cost"])
def test_every_policy_runs_through_the_dispatcher_and_respects_admission(policy: str) -> None:
    fleet = make_fleet(full=(1000, 50), free=(1000, 1000))
    d = dispatcher(fleet, policy)
    homes = {placed(d.submit(job(str(i), "x" * 2000), float(i))).backend_id for i in range(6)}
    assert homes == {"free"}


def test_a_scrape_that_does_not_show_requests_in_flight_yet_cannot_make_the_gateway_overcommit(
) -> None:
    fleet = make_fleet(a=(1000, 1000))
    d = dispatcher(fleet)
    # ~2,500 tokens: ~157 blocks, ~167 at the expected peak; no two share a prefix.
    outs = [d.submit(job(str(i), f"{i} " + "word " * 2000, max_tokens=200), 0.0)
            for i in range(7)]
    admitted = [o for o in outs if isinstance(o, Dispatch)]
    assert len(admitted) == 5 and all(isinstance(o, Waiting) for o in outs[5:])
    # The backend has not allocated them yet: its scrape still reads empty. The committed peaks
    # of what is in flight keep the next request out all the same.
    scrape(fleet, "a", 1000, 1000, at=1.0, running=0)
    assert d.pump(1.0).dispatched == ()
    d.finish(admitted[0], 2.0)
    assert len(d.pump(2.0).dispatched) == 1


def test_prompts_sent_since_the_scrape_queue_ahead_at_their_own_size_until_prefilled() -> None:
    fleet = make_fleet(a=(100_000, 100_000))
    d = dispatcher(fleet)
    first = placed(d.submit(job("long", LONG), 0.0))
    behind = placed(d.submit(job("next"), 0.0)).prediction
    scrape(fleet, "a", 100_000, 99_000, at=59.0, running=2)
    much_later = placed(d.submit(job("later"), 60.0)).prediction
    assert first.prediction is not None and behind is not None and much_later is not None
    # The long prompt's own prefill is what the next request finds ahead of it, not a
    # typical prompt; a minute later the backend has long prefilled both.
    assert behind.queued_prefill_s == pytest.approx(first.prediction.own_prefill_s, rel=0.01)
    assert much_later.queued_prefill_s == 0.0


# Backends of two classes (their KV capacities differ), so that each one's speed is its own: a
# class's members share theirs (tests/test_routing_speed_pool.py).
OTHER_CLASS = (99_000, 99_000)


def test_a_backend_is_eased_in_until_its_replies_show_its_speed() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000), b=OTHER_CLASS))
    for i in range(30):  # only b's replies are measured (fast); a's come back without figures
        out = placed(d.submit(job(f"r{i}"), float(i)))
        fast = Completion(completion_tokens=100, ttft_s=0.02, tpot_s=0.008)
        d.finish(out, float(i), fast if out.backend_id == "b" else None)
    assert d.profile("b").prefill_tokens_per_s > 2 * d.profile("a").prefill_tokens_per_s
    assert placed(d.submit(job("next"), 40.0)).backend_id == "b"


def test_first_tokens_show_a_backends_speed_long_before_its_replies_end() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000), b=OTHER_CLASS))
    for i in range(8):  # nothing finishes; b's first tokens come fast, a's not at all
        out = placed(d.submit(job(f"r{i}"), float(i)))
        if out.backend_id == "b":
            d.first_token(out, float(i) + 0.01)
    assert d.profile("b").prefill_tokens_per_s > 2 * d.profile("a").prefill_tokens_per_s
    assert placed(d.submit(job("next"), 10.0)).backend_id == "b"


def test_a_backend_read_too_slow_at_a_cold_start_is_measured_again_while_idle() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000), b=OTHER_CLASS))
    fast = Completion(completion_tokens=100, ttft_s=0.02, tpot_s=0.008)

    def streamed(name: str) -> Job:
        return Job(name, "m", SHORT, max_tokens=64, stream=True)

    # A cold start: one request each; b's first token comes a second late (a connection, a
    # queue), 20x and more its prediction, though its reply is as fast as a's.
    one, other = placed(d.submit(streamed("r0"), 0.0)), placed(d.submit(streamed("r1"), 0.0))
    assert {one.backend_id, other.backend_id} == {"a", "b"}
    for out in (one, other):
        d.first_token(out, 1.0 if out.backend_id == "b" else 0.02)
        d.finish(out, 1.5, fast)
    slow_read = d.learned_speed("b")[0]
    assert slow_read is not None and slow_read > 3 * (d.learned_speed("a")[0] or 0.0)
    # Every later request finds both idle; b is measured until its replies have shown its speed.
    for i in range(20):
        out = placed(d.submit(streamed(f"s{i}"), 2.0 + i))
        d.first_token(out, 2.0 + i + 0.02)
        d.finish(out, 2.5 + i, fast)
    scale_b, replies_b = d.learned_speed("b")
    assert replies_b >= 8
    assert scale_b is not None and scale_b < slow_read / 3  # its replies pulled it back


def test_a_whole_answer_teaches_its_backends_speed_from_its_duration() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    out = placed(d.submit(job("r"), 0.0))
    assert out.prediction is not None
    # 100 tokens at 8 ms after the first token's predicted time: a fast card.
    d.finish(out, 1.0, Completion(completion_tokens=100,
                                  duration_s=out.prediction.predicted_ttft_s + 99 * 0.008))
    scale, replies = d.learned_speed("a")
    assert replies == 1 and scale is not None and scale < 2.0  # from the slow start's 4


@pytest.mark.parametrize("completion", [
    Completion(completion_tokens=10, duration_s=5.0),  # too short for its decode to outweigh TTFT
    Completion(completion_tokens=100, duration_s=0.001),  # over before its first token was due
    Completion(completion_tokens=None, duration_s=5.0),  # no usage
], ids=["short", "impossible", "no usage"])
def test_a_whole_answer_that_cannot_show_the_speed_teaches_nothing(completion: Completion) -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    d.finish(placed(d.submit(job("r"), 0.0)), 1.0, completion)
    assert d.learned_speed("a") == (None, 0)


def test_a_first_token_after_the_attempt_finished_teaches_nothing() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    out = placed(d.submit(job("r"), 0.0))
    before = d.profile("a")
    d.finish(out, 0.5)
    d.first_token(out, 0.6)
    assert d.profile("a") == before


# SLO admission: past the TPOT SLO, one more request would slow every reply on the backend.

def flood(d: Dispatcher, at: float = 0.0, limit: int = 20, tpot_s: float = 0.036
          ) -> tuple[list[Dispatch], Waiting | Rejection]:
    """One short reply measured at `tpot_s` (the gate waits for a backend's first speed
    reading), then distinct long prompts at `at` until one is not dispatched: their prefill
    stretches every decode step there (ttft.py), so the predicted TPOT climbs past the SLO."""
    warm = placed(d.submit(job("warm"), at))
    d.finish(warm, at, Completion(completion_tokens=10, tpot_s=tpot_s))
    placed_so_far: list[Dispatch] = []
    for i in range(limit):
        out = d.submit(job(f"long{i}", f"{i} {LONG}"), at)
        if not isinstance(out, Dispatch):
            return placed_so_far, out
        placed_so_far.append(out)
    raise AssertionError(f"{limit} long prompts and the TPOT SLO never closed")


def queued(out: Dispatch | Waiting | Rejection) -> Waiting:
    assert isinstance(out, Waiting), out
    return out


def test_past_the_tpot_slo_a_request_waits_then_is_refused_429_over_slo() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)), slo_wait_s=0.5)
    sent, out = flood(d)
    waiting = queued(out)
    assert len(sent) >= 2  # the SLO admits some load before it closes
    assert d.next_deadline(0.0) == pytest.approx(0.5)
    assert d.pump(0.4).rejected == ()
    refused = d.pump(0.5).rejected
    assert [(r.job.request_id, r.status, r.code) for r in refused] == [
        (waiting.job.request_id, 429, OVER_SLO)]
    assert refused[0].retry_after_s is not None and refused[0].retry_after_s >= 1
    assert refused[0].queue_wait_s == pytest.approx(0.5)
    assert d.queue_depth == 0


def test_a_request_waiting_on_the_slo_leaves_once_the_backend_is_back_under_it() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)), slo_wait_s=25.0)
    sent, out = flood(d)
    waiting = queued(out)
    for s in sent[1:]:
        d.finish(s, 0.1)
    assert d.pump(0.1) == Pumped((), ())  # the prefill load is still recent: still over the SLO
    out = d.pump(20.0)  # it has decayed (a 5 s average): back under
    assert [p.job.request_id for p in out.dispatched] == [waiting.job.request_id]
    assert out.dispatched[0].reason == QUEUED


def test_a_backend_with_none_of_the_gateways_requests_in_flight_always_takes_one() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)), slo_wait_s=25.0)
    sent, out = flood(d)
    waiting = queued(out)
    for s in sent:
        d.finish(s, 0.1)
    assert [p.job.request_id for p in d.pump(0.1).dispatched] == [waiting.job.request_id]


def test_by_default_a_request_over_the_slo_is_refused_at_once_not_queued() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    _, out = flood(d)
    assert isinstance(out, Rejection) and (out.status, out.code) == (429, OVER_SLO)
    assert out.retry_after_s is not None and out.retry_after_s >= 1
    assert d.queue_depth == 0


def test_an_over_slo_refusals_retry_after_is_when_the_same_request_would_be_admitted() -> None:
    # Very long prompts overshoot the SLO by seconds of prefill load. With nothing else
    # arriving, the refused request fits again once that load has decayed: not a second before
    # the Retry-After (whole seconds, rounded up), and at it.
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    warm = placed(d.submit(job("warm"), 0.0))
    d.finish(warm, 0.0, Completion(completion_tokens=10, tpot_s=0.03))
    huge = "word " * 16_000
    for i in range(5):
        out = d.submit(job(f"huge{i}", f"{i} {huge}"), 0.0)
        if isinstance(out, Rejection):
            break
    assert isinstance(out, Rejection) and out.code == OVER_SLO
    wait = out.retry_after_s
    assert wait is not None and wait >= 2
    assert isinstance(d.submit(job("early", f"{i} {huge}"), wait - 1.0), Rejection)
    placed(d.submit(job("on time", f"{i} {huge}"), float(wait)))


def test_a_class_at_or_above_slo_exempt_priority_is_served_past_the_slo_the_rest_refused(
) -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)), slo_exempt_priority=1)
    _, out = flood(d)  # class 0: the SLO closes
    assert isinstance(out, Rejection) and out.code == OVER_SLO
    for i in range(3):
        placed(d.submit(job(f"paid{i}", f"paid {i} {LONG}", priority=1 + i), 0.0))
    late = d.submit(job("free", f"free {LONG}"), 0.0)
    assert isinstance(late, Rejection) and late.code == OVER_SLO


def test_an_exempt_class_overtakes_a_request_waiting_on_the_slo() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)), slo_wait_s=25.0, slo_exempt_priority=5)
    _, out = flood(d)
    waiting = queued(out)
    paid = placed(d.submit(job("paid", f"paid {LONG}", priority=5), 0.1))
    assert paid.job.request_id == "paid"
    assert d.queue_depth == 1 and d.pump(0.2) == Pumped((), ())  # the class-0 one still waits
    assert waiting.job.priority == 0


def test_a_backend_is_not_gated_before_its_first_speed_reading() -> None:
    # Until a first token or a reply is measured, its speed is the slow-start guess: a burst at
    # start-up is not refused for a slowness nobody has seen.
    d = dispatcher(make_fleet(a=(100_000, 100_000)))
    for i in range(20):
        placed(d.submit(job(f"long{i}", f"{i} {LONG}"), 0.0))


def test_without_slo_admission_the_same_flood_is_all_dispatched() -> None:
    d = dispatcher(make_fleet(a=(100_000, 100_000)), slo_admission=False)
    for i in range(20):
        placed(d.submit(job(f"long{i}", f"{i} {LONG}"), 0.0))


def test_a_backend_too_slow_for_the_slo_alone_is_held_to_twice_its_idle_tpot() -> None:
    # A prior whose bare decode step (x4 until measured) is 80 ms: over a 50 ms SLO even alone.
    slow = BackendProfile(decode_base_s=0.02)
    fleet = make_fleet(a=(100_000, 100_000))
    d = Dispatcher(fleet, build_router("cost", PolicyContext(rng=random.Random(0))),
                   config=DispatchConfig(), profile=slow)
    warm = placed(d.submit(job("warm"), 0.0))
    d.finish(warm, 0.0, Completion(completion_tokens=10, tpot_s=0.09))  # slow, as predicted
    for i in range(3):  # short prompts add almost nothing: within 2 x its idle TPOT
        placed(d.submit(job(f"short{i}"), 0.0))
    flood(d, tpot_s=0.09)  # long ones still push it past that


def test_a_backend_that_never_reported_its_kv_is_filled_no_further_than_its_peers_hold() -> None:
    # b answers requests but its metrics never did: the ledger alone knows what it holds, and
    # it is assumed to hold no more than a (b's capacity is a's: 40 blocks of 128 tokens).
    fleet = Fleet([BackendSpec(b, f"http://127.0.0.1/{b}", ("m",)) for b in ("a", "b")],
                  max_snapshot_age=100.0)
    fleet.record_scrape("a", BackendSnapshot(taken_at=0.0, format="vllm", kv_total_blocks=40,
                                             kv_free_blocks=0, block_size=128, running=3,
                                             waiting=0))
    fleet.record_request_success("b", 0.0)
    d = dispatcher(fleet)
    long = [Job(f"r{i}", "m", "write a long story", max_tokens=1500, ignore_eos=True)
            for i in range(6)]
    outcomes = [d.submit(j, 0.0) for j in long]
    on_b = [o for o in outcomes if isinstance(o, Dispatch) and o.backend_id == "b"]
    # 1,500 + prompt tokens is 12 blocks of 128: at most three fit under the 0.9 high-water
    # mark of 40 (with no reading of its own, admission may hold it to fewer).
    assert 1 <= len(on_b) <= 3
    assert all(isinstance(o, Waiting) for o in outcomes if o not in on_b)
