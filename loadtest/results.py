"""Benchmark results as JSON records under `loadtest/results/`, the one source of the figures
in `docs/benchmarks.md` (rendered by `python -m loadtest.render_benchmarks`).

A record is one benchmark run: its title, the exact command that produced it, the machine and
the date it ran on, and one or more tables of figures. Benchmarks call `record(...)` at the end
of a run (with `--no-record` to leave the files alone); the renderer turns every record into a
section of the benchmarks page, so a figure quoted anywhere in the docs has its command beside it.
"""

from __future__ import annotations

import datetime
import os
import platform
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
    """What the figures depend on: processor, cores, Python."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


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
    """One record back from its file (ValueError when it is not one)."""
    raw = orjson.loads(path.read_bytes())
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a kvgate benchmark record (schema {SCHEMA})")
    tables = tuple(Table(t["title"], tuple(t["columns"]), tuple(map(tuple, t["rows"])),
                         t.get("notes", "")) for t in raw["tables"])
    return Record(name=raw["name"], title=raw["title"], command=raw["command"], tables=tables,
                  notes=raw.get("notes", ""), machine=raw.get("machine", {}),
                  date=raw.get("date", ""))
