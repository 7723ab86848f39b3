"""The README's snippets work as written: its first command starts the demo, its curl lines and
its Python snippet (with the openai client) answer through it, `kvgate serve --backend ...` serves
in front of a server, its YAML blocks are valid configs and `kvgate plan` prints what the README
shows. Each snippet is read out of README.md's fenced blocks and inline code, so a README that
drifts from the product fails here; the only changes made are the ports (free ones instead of
8000 and 9000) and `.venv/bin/kvgate` (this interpreter's `-m gateway.cli`)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config import load_settings
from tests.paths import free_port

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
START_DEADLINE_S = 60.0  # four simulator processes and the gateway, on a loaded 2-core host
EXIT_DEADLINE_S = 20.0
KVGATE = [sys.executable, "-m", "gateway.cli"]


def fenced_blocks(language: str) -> list[str]:
    """The README's fenced blocks of `language`, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README, re.M | re.S)


def inline_commands(prefix: str) -> list[str]:
    """The README's inline code spans that are a command starting with `prefix` and a URL."""
    return [span for span in re.findall(r"`([^`\n]+)`", README)
            if span.startswith(prefix) and "http://" in span]


def kvgate_argv(command: str, ports: dict[int, int]) -> list[str]:
    """A README command line as this test runs it: comments dropped, ports swapped, kvgate as
    this interpreter's module."""
    line = command.split("#", 1)[0].strip()
    for old, new in ports.items():
        line = line.replace(f":{old}", f":{new}").replace(f"--port {old}", f"--port {new}")
    argv = shlex.split(line)
    assert argv[0].endswith("kvgate"), line
    return KVGATE + argv[1:]


def wait_ready(url: str, proc: subprocess.Popen[str], path: str = "/ready") -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        assert proc.poll() is None, f"{proc.args} exited: {proc.communicate()[1]}"
        with contextlib.suppress(urllib.error.URLError, ConnectionError):  # not listening yet
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                if resp.status == 200:
                    return
        assert time.monotonic() < deadline, f"{url}{path} never answered 200"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
    return proc.returncode, stderr


def first_command() -> str:
    """The `kvgate demo` part of the README's first line."""
    first_line = fenced_blocks("sh")[0].splitlines()[0].split("#", 1)[0]
    [demo] = [part.strip() for part in first_line.split("&&") if "kvgate demo" in part]
    return demo


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """The README's first command, the demo, on a free port: its URL."""
    port = free_port()
    argv = kvgate_argv(first_command(), {}) + ["--port", str(port)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url
    finally:
        code, stderr = stop(proc)
        assert code == 0, stderr
        assert "Traceback" not in stderr


def test_the_first_line_installs_kvgate_and_starts_the_demo() -> None:
    first_line = fenced_blocks("sh")[0].splitlines()[0]
    assert first_line.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && ")
    assert first_command() == ".venv/bin/kvgate demo"


@pytest.mark.parametrize("command", inline_commands("curl "))
def test_the_readme_curl_lines_answer_from_the_demo(demo: str, command: str) -> None:
    argv = shlex.split(command.replace("http://127.0.0.1:8000", demo))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


def test_there_are_curl_lines_to_run() -> None:
    assert inline_commands("curl "), "the README shows no curl line against the demo"


def python_snippet() -> tuple[str, str]:
    """The shell block running Python: its install line and the Python between the heredoc's
    markers."""
    [block] = [b for b in fenced_blocks("sh") if "<<'EOF'" in b]
    install, rest = block.split("\n", 1)
    code = rest.split("<<'EOF'\n", 1)[1].rsplit("EOF", 1)[0]
    return install, code


def test_the_python_snippet_installs_the_openai_client_first() -> None:
    install, _ = python_snippet()
    assert install == ".venv/bin/pip install openai"


@pytest.mark.skipif(importlib.util.find_spec("openai") is None,
                    reason="the openai client is not installed (the dev extra has it)")
def test_the_python_snippet_streams_through_the_demo(demo: str) -> None:
    _, code = python_snippet()
    assert "http://127.0.0.1:8000/v1" in code
    done = subprocess.run([sys.executable, "-"], input=code.replace("http://127.0.0.1:8000", demo),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the stream printed nothing"


def serve_line() -> str:
    [block] = [b for b in fenced_blocks("sh") if "kvgate serve --backend" in b]
    [line] = [ln for ln in block.splitlines() if ln.startswith("kvgate serve")]
    return line


def test_kvgate_serve_runs_in_front_of_a_server_as_the_readme_says() -> None:
    line = serve_line()
    assert "--backend http://127.0.0.1:8000" in line and "--port 9000" in line
    backend_port, gateway_port = free_port(), free_port()
    sim = subprocess.Popen(KVGATE + ["sim", "--port", str(backend_port), "--time-scale", "10"],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{backend_port}", sim, "/health")
        argv = kvgate_argv(line, {8000: backend_port, 9000: gateway_port})
        gateway = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{gateway_port}"
        try:
            wait_ready(url, gateway)
            body = json.dumps({"model": "llama-3-8b", "max_tokens": 8,
                               "messages": [{"role": "user", "content": "Hello!"}]}).encode()
            request = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as resp:
                answer = json.loads(resp.read())
                assert resp.headers["x-kvgate-backend"]
            assert answer["choices"][0]["message"]["content"]
        finally:
            code, stderr = stop(gateway)
        assert code == 0, stderr
    finally:
        stop(sim)


@pytest.mark.parametrize("index", range(len(fenced_blocks("yaml"))))
def test_every_yaml_block_is_a_valid_config(index: int, tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(fenced_blocks("yaml")[index])
    load_settings(path, environ={})


def test_kvgate_plan_prints_what_the_readme_shows() -> None:
    [block] = [b for b in fenced_blocks("") if b.startswith("$ kvgate plan")]
    command, *expected = block.rstrip("\n").splitlines()
    argv = KVGATE + shlex.split(command.removeprefix("$ kvgate"))
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n").splitlines() == expected
