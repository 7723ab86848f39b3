"""The fidelity table: every published benchmark row is simulated within 20% of its figure, each
row carries the page and the text its figure was read from, and the comparison is a benchmark
record like the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest import results
from loadtest.fidelity import TOLERANCE, Row, compare, load_rows, simulate
from loadtest.fidelity.__main__ import main

ROWS = load_rows()


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_every_published_row_is_simulated_within_20_percent(row: Row) -> None:
    simulated = simulate(row).figure(row.metric)
    assert abs(simulated / row.published - 1.0) <= TOLERANCE, (row.id, simulated, row.published)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_every_row_names_its_source_and_quotes_its_figure(row: Row) -> None:
    assert row.source.startswith("https://")
    assert f"{row.published:g}" in row.quote


def test_the_table_covers_8b_on_a100_and_h100_and_70b_at_tp2_and_tp4() -> None:
    configs = {(r.model, r.gpu, r.num_gpus) for r in ROWS}
    assert {("llama-3-8b", "a100", 1), ("llama-3-8b", "h100", 1), ("llama-3-70b", "h100", 2),
            ("llama-3-70b", "h100", 4)} <= configs


def test_a_batch_finishes_later_on_slower_gpus_and_with_more_layers() -> None:
    by_id = {r.id: simulate(r).e2e_latency_ms for r in ROWS if r.mode == "batch"}
    assert by_id["vllm-8b-h200-latency"] < by_id["vllm-8b-h100-latency"] < by_id[
        "vllm-8b-a100-latency"]
    assert by_id["vllm-8b-h100-latency"] < by_id["vllm-70b-tp4-h100-latency"]


def test_the_comparison_is_written_as_a_benchmark_record(tmp_path: Path) -> None:
    assert main(["--results-dir", str(tmp_path)]) == 0
    record = results.load(tmp_path / "fidelity.json")
    (table,) = record.tables
    assert len(table.rows) == len(compare())
    assert record.command == ".venv/bin/python -m loadtest.fidelity"
