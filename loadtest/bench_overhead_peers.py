"""The processes `loadtest.bench_overhead` measures: starting them, reading their CPU clocks and
RSS, and the peers installed from PyPI into venvs of their own under /tmp.

A peer is installed once (`python -m venv /tmp/kvgate-bench-peers/NAME`, then `pip install`) and
reused by later runs; one that does not install or start is skipped with its reason. Everything
binds 127.0.0.1 and talks only to the mock backend; LiteLLM is told to use its bundled model
cost map and to send no telemetry.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from loadtest.bench_overhead_procs import BENCH_KEY, MODEL

PEERS_DIR = Path("/tmp/kvgate-bench-peers")
READY_S = 90.0
SLOW_READY_S = 300.0  # LiteLLM's proxy imports for minutes on a busy machine
INSTALL_S = 900.0
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class BenchProc:
    name: str
    url: str
    popen: subprocess.Popen[bytes]


@dataclass
class Started:
    """Ends every process it was given, in reverse, on leaving."""

    procs: list[BenchProc] = field(default_factory=list)

    def add(self, proc: BenchProc) -> BenchProc:
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Started:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for proc in reversed(self.procs):
            proc.popen.terminate()
        for proc in reversed(self.procs):
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start(name: str, argv: list[str], port: int, ready_path: str, workdir: Path,
           env: dict[str, str] | None = None, ready_s: float = READY_S) -> BenchProc:
    log = workdir / f"{name}.log"
    with log.open("wb") as err:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err,
                                 stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{name} exited with {popen.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url + ready_path, timeout=2) as resp:
                if resp.status == 200:
                    return BenchProc(name, url, popen)
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    popen.kill()
    raise RuntimeError(f"{name} not ready within {ready_s:g} s; see {log}")


def _procs(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "loadtest.bench_overhead_procs", role, *args]


def start_mock(workdir: Path) -> BenchProc:
    port = free_port()
    return _start("mock", _procs("mock", "--port", str(port)), port, "/health", workdir)


def relay_proc(workdir: Path, upstream: str) -> BenchProc:
    port = free_port()
    return _start("relay", _procs("relay", "--port", str(port), "--upstream", upstream), port,
                  "/v1/models", workdir)


def kvgate_proc(workdir: Path, upstream: str, name: str, *, cache: bool = False,
                flush_ms: int = 0) -> BenchProc:
    port = free_port()
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "backends": [{"url": upstream, "id": "mock", "models": [MODEL]}],
    }
    if flush_ms:
        config["server"]["stream_flush_interval_ms"] = flush_ms
    if cache:
        config["cache"] = {"enabled": True, "store": "memory", "embedder": "hashing",
                           "semantic": "on"}
    path = workdir / f"{name}.json"  # JSON is YAML
    path.write_bytes(orjson.dumps(config))
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path),
            "--log-level", "warning"]
    return _start(name, argv, port, "/ready", workdir)


def _installed(name: str, spec: str, binary: str) -> tuple[Path | None, str]:
    venv = PEERS_DIR / name
    exe = venv / "bin" / binary
    if exe.exists():
        return exe, ""
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    log = PEERS_DIR / f"{name}.log"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       capture_output=True, timeout=120)
        with log.open("wb") as out:
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", spec], check=True,
                           stdout=out, stderr=out, timeout=INSTALL_S)
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"pip install {spec} failed ({type(exc).__name__}; {log})"
    return (exe, "") if exe.exists() else (None, f"{binary} not found after installing {spec}")


def peer_procs(workdir: Path, upstream: str) -> Iterator[tuple[str, BenchProc | None, str]]:
    """LiteLLM's proxy, vllm-router (its default policy) and sglang-router, each installed and
    started if it can be; (name, None, why) for one that cannot."""
    exe, why = _installed("litellm", "litellm[proxy]", "litellm")
    if exe is not None:
        port = free_port()
        config = workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {upstream}/v1\n"
            "      api_key: none\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "  drop_params: true\n")
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
               "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": BENCH_KEY}
        yield _attempt("litellm", [str(exe), "--config", str(config), "--host", "127.0.0.1",
                                   "--port", str(port), "--num_workers", "1"],
                       port, "/health/liveliness", workdir, env, SLOW_READY_S)
    else:
        yield "litellm", None, why
    for name, binary, argv in (
        ("vllm-router", "vllm-router", ["{exe}"]),
        ("sglang-router", "python", ["{exe}", "-m", "sglang_router.launch_router"]),
    ):
        exe, why = _installed(name, name, binary)
        if exe is None:
            yield name, None, why
            continue
        port = free_port()
        command = [a.format(exe=exe) for a in argv] + [
            "--worker-urls", upstream, "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        yield _attempt(name, command, port, "/v1/models", workdir)


def _attempt(name: str, argv: list[str], port: int, ready: str, workdir: Path,
             env: dict[str, str] | None = None,
             ready_s: float = READY_S) -> tuple[str, BenchProc | None, str]:
    try:
        return name, _start(name, argv, port, ready, workdir, env, ready_s), ""
    except RuntimeError as exc:
        return name, None, str(exc)


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except OSError:
            continue
    return total * _PAGE / 2**20


def run_load(proc: BenchProc | None, url: str, mode: str, concurrency: int, requests: int,
             tokens: int, pace_ms: float) -> tuple[dict[str, Any], float | None, float | None]:
    """One load run against `url`: the load generator's figures, the proxy's CPU seconds over
    the run and its largest RSS seen (MB), sampled while the run lasts."""
    pids = _tree(proc.popen.pid) if proc is not None else []
    before = cpu_seconds(pids)
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        load = subprocess.Popen(
            [sys.executable, "-m", "loadtest.bench_overhead_procs", "load", "--url", url,
             "--mode", mode, "--concurrency", str(concurrency), "--requests", str(requests),
             "--tokens", str(tokens), "--pace-ms", str(pace_ms), "--out", result.name],
            stdin=subprocess.DEVNULL)
        out, peak, after = _awaited(load, pids, Path(result.name))
    if load.returncode != 0:
        raise RuntimeError(f"the load generator failed against {url}")
    return orjson.loads(out), (after - before) if pids else None, peak


def _awaited(load: subprocess.Popen[bytes], pids: list[int],
             result: Path) -> tuple[bytes, float | None, float]:
    """The load generator's figures once it ended, the largest RSS of `pids` seen meanwhile
    (MB) and their CPU seconds at its end."""
    peak = rss_mb(pids) if pids else None
    while load.poll() is None:
        time.sleep(0.1)
        if pids:
            peak = max(peak or 0.0, rss_mb(pids))
    after = cpu_seconds(pids)
    return result.read_bytes(), peak, after
