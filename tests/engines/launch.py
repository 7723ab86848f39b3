"""Real engines on loopback for the `engines` tier: started from scripts/real-engines.sh's cache,
stopped by their process id.

The tier runs only where KVGATE_ENGINES is set (scripts/test.sh sets it after running
scripts/real-engines.sh): its value is the script's cache directory, or any other non-empty
value for the script's default one. Elsewhere every engine test is skipped, saying so.
Each engine runs through `scripts/real-engines.sh serve-*`, so the tests use exactly the flags
the script documents; `exec` there keeps the engine's PID, and the engine runs in a session of
its own so that vLLM's engine-core child goes down with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real-engines.sh"
ENV = "KVGATE_ENGINES"
VLLM_MODEL = "tiny-llama"  # --served-model-name in the script
LLAMACPP_MODEL = "smollm2-135m"  # --alias in the script
VLLM_BLOCKS = 40  # --num-gpu-blocks-override
VLLM_BLOCK_SIZE = 128  # vLLM's CPU backend
VLLM_MAX_MODEL_LEN = 2048
LLAMACPP_CONTEXT = 4096  # -c, split between the slots
# Generous: a vLLM start takes a minute or two on a loaded 2-core host.
VLLM_START_S = 900.0
LLAMACPP_START_S = 120.0
STOP_S = 30.0


def engines_dir() -> Path:
    """The script's cache directory; skips the test when KVGATE_ENGINES is unset."""
    value = os.environ.get(ENV, "")
    if not value:
        pytest.skip(f"{ENV} is unset: run scripts/real-engines.sh, then set {ENV} to its cache"
                    " directory (scripts/test.sh does both)")
    if Path(value).is_dir():
        return Path(value)
    default = Path.home() / ".cache" / "kvgate-engines"
    return Path(os.environ.get("KVGATE_ENGINES_DIR", default))


@dataclass(frozen=True)
class Engine:
    url: str  # http://127.0.0.1:PORT, no /v1
    pid: int
    log: Path


@contextmanager
def running_engines(kinds: list[tuple[str, tuple[str, ...]]], *,
                    log_dir: Path) -> Iterator[list[Engine]]:
    """Starts every (kind, args) at once, waits for all of them to be healthy, and stops them
    all at the end. `kind` is "llamacpp" or "vllm"; `args` follow the port on the script's
    command line (serve-vllm: the KV block count)."""
    directory = engines_dir()
    env = {**os.environ, "KVGATE_ENGINES_DIR": str(directory)}
    started: list[tuple[Engine, subprocess.Popen[bytes], float]] = []
    try:
        for kind, args in kinds:
            port = free_port()
            log = log_dir / f"{kind}-{port}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    ["bash", str(SCRIPT), f"serve-{kind}", str(port), *args], env=env,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            timeout_s = VLLM_START_S if kind == "vllm" else LLAMACPP_START_S
            started.append((Engine(f"http://127.0.0.1:{port}", process.pid, log), process,
                            timeout_s))
        for engine, process, timeout_s in started:
            _wait_healthy(engine, process, timeout_s)
        yield [engine for engine, _, _ in started]
    finally:
        for _, process, _ in started:
            _stop(process)


def _wait_healthy(engine: Engine, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{engine.url} exited with {process.returncode} before it was"
                                 f" healthy; its log:\n{_tail(engine.log)}")
        with contextlib.suppress(urllib.error.URLError, OSError), \
                urllib.request.urlopen(engine.url + "/health", timeout=5) as resp:
            if resp.status == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"{engine.url} not healthy within {timeout_s} s; its log:\n"
                         f"{_tail(engine.log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the engine's PID, then SIGKILL to its session (its PID is the session's id)
    if it has not ended within STOP_S."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # children left behind, if any
    process.wait()


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
