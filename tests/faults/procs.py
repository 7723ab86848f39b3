"""Processes the fault rows start, break and inspect: `kvgate sim`, the misbehaving upstream,
`kvgate serve` and `redis-server`, each a subprocess on a free loopback port.

`Proc` sends the faults (SIGKILL, SIGSTOP, SIGCONT, SIGTERM) and reads what a row checks
afterwards: the process's open file descriptors (/proc/PID/fd) and its resident memory
(/proc/PID/status VmRSS). Every context manager stops what it started, by its PID, even when
the test failed or the process is frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.paths import free_port

ROOT = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0


@dataclass(slots=True)
class Proc:
    """One started process and where it listens."""

    proc: asyncio.subprocess.Process
    url: str
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def fds(self) -> int:
        """How many file descriptors the process has open."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_kib(self) -> int:
        """The process's resident memory, KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError(f"no VmRSS for pid {self.pid}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait(self, timeout_s: float = STOP_DEADLINE_S) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout_s)


async def _answers(url: str) -> bool:
    timeout = aiohttp.ClientTimeout(total=2)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as resp:
            return resp.status < 500
    except (aiohttp.ClientError, TimeoutError):
        return False


@contextlib.asynccontextmanager
async def _started(argv: list[str], port: int, probe: str,
                   env: Mapping[str, str] | None = None) -> AsyncIterator[Proc]:
    """Runs `argv`, waits until GET `probe` answers, yields; SIGCONT + SIGKILL on exit."""
    with tempfile.TemporaryDirectory(prefix="kvgate-faults-") as workdir:
        log = Path(workdir) / "output.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, cwd=ROOT,
                env={**os.environ, **(env or {})})
        started = Proc(proc=proc, url=f"http://127.0.0.1:{port}", port=port, log=log)
        try:
            deadline = time.monotonic() + START_DEADLINE_S
            while not await _answers(started.url + probe):
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{argv} did not start:\n{started.output()}")
                await asyncio.sleep(0.05)
            yield started
        finally:
            await stop(started)


async def stop(started: Proc) -> None:
    """Thaws the process (a frozen one ignores SIGKILL's delivery until then) and kills it."""
    if started.proc.returncode is None:
        started.thaw()
        started.kill()
    await started.proc.wait()


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


@contextlib.asynccontextmanager
async def sim(*, model: str = "faulty-model", time_scale: float = 1.0, seed: int = 0,
              port: int | None = None, preset: str | None = None,
              num_gpu_blocks: int | None = None) -> AsyncIterator[Proc]:
    """`kvgate sim` on `port` (default: a free one; a given one lets a killed backend come
    back where the gateway knows it)."""
    port = port or free_port()
    argv = _python("-m", "gateway.cli", "sim", "--port", str(port), "--model", model,
                   "--time-scale", str(time_scale), "--seed", str(seed))
    if preset:
        argv += ["--preset", preset]
    if num_gpu_blocks:
        argv += ["--num-gpu-blocks", str(num_gpu_blocks)]
    async with _started(argv, port, "/health") as started:
        yield started


@contextlib.asynccontextmanager
async def misbehaving(chat: str = "ok", metrics: str = "good", *, model: str = "faulty-model",
                      port: int | None = None) -> AsyncIterator[Proc]:
    """The misbehaving upstream (tests/faults/misbehave.py) on `port` (default: a free one)."""
    port = port or free_port()
    argv = _python("-m", "tests.faults.misbehave", str(port), chat, metrics, "--model", model)
    async with _started(argv, port, "/health") as started:
        yield started


async def set_mode(upstream: Proc, **modes: str) -> None:
    """Switches the misbehaving upstream's modes (chat=..., metrics=...)."""
    async with aiohttp.ClientSession() as http, \
            http.post(upstream.url + "/_mode", json=modes) as resp:
        assert resp.status == 200, await resp.text()


async def upstream_stats(upstream: Proc) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(upstream.url + "/_stats") as resp:
        stats: dict[str, Any] = await resp.json()
        return stats


def gateway_config(backends: list[Proc] | list[str], **sections: Any) -> dict[str, Any]:
    """A config for `kvgate serve` in front of `backends` (ids b0, b1, ...), serving the model
    `faulty-model`, polled fast; `sections` are merged over it (server, health, routing, ...)."""
    urls = [b if isinstance(b, str) else b.url for b in backends]
    config: dict[str, Any] = {
        "server": {"first_byte_timeout_s": 2, "stream_idle_timeout_s": 2,
                   "client_header_timeout_s": 2, "client_body_timeout_s": 2,
                   "shutdown_timeout_s": 2, "drain_grace_s": 0.5},
        "backends": [{"url": u, "id": f"b{i}", "models": ["faulty-model"]}
                     for i, u in enumerate(urls)],
        "routing": {"poll_interval_s": 0.1},
        "telemetry": {"access_log_sample_rate": 0.0},
    }
    for name, section in sections.items():
        base = config.get(name)
        config[name] = {**base, **section} if isinstance(base, dict) else section
    return config


@contextlib.asynccontextmanager
async def gateway(config: dict[str, Any]) -> AsyncIterator[Proc]:
    """`kvgate serve --config` with `config` (its port replaced by a free one)."""
    port = free_port()
    config = {**config, "server": {**config.get("server", {}), "host": "127.0.0.1",
                                   "port": port}}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="kvgate-faults-",
                                     delete=False) as file:
        yaml.safe_dump(config, file)
    try:
        argv = _python("-m", "gateway.cli", "serve", "--config", file.name, "--log-level",
                       "warning")
        async with _started(argv, port, "/health") as started:
            yield started
    finally:
        os.unlink(file.name)


@contextlib.asynccontextmanager
async def redis(port: int | None = None) -> AsyncIterator[Proc]:
    """A redis-server of this test's own (no persistence) on `port` (default: a free one); the
    test fails when redis-server is not installed (./scripts/test.sh installs it)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise AssertionError("redis-server is not on PATH: run ./scripts/test.sh, or apt-get"
                             " install redis-server")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-faults-redis-") as workdir:
        argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--appendonly", "no", "--dir", workdir]
        log = Path(workdir) / "redis.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out)
        started = Proc(proc=proc, url=f"redis://127.0.0.1:{port}/0", port=port, log=log)
        try:
            deadline = time.monotonic() + START_DEADLINE_S
            while not await _pongs(port):
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(f"redis-server did not start:\n{started.output()}")
                await asyncio.sleep(0.02)
            yield started
        finally:
            await stop(started)


async def _pongs(port: int) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(b"PING\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 2) == b"+PONG\r\n"
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
