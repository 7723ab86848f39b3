"""The shipped compose file lets kvgate drain: docker compose sends SIGKILL only after the drain
grace, the shutdown timeout and a margin have passed (the Kubernetes base's own arithmetic, its
preStop included, is checked in tests/test_deploy_configs.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.config import load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MARGIN_S = 1.0  # the exit itself: the app's cleanup after the streams are ended


def test_compose_waits_for_the_whole_drain() -> None:
    gateway = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["gateway"]
    server = load_settings(environ=gateway["environment"]).server
    grace = gateway["stop_grace_period"]
    assert grace.endswith("s")
    assert float(grace[:-1]) >= server.drain_grace_s + server.shutdown_timeout_s + MARGIN_S
