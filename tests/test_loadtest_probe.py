"""`python -m loadtest.probe`: where one policy's requests went and how well they were
predicted, on a small simulated fleet."""

from __future__ import annotations

import pytest

from loadtest.probe import main

SMALL = ["--backends", "2xllama-3-8b-h100,1xllama-3-8b-l40s", "--workload", "chat",
         "--rate", "12", "--duration", "5", "--quiet"]


def test_the_probe_prints_shares_by_preset_and_prediction_accuracy_by_backend(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--policy", "cost"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cost+adm on 2xllama-3-8b-h100,1xllama-3-8b-l40s, seed 0")
    shares = [line.split()[1] for line in out.splitlines()
              if line.startswith(("llama-3-8b-h100", "llama-3-8b-l40s"))]
    assert len(shares) >= 1 and all(s.endswith("%") for s in shares)
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("b0", "b1", "b2", "all")}
    assert "all" in rows and int(rows["all"][1]) == sum(
        int(r[1]) for name, r in rows.items() if name != "all")


def test_a_baseline_is_probed_too_and_bad_usage_exits_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--policy", "round_robin"]) == 0
    assert capsys.readouterr().out.startswith("round_robin on ")
    assert main([*SMALL, "--policy", "fastest"]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err
