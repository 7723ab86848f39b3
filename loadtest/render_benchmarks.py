"""Renders `docs/benchmarks.md` from the benchmark records in `loadtest/results/*.json`.

    .venv/bin/python -m loadtest.render_benchmarks [--check]

The page is a function of the records alone: a fixed introduction, then one section per record
in the order of their names, each with its title, the command that produced it, the machine and
date it ran on, its notes and its tables. Rendering the same records twice gives the same bytes,
so `--check` (exit 1 when the committed page differs from a fresh render) can hold the page to
the records in CI. A file under `loadtest/results/` that is not a valid record is an error (exit
2), never skipped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.results import RESULTS_DIR, Record, Table, load

PAGE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
INTRO = """\
# Benchmarks

Every figure on this page was produced by the command printed above its table and comes from a
record under `loadtest/results/`, written by the benchmark at the end of its run
(`loadtest/results.py`). This page is rendered from those records and never edited by hand:

    .venv/bin/python -m loadtest.render_benchmarks          # rewrite this page
    .venv/bin/python -m loadtest.render_benchmarks --check  # exit 1 when it is out of date

To refresh a figure, run its command again (it replaces its record; `--no-record` leaves the
records alone), then render the page. What each benchmark measures and how to run it is in
`loadtest/README.md`.

Absolute timings depend on the machine and on what else ran on it: each section names the
machine and the date. Where a benchmark compares variants, it runs them side by side in one run
and reports their ratio, which moves far less between machines than the timings do. The
virtual-time simulations (`kvgate simulate`, `bench_fleet`) do not depend on the machine at all:
the same command gives the same figures.

The public production traces `kvgate simulate --trace` replays are not in the repository; each
is read in the format it is published in: the Azure LLM inference traces
(`AzureLLMInferenceTrace_conv.csv`, `_code.csv` and the 2024 `_1week` files) from
[Azure/AzurePublicDataset](https://github.com/Azure/AzurePublicDataset), Mooncake's
(`FAST25-release/traces/conversation_trace.jsonl`, `toolagent_trace.jsonl`, `mooncake_trace.jsonl`)
from [kvcache-ai/Mooncake](https://github.com/kvcache-ai/Mooncake), and BurstGPT's CSVs from
[HPMLL/BurstGPT](https://github.com/HPMLL/BurstGPT). One replays at 85% of the fleet's measured
capacity over five seeds with, for example:

    kvgate simulate --trace conversation_trace.jsonl --load 0.85 --seeds 0,1,2,3,4

(`loadtest/README.md` has the command for each trace, and what the replay keeps of it.)
"""


def records(directory: Path = RESULTS_DIR) -> list[Record]:
    """Every record in `directory`, in the order of their names (ValueError on a bad file)."""
    return [load(path) for path in sorted(directory.glob("*.json"))]


def render(found: Sequence[Record]) -> str:
    """The whole page for these records."""
    parts = [INTRO]
    if found:
        parts.append("## Contents\n\n" + "".join(
            f"- [{r.title}](#{_anchor(r.name)})\n" for r in found))
    else:
        parts.append("No benchmark has recorded a result yet.\n")
    parts.extend(_section(r) for r in found)
    return "\n".join(parts)


def _section(rec: Record) -> str:
    lines = [f'<a id="{_anchor(rec.name)}"></a>', "", f"## {rec.title}", "", "```",
             rec.command, "```", "", f"{_machine(rec.machine)}; {rec.date}; record "
             f"`loadtest/results/{rec.name}.json`.", ""]
    if rec.notes:
        lines += [rec.notes.strip(), ""]
    for table in rec.tables:
        lines += _table(table)
    return "\n".join(lines)


def _table(table: Table) -> list[str]:
    lines = [f"### {table.title}", "", _row(table.columns),
             "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += [_row([_cell(c) for c in row]) for row in table.rows]
    lines.append("")
    if table.notes:
        lines += [table.notes.strip(), ""]
    return lines


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _machine(machine: dict[str, Any]) -> str:
    cores = machine.get("cores")
    parts = [str(machine.get("cpu") or "unknown CPU"),
             f"{cores} cores" if cores else "cores unknown",
             f"Python {machine.get('python', '?')}", str(machine.get("system") or "")]
    if machine.get("load_average") is not None:
        parts.append(f"load average {machine['load_average']} at the end of the run")
    return ", ".join(p for p in parts if p)


def _anchor(name: str) -> str:
    return name.lower().replace("_", "-")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.render_benchmarks",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the page differs from a fresh render; write nothing")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, metavar="DIR")
    parser.add_argument("--page", type=Path, default=PAGE, metavar="FILE")
    args = parser.parse_args(argv)
    try:
        text = render(records(args.results_dir))
    except ValueError as exc:
        print(f"render_benchmarks: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.page.read_text(encoding="utf-8") if args.page.exists() else None
        if current != text:
            print(f"render_benchmarks: {args.page} is out of date; run "
                  "`python -m loadtest.render_benchmarks`", file=sys.stderr)
            return 1
        return 0
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(text, encoding="utf-8")
    print(f"wrote {args.page} from {args.results_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
