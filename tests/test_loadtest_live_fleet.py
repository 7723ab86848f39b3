"""`python -m loadtest.live_fleet`: the gateway live in front of a mixed fleet of simulators,
bounded by its request count, reporting placement, learned speeds and client latencies."""

from __future__ import annotations

import pytest

from loadtest.live_fleet import main


def test_a_short_run_reports_every_backend_and_exits_zero(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    code = main(["--fleet", "llama-3-8b-h100,llama-3-8b-l40s", "--requests", "24",
                 "--concurrency", "4", "--skip", "8", "--max-tokens", "8", "--long-words", "600",
                 "--long-share", "0.25", "--policy", "round_robin"])
    out = capsys.readouterr().out
    assert code == 0
    assert "b0-h100" in out and "b1-l40s" in out
    assert "the last 16 counted" in out
    assert "statuses: {200: 24}" in out
    # Round robin: each backend served 12, and every reply was learned from, though no client
    # asked for usage.
    assert out.count("over 12 replies") == 2


@pytest.mark.parametrize("argv", [
    ["--fleet", "no-such-preset"],
    ["--requests", "0"],
    ["--skip", "300"],
    ["--long-share", "1.5"],
    ["--policy", "fastest"],
])
def test_bad_usage_exits_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
