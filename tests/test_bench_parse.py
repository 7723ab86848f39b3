"""The parse benchmark's servers answer what its docstring says they answer: payloads of each kind
move only the samples named, and a filtered server answers `name[]` with only those samples."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from loadtest.bench_parse import Exposition, payloads
from routing.metrics import parse_metrics, read_metrics
from routing.metrics.query import SAMPLE_NAMES, filtered_path
from tests.paths import FIXTURES

TEMPLATE = (FIXTURES / "vllm-v1.prom").read_text()
QUERY = urlsplit(filtered_path("vllm") or "").query


def sample_names(payload: bytes) -> set[str]:
    lines = payload.decode().splitlines()
    return {line.split("{")[0].split(" ")[0] for line in lines if line and line[0] != "#"}


@pytest.mark.parametrize(("kind", "load_moves"), [
    pytest.param("same", False, id="same: the same bytes at every scrape"),
    pytest.param("idle", False, id="idle: the process CPU moves, the load series do not"),
    pytest.param("busy", True, id="busy: running, KV usage and a counter move"),
])
def test_unfiltered_payloads_move_as_their_kind_says(kind: str, load_moves: bool) -> None:
    next_payload = payloads(TEMPLATE, kind)
    first, second = next_payload(), next_payload()
    assert (first == second) is (kind == "same")
    assert (read_metrics(first) != read_metrics(second)) is load_moves


@pytest.mark.parametrize(("kind", "running", "moves"), [
    pytest.param("same", 24, False, id="same: the fixture's figures, every time"),
    pytest.param("idle", 24, False, id="idle: no process series in a filtered answer"),
    pytest.param("busy", 0, True, id="busy: running starts at 0 and moves"),
])
def test_a_filtered_answer_holds_only_the_samples_asked_for(
    kind: str, running: int, moves: bool
) -> None:
    exposition = Exposition(TEMPLATE, kind, cycle=2)
    answer = exposition.answer(QUERY, 0)
    assert sample_names(answer) == set(SAMPLE_NAMES["vllm"]) & sample_names(TEMPLATE.encode())
    snapshot = parse_metrics(answer, taken_at=0.0)
    assert snapshot.running == running and snapshot.kv_total_blocks == 27313
    assert (exposition.answer(QUERY, 1) != answer) is moves
