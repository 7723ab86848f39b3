"""Workload generators: exact synthetic text, shared prefixes, seeded schedules and traces."""

from __future__ import annotations

import statistics

import pytest

from loadtest.sim.api import ChatMessage, render_chat
from loadtest.sim.tokens import tokenize
from loadtest.workloads import (
    WORKLOADS,
    Limits,
    SessionSource,
    SharedPrefix,
    WorkItem,
    schedule,
    workload,
)


def _schedule(name: str, seed: int = 0, rate: float = 4.0, duration: float = 60.0,
              arrival: str = "poisson", burstiness: float = 2.0) -> tuple[WorkItem, ...]:
    return schedule(workload(name), rate=rate, duration_s=duration, seed=seed, arrival=arrival,
                    burstiness=burstiness)


@pytest.mark.parametrize("name", WORKLOADS)
def test_prompt_ids_are_what_the_simulator_renders_from_the_messages(name: str) -> None:
    for item in _schedule(name)[:40]:
        messages = [ChatMessage(role=role, content=content) for role, content in item.messages()]
        assert item.prompt_ids() == render_chat(messages).tokens
        assert item.prompt_tokens == len(item.prompt_ids())


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_request_fits_the_context_and_its_cap(name: str) -> None:
    limits = Limits(max_context=8192)
    for item in schedule(workload(name, limits=limits), rate=6.0, duration_s=60.0, seed=3):
        assert item.prompt_tokens + item.max_tokens <= limits.max_context
        assert 1 <= item.output_tokens <= item.max_tokens


@pytest.mark.parametrize("name", WORKLOADS)
def test_the_same_seed_gives_the_same_schedule_and_another_seed_another(name: str) -> None:
    first, again, other = _schedule(name, 7), _schedule(name, 7), _schedule(name, 8)
    assert first == again
    assert [i.messages() for i in first[:5]] == [i.messages() for i in again[:5]]
    assert first != other


def test_arrivals_are_sorted_inside_the_window_at_the_requested_mean_rate() -> None:
    items = _schedule("chat", rate=20.0, duration=200.0)
    times = [i.arrival_s for i in items]
    assert times == sorted(times)
    assert 0.0 <= times[0] and times[-1] < 200.0
    assert len(items) / 200.0 == pytest.approx(20.0, rel=0.1)


def test_bursty_arrivals_clump_more_than_poisson() -> None:
    def gap_cv(arrival: str) -> float:
        times = [i.arrival_s for i in _schedule("chat", rate=20.0, duration=300.0,
                                               arrival=arrival, burstiness=3.0)]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        return statistics.pstdev(gaps) / statistics.mean(gaps)

    assert gap_cv("poisson") == pytest.approx(1.0, abs=0.15)
    assert gap_cv("bursty") > 2.0


def test_shared_prefix_groups_share_their_document_and_nothing_else() -> None:
    spec = workload("shared-prefix", shared_prefix=SharedPrefix(groups=3, prefix_tokens=600,
                                                                 question_tokens=100))
    items = schedule(spec, rate=5.0, duration_s=40.0, seed=1)
    by_group: dict[str | None, list[tuple[int, ...]]] = {}
    for item in items:
        by_group.setdefault(item.prefix_group, []).append(item.prompt_ids())
    assert len(by_group) == 3
    docs = set()
    for prompts in by_group.values():
        doc = prompts[0][:600]
        assert all(p[:600] == doc for p in prompts)  # the shared document
        assert len({p[610:626] for p in prompts}) == len(prompts)  # unique questions
        docs.add(doc[:16])
    assert len(docs) == 3  # groups differ from their first block on


def test_unique_messages_differ_from_their_first_tokens() -> None:
    firsts = [item.segments[-1].token_ids()[:3] for item in _schedule("rag-long")]
    assert len(set(firsts)) == len(firsts)


def test_a_conversation_turn_extends_the_previous_turns_prompt() -> None:
    items = [i for i in _schedule("multi-turn", duration=400.0) if i.conversation]
    turns: dict[str, list[tuple[int, ...]]] = {}
    for item in items:
        assert item.conversation is not None
        turns.setdefault(item.conversation, []).append(item.prompt_ids())
    grown = [t for t in turns.values() if len(t) >= 2]
    assert grown
    for prompts in grown:
        for earlier, later in zip(prompts, prompts[1:], strict=False):
            assert later[:len(earlier)] == earlier and len(later) > len(earlier)


def test_streams_share_documents_but_never_unique_text() -> None:
    spec = workload("shared-prefix", shared_prefix=SharedPrefix(groups=1, prefix_tokens=300))
    a = SessionSource(spec, seed=0, stream=1).next_session()[0]
    b = SessionSource(spec, seed=0, stream=2).next_session()[0]
    assert a.segments[0] == b.segments[0]
    assert a.segments[1].text() != b.segments[1].text()


def test_synthetic_text_counts_as_many_tokens_as_it_claims() -> None:
    for item in _schedule("mixed")[:60]:
        for segment in item.segments:
            assert tokenize(segment.text()) == list(segment.token_ids())
            assert len(segment.token_ids()) == segment.tokens


def test_unknown_workloads_and_arrival_processes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        workload("nope")
    with pytest.raises(ValueError, match="unknown arrival process"):
        _schedule("chat", arrival="steady")
