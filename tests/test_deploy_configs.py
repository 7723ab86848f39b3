"""The shipped example configs are valid kvgate configs: deploy/ never drifts from the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_example_config_loads_with_every_section() -> None:
    settings = load_settings(DEPLOY / "config.example.yaml", environ={})
    assert [b.id for b in settings.backend_specs()] == ["vllm-a", "vllm-b", "small"]
    assert settings.model_aliases == {"gpt-4o-mini": "llama-3-8b"}


def test_kubernetes_configmap_embeds_a_valid_config(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "kvgate.yaml").read_text()))
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    settings = load_settings(path, environ={})
    assert len(settings.backend_specs()) == 2
    assert (settings.cache.enabled, settings.cache.store) == (True, "redis")
    assert settings.cache.semantic == "off"


@pytest.mark.parametrize("service", ["sim-a", "sim-b", "sim-small", "gateway"])
def test_compose_services_run_kvgate_subcommands_that_exist(service: str) -> None:
    from gateway.cli import build_parser

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    args = build_parser().parse_args(compose["services"][service]["command"])
    assert args.command in {"sim", "serve"}


def test_the_compose_gateway_caches_in_redis_and_routes_auto_to_the_small_model() -> None:
    from gateway.cli import build_parser
    from gateway.serve import overrides_of

    gateway = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["gateway"]
    args = build_parser().parse_args(gateway["command"])
    settings = load_settings(environ=gateway["environment"], overrides=overrides_of(args))
    assert settings.small_model_routes()["auto"].small == "llama-3.2-1b"
    assert settings.cache.redis_url == "redis://redis:6379/0"
    assert settings.cache.semantic == "shadow"  # measured, never served
