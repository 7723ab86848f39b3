"""Benchmark results as JSON records under `loadtest/results/`, the one source of the figures
in `docs/benchmarks.md` (rendered by `python -m loadtest.render_benchmarks`).

A record is one benchmark run: its title, the exact command that produced it, the machine and
the date it ran on, and one or more tables of figures. Benchmarks call `record(...)` at the end
of a run (with `--no-record` to leave the files alone); the renderer turns every record into a
section of the benchmarks page, so a figure quoted anywhere in the docs has its command beside it.

A benchmark's command line gets `--no-record` and `--results-dir` from `add_arguments`, and
`save` writes its record unless told not to; `command` spells the command the record names.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCHEMA = 1


@dataclass(frozen=True, slots=True)
class Table:
    """One table of figures: a title, its column names and its rows (numbers or strings)."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    notes: str = ""  # one paragraph under the table: what to read from it


@dataclass(frozen=True, slots=True)
class Record:
    name: str  # the file's stem: results/<name>.json
    title: str
    command: str  # what to run to reproduce it, from the project's root
    tables: Sequence[Table]
    notes: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    schema: int = SCHEMA


def machine() -> dict[str, Any]:
    """What the figures depend on: processor, cores, Python, and how busy the machine was (the
    one-minute load average when the record is written: other work on a shared machine slows
    every timing down)."""
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:  # not every system keeps one
        load = None
    return {
        "cpu": _cpu_model() or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average": load,
    }


def _cpu_model() -> str:
    """The processor's model name on Linux ("" elsewhere or when it is not given)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return ""


def record(name: str, *, title: str, command: str, tables: Sequence[Table], notes: str = "",
           directory: Path = RESULTS_DIR) -> Path:
    """Writes `directory/<name>.json` (replacing an earlier run) and returns its path."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"a result's name is a plain file stem, got {name!r}")
    rec = Record(
        name=name, title=title, command=command, tables=tuple(tables), notes=notes,
        machine=machine(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_bytes(orjson.dumps(asdict(rec), option=orjson.OPT_INDENT_2) + b"\n")
    return path


def load(path: Path) -> Record:
    """One record back from its file (ValueError naming the first problem when it is not one:
    a missing or mistyped field, a name that is not the file's stem, a row whose length is not
    the columns', a cell that is neither text, a finite number nor empty)."""
    try:
        raw = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a kvgate benchmark record (schema {SCHEMA})")
    for key in ("name", "title", "command", "date"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ValueError(f"{path}: {key!r} must be a non-empty string")
    if raw["name"] != path.stem:
        raise ValueError(f"{path}: its name {raw['name']!r} is not its file's stem")
    if not isinstance(raw.get("notes", ""), str) or not isinstance(raw.get("machine", {}), dict):
        raise ValueError(f"{path}: 'notes' must be a string and 'machine' an object")
    if not isinstance(raw.get("tables"), list) or not raw["tables"]:
        raise ValueError(f"{path}: 'tables' must be a non-empty list")
    tables = tuple(_table(path, i, t) for i, t in enumerate(raw["tables"]))
    return Record(name=raw["name"], title=raw["title"], command=raw["command"], tables=tables,
                  notes=raw.get("notes", ""), machine=raw.get("machine", {}),
                  date=raw["date"])


def _table(path: Path, index: int, raw: Any) -> Table:
    where = f"{path}: table {index}"
    if not isinstance(raw, dict) or not isinstance(raw.get("title"), str):
        raise ValueError(f"{where}: must be an object with a 'title' string")
    columns, rows = raw.get("columns"), raw.get("rows")
    if (not isinstance(columns, list) or not columns
            or not all(isinstance(c, str) for c in columns)):
        raise ValueError(f"{where}: 'columns' must be a non-empty list of strings")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: 'rows' must be a non-empty list")
    for n, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise ValueError(f"{where}, row {n}: must be a list of {len(columns)} cells")
        for cell in row:
            if not _cell_ok(cell):
                raise ValueError(f"{where}, row {n}: {cell!r} is not text, a number or null")
    if not isinstance(raw.get("notes", ""), str):
        raise ValueError(f"{where}: 'notes' must be a string")
    return Table(raw["title"], tuple(columns), tuple(map(tuple, rows)), raw.get("notes", ""))


def _cell_ok(cell: Any) -> bool:
    if cell is None or isinstance(cell, str | bool | int):
        return True
    return isinstance(cell, float) and math.isfinite(cell)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--no-record` and `--results-dir DIR` on a benchmark's command line."""
    parser.add_argument("--no-record", action="store_true",
                        help="do not write the result record (loadtest/results/<name>.json)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, metavar="DIR",
                        help="where the result record goes (default loadtest/results)")


def command(module: str, argv: Sequence[str]) -> str:
    """The command that reproduces a run, from the project's root: `module` run with `argv`,
    less the options that only say where the record goes."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--results-dir":
            skip = True  # and its value, next
        elif arg != "--no-record" and not arg.startswith("--results-dir="):
            kept.append(arg)
    return shlex.join([".venv/bin/python", "-m", module, *kept])


def save(args: argparse.Namespace, name: str, *, title: str, command: str,
         tables: Sequence[Table], notes: str = "") -> Path | None:
    """`record(...)` into `args.results_dir`, unless `args.no_record`; prints where it went."""
    if args.no_record:
        return None
    path = record(name, title=title, command=command, tables=tables, notes=notes,
                  directory=args.results_dir)
    print(f"result recorded in {path}")
    return path
