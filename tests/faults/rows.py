"""What every fault row checks beside its own promise: the gateway's open file descriptors come
back to their baseline after the fault, and its memory does not grow over three repetitions.

The baseline is taken after the first repetition, once pools, caches and lazy imports are warm;
the second and third must then give back every descriptor they opened (polled with a deadline:
idle upstream connections are closed by the pool on its own schedule) and end within a generous
margin of the first one's resident memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tests.faults.clients import get_json
from tests.faults.procs import Proc
from tests.waiting import until

REPETITIONS = 3
FD_SLACK = 8  # pooled keep-alive connections to the backends, a log file being rotated, ...
FD_DEADLINE_S = 40.0  # the upstream pool closes idle connections after 15 s
RSS_GROWTH = 1.3  # x the first repetition's resident memory ...
RSS_SLACK_KIB = 40_000  # ... plus this: allocator arenas settle, nothing that leaks per request


async def three_times(gateway: Proc, row: Callable[[], Awaitable[None]], *,
                      rss_slack_kib: int = RSS_SLACK_KIB) -> None:
    """Runs `row` REPETITIONS times against `gateway`, checking descriptors and memory (a row
    of huge bodies passes a larger `rss_slack_kib`: the allocator may keep a few times a body's
    size after parsing it, which a leak per request still exceeds)."""
    await row()
    fds, rss = gateway.fds(), gateway.rss_kib()
    for _ in range(REPETITIONS - 1):
        await row()
        await until(lambda: gateway.fds() <= fds + FD_SLACK,
                    f"the gateway's open fds back to {fds} (+{FD_SLACK})", FD_DEADLINE_S)
    grown = gateway.rss_kib()
    assert grown <= rss * RSS_GROWTH + rss_slack_kib, f"RSS grew from {rss} to {grown} KiB"


async def backend_rows(gateway: Proc) -> dict[str, dict[str, Any]]:
    status, payload = await get_json(gateway.url, "/admin/backends")
    assert status == 200, payload
    return {row["id"]: row for row in payload["backends"]}


async def until_healthy(gateway: Proc, *ids: str, timeout_s: float = 30.0) -> None:
    """Waits until the gateway routes to every backend in `ids` again."""
    async def healthy() -> bool:
        rows = await backend_rows(gateway)
        return all(rows[i]["healthy"] for i in ids)
    await until(healthy, f"backends {ids} healthy at {gateway.url}", timeout_s)
