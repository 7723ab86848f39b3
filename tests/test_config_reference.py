"""docs/configuration.md is the render of the configuration schema: the committed page equals a
fresh render, `--check` says when it does not, every key of every settings model is on it with
its type, default and constraints, and every field outside the cache section has a
description; and the README names only keys that exist, in configurations that load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway import config_reference
from gateway.config import CacheSettings, Settings, load_settings

SECTIONS = config_reference.sections()
BY_PATH = {s.path: s for s in SECTIONS}


def test_the_committed_page_is_the_render_of_the_schema() -> None:
    expected = config_reference.render(SECTIONS)
    assert config_reference.PAGE.read_text(encoding="utf-8") == expected, (
        "docs/configuration.md is out of date: run `python -m gateway.config_reference`")
    assert config_reference.main(["--check"]) == 0


@pytest.mark.parametrize(("page_text", "code"), [
    (None, 0),  # rendered first, then checked
    ("stale\n", 1),
], ids=["a-fresh-render-passes", "a-stale-page-fails"])
def test_check_exits_non_zero_when_the_page_differs(tmp_path: Path, page_text: str | None,
                                                    code: int) -> None:
    page = tmp_path / "configuration.md"
    assert config_reference.main(["--page", str(page)]) == 0
    if page_text is not None:
        page.write_text(page_text, encoding="utf-8")
    before = page.read_text(encoding="utf-8")
    assert config_reference.main(["--page", str(page), "--check"]) == code
    assert page.read_text(encoding="utf-8") == before  # --check writes nothing


def test_a_missing_page_fails_the_check(tmp_path: Path) -> None:
    assert config_reference.main(["--page", str(tmp_path / "none.md"), "--check"]) == 1


def _models(model: type[BaseModel], path: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Every settings model in the tree, by the path the page gives it."""
    found = [(path, model)]
    for name, field in model.model_fields.items():
        child = config_reference._model_of(field.annotation)
        if child is not None:
            suffix = "[]" if child is not field.annotation else ""
            found += _models(child, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")
    return found


MODELS = _models(Settings)


@pytest.mark.parametrize(("path", "model"), MODELS, ids=[p or "top" for p, _ in MODELS])
def test_every_settings_model_has_a_section_listing_each_of_its_keys(
        path: str, model: type[BaseModel]) -> None:
    section = BY_PATH[path]
    assert [r.key for r in section.rows] == list(model.model_fields)
    assert section.doc, f"{model.__name__} needs a docstring: it is the section's introduction"
    heading = f"## {path or 'Top level'}\n"
    assert heading in config_reference.render(SECTIONS)


DESCRIBED = [(p, m) for p, m in MODELS if m is not CacheSettings]


@pytest.mark.parametrize(("path", "model"), DESCRIBED, ids=[p or "top" for p, _ in DESCRIBED])
def test_every_field_outside_the_cache_section_is_described(
        path: str, model: type[BaseModel]) -> None:
    undescribed = [r.key for r in BY_PATH[path].rows if not r.description]
    assert not undescribed, f"{path or 'top level'}: Field(description=...) missing"


def _row(path: str, key: str) -> config_reference.Row:
    return next(r for r in BY_PATH[path].rows if r.key == key)


@pytest.mark.parametrize(("path", "key", "type_", "default", "constraints"), [
    ("server", "port", "integer", "`8000`", "≥ 0, ≤ 65535"),
    ("backends[]", "url", "string", "required", ""),
    ("backends[]", "max_batch_total_tokens", "integer or null", "`null`", "≥ 1"),
    ("routing", "high_water", "number", "`0.9`", "> 0, ≤ 1"),
    ("routing", "queue", "section [routing.queue](#routingqueue)", "see its section", ""),
    ("cache", "store", '`"memory"` or `"redis"`', '`"memory"`', ""),
    ("auth.keys[]", "sha256", "string or null", "`null`", "matches `^[0-9a-fA-F]{64}$`"),
    ("", "backends", "list of [backends[]](#backends) entries", "`[]`", ""),
    ("", "model_aliases", "mapping of string to string", "`{}`", ""),
    ("small_model[]", "hard_markers", "list of string", None, ""),
], ids=["bounded-int", "required", "optional-int", "bounded-float", "nested-section",
        "literal", "pattern", "list-of-sections", "mapping", "list-of-strings"])
def test_a_row_states_type_default_and_constraints_as_the_schema_does(
        path: str, key: str, type_: str, default: str | None, constraints: str) -> None:
    row = _row(path, key)
    assert (row.type, row.constraints) == (type_, constraints)
    if default is not None:
        assert row.default == default


def test_a_default_holding_backticks_stays_one_code_span() -> None:
    default = _row("small_model[]", "hard_markers").default
    assert default.startswith("```` [\"```\"") and default.endswith("] ````")


@pytest.mark.parametrize(("path", "env"), [
    ("", "KVGATE_<KEY>"),
    ("routing.queue", "KVGATE_ROUTING__QUEUE__<KEY>"),
    ("backends[]", "KVGATE_BACKENDS__<N>__<KEY>"),
    ("auth.keys[]", "KVGATE_AUTH__KEYS__<N>__<KEY>"),
], ids=["top", "nested", "list", "list-in-a-section"])
def test_each_section_names_the_environment_variables_that_set_it(path: str, env: str) -> None:
    assert BY_PATH[path].env == env


def test_a_pipe_in_a_description_does_not_split_the_table_row() -> None:
    page = config_reference.render(SECTIONS)
    line = next(ln for ln in page.splitlines() if ln.startswith("| `sha256` |"))
    assert line.count(" | ") == 4 and "\\| sha256sum" in line


README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
YAML_BLOCKS = re.findall(r"```yaml\n(.*?)```", README, re.S)
SECTION_NAMES = "|".join(Settings.model_fields)
# `routing.poll_interval_s` and `server.stream_usage: false` alike
DOTTED_KEYS = sorted(set(re.findall(rf"`((?:{SECTION_NAMES})\.[a-z_.]+)(?::[^`]*)?`", README)))
ENV_KEYS = sorted(set(re.findall(r"`(KVGATE_[A-Z0-9_]+)=", README)))


def _has_key(model: type[BaseModel], path: list[str]) -> bool:
    if not path:
        return True
    field = model.model_fields.get(path[0])
    if field is None:
        return False
    child = config_reference._model_of(field.annotation)
    return not path[1:] if child is None else _has_key(child, path[1:])


def test_the_readme_shows_configurations_and_names_keys() -> None:
    assert YAML_BLOCKS and DOTTED_KEYS and ENV_KEYS


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[f"block-{i}" for i in range(len(YAML_BLOCKS))])
def test_every_configuration_the_readme_shows_loads(tmp_path: Path, block: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(block, encoding="utf-8")
    load_settings(path, environ={})


@pytest.mark.parametrize("key", DOTTED_KEYS)
def test_every_key_the_readme_names_exists(key: str) -> None:
    assert _has_key(Settings, key.split(".")), f"README.md names {key}, which is no key"


@pytest.mark.parametrize("var", ENV_KEYS)
def test_every_environment_variable_the_readme_shows_names_a_key(var: str) -> None:
    path = [p for p in var.removeprefix("KVGATE_").lower().split("__") if not p.isdigit()]
    assert _has_key(Settings, path), f"README.md shows {var}, which sets no key"
