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


def _kind_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("kind "))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def _pct(cell: str) -> float:
    return float(cell.rstrip("%"))


def test_the_probe_splits_slo_misses_by_request_kind_and_preset(
        capsys: pytest.CaptureFixture[str]) -> None:
    mixed = [*SMALL[:3], "mixed", *SMALL[4:], "--policy", "cost"]
    assert main([*mixed, "--slo-ttft", "1000", "--slo-tpot", "1000"]) == 0
    out = capsys.readouterr().out
    rows = _kind_rows(out)
    assert len({r[0] for r in rows}) >= 3
    assert {r[1] for r in rows} <= {"llama-3-8b-h100", "llama-3-8b-l40s"}
    completed = int(next(line.split()[1] for line in out.splitlines()
                         if line.startswith("all ")))
    assert sum(int(r[2]) for r in rows) == completed
    assert all(r[3:] == ["100.0%", "0.0%", "0.0%"] for r in rows)

    # No TTFT can miss, and no TPOT can meet: a request meets both SLOs exactly when it has no
    # TPOT (a one-token reply), so in each row the met and TPOT-missed shares add up to all.
    assert main([*mixed, "--slo-ttft", "1000", "--slo-tpot", "0.000001"]) == 0
    rows = _kind_rows(capsys.readouterr().out)
    assert all(r[4] == "0.0%" and abs(_pct(r[3]) + _pct(r[5]) - 100.0) < 0.15 for r in rows)
    assert sum(_pct(r[5]) * int(r[2]) for r in rows) > 90.0 * sum(int(r[2]) for r in rows)
