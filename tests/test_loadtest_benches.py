"""The cache, small-model and index benchmarks run end to end on a small budget: live traffic
through the real gateway to simulators (and a redis-server of their own), figures that add up,
exit 0, and a valid result record in the results directory they are given."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from loadtest import bench_cache, bench_fleet, bench_index, bench_small_model
from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.experiment import Contender, Experiment, run_experiment
from loadtest.results import Record, load
from loadtest.workloads import workload


def _record(directory: Path, name: str) -> Record:
    rec = load(directory / f"{name}.json")
    assert rec.command.startswith(f".venv/bin/python -m loadtest.{name} ")
    assert "--results-dir" not in rec.command
    return rec


def test_the_cache_benchmark_moves_work_off_the_backends(tmp_path: Path) -> None:
    stores = "off,memory,redis"  # ./scripts/test.sh installs redis-server
    out = tmp_path / "cache.json"
    code = bench_cache.main(["--requests", "40", "--questions", "10", "--concurrency", "4",
                             "--time-scale", "20", "--lookups", "40", "--stores", stores,
                             "--search-sizes", "300,600", "--search-lookups", "30",
                             "--embed-runs", "3", "--exact-lookups", "40", "--cpu-rounds", "2",
                             "--cpu-requests", "20",
                             "--json", str(out), "--results-dir", str(tmp_path)])
    assert code == 0
    result = json.loads(out.read_text())
    off, memory = result["live"]["off"], result["live"]["memory"]
    assert off["backend_requests"] == 40 and off["exact"] + off["semantic"] == 0
    # 40 requests over 10 questions: at least 30 of them repeat one already answered.
    assert memory["exact"] + memory["semantic"] + memory["backend_requests"] == 40
    assert memory["backend_tokens"] < off["backend_tokens"]
    assert memory["false_hits"] == 0
    assert set(result["lookup_us"]) == set(stores.split(",")) - {"off"}
    live, lookups, targets, searches, embedding, cpu = _record(tmp_path, "bench_cache").tables
    assert [row[0] for row in live.rows] == stores.split(",")
    assert [row[0] for row in lookups.rows] == ["memory", "redis"]
    # The targets: two search sizes, the exact hit (its whole path, then the lookup alone), the
    # CPU ratio, each with its figures.
    assert len(targets.rows) == 5 and all(row[1] > 0 for row in targets.rows)
    exact = result["targets"]["exact"]
    assert 0 < exact["lookup"]["cpu_p50_ms"] <= exact["cpu_p50_ms"]
    for search in result["targets"]["search"]:  # every probe found what it should
        assert search["right"] == search["lookups"] == 30
    assert [row[0] for row in embedding.rows] == [8, 50, 200]
    assert result["targets"]["cpu"]["hits"] == 0  # every request a miss
    assert cpu.rows[0][0] > 0 and cpu.rows[0][1] > 0


def test_the_small_model_benchmark_sends_the_easy_share_to_the_small_model(
        tmp_path: Path) -> None:
    out = tmp_path / "small.json"
    code = bench_small_model.main(["--requests", "20", "--rate", "40", "--easy-share", "0.5",
                                   "--time-scale", "20", "--json", str(out),
                                   "--results-dir", str(tmp_path)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert runs["large only"]["small_share"] == 0.0
    plan = bench_small_model.plan(20, 0.5, 0)
    # The classifier sends small only what it judges easy: some of the easy prompts, never
    # more than their share (a conservative threshold keeps some easy ones large).
    easy_share = sum(not hard for hard, _ in plan) / 20
    assert 0 < runs["auto, easy"]["small_share"] <= easy_share
    assert all(run["failed"] == 0 for run in runs.values())
    (table,) = _record(tmp_path, "bench_small_model").tables
    assert [row[0] for row in table.rows] == list(runs)




def test_the_index_benchmark_finds_what_a_brute_force_scan_finds(tmp_path: Path) -> None:
    assert bench_index.main(["--members", "40", "--lookups", "20",
                             "--results-dir", str(tmp_path)]) == 0
    (table,) = _record(tmp_path, "bench_index").tables
    assert all(row[-1] == "yes" for row in table.rows)


def test_no_record_writes_no_record(tmp_path: Path) -> None:
    assert bench_index.main(["--members", "20", "--lookups", "4", "--no-record",
                             "--results-dir", str(tmp_path)]) == 0
    assert list(tmp_path.iterdir()) == []


TINY_RUNS = {  # bench_fleet's smallest run measures three workloads' capacity: too long here
    "bench_telemetry": ["--requests", "200", "--repeat", "1"],
    "bench_sim": ["--streams", "8", "--engine-only"],
    "bench_gateway_telemetry": ["--requests", "20", "--rounds", "1"],
    "bench_workers": ["--requests", "20", "--rounds", "1"],
}


@pytest.mark.parametrize("name", list(TINY_RUNS), ids=[f"{n}-records-its-run" for n in TINY_RUNS])
def test_every_benchmark_records_its_run_with_the_command(name: str, tmp_path: Path) -> None:
    module = importlib.import_module(f"loadtest.{name}")
    code = module.main([*TINY_RUNS[name], "--results-dir", str(tmp_path)])
    assert code in (0, None)
    rec = _record(tmp_path, name)
    assert rec.command.endswith(" ".join(TINY_RUNS[name]))
    assert all(table.rows for table in rec.tables)


def test_the_fleet_benchmark_tables_each_load_level_with_its_spread() -> None:
    report = run_experiment(Experiment(
        fleet=parse_fleet("2"), contenders=(Contender("round_robin", False), bench_fleet.KVGATE),
        workload=workload("chat"), rates=(4.0, 8.0), duration_s=2.0, seeds=(0, 1)))
    tables = bench_fleet.scenario_tables("chat", report)
    assert [t.title for t in tables] == [
        "chat at 4.00 requests/s, means over 2 seeds",
        "chat at 4.00 requests/s: spread over seeds (min .. max)",
        "chat at 8.00 requests/s, means over 2 seeds",
        "chat at 8.00 requests/s: spread over seeds (min .. max)"]
    means = tables[0]
    assert means.columns[:6] == ["policy", "done", "rej", "TTFT p50", "TTFT p90", "TTFT p99"]
    assert [row[0] for row in means.rows] == ["round_robin", "cost+adm"]
    assert all(len(row) == len(t.columns) for t in tables for row in t.rows)


def test_the_overhead_benchmark_measures_every_path_and_phase(tmp_path: Path) -> None:
    from loadtest import bench_overhead

    out = tmp_path / "overhead.json"
    assert bench_overhead.main(["--scale", "0.02", "--rounds", "1", "--peers", "none",
                                "--json", str(out), "--results-dir", str(tmp_path)]) == 0
    figures = json.loads(out.read_text())
    paths = figures["paths"]
    assert list(paths) == ["direct", "relay", "kvgate", "kvgate+cache"]
    assert all(f["failed"] == 0 for f in paths.values())
    cpu = ("cpu_us_per_request", "cpu_us_per_stream", "cpu_us_per_chunk")
    for name in ("relay", "kvgate", "kvgate+cache"):  # each proxy's own CPU clock read
        # A tiny run may fit a light proxy's phase in one 10 ms tick of its CPU clock (0 then).
        assert all(paths[name][field] >= 0 for field in cpu) and paths[name]["rss_mb_peak"] > 0
        assert paths[name]["delivered_64"] == 1.0  # every content event offered arrived
    assert sum(paths["kvgate"][field] for field in cpu) > 0  # the gateway's own clock moved
    assert paths["direct"]["cpu_us_per_request"] is None  # no proxy, no proxy CPU
    assert set(figures["coalescing"]) == {"0", "20", "50", "100"}
    paths_table, coalescing, targets = _record(tmp_path, "bench_overhead").tables
    assert [row[0] for row in coalescing.rows] == [0, 20, 50, 100]
    assert len(targets.rows) == 8
