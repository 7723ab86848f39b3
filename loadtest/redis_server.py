"""`running_redis()`: a throwaway redis-server on loopback, started and stopped here (for the
tests and the cache benchmark).

The server is ours alone: a free 127.0.0.1 port, no persistence (`--save ""`, `--appendonly no`),
its working directory a temporary one. It never touches a server it did not start: a port someone
took between our probe and the server's bind makes the server exit, and we try another port.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

START_DEADLINE_S = 10.0
STOP_DEADLINE_S = 5.0
PORT_ATTEMPTS = 3


class RedisMissing(RuntimeError):
    """redis-server is not on PATH."""


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def running_redis() -> AsyncIterator[str]:
    """Yields "redis://127.0.0.1:PORT/0" of a redis-server that answers PING; terminates it (and
    kills it if it will not stop) on exit. RedisMissing when redis-server is not on PATH."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisMissing("redis-server is not on PATH (apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="kvgate-redis-") as workdir:
        log_path = Path(workdir) / "redis.log"
        for _ in range(PORT_ATTEMPTS):
            port = free_port()
            with log_path.open("wb") as log:
                proc = await asyncio.create_subprocess_exec(
                    binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                    "--appendonly", "no", "--dir", workdir,
                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                )
            try:
                if await _answers_ping(proc, port):
                    yield f"redis://127.0.0.1:{port}/0"
                    return
            finally:
                await _stop(proc)
        raise RuntimeError(f"redis-server did not start after {PORT_ATTEMPTS} ports; its log:\n"
                           + log_path.read_text(errors="replace"))


async def _answers_ping(proc: asyncio.subprocess.Process, port: int) -> bool:
    """Polls PING until +PONG (True) or until the server exited, e.g. the port was taken (False);
    fails after START_DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_DEADLINE_S
    while proc.returncode is None:
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"PING\r\n")
                await writer.drain()
                if await asyncio.wait_for(reader.readline(), START_DEADLINE_S) == b"+PONG\r\n":
                    return True
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        if loop.time() > deadline:
            raise TimeoutError(f"redis-server on port {port} did not answer PING"
                               f" within {START_DEADLINE_S} s")
        await asyncio.sleep(0.01)
    return False


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), STOP_DEADLINE_S)
        finally:
            if proc.returncode is None:  # it would not stop, or we were cancelled
                proc.kill()
    await proc.wait()
