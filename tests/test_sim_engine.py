"""The simulated engine's scheduler: batching, blocks, preemption, prefix reuse, step times."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from loadtest.sim.engine import Engine, SimRequest, StepResult, TokenEvent
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, Preset

BASE = PRESETS[DEFAULT_PRESET]
MAX_STEPS = 20_000


def preset(max_num_batched_tokens: int = BASE.max_num_batched_tokens,
           max_num_seqs: int = BASE.max_num_seqs) -> Preset:
    return dataclasses.replace(BASE, max_num_batched_tokens=max_num_batched_tokens,
                               max_num_seqs=max_num_seqs)


def prompt(n: int, start: int = 0) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def request(rid: str, prompt_len: int = 32, max_tokens: int = 8, natural_len: int = 1000,
            ignore_eos: bool = False, start: int = 0, extra_key: str = "") -> SimRequest:
    return SimRequest(rid, prompt(prompt_len, start), max_tokens, natural_len, ignore_eos,
                      extra_key)


def drain(engine: Engine, events: dict[str, list[TokenEvent]] | None = None,
          results: list[StepResult] | None = None) -> dict[str, list[TokenEvent]]:
    """Step until idle, checking conservation at every step; the events by request."""
    out: dict[str, list[TokenEvent]] = defaultdict(list) if events is None else events
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            return out
        result = engine.step()
        stats = engine.stats()
        assert stats.free_blocks + stats.used_blocks == stats.num_gpu_blocks
        for event in result.events:
            out[event.request_id].append(event)
        if results is not None:
            results.append(result)
    raise AssertionError(f"engine still busy after {MAX_STEPS} steps")


def step_until_decoding(engine: Engine, batch: int) -> StepResult:
    for _ in range(MAX_STEPS):
        result = engine.step()
        if result.num_decode_seqs == batch and result.num_prefill_tokens == 0:
            return result
    raise AssertionError("never reached a pure decode step")


# --- output lengths -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_tokens", "natural_len", "ignore_eos", "count", "reason"),
    [
        pytest.param(10, 5, False, 5, "stop", id="stops at its natural length"),
        pytest.param(5, 10, False, 5, "length", id="capped by max_tokens"),
        pytest.param(5, 5, False, 5, "stop", id="eos on the last allowed token is a stop"),
        pytest.param(5, 3, True, 5, "length", id="ignore_eos runs to exactly max_tokens"),
        pytest.param(1, 1, False, 1, "stop", id="a one-token answer"),
    ],
)
def test_a_request_ends_at_max_tokens_or_its_natural_length(
    max_tokens: int, natural_len: int, ignore_eos: bool, count: int, reason: str
) -> None:
    engine = Engine(BASE)
    engine.add(request("r", max_tokens=max_tokens, natural_len=natural_len, ignore_eos=ignore_eos))
    events = drain(engine)["r"]
    assert [e.token_index for e in events] == list(range(count))
    assert [e.finish_reason for e in events] == [None] * (count - 1) + [reason]
    assert engine.stats().finished[reason] == 1
    assert engine.stats().generation_tokens_total == count
    assert engine.stats().prompt_tokens_total == 32


# --- admission ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "num_gpu_blocks", "message"),
    [
        pytest.param(request("r", prompt_len=8000, max_tokens=193), None, "maximum context length",
                     id="prompt plus max_tokens beyond max_model_len"),
        pytest.param(request("r", prompt_len=100, max_tokens=30), 9, "needs 9 KV blocks",
                     id="more blocks than the whole cache"),
        pytest.param(request("r", prompt_len=0), None, "prompt", id="an empty prompt"),
        pytest.param(request("r", max_tokens=0), None, "max_tokens", id="max_tokens of zero"),
    ],
)
def test_add_rejects_requests_that_can_never_run(
    req: SimRequest, num_gpu_blocks: int | None, message: str
) -> None:
    engine = Engine(BASE, num_gpu_blocks=num_gpu_blocks)
    with pytest.raises(ValueError, match=message):
        engine.add(req)
    assert not engine.has_work()


def test_a_request_that_exactly_fills_the_cache_is_accepted_and_finishes() -> None:
    engine = Engine(BASE, num_gpu_blocks=9)  # 8 usable blocks = 128 tokens
    engine.add(request("r", prompt_len=100, max_tokens=29, ignore_eos=True))  # 128 KV tokens
    assert len(drain(engine)["r"]) == 29


def test_a_duplicate_request_id_is_rejected() -> None:
    engine = Engine(BASE)
    engine.add(request("r"))
    with pytest.raises(ValueError, match="already"):
        engine.add(request("r"))


def test_the_first_token_ends_the_step_that_completes_the_prefill() -> None:
    engine = Engine(preset(max_num_batched_tokens=16))
    engine.add(request("r", prompt_len=40, max_tokens=3))
    results = [engine.step() for _ in range(4)]
    assert [r.num_prefill_tokens for r in results] == [16, 16, 8, 0]
    assert [len(r.events) for r in results] == [0, 0, 1, 1]
    assert results[3].num_decode_seqs == 1


def test_a_step_never_exceeds_the_token_budget() -> None:
    engine = Engine(preset(max_num_batched_tokens=100))
    for i in range(5):
        engine.add(request(f"r{i}", prompt_len=70, start=1000 * i))
    results: list[StepResult] = []
    drain(engine, results=results)
    assert max(r.num_prefill_tokens + r.num_decode_seqs for r in results) == 100


def test_no_more_than_max_num_seqs_run_at_once() -> None:
    engine = Engine(preset(max_num_seqs=2))
    for i in range(3):
        engine.add(request(f"r{i}", start=1000 * i))
    engine.step()
    assert (engine.stats().running, engine.stats().waiting) == (2, 1)
    assert set(drain(engine)) == {"r0", "r1", "r2"}


def test_waiting_requests_are_admitted_first_come_first_served() -> None:
    engine = Engine(BASE, num_gpu_blocks=9)
    engine.add(request("holder", prompt_len=64, max_tokens=2))  # 4 blocks for two steps
    engine.step()
    engine.add(request("big", prompt_len=80, max_tokens=1, start=1000))  # needs 5, 4 free
    engine.add(request("small", prompt_len=16, max_tokens=1, start=2000))  # would fit
    second = engine.step()
    assert {e.request_id for e in second.events} == {"holder"}
    assert engine.stats().waiting == 2  # "small" waits behind "big"
    order = [rid for r in [engine.step() for _ in range(3)] for rid in
             (e.request_id for e in r.events)]
    assert order == ["big", "small"]


# --- blocks and preemption -----------------------------------------------------------------


def test_blocks_are_conserved_and_all_returned_when_everything_finished() -> None:
    engine = Engine(BASE, num_gpu_blocks=40)
    for i in range(12):
        engine.add(request(f"r{i}", prompt_len=20 + 7 * i, max_tokens=30, natural_len=5 + 3 * i,
                           start=100 * i))
    drain(engine)
    stats = engine.stats()
    assert (stats.free_blocks, stats.used_blocks, stats.kv_usage) == (39, 1, 0.0)
    assert engine.invariant_violations() == []


def test_kv_usage_is_one_minus_free_over_total_minus_the_null_block() -> None:
    engine = Engine(BASE, num_gpu_blocks=11)
    engine.add(request("r", prompt_len=48))  # 3 full blocks; the first decode needs a 4th
    engine.step()
    stats = engine.stats()
    assert stats.free_blocks == 7
    assert stats.kv_usage == pytest.approx(1 - 7 / 10)


def test_when_blocks_run_out_the_newest_running_sequences_are_preempted() -> None:
    # 8 usable blocks; four sequences of 2 prompt blocks fill them, and each needs a third block
    # for its first decode. A fifth request waits for a slot (max_num_seqs 4).
    engine = Engine(preset(max_num_seqs=4), num_gpu_blocks=9, enable_prefix_caching=False)
    for i in range(5):
        engine.add(request(f"r{i}", prompt_len=32, max_tokens=40, ignore_eos=True, start=100 * i))
    results: list[StepResult] = []
    events = drain(engine, results=results)
    first = next(r for r in results if r.preempted)
    # r0 takes r3's blocks; r1 takes the rest; r2 finds none and preempts itself.
    assert first.preempted == ("r3", "r2")
    assert engine.stats().preemptions_total == sum(len(r.preempted) for r in results)
    assert "r0" not in {rid for r in results for rid in r.preempted}  # the oldest only preempts

    def resumed_at(rid: str) -> tuple[int, int]:  # (step, position) of its first token after
        start = results.index(first)
        return next((s, p) for s, r in enumerate(results) if s > start
                    for p, e in enumerate(r.events) if e.request_id == rid)

    # Preempted requests return to the front of the waiting queue, in their arrival order.
    assert resumed_at("r2") < resumed_at("r3") < resumed_at("r4")
    for rid in events:  # no token re-emitted or lost across preemptions
        assert [e.token_index for e in events[rid]] == list(range(40))


def test_a_preempted_request_recomputes_its_prompt_and_generated_tokens() -> None:
    engine = Engine(BASE, num_gpu_blocks=9, enable_prefix_caching=False)
    engine.add(request("old", prompt_len=32, max_tokens=90, ignore_eos=True))
    engine.add(request("new", prompt_len=32, max_tokens=60, ignore_eos=True, start=100))
    emitted = 0
    for _ in range(MAX_STEPS):
        result = engine.step()
        if "new" in result.preempted:
            break
        emitted += sum(e.request_id == "new" for e in result.events)
    else:
        raise AssertionError("no preemption")
    for _ in range(MAX_STEPS):
        result = engine.step()
        new_events = [e for e in result.events if e.request_id == "new"]
        if new_events:
            assert new_events[0].token_index == emitted
            assert result.num_prefill_tokens == 32 + emitted
            return
    raise AssertionError("the preempted request never resumed")


# --- prefix caching ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("second", "cached"),
    [
        pytest.param(request("b", prompt_len=64), 48,
                     id="the same prompt reuses all but the block holding its last token"),
        pytest.param(request("b", prompt_len=70), 64, id="a longer prompt reuses the full prefix"),
        pytest.param(request("b", prompt_len=40), 32, id="a shorter prompt reuses its full blocks"),
        pytest.param(request("b", prompt_len=64, start=1), 0, id="a different prompt reuses none"),
        pytest.param(request("b", prompt_len=64, extra_key="adapter"), 0,
                     id="another extra key (LoRA, cache salt) has its own cache"),
    ],
)
def test_a_later_request_skips_the_prefill_of_a_cached_prefix(
    second: SimRequest, cached: int
) -> None:
    engine = Engine(BASE)
    engine.add(request("a", prompt_len=64))
    drain(engine)
    engine.add(second)
    first_step = engine.step()
    assert first_step.num_prefill_tokens == len(second.prompt) - cached
    assert first_step.events[0].num_cached_tokens == cached
    stats = engine.stats()
    assert stats.prefix_queries_tokens == 64 + len(second.prompt)
    assert stats.prefix_hits_tokens == cached


def test_a_cached_prefix_makes_the_prefill_step_shorter() -> None:
    engine = Engine(BASE)
    engine.add(request("a", prompt_len=4096, max_tokens=1))
    cold = engine.step()
    engine.add(request("b", prompt_len=4096, max_tokens=1))
    warm = engine.step()
    assert warm.duration < cold.duration / 10


def test_a_running_sequences_blocks_are_shared_by_a_request_with_the_same_prefix() -> None:
    engine = Engine(BASE, num_gpu_blocks=20)
    engine.add(request("a", prompt_len=64, max_tokens=50))
    engine.step()
    used_by_a = engine.stats().used_blocks
    engine.add(request("b", prompt_len=64, max_tokens=50))
    engine.step()
    # One block for a's first decode, one for b's last prompt block: b shares a's first three.
    assert engine.stats().used_blocks == used_by_a + 2
    assert engine.invariant_violations() == []


def test_prefix_caching_disabled_reuses_nothing_and_counts_nothing() -> None:
    engine = Engine(BASE, enable_prefix_caching=False)
    engine.add(request("a", prompt_len=64))
    drain(engine)
    engine.add(request("b", prompt_len=64))
    assert engine.step().num_prefill_tokens == 64
    assert (engine.stats().prefix_queries_tokens, engine.stats().prefix_hits_tokens) == (0, 0)


def test_cached_blocks_are_evicted_when_memory_is_needed() -> None:
    engine = Engine(BASE, num_gpu_blocks=9)
    engine.add(request("a", prompt_len=64, max_tokens=1))
    drain(engine)
    engine.add(request("filler", prompt_len=120, max_tokens=1, start=5000))  # takes all 8 blocks
    drain(engine)
    engine.add(request("b", prompt_len=64, max_tokens=1))
    assert engine.step().num_prefill_tokens == 64


# --- aborts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("steps_before", [pytest.param(0, id="while waiting"),
                                          pytest.param(2, id="while running")])
def test_abort_frees_the_blocks_at_once_and_counts_as_abort(steps_before: int) -> None:
    engine = Engine(BASE, num_gpu_blocks=20)
    engine.add(request("r", prompt_len=64, max_tokens=100))
    for _ in range(steps_before):
        engine.step()
    assert engine.abort("r") is True
    stats = engine.stats()
    assert (stats.free_blocks, stats.running, stats.waiting) == (19, 0, 0)
    assert stats.finished["abort"] == 1
    assert not engine.has_work()
    assert engine.abort("r") is False


def test_aborting_an_unknown_request_is_a_no_op() -> None:
    assert Engine(BASE).abort("nobody") is False


# --- step time ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("smaller", "larger"),
    [
        pytest.param((1, 512), (16, 512), id="1 to 16 sequences"),
        pytest.param((16, 512), (64, 512), id="16 to 64 sequences"),
        pytest.param((16, 256), (16, 2048), id="256 to 2048 tokens of context each"),
    ],
)
def test_a_decode_step_takes_longer_with_more_sequences_and_more_context(
    smaller: tuple[int, int], larger: tuple[int, int]
) -> None:
    durations = []
    for batch, context in (smaller, larger):
        engine = Engine(BASE)
        for i in range(batch):
            engine.add(request(f"r{i}", prompt_len=context, max_tokens=10, start=10_000 * i))
        durations.append(step_until_decoding(engine, batch).duration)
    assert durations[0] < durations[1]


# --- random request mixes -------------------------------------------------------------------

add_op = st.tuples(
    st.just("add"),
    st.integers(min_value=1, max_value=90),  # prompt length
    st.integers(min_value=0, max_value=2),  # which shared prefix family
    st.integers(min_value=1, max_value=60),  # max_tokens
    st.integers(min_value=1, max_value=80),  # natural length
    st.booleans(),  # ignore_eos
)
abort_op = st.tuples(st.just("abort"), st.integers(min_value=0, max_value=100))  # which one
step_op = st.tuples(st.just("step"), st.integers(min_value=1, max_value=5))


@settings(max_examples=300, deadline=None)
@given(
    num_gpu_blocks=st.integers(min_value=4, max_value=24),
    budget=st.sampled_from([16, 40, 8192]),
    max_num_seqs=st.integers(min_value=1, max_value=6),
    caching=st.booleans(),
    ops=st.lists(st.one_of(add_op, add_op, abort_op, step_op), min_size=8, max_size=50),
)
def test_random_mixes_conserve_blocks_and_finish_every_request_exactly(
    num_gpu_blocks: int,
    budget: int,
    max_num_seqs: int,
    caching: bool,
    ops: list[tuple[object, ...]],
) -> None:
    engine = Engine(preset(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs),
                    num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=caching)
    expected: dict[str, tuple[int, str]] = {}
    added: list[str] = []
    aborted: dict[str, int] = {}  # request id -> tokens it had received when aborted
    events: dict[str, list[TokenEvent]] = defaultdict(list)

    def check() -> None:
        stats = engine.stats()
        assert stats.free_blocks + stats.used_blocks == num_gpu_blocks
        assert engine.invariant_violations() == []

    for i, op in enumerate(ops):
        if op[0] == "add":
            _, length, family, max_tokens, natural, ignore_eos = op
            assert isinstance(length, int) and isinstance(family, int)
            assert isinstance(max_tokens, int) and isinstance(natural, int)
            req = SimRequest(f"r{i}", prompt(length, 1000 * family), max_tokens, natural,
                             bool(ignore_eos))
            fits = -(-(length + max_tokens - 1) // 16) <= num_gpu_blocks - 1
            if not fits:
                with pytest.raises(ValueError):
                    engine.add(req)
                continue
            engine.add(req)
            added.append(req.request_id)
            stops = not ignore_eos and natural <= max_tokens
            expected[req.request_id] = (natural, "stop") if stops else (max_tokens, "length")
        elif op[0] == "abort":
            assert isinstance(op[1], int)
            rid = added[op[1] % len(added)] if added else "nobody"
            done = rid in events and events[rid][-1].finish_reason is not None
            if engine.abort(rid):
                assert not done
                aborted[rid] = len(events.get(rid, []))
        else:
            assert isinstance(op[1], int)
            for _ in range(op[1]):
                for event in engine.step().events:
                    events[event.request_id].append(event)
        check()

    drain(engine, events)
    check()
    target(float(engine.stats().preemptions_total), label="preemptions")  # steer towards them
    for rid, (count, reason) in expected.items():
        got = events.get(rid, [])
        if rid in aborted:  # nothing after the abort, and no finish reason
            assert len(got) == aborted[rid]
            assert [e.token_index for e in got] == list(range(len(got)))
            assert all(e.finish_reason is None for e in got)
            continue
        assert [e.token_index for e in got] == list(range(count))
        assert [e.finish_reason for e in got[:-1]] == [None] * (count - 1)
        assert got[-1].finish_reason == reason
    stats = engine.stats()
    assert (stats.free_blocks, stats.used_blocks) == (num_gpu_blocks - 1, 1)
    assert stats.finished["abort"] == len(aborted)
    assert stats.finished["stop"] + stats.finished["length"] == len(expected) - len(aborted)
