"""The shipped deployments are what they claim: the Kubernetes base (deploy/k8s, what `kubectl
apply -k deploy/k8s` applies) holds valid objects for a pinned Kubernetes version, its config
loads with kvgate's own loader, its probes, ports and drain agree with that config; the compose
file's services run real subcommands, wait on real health endpoints and drain in time; the
example config is a valid config."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp import web

from gateway.config import ConfigError, Settings, load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S = DEPLOY / "k8s"
# The Kubernetes versions the manifests are checked against (kubernetes-validate bundles their
# schemas): an old one still run on managed clusters' long-term support, and a current one.
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
# What the base must hold: one object of each kind (Deployment and Service twice: Redis too).
PIECES = {("ConfigMap", "kvgate-config"), ("Secret", "kvgate-api-keys"), ("Deployment", "kvgate"),
          ("Service", "kvgate"), ("PodDisruptionBudget", "kvgate"),
          ("HorizontalPodAutoscaler", "kvgate"), ("Deployment", "kvgate-redis"),
          ("Service", "kvgate-redis")}
MARGIN_S = 1.0  # the exit itself: the app's cleanup after the streams are ended


def render_base() -> list[dict[str, Any]]:
    """The objects `kubectl apply -k deploy/k8s` applies: every document of every file in the
    kustomization's `resources`, in order. The kustomization uses nothing else that would change
    them (checked below), so this is the whole rendering."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None)
    return docs


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def gateway_settings(docs: list[dict[str, Any]], tmp_path: Path,
                     environ: Mapping[str, str] | None = None) -> Settings:
    """The config the gateway pod starts with: the ConfigMap's file and the Secret's variables."""
    path = tmp_path / "config.yaml"
    path.write_text(one(docs, "ConfigMap", "kvgate-config")["data"]["config.yaml"])
    secret = one(docs, "Secret", "kvgate-api-keys")["stringData"]
    return load_settings(path, environ={**secret, **(environ or {})})


def gateway_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(docs, "Deployment", "kvgate")["spec"]["template"]["spec"]
    return pod


def service_link_variables(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The variables Kubernetes puts in a pod for every Service of its namespace, unless the pod
    sets enableServiceLinks: false (Docker links' names: NAME_SERVICE_HOST, NAME_PORT, ...)."""
    out: dict[str, str] = {}
    for service in (d for d in docs if d["kind"] == "Service"):
        name = service["metadata"]["name"].upper().replace("-", "_")
        port = service["spec"]["ports"][0]["port"]
        out[f"{name}_SERVICE_HOST"] = "10.96.0.10"
        out[f"{name}_SERVICE_PORT"] = str(port)
        out[f"{name}_PORT"] = f"tcp://10.96.0.10:{port}"
        out[f"{name}_PORT_{port}_TCP_ADDR"] = "10.96.0.10"
    return out


def test_the_kustomization_lists_every_piece_and_nothing_that_would_rewrite_them() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "images"}
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert {(d["kind"], d["metadata"]["name"]) for d in render_base()} == PIECES
    assert [i["name"] for i in kustomization["images"]] == ["kvgate"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("index", range(len(PIECES)))
def test_every_object_of_the_base_is_valid_for_the_pinned_kubernetes(index: int,
                                                                     version: str) -> None:
    doc = render_base()[index]
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    """The check above can fail: a field Kubernetes does not know is an error in strict mode."""
    deployment = one(render_base(), "Deployment", "kvgate")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 75
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_configmap_holds_a_production_config(tmp_path: Path) -> None:
    settings = gateway_settings(render_base(), tmp_path)
    assert [b.id for b in settings.backend_specs()] == ["vllm-0", "vllm-1"]
    assert settings.routing.policy == "cost" and settings.routing.admission
    assert settings.slo.admission
    assert (settings.cache.enabled, settings.cache.store) == (True, "redis")
    assert settings.cache.semantic == "off"
    assert settings.server.host == "0.0.0.0"


def test_the_cache_points_at_the_redis_the_base_starts(tmp_path: Path) -> None:
    docs = render_base()
    url = gateway_settings(docs, tmp_path).cache.redis_url
    assert url is not None
    service = one(docs, "Service", "kvgate-redis")
    assert url.startswith(f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/")
    redis = one(docs, "Deployment", "kvgate-redis")
    assert (redis["spec"]["template"]["metadata"]["labels"].items()
            >= service["spec"]["selector"].items())


def test_the_secret_takes_hashed_api_keys(tmp_path: Path) -> None:
    docs = render_base()
    pod = gateway_pod(docs)
    assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "kvgate-api-keys"}}]
    assert gateway_settings(docs, tmp_path).auth.keys == ()  # shipped without a key
    keys = ('[{"name": "ops", "sha256": "' + "ab" * 32 + '", "admin": true}]')
    settings = gateway_settings(docs, tmp_path, {"KVGATE_AUTH__KEYS": keys})
    assert [(k.name, k.admin) for k in settings.auth.keys] == [("ops", True)]


def test_the_pod_environment_loads_as_kubernetes_builds_it(tmp_path: Path) -> None:
    """Every KVGATE_* variable is a config key, and a Service named kvgate would give the pod
    KVGATE_SERVICE_HOST and the like: the pod must not get them."""
    docs = render_base()
    pod = gateway_pod(docs)
    links = service_link_variables(docs) if pod.get("enableServiceLinks", True) else {}
    gateway_settings(docs, tmp_path, links)
    with pytest.raises(ConfigError, match="KVGATE_"):
        gateway_settings(docs, tmp_path, service_link_variables(docs))


def test_probes_ports_and_the_service_match_the_config(tmp_path: Path) -> None:
    docs = render_base()
    settings = gateway_settings(docs, tmp_path)
    container = gateway_pod(docs)["containers"][0]
    assert container["args"] == ["serve", "--config", "/etc/kvgate/config.yaml"]
    mount = container["volumeMounts"][0]
    assert mount["mountPath"] == "/etc/kvgate"
    [port] = container["ports"]
    assert port["containerPort"] == settings.server.port
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": port["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": port["name"]}
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert {"/ready", "/health"} <= served_paths(container["args"][:1] + ["--port", "8000"])
    service = one(docs, "Service", "kvgate")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    labels = one(docs, "Deployment", "kvgate")["spec"]["template"]["metadata"]["labels"]
    assert labels.items() >= service["spec"]["selector"].items()
    annotations = one(docs, "Deployment", "kvgate")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(settings.server.port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_pdb_and_the_hpa_govern_the_gateway() -> None:
    docs = render_base()
    deployment = one(docs, "Deployment", "kvgate")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert one(docs, "PodDisruptionBudget", "kvgate")["spec"]["selector"]["matchLabels"].items() \
        <= labels.items()
    hpa = one(docs, "HorizontalPodAutoscaler", "kvgate")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "kvgate"}
    assert hpa["minReplicas"] >= 2  # the PDB's one eviction at a time leaves one serving
    assert "replicas" not in deployment["spec"], "the HPA owns the count"
    # CPU utilisation is measured against the request
    assert "cpu" in deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]


def prestop_sleep_s(container: Mapping[str, Any]) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2
    return float(command[1])


def test_kubernetes_waits_for_the_whole_drain(tmp_path: Path) -> None:
    """terminationGracePeriodSeconds counts from the start of preStop: the sleep, then kvgate's
    own drain (the grace, then the shutdown timeout), then its exit."""
    docs = render_base()
    server = gateway_settings(docs, tmp_path).server
    pod = gateway_pod(docs)
    container = pod["containers"][0]
    drain = prestop_sleep_s(container) + server.drain_grace_s + server.shutdown_timeout_s
    assert pod["terminationGracePeriodSeconds"] >= drain + MARGIN_S
    readiness = container["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= server.drain_grace_s, \
        "the 503 of /ready must be seen during the grace"


def test_example_config_loads_with_every_section() -> None:
    settings = load_settings(DEPLOY / "config.example.yaml", environ={})
    assert [b.id for b in settings.backend_specs()] == ["vllm-a", "vllm-b", "small"]
    assert settings.model_aliases == {"gpt-4o-mini": "llama-3-8b"}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


@pytest.mark.parametrize("service", ["sim-a", "sim-b", "sim-small", "gateway"])
def test_compose_services_run_kvgate_subcommands_that_exist(service: str) -> None:
    from gateway.cli import build_parser

    args = build_parser().parse_args(compose()["services"][service]["command"])
    assert args.command in {"sim", "serve"}


def test_the_compose_gateway_caches_in_redis_and_routes_auto_to_the_small_model() -> None:
    from gateway.cli import build_parser
    from gateway.serve import overrides_of

    gateway = compose()["services"]["gateway"]
    args = build_parser().parse_args(gateway["command"])
    settings = load_settings(environ=gateway["environment"], overrides=overrides_of(args))
    assert settings.small_model_routes()["auto"].small == "llama-3.2-1b"
    assert settings.cache.redis_url == "redis://redis:6379/0"
    assert settings.cache.semantic == "shadow"  # measured, never served
    backends = {b.url for b in settings.backend_specs()}
    assert backends == {f"http://{name}:8000" for name in ("sim-a", "sim-b", "sim-small")}
    assert set(gateway["depends_on"]) == {"sim-a", "sim-b", "sim-small", "redis"}
    assert all(d["condition"] == "service_healthy" for d in gateway["depends_on"].values())


def served_paths(argv: list[str]) -> set[str]:
    """The GET paths the process `kvgate ARGV` serves, from the app it would run (not started)."""
    from gateway.cli import build_parser
    from gateway.handlers import add_routes
    from loadtest.sim.server import SimSettings, create_app

    args = build_parser().parse_args(argv)
    if args.command == "sim":
        app = create_app(SimSettings(preset=args.preset, metrics_format=args.metrics_format,
                                     seed=args.seed))
    else:
        app = web.Application()
        add_routes(app)
    return {r.resource.canonical for r in app.router.routes()
            if r.method == "GET" and r.resource is not None}


@pytest.mark.parametrize("service", ["sim-a", "sim-b", "sim-small", "gateway"])
def test_compose_healthchecks_ask_an_endpoint_the_service_serves(service: str) -> None:
    from gateway.cli import build_parser

    spec = compose()["services"][service]
    test = spec["healthcheck"]["test"]
    assert test[0] == "CMD"
    [url] = re.findall(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", shlex.join(test[1:]))
    port, path = int(url[0]), url[1]
    args = build_parser().parse_args(spec["command"])
    assert port == args.port
    assert path in served_paths(spec["command"])


def test_compose_redis_is_checked_with_its_own_client() -> None:
    redis = compose()["services"]["redis"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
