"""`kvgate simulate` as a user runs it: its exit codes, one-line errors, JSON and plot output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main as kvgate
from loadtest.fleetsim.report import PLOT_EXTRA_HINT

SMALL = ["simulate", "--backends", "2", "--policies", "round_robin,cost", "--duration", "3",
         "--rate", "6", "--quiet"]


def test_json_to_stdout_is_a_complete_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvgate([*SMALL, "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["fleet"] == "2xllama-3-8b-h100"
    assert [c["label"] for c in doc["config"]["contenders"]] == ["round_robin", "cost+adm"]
    point = doc["points"][0]
    assert point["rate_rps"] == 6.0
    for label in ("round_robin", "cost+adm"):
        run = point["policies"][label]["runs"][0]
        assert run["completed"] + run["rejected"] == run["requests"] > 0
        assert {"ttft_p99_s", "goodput_rps", "prefix_hit_rate", "load_imbalance"} <= set(run)


def test_the_same_command_writes_the_same_json(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert kvgate([*SMALL, "--seeds", "3,4", "--json", str(a)]) == 0
    assert kvgate([*SMALL, "--seeds", "3,4", "--json", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    spread = json.loads(a.read_text())["points"][0]["policies"]["cost+adm"]["spread"]
    assert spread["ttft_p99_s"]["min"] <= spread["ttft_p99_s"]["mean"] <= spread["ttft_p99_s"][
        "max"]


def test_weights_override_a_policys_defaults_and_are_recorded(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = [*SMALL, "--rate", "40", "--duration", "5", "--json", "-"]
    assert kvgate(base) == 0
    default = json.loads(capsys.readouterr().out)
    assert kvgate([*base, "--weights", "cost:ttft=0,goodput=0,prefill_load=0,preemption=0"]) == 0
    flat = json.loads(capsys.readouterr().out)
    assert default["config"]["weights"] == {}
    assert flat["config"]["weights"] == {"cost": {"ttft": 0.0, "goodput": 0.0,
                                                  "prefill_load": 0.0, "preemption": 0.0}}
    # Only cost's routing changed: round robin's figures are the same, cost's are not.
    runs = [doc["points"][0]["policies"] for doc in (default, flat)]
    assert runs[0]["round_robin"] == runs[1]["round_robin"]
    assert runs[0]["cost+adm"] != runs[1]["cost+adm"]


def test_slo_admission_follows_the_tpot_slo_and_is_recorded(
        capsys: pytest.CaptureFixture[str]) -> None:
    configs = []
    for extra in ([], ["--slo-tpot", "0.04", "--slo-wait", "0.3"], ["--slo-admission", "off"]):
        assert kvgate([*SMALL, *extra, "--json", "-"]) == 0
        configs.append(json.loads(capsys.readouterr().out)["config"])
    assert [(c["tpot_slo_s"], c["slo_wait_s"]) for c in configs] == [
        (0.05, 0.0), (0.04, 0.3), (None, 0.0)]


def test_offload_is_on_by_default_switched_off_by_the_flag_and_recorded(
        capsys: pytest.CaptureFixture[str]) -> None:
    configs = []
    for extra in ([], ["--offload", "off"]):
        assert kvgate([*SMALL, *extra, "--json", "-"]) == 0
        configs.append(json.loads(capsys.readouterr().out)["config"])
    assert [c["offload_long_prompts"] for c in configs] == [True, False]


def test_the_table_names_every_policy_and_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvgate([*SMALL, "--arrival", "bursty", "--replicas", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 gateway replicas" in out and "bursty arrivals" in out
    for word in ("round_robin", "cost+adm", "TTFT p50", "goodput", "preempt", "imbal"):
        assert word in out


def test_a_trace_replays_at_a_scaled_rate(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        json.dumps({"arrival_s": i * 0.5, "prompt_tokens": 400 + i, "output_tokens": 20,
                    "prefix_group": f"g{i % 2}"}) + "\n" for i in range(20)))
    args = ["simulate", "--backends", "1", "--policies", "prefix_hash", "--trace", str(trace),
            "--quiet", "--json", "-"]
    assert kvgate(args) == 0
    natural = json.loads(capsys.readouterr().out)["points"][0]
    assert natural["rate_rps"] == pytest.approx(20 / 9.5, abs=1e-3)  # requests / span
    assert kvgate([*args, "--rate", "8"]) == 0
    scaled = json.loads(capsys.readouterr().out)["points"][0]
    assert scaled["rate_rps"] == 8.0
    assert scaled["policies"]["prefix_hash"]["runs"][0]["requests"] == 20


def test_load_is_a_fraction_of_the_measured_capacity(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    args = ["simulate", "--backends", "1xllama-3-8b-l4", "--policies", "random",
            "--workload", "agents", "--load", "0.5", "--duration", "2", "--quiet", "--json", "-"]
    assert kvgate(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["capacity_rps"] > 0
    assert doc["points"][0]["rate_rps"] == pytest.approx(0.5 * doc["capacity_rps"], abs=1e-3)


def test_plot_writes_a_png_or_names_the_missing_extra(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "p.png"
    code = kvgate([*SMALL, "--plot", str(png)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert code == 2 and PLOT_EXTRA_HINT in capsys.readouterr().err
    else:
        assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_fails_before_simulating(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    png = tmp_path / "p.png"
    assert kvgate([*SMALL, "--duration", "100000", "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plot needs matplotlib" in err and not png.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--policies", "fastest"], "unknown policy 'fastest' in --policies"),
    (["--admission", "cost,nope"], "unknown policy 'nope' in --admission"),
    (["--backends", "3xgpt-5-b200"], "--backends: unknown preset 'gpt-5-b200'"),
    (["--backends", "1xllama-3-8b-h100,1xllama-3-70b-2xh100"], "serves one model"),
    (["--load", "0.5,x"], "--load must be comma-separated numbers"),
    (["--rate", "-1"], "--rate must be numbers > 0"),
    (["--seeds", "a"], "--seeds must be comma-separated integers"),
    (["--duration", "0"], "--duration must be > 0"),
    (["--scrape-interval", "-0.1"], "--scrape-interval must be > 0"),
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace: cannot read"),
    (["--prefix-groups", "0"], "--prefix-groups must be >= 1"),
    (["--weights", "cost:speed=2"], "'cost' has no scorer 'speed'"),
    (["--weights", "cost:ttft=-1"], "cost:ttft needs a weight >= 0"),
    (["--weights", "ttft=2"], "expected POLICY:NAME=W"),
    (["--policies", "kv_util", "--weights", "cost:ttft=1"], "which --policies does not compare"),
    (["--slo-tpot", "0"], "--slo-tpot must be > 0"),
    (["--slo-wait", "-1"], "--slo-wait must be >= 0"),
], ids=["unknown-policy", "unknown-admission", "unknown-preset", "mixed-models", "bad-load",
        "negative-rate", "bad-seed", "zero-duration", "negative-interval", "no-replicas",
        "missing-trace", "no-groups", "unknown-scorer", "negative-weight", "no-policy",
        "weights-of-a-policy-not-compared", "zero-slo", "negative-slo-wait"])
def test_bad_usage_exits_2_with_one_line_naming_the_problem(
        args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kvgate(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvgate simulate: ") and err.count("\n") == 1
    assert message in err


def test_a_malformed_trace_exits_2_naming_its_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n{oops\n')
    assert kvgate(["simulate", "--trace", str(trace)]) == 2
    assert "line 2: not JSON" in capsys.readouterr().err


def test_results_do_not_depend_on_the_process_hash_seed() -> None:
    """Same seed, same JSON, even across processes with different string hashing."""
    args = [sys.executable, "-m", "loadtest.simulate_cli", "--backends", "2", "--policies",
            "kv_util,prefix_hash,cost", "--workload", "shared-prefix", "--duration", "3",
            "--rate", "4", "--quiet", "--json", "-"]
    outputs = [
        subprocess.run(args, cwd=Path(__file__).resolve().parents[1], capture_output=True,
                       text=True, check=True, timeout=120,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    ]
    assert outputs[0] == outputs[1] and json.loads(outputs[0])["points"]
