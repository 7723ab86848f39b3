"""Streams read on for their followers after their own client left.

A stream that identical streams follow (the cache's `LineTap.followed`) outlives its own client:
when the client leaves, `Carrier.carry_on` hands the upstream to a task that reads on for the
followers while any remains, and closes it (the backend aborts) when the last one goes or the
backend falls silent for the stream idle timeout. The attempt's lease on its backend is held
until then (`carried(dispatch)`): the backend still holds its KV.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from gateway.sse import StreamObserver
from routing.dispatch import Dispatch

log = logging.getLogger("kvgate.gateway")


class LineTap(Protocol):
    """Sees a stream's complete SSE lines as the client gets them (the cache's store side and
    the identical streams following this one, gateway/cache)."""

    def stream_lines(self, lines: bytes) -> None: ...

    def followed(self) -> bool:
        """Identical streams follow this one now."""
        ...

    def carry_on(self) -> None:
        """The client left; the upstream is read on for the followers."""
        ...

    def carried_end(self, usage: dict[str, Any] | None, *, whole: bool) -> None:
        """The upstream read on for the followers ended."""
        ...


class Carrier:
    """The upstreams read on for followers, each by its task, and the same tasks by the dispatch
    they belong to (whose lease they keep held)."""

    def __init__(self, *, idle_s: float, on_idle: Callable[[str], None]) -> None:
        self._idle_s = idle_s
        self._on_idle = on_idle  # called with the backend id when one fell silent
        self._carried: dict[aiohttp.ClientResponse, asyncio.Task[None]] = {}
        self._carried_for: dict[Dispatch, asyncio.Task[None]] = {}

    def carried(self, dispatch: Dispatch) -> asyncio.Task[None] | None:
        """The task reading `dispatch`'s stream on for its followers, if its client left while
        identical streams followed it: the backend still generates it until the task ends."""
        return self._carried_for.get(dispatch)

    def holds(self, upstream: aiohttp.ClientResponse) -> bool:
        """`upstream` is read on by a task, whose to close it is."""
        return upstream in self._carried

    def carry_on(self, upstream: aiohttp.ClientResponse, observer: StreamObserver,
                 tap: LineTap | None, dispatch: Dispatch) -> None:
        """Hands the upstream to a task reading on for the followers, if there are any."""
        if tap is None or not tap.followed() or upstream.content.at_eof():
            return
        tap.carry_on()
        task = asyncio.get_running_loop().create_task(
            self._read_on(upstream, observer, tap, dispatch.backend_id))
        self._carried[upstream] = task
        self._carried_for[dispatch] = task
        task.add_done_callback(lambda _: self._carried.pop(upstream, None))
        task.add_done_callback(lambda _: self._carried_for.pop(dispatch, None))

    async def _read_on(self, upstream: aiohttp.ClientResponse, observer: StreamObserver,
                       tap: LineTap, backend_id: str) -> None:
        """The stream's rest, for the followers only, while any remains."""
        whole = False
        try:
            while tap.followed():
                async with asyncio.timeout(self._idle_s):
                    chunk = await upstream.content.readany()
                if not chunk:
                    tail = observer.finish()
                    if tail:
                        tap.stream_lines(tail)
                    whole = observer.complete and observer.error is None
                    break
                out = observer.feed(chunk)
                if out:
                    tap.stream_lines(out)
        except TimeoutError:
            log.info("a stream read on for its followers: backend %s sent nothing for %g s",
                     backend_id, self._idle_s)
            self._on_idle(backend_id)
        except Exception as exc:  # a read error, or an error the stream was cut with
            log.info("a stream read on for its followers failed: %s: %s",
                     type(exc).__name__, exc)
        finally:
            if upstream.content.at_eof():
                upstream.release()
            else:
                upstream.close()  # the last follower left: the backend aborts
            tap.carried_end(observer.usage, whole=whole)
