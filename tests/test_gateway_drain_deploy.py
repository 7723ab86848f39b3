"""The shipped deployments let kvgate drain: Kubernetes and docker compose send SIGKILL only
after the drain grace, the shutdown timeout and a margin have passed."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.config import load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MARGIN_S = 1.0  # the exit itself: the app's cleanup after the streams are ended


def test_kubernetes_waits_for_the_whole_drain(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "kvgate.yaml").read_text()))
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    server = load_settings(path, environ={}).server
    pod = deployment["spec"]["template"]["spec"]
    readiness = pod["containers"][0]["readinessProbe"]["periodSeconds"]
    assert pod["terminationGracePeriodSeconds"] >= (
        server.drain_grace_s + server.shutdown_timeout_s + MARGIN_S)
    assert readiness < server.drain_grace_s, "the 503 of /ready must be seen during the grace"


def test_compose_waits_for_the_whole_drain() -> None:
    gateway = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["gateway"]
    server = load_settings(environ=gateway["environment"]).server
    grace = gateway["stop_grace_period"]
    assert grace.endswith("s")
    assert float(grace[:-1]) >= server.drain_grace_s + server.shutdown_timeout_s + MARGIN_S
