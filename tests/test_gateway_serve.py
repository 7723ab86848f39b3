"""`kvgate serve` as an operator runs it: the quick form discovers models from --backend URLs, the
config form reads a YAML file with KVGATE_* overrides, and SIGTERM stops it with exit code 0."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from tests.paths import free_port

REPO = Path(__file__).resolve().parents[1]
MODEL = PRESETS[DEFAULT_PRESET].model_name
START_DEADLINE_S = 30.0
EXIT_DEADLINE_S = 15.0



@pytest.fixture
async def sim() -> AsyncIterator[str]:
    async with running_sim(time_scale=50.0) as url:
        yield url


async def serve_and_query(args: list[str], port: int, env: dict[str, str]) -> list[str]:
    """Starts `kvgate serve ARGS`, waits for /ready, returns /v1/models ids, then SIGTERMs it and
    checks the exit code."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")} | env
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", *args, cwd=REPO, env=environ,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            loop = asyncio.get_running_loop()
            end = loop.time() + START_DEADLINE_S
            while True:
                assert proc.returncode is None, "kvgate serve exited early"
                with contextlib.suppress(aiohttp.ClientConnectionError):  # not listening yet
                    async with http.get(base + "/ready") as resp:
                        if resp.status == 200:
                            break
                assert loop.time() < end, "kvgate serve never became ready"
                await asyncio.sleep(0.05)
            async with http.get(base + "/v1/models") as resp:
                ids = [m["id"] for m in orjson.loads(await resp.read())["data"]]
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), EXIT_DEADLINE_S)
        stderr = (await proc.stderr.read()).decode()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    return ids


async def test_quick_form_discovers_models_from_each_backend(sim: str) -> None:
    port = free_port()
    ids = await serve_and_query(["--backend", sim + "/v1", "--port", str(port)], port, {})
    assert ids == [MODEL]


async def test_config_form_with_environment_override(sim: str, tmp_path: Path) -> None:
    config = tmp_path / "kvgate.yaml"
    config.write_text(
        f"server: {{port: 1}}\nbackends:\n  - url: {sim}\nmodel_aliases: {{fast: {MODEL}}}\n"
    )
    port = free_port()
    ids = await serve_and_query(["--config", str(config)], port,
                                {"KVGATE_SERVER__PORT": str(port)})
    assert ids == sorted(["fast", MODEL])
