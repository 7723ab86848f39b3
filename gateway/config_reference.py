"""Renders `docs/configuration.md`, the configuration reference, from the pydantic schema.

    .venv/bin/python -m gateway.config_reference [--check] [--page PATH]

The page is a function of `gateway.config.Settings` alone: a fixed introduction (the file, the
`KVGATE_*` environment rule, the precedence), then one section per settings model, depth first
in the schema's field order, each with the model's docstring and a table of its fields: key,
type, default, constraints and the field's own `description`. Rendering twice gives the same
bytes, so `--check` (exit 1 when the page differs from a fresh render, writing nothing) holds
the committed page to the code in the test suite.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from gateway.config import ENV_PREFIX, Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
INTRO = f"""\
# Configuration reference

`kvgate serve --config FILE` reads one YAML file and validates all of it at start-up: an unknown
key or a bad value stops the gateway with exit code 2 and one line naming the field, never at the
first request. Every section and every key is optional; what is left out keeps the default shown
here. `deploy/config.example.yaml` is a commented example of every section.

Sources, later ones winning: the defaults below, the YAML file, `{ENV_PREFIX}*` environment
variables, then the command line's flags (`kvgate serve --backend URL`, `--redis URL`, `--host`,
`--port`).

**Environment variables.** Every variable whose name starts with `{ENV_PREFIX}` sets one key. The
rest of the name is the key's path, sections separated by a double underscore, in any case:
`{ENV_PREFIX}SERVER__PORT=8080` sets `server.port`, `{ENV_PREFIX}SLO__TPOT_S=0.08` sets
`slo.tpot_s`, `{ENV_PREFIX}BACKENDS__0__WEIGHT=2` sets the first backend's `weight` (an index one
past the end of a list appends an entry). A value starting with `[` or `{{` is read as a YAML/JSON
list or mapping (`{ENV_PREFIX}MODEL_ALIASES='{{"gpt-4o": "llama-3-8b"}}'`,
`{ENV_PREFIX}AUTH__KEYS='[{{"name": "ci", "key": "..."}}]'`); any other value is converted to the
key's type. An unknown variable name is an error, like an unknown key.

Durations are in seconds (keys ending in `_s`); `null` is YAML's null.

This page is generated from the schema (`gateway/config.py` and the `gateway/*_settings.py`
modules it assembles); do not edit it by hand:

    .venv/bin/python -m gateway.config_reference          # rewrite this page
    .venv/bin/python -m gateway.config_reference --check  # exit 1 when it is out of date
"""


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    type: str
    default: str
    constraints: str
    description: str


@dataclass(frozen=True, slots=True)
class Section:
    """One settings model at one place in the tree: `routing.queue`, `backends[]`."""

    path: str  # "" for the top level
    env: str  # the environment variables that set its keys
    doc: str
    rows: tuple[Row, ...]


def sections(model: type[BaseModel] = Settings) -> list[Section]:
    """Every settings model under `model`, depth first in field order, `model` first."""
    found: list[Section] = []
    _walk(model, "", ENV_PREFIX, found)
    return found


def render(found: Sequence[Section]) -> str:
    """The whole page for these sections."""
    contents = "".join(
        f"- [{_title(s.path)}](#{_anchor(_title(s.path))})\n" for s in found)
    return "\n".join([INTRO, "## Contents\n\n" + contents, *(_section(s) for s in found)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.config_reference",
        description="Renders the configuration reference from the pydantic schema.")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"default: {PAGE}")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the page differs from a fresh render; write nothing")
    args = parser.parse_args(argv)
    text = render(sections())
    page: Path = args.page
    if args.check:
        current = page.read_text(encoding="utf-8") if page.is_file() else None
        if current != text:
            print(f"{page} is out of date: run `python -m gateway.config_reference`",
                  file=sys.stderr)
            return 1
        return 0
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text, encoding="utf-8")
    return 0


def _walk(model: type[BaseModel], path: str, env: str, found: list[Section]) -> None:
    rows: list[Row] = []
    children: list[tuple[type[BaseModel], str, str]] = []
    for name, field in model.model_fields.items():
        child_path = f"{path}.{name}" if path else name
        child_env = f"{env}{name.upper()}__"
        child = _model_of(field.annotation)
        if child is not None:
            is_list = get_origin(field.annotation) is tuple
            child_path += "[]" if is_list else ""
            child_env += "<N>__" if is_list else ""
            children.append((child, child_path, child_env))
        rows.append(Row(name, _type(field.annotation, child_path), _default(field),
                        _constraints(field), field.description or ""))
    own_doc = model.__dict__.get("__doc__")
    doc = inspect.cleandoc(own_doc) if isinstance(own_doc, str) else ""
    found.append(Section(path, f"{env}<KEY>", doc, tuple(rows)))
    for child, child_path, child_env in children:
        _walk(child, child_path, child_env, found)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds, alone or as a list of them."""
    if get_origin(annotation) is tuple:
        args = get_args(annotation)
        annotation = args[0] if len(args) == 2 and args[1] is Ellipsis else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string",
            SecretStr: "string (secret)"}


def _type(annotation: Any, path: str) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"section [{path}](#{_anchor(path)})"
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(_code(json.dumps(arg)) for arg in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_type(arg, path) for arg in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if isinstance(args[0], type) and issubclass(args[0], BaseModel):
            return f"list of [{path}](#{_anchor(path)}) entries"
        return f"list of {_type(args[0], path)}"
    if origin is dict:
        return f"mapping of {_type(args[0], path)} to {_type(args[1], path)}"
    return _code(str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "see its section"
    return _code(json.dumps(_plain(value)))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


_BOUNDS = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"),
           ("min_length", "length ≥"), ("max_length", "length ≤"))


def _constraints(field: FieldInfo) -> str:
    parts: list[str] = []
    for meta in field.metadata:
        for attr, symbol in _BOUNDS:
            bound = getattr(meta, attr, None)
            if bound is not None:
                parts.append(f"{symbol} {bound}")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            parts.append(f"matches {_code(str(pattern))}")
    return ", ".join(parts)


def _section(section: Section) -> str:
    title = _title(section.path)
    lines = [f"## {title}", ""]
    if section.doc:
        lines += [section.doc, ""]
    lines += [f"Environment: `{section.env}`.", "",
              "| key | type | default | constraints | description |",
              "|---|---|---|---|---|"]
    lines += [f"| `{r.key}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.constraints)} "
              f"| {_cell(r.description)} |" for r in section.rows]
    return "\n".join(lines) + "\n"


def _title(path: str) -> str:
    return path or "Top level"


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _code(text: str) -> str:
    """`text` as a code span, fenced by more backticks than it holds."""
    runs = [len(run) for run in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if runs else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    raise SystemExit(main())
