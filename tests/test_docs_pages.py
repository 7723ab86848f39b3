"""Every page under docs/ says when it was last brought up to date: a hand-written page carries an
"Updated YYYY-MM-DD." line under its title; a generated page names the command that renders it,
and the benchmarks page dates every record it shows."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
# Rendered by a script, never edited by hand: the command that renders each.
GENERATED = {
    "configuration.md": "python -m gateway.config_reference",
    "benchmarks.md": "python -m loadtest.render_benchmarks",
}
DATE_LINE = re.compile(r"^Updated (\d{4}-\d{2}-\d{2})\.$", re.M)
PAGES = sorted(p.name for p in DOCS.glob("*.md"))


@pytest.mark.parametrize("name", [p for p in PAGES if p not in GENERATED])
def test_a_written_page_has_its_date_under_its_title(name: str) -> None:
    lines = (DOCS / name).read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{name}: no title on its first line"
    head = "\n".join(lines[:6])
    match = DATE_LINE.search(head)
    assert match, f"{name}: no 'Updated YYYY-MM-DD.' line under its title"
    date = datetime.date.fromisoformat(match.group(1))
    assert datetime.date(2025, 1, 1) <= date <= datetime.date.today() + datetime.timedelta(1)


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_a_generated_page_names_the_command_that_renders_it(name: str) -> None:
    assert GENERATED[name] in (DOCS / name).read_text(encoding="utf-8")


def test_every_benchmark_record_on_the_page_is_dated() -> None:
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    records = [line for line in text.splitlines() if "record `loadtest/results/" in line]
    assert records
    undated = [r for r in records if not re.search(r"\b\d{4}-\d{2}-\d{2}\b", r)]
    assert not undated, undated
