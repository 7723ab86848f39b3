"""SIGTERM drains `kvgate serve` before it exits: /ready answers 503 at once, new completions get
503 `shutting_down` with Retry-After during the grace, running streams finish whole, a stream
longer than the shutdown timeout ends with an SSE error event and `[DONE]`, and the process exits
0 within grace + shutdown timeout (+ a slack a loaded host meets)."""

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

from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from tests.paths import free_port
from tests.waiting import until

REPO = Path(__file__).resolve().parents[1]
MODEL = PRESETS[DEFAULT_PRESET].model_name
GRACE_S = 3.0
SHUTDOWN_S = 3.0
SHORT_TOKENS = 120  # under a second at the simulator's real speed
LONG_TOKENS = 3000  # many seconds: past the shutdown timeout


async def _spawn(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")} | (env or {})
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, cwd=REPO, env=environ,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)


async def _answers(http: aiohttp.ClientSession, url: str, status: int = 200) -> bool:
    with contextlib.suppress(aiohttp.ClientConnectionError):
        async with http.get(url) as resp:
            return resp.status == status
    return False


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    sim_port, port = free_port(), free_port()
    sim = await _spawn("sim", "--port", str(sim_port))
    proc: asyncio.subprocess.Process | None = None
    try:
        async with aiohttp.ClientSession() as http:
            await until(lambda: _answers(http, f"http://127.0.0.1:{sim_port}/health"),
                        "the simulator answers", timeout_s=30)
            proc = await _spawn(
                "serve", "--backend", f"http://127.0.0.1:{sim_port}/v1", "--port", str(port),
                env={"KVGATE_SERVER__DRAIN_GRACE_S": str(GRACE_S),
                     "KVGATE_SERVER__SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_S)})
            await until(lambda: _answers(http, f"http://127.0.0.1:{port}/ready"),
                        "the gateway is ready", timeout_s=30)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        for child in (proc, sim):
            if child is not None and child.returncode is None:
                child.kill()
                await child.wait()


def _body(tokens: int) -> bytes:
    return orjson.dumps({"model": MODEL, "stream": True, "max_tokens": tokens, "ignore_eos": True,
                         "messages": [{"role": "user", "content": f"count to {tokens}"}]})


async def _stream(http: aiohttp.ClientSession, base: str, tokens: int,
                  started: asyncio.Event) -> list[dict[str, object] | str]:
    """The stream's events, decoded ("[DONE]" as the string)."""
    events: list[dict[str, object] | str] = []
    async with http.post(base + "/v1/chat/completions", data=_body(tokens),
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            started.set()
            payload = line[6:].strip()
            events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return events


async def test_sigterm_drains_then_ends_what_still_runs(
        gateway: tuple[str, asyncio.subprocess.Process]) -> None:
    base, proc = gateway
    async with aiohttp.ClientSession() as http:
        flags = [asyncio.Event() for _ in range(4)]
        short = [asyncio.create_task(_stream(http, base, SHORT_TOKENS, f)) for f in flags[:3]]
        long = asyncio.create_task(_stream(http, base, LONG_TOKENS, flags[3]))
        await until(lambda: all(f.is_set() for f in flags), "every stream has begun")

        loop = asyncio.get_running_loop()
        signalled = loop.time()
        proc.send_signal(signal.SIGTERM)
        await until(lambda: _answers(http, base + "/ready", 503), "/ready answers 503")
        async with http.post(base + "/v1/chat/completions", data=_body(5),
                             headers={"Content-Type": "application/json"}) as resp:
            refused = orjson.loads(await resp.read())
            assert (resp.status, resp.headers.get("Retry-After")) == (503, "1")
        assert refused["error"]["code"] == "shutting_down"

        for events in await asyncio.gather(*short):
            assert events[-1] == "[DONE]"
            assert not any(isinstance(e, dict) and "error" in e for e in events)
            finals = [e for e in events if isinstance(e, dict) and e.get("choices")
                      and e["choices"][0].get("finish_reason")]  # type: ignore[index]
            assert finals, "a short stream ended before its last token"
        cut = await long
        assert cut[-1] == "[DONE]"
        error = cut[-2]
        assert isinstance(error, dict) and error["error"]["code"] == "shutting_down"  # type: ignore[index]

        code = await asyncio.wait_for(proc.wait(), GRACE_S + SHUTDOWN_S + 10)
        elapsed = loop.time() - signalled
    assert proc.stderr is not None
    stderr = (await proc.stderr.read()).decode()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert elapsed < GRACE_S + SHUTDOWN_S + 5, f"exited {elapsed:.1f} s after SIGTERM"
