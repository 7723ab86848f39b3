"""Small helpers shared by the tests."""

import socket
from collections.abc import Callable
from pathlib import Path

from tests.waiting import until

# Real-format payloads of vLLM, SGLang, TGI and llama.cpp (see fixtures/README.md); a copy of the
# project's shared fixtures, kept in the repository so the suite needs nothing beside the clone.
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def eventually(predicate: Callable[[], bool], what: str, deadline_s: float = 15.0) -> None:
    """Polls `predicate` until it holds; fails the test after `deadline_s` (`waiting.until`)."""
    await until(predicate, what, deadline_s)
