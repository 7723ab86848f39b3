"""`kvgate route-eval`: per alias of a config, the confusion matrix on a labelled set, the share
routed small, the hard prompts wrongly sent small and the threshold meeting the target;
`--calibrate` adds the config line that sets it. Bad usage exits 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main

DATA = Path(__file__).parent / "data" / "routing_prompts.jsonl"
ROUTES = """
backends: [{url: "http://127.0.0.1:9"}]
small_model:
  - {alias: auto, large: big, small: tiny, classifier: hashed}
  - {alias: strict, large: big, small: tiny, classifier: hashed, max_hard_share: 0.0}
"""


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str,
        config: str = ROUTES) -> tuple[int, str, str]:
    path = tmp_path / "kvgate.yaml"
    path.write_text(config, encoding="utf-8")
    code = main(["route-eval", "--config", str(path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_it_prints_each_alias_on_the_eval_split(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(tmp_path, capsys, "--data", str(DATA))
    assert code == 0
    eval_count = sum(json.loads(line)["split"] == "eval"
                     for line in DATA.read_text(encoding="utf-8").splitlines())
    assert f"eval split, {eval_count} prompts" in out
    auto, strict = out.split("\n\nalias ")[1:]
    for block in (auto, strict):
        assert "sent small  sent large" in block
        assert "routed small" in block and "hard sent small" in block
        assert "threshold meeting a hard share of" in block
        assert "config line" not in block
    assert "threshold meeting a hard share of 0.05" in auto
    assert "threshold meeting a hard share of 0 on this data" in strict


def test_calibrate_prints_the_threshold_and_its_config_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(tmp_path, capsys, "--data", str(DATA), "--calibrate", "--target", "0.0")
    assert code == 0
    line = next(line for line in out.splitlines() if "config line" in line and "auto" in line)
    threshold = float(line.rsplit("threshold: ", 1)[1])
    # At target 0 the calibrated threshold sends no hard prompt of this data small.
    config = ROUTES.replace("classifier: hashed}", f"classifier: hashed, threshold: {threshold}}}",
                            1)
    code, out, _ = run(tmp_path, capsys, "--data", str(DATA), config=config)
    auto = out.split("\n\nalias ")[1]
    assert code == 0 and "hard sent small 0/" in auto
    assert "hard prompts sent small" not in auto


def test_a_hard_prompt_sent_small_is_listed(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "two.jsonl"
    data.write_text(json.dumps({"text": "hi", "label": "hard", "domain": "chitchat"}) + "\n"
                    + json.dumps({"text": "hello", "label": "easy", "domain": "chitchat"})
                    + "\n", encoding="utf-8")
    code, out, _ = run(tmp_path, capsys, "--data", str(data))
    assert code == 0
    assert "hard prompts sent small (score, text):" in out and "  hi\n" in out + "\n"


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        pytest.param(("--data", "/nonexistent.jsonl"), ROUTES, "nonexistent",
                     id="a missing data file"),
        pytest.param(("--data", str(DATA)), "backends: [{url: 'http://127.0.0.1:9'}]\n",
                     "no small_model", id="a config without aliases"),
        pytest.param(("--data", str(DATA), "--split", "train", "--target", "2"), ROUTES,
                     "--target", id="a target past 1"),
    ],
)
def test_bad_usage_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         args: tuple[str, ...], config: str,
                                         message: str) -> None:
    code, _, err = run(tmp_path, capsys, *args, config=config)
    assert code == 2
    assert message in err and err.count("\n") == 1
