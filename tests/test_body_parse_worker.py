"""The parse worker process: a big body parsed there equals one parsed on the loop, and the
worker (with its forkserver) ends when the gateway's process ends, even by SIGKILL."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from pathlib import Path

import orjson

from gateway.body import BodyParser, parsed
from gateway.schemas import validate_chat
from tests.waiting import until

REPO = Path(__file__).resolve().parents[1]
VALIDATE = functools.partial(validate_chat, max_messages=10_000)
PARSES_ONE = """
import asyncio, functools, sys
from gateway.body import BodyParser
from gateway.schemas import validate_chat
async def main():
    body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b'x' * 600_000 + b'"}]}'
    parser = BodyParser()  # kept: a parser that is collected ends its worker
    await parser.parse(body, functools.partial(validate_chat, max_messages=10))
    print("parsed", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_big_body_parsed_in_the_worker_equals_one_parsed_here() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 3000}}
    body = orjson.dumps({"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": "naïve? 東京 " * 30_000}] + [
        {"role": "user", "content": [image, {"type": "text", "text": f"picture {i}"}]}
        for i in range(2_000)]})
    parser = BodyParser(threshold=1)
    try:
        there = await parser.parse(body, VALIDATE)
    finally:
        parser.close()
    assert there == parsed(body, VALIDATE)


async def test_the_worker_ends_with_a_killed_gateway() -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARSES_ONE, cwd=REPO, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout is not None
        assert (await asyncio.wait_for(child.stdout.readline(), 60)).strip() == b"parsed"
        forkservers = _children(child.pid)
        workers = [pid for server in forkservers for pid in _children(server)]
        assert forkservers and workers  # the forkserver and the parse worker under it
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    await until(lambda: not any(_alive(pid) for pid in forkservers + workers),
                "the parse worker and its forkserver ended with the gateway")
