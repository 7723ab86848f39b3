"""The locust load test, run headless by loadtest/run_locust.py in subprocesses (gevent's
monkey-patching never enters this process): against `kvgate demo` it reports TTFT, TPOT and ITL
as request types of their own, records its summary and exits 0; against a dead gateway it exits
non-zero and records nothing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from loadtest.results import load

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 240.0


def _run_locust(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadtest.run_locust", "--users", "3", "--spawn-rate", "3",
         "--run-time", "4s", "--stop-timeout", "10s", *args],
        cwd=REPO, capture_output=True, text=True, timeout=DEADLINE_S, check=False)


def test_a_bounded_run_against_kvgate_demo_reports_streaming_latencies(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _run_locust("--time-scale", "20", "--backends", "2", "--workload", "multi-turn",
                       "--think-scale", "0", "--out", str(out), "--results-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    final = json.loads((tmp_path / "run_final.json").read_text())
    chat = final["POST chat"]
    assert chat["count"] > 0 and chat["failures"] == 0
    # One TTFT per reply; TPOT per reply of two tokens or more; ITL per gap between tokens.
    assert final["TTFT chat"]["count"] == chat["count"]
    assert 0 < final["TPOT chat"]["count"] <= chat["count"]
    assert final["ITL chat"]["count"] > chat["count"]
    assert (tmp_path / "run_stats.csv").read_text().startswith("Type,Name,")
    summary = (tmp_path / "run_summary.txt").read_text()
    assert summary in done.stdout
    for kind in ("chat", "TTFT", "TPOT", "ITL"):
        assert f"\n{kind} " in summary
    (table,) = load(tmp_path / "run_locust.json").tables
    assert [(row[0], row[1]) for row in table.rows][0] == ("chat", chat["count"])


def test_a_run_whose_requests_fail_exits_non_zero(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = _run_locust("--host", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "dead"),
                       "--results-dir", str(tmp_path))
    assert done.returncode == 1
    assert "FAILED" in done.stderr
    final = json.loads((tmp_path / "dead_final.json").read_text())
    assert final["POST chat"]["failures"] == final["POST chat"]["count"] > 0
    assert not (tmp_path / "run_locust.json").exists()
