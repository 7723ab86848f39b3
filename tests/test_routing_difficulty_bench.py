"""`python -m loadtest.bench_small_model --decision` measures the routing decision beside the
embedding and records one table: every step's CPU and wall quantiles, over every prompt."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cache.embedders.choice import local_installed
from loadtest import bench_small_model
from routing.difficulty.labelled import read_prompts

DATA = Path(__file__).parent / "data" / "routing_prompts.jsonl"


def test_the_decision_bench_records_each_step(tmp_path: Path) -> None:
    code = bench_small_model.main(["--decision", "--rounds", "1", "--embed-rounds", "1",
                                   "--results-dir", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "bench_small_model_decision.json").read_text())
    (table,) = record["tables"]
    steps = [row[0] for row in table["rows"]]
    assert steps[:2] == ["rules (certain)", "rules + hashed classifier"]
    assert len(steps) == (4 if local_installed() else 2)
    prompts = len(read_prompts(DATA.read_text(encoding="utf-8")))
    for _, calls, p50, p99, worst, wall50, wall99 in table["rows"]:
        assert calls == prompts
        assert 0 <= p50 <= p99 <= worst and 0 <= wall50 <= wall99


def test_bad_rounds_are_bad_usage() -> None:
    assert bench_small_model.main(["--decision", "--rounds", "0", "--no-record"]) == 2
