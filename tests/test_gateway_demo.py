"""`kvgate demo` as a user runs it: it prints a curl command that works, its simulators run in
processes of their own, and Ctrl-C stops it with exit code 0, its simulators with it."""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import sys
from pathlib import Path

import aiohttp
import orjson

from tests.paths import free_port
from tests.waiting import until

REPO = Path(__file__).resolve().parents[1]
START_DEADLINE_S = 30.0
EXIT_DEADLINE_S = 15.0



async def read_banner(stdout: asyncio.StreamReader) -> list[str]:
    """The lines the demo prints once ready, through its last line ("Ctrl-C stops it.")."""
    lines: list[str] = []
    while not lines or "Ctrl-C" not in lines[-1]:
        raw = await stdout.readline()
        assert raw, "kvgate demo exited before printing its banner:\n" + "".join(lines)
        lines.append(raw.decode())
    return lines


def parent_of(pid: int) -> int | None:
    """The process's parent PID, None once it is gone (or a zombie: it has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    if re.search(r"^State:\s+Z", status, re.M):
        return None
    match = re.search(r"^PPid:\s+(\d+)", status, re.M)
    return int(match.group(1)) if match else None


def simulator_pids(banner: list[str]) -> list[int]:
    text = " ".join(line.strip() for line in banner)
    match = re.search(r"\(pids ([\d, ]+)\)", text)
    assert match, "the banner names no simulator processes:\n" + "".join(banner)
    return [int(p) for p in match.group(1).split(",")]


async def test_kvgate_demo_answers_its_printed_curl_and_exits_0_on_sigint() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "demo", "--port", str(port),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        banner = await asyncio.wait_for(read_banner(proc.stdout), START_DEADLINE_S)
        assert f"http://127.0.0.1:{port}/v1" in banner[0]
        assert any("from openai import OpenAI" in line for line in banner)
        assert any("sharing this machine's" in line for line in banner)
        # Three large simulators and the small one, each its own child process of the demo.
        pids = simulator_pids(banner)
        assert len(set(pids)) == 4 and proc.pid not in pids
        assert [parent_of(p) for p in pids] == [proc.pid] * 4
        curl = next(line.strip() for line in banner if line.strip().startswith("curl "))
        args = shlex.split(curl)
        url = next(a for a in args if a.startswith("http://"))
        body = args[args.index("-d") + 1]
        headers = dict([args[args.index("-H") + 1].split(": ", 1)])
        async with aiohttp.ClientSession() as http:
            loop = asyncio.get_running_loop()
            end = loop.time() + START_DEADLINE_S
            while True:
                async with http.get(f"http://127.0.0.1:{port}/ready") as resp:
                    if resp.status == 200:
                        break
                assert loop.time() < end, "the demo gateway never became ready"
                await asyncio.sleep(0.05)
            async with http.post(url, data=body.encode(), headers=headers) as resp:
                assert resp.status == 200
                answer = orjson.loads(await resp.read())
        assert answer["choices"][0]["message"]["content"]
        assert answer["usage"]["completion_tokens"] >= 1
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), EXIT_DEADLINE_S)
        stderr = (await proc.stderr.read()).decode()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    await until(lambda: all(parent_of(p) is None for p in pids),
                "the demo's simulators are gone once it has exited")

