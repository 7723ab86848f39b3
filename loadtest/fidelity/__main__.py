"""`python -m loadtest.fidelity`: the fidelity table, published figures against the simulator's.

Prints the table and writes it as the `fidelity` benchmark record (`loadtest/results.py`), which
`python -m loadtest.render_benchmarks` turns into a section of docs/benchmarks.md. Exit 1 when a
row is outside the tolerance.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from loadtest import results
from loadtest.fidelity import TOLERANCE, Compared, compare

COLUMNS = ("row", "engine", "configuration", "metric", "published", "simulated", "ratio",
           "source")


def table_rows(compared: Sequence[Compared]) -> list[list[object]]:
    return [[c.row.id, c.row.engine, c.row.describe(), c.row.metric, c.row.published,
             round(c.simulated, 2), round(c.ratio, 3), c.row.source] for c in compared]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.fidelity",
                                     description=(__doc__ or "").split("\n\n")[0])
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    compared = compare()
    rows = table_rows(compared)
    for row in rows:
        print("  ".join(str(cell) for cell in row[:7]))
    outside = [c for c in compared if not c.within]
    worst = max(abs(c.ratio - 1) for c in compared)
    notes = (f"Each row is a published benchmark configuration, its figure as published, the "
             f"simulator's figure for the same configuration and their ratio (simulated / "
             f"published); the target is every ratio within {1 - TOLERANCE:.2f}-"
             f"{1 + TOLERANCE:.2f}. {len(compared) - len(outside)} of {len(compared)} rows are "
             f"within it; the largest deviation is {worst:.0%}. The rows, with the text each "
             "figure was read from, are in loadtest/fidelity/published.json; "
             "docs/capacity-planning.md explains the model.")
    results.save(args, "fidelity", title="Simulator fidelity: published engine benchmarks",
                 command=results.command("loadtest.fidelity", sys.argv[1:] if argv is None
                                         else argv),
                 tables=[results.Table("Published figures against the simulator's", COLUMNS,
                                       rows)], notes=notes)
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
