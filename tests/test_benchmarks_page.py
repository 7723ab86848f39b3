"""docs/benchmarks.md is the render of loadtest/results/*.json: every file there is a valid
benchmark record, the committed page equals a fresh render, `--check` says when it does not, and
a record that is not one is refused with the reason."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadtest import render_benchmarks
from loadtest.results import RESULTS_DIR, Table, add_arguments, command, load, record, save

RESULT_FILES = sorted(p for p in RESULTS_DIR.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.name for p in RESULT_FILES])
def test_every_file_under_loadtest_results_is_a_valid_record(path: Path) -> None:
    assert path.suffix == ".json" and path.parent == RESULTS_DIR, "only records live there"
    rec = load(path)
    assert rec.name == path.stem and rec.command and rec.date and rec.machine


def test_there_are_records_to_render() -> None:
    assert RESULT_FILES


def test_the_committed_page_is_the_render_of_the_committed_records() -> None:
    expected = render_benchmarks.render(render_benchmarks.records())
    assert render_benchmarks.PAGE.read_text(encoding="utf-8") == expected, (
        "docs/benchmarks.md is out of date: run `python -m loadtest.render_benchmarks`")
    assert render_benchmarks.main(["--check"]) == 0


def _write(directory: Path, name: str = "demo", **fields: Any) -> Path:
    return record(name, title=fields.pop("title", "A demo"), command="python -m demo --n 3",
                  tables=fields.pop("tables", [Table("speed", ["variant", "us", "ratio"],
                                                     [["old", 12.5, 1.0], ["new", 2.5, 0.2]],
                                                     "new is faster")]),
                  notes=fields.pop("notes", "Measured side by side."), directory=directory)


def test_a_section_shows_title_command_machine_date_notes_and_tables(tmp_path: Path) -> None:
    rec = load(_write(tmp_path))
    page = render_benchmarks.render([rec])
    section = page.split("## A demo\n", 1)[1]
    assert "```\npython -m demo --n 3\n```" in section
    assert f"{rec.machine['cores']} cores" in section and rec.date in section
    assert f"load average {rec.machine['load_average']}" in section
    assert "Measured side by side." in section
    assert "| variant | us | ratio |\n|---|---|---|\n| old | 12.5 | 1 |\n| new | 2.5 | 0.2 |" \
        in section
    assert "new is faster" in section


def test_sections_follow_the_records_names_whatever_order_they_were_written(
        tmp_path: Path) -> None:
    for name in ("zeta", "alpha", "mid"):
        _write(tmp_path, name, title=f"title {name}")
    page = render_benchmarks.render(render_benchmarks.records(tmp_path))
    assert page.index("## title alpha") < page.index("## title mid") < page.index("## title zeta")
    assert page == render_benchmarks.render(render_benchmarks.records(tmp_path))


@pytest.mark.parametrize(("page_text", "code"), [
    (None, 0),  # rendered first, then checked
    ("stale\n", 1),
], ids=["a-fresh-render-passes", "a-stale-page-fails"])
def test_check_exits_non_zero_when_the_page_differs(tmp_path: Path, page_text: str | None,
                                                    code: int) -> None:
    results, page = tmp_path / "results", tmp_path / "benchmarks.md"
    _write(results)
    args = ["--results-dir", str(results), "--page", str(page)]
    assert render_benchmarks.main(args) == 0
    if page_text is not None:
        page.write_text(page_text, encoding="utf-8")
    before = page.read_text(encoding="utf-8")
    assert render_benchmarks.main([*args, "--check"]) == code
    assert page.read_text(encoding="utf-8") == before  # --check writes nothing


def test_a_file_that_is_not_a_record_stops_the_render(tmp_path: Path) -> None:
    (tmp_path / "adhoc.json").write_bytes(b'{"config": {}, "live": {}}')
    assert render_benchmarks.main(["--results-dir", str(tmp_path),
                                   "--page", str(tmp_path / "page.md")]) == 2
    assert not (tmp_path / "page.md").exists()


def _edit(raw: dict[str, Any], change: str) -> None:
    table = raw["tables"][0]
    match change:
        case "no schema":
            del raw["schema"]
        case "empty command":
            raw["command"] = ""
        case "name not the stem":
            raw["name"] = "other"
        case "no tables":
            raw["tables"] = []
        case "short row":
            table["rows"][0] = table["rows"][0][:-1]
        case "object in a cell":
            table["rows"][0][1] = {"p50": 1}
        case "no columns":
            table["columns"] = []


BROKEN = ("no schema", "empty command", "name not the stem", "no tables", "short row",
          "object in a cell", "no columns")


@pytest.mark.parametrize("change", BROKEN, ids=[c.replace(" ", "-") for c in BROKEN])
def test_a_malformed_record_is_refused_with_its_reason(tmp_path: Path, change: str) -> None:
    path = _write(tmp_path)
    raw = orjson.loads(path.read_bytes())
    _edit(raw, change)
    path.write_bytes(orjson.dumps(raw))
    with pytest.raises(ValueError, match=str(path)):
        load(path)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--n", "3"], ".venv/bin/python -m loadtest.bench_x --n 3"),
    (["--n", "3", "--no-record"], ".venv/bin/python -m loadtest.bench_x --n 3"),
    (["--results-dir", "/tmp/r", "--n", "3"], ".venv/bin/python -m loadtest.bench_x --n 3"),
    (["--results-dir=/tmp/r", "--label", "a b"],
     ".venv/bin/python -m loadtest.bench_x --label 'a b'"),
], ids=["as-given", "without-no-record", "without-results-dir", "quoted-for-a-shell"])
def test_the_recorded_command_is_the_run_less_where_its_record_went(
        argv: list[str], expected: str) -> None:
    assert command("loadtest.bench_x", argv) == expected


@pytest.mark.parametrize(("flags", "written"), [([], True), (["--no-record"], False)],
                         ids=["records-by-default", "no-record-writes-nothing"])
def test_save_writes_the_record_unless_told_not_to(tmp_path: Path, flags: list[str],
                                                   written: bool) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*flags, "--results-dir", str(tmp_path)])
    path = save(args, "x", title="t", command="c", tables=[Table("t", ["a"], [[1]])])
    assert (path is not None) == written == (tmp_path / "x.json").exists()
