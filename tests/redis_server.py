"""Redis for the tests: `loadtest.redis_server.running_redis` (a throwaway redis-server on a free
loopback port, stopped at exit) that fails the test, naming the fix, when redis-server is not
installed (./scripts/test.sh installs it: a missing one is a broken setup, not a pass), and a
synchronous form for tests of code that runs its own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from loadtest import redis_server


@contextlib.asynccontextmanager
async def running_redis() -> AsyncIterator[str]:
    """Yields "redis://127.0.0.1:PORT/0" of a redis-server of this test's own (the test fails
    when redis-server is not on PATH)."""
    if not redis_server.redis_available():
        pytest.fail("redis-server is not on PATH: run ./scripts/test.sh, or apt-get install"
                    " redis-server")
    async with redis_server.running_redis() as url:
        yield url


@contextlib.contextmanager
def running_redis_sync() -> Iterator[str]:
    """`running_redis()` for a synchronous test, e.g. one calling code that runs its own
    `asyncio.run`: an event loop in a background thread starts the server and later stops it,
    so the test's thread has no loop of its own. A failure to start is raised here."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="running_redis_sync", daemon=True)
    thread.start()
    try:
        server = running_redis()
        url = asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result()
        try:
            yield url
        finally:
            # None: the server stops the same way whether or not the test passed.
            asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
