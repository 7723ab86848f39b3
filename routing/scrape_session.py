"""The scrape client's interface over an aiohttp session, and the choice of client per backend.

Contract
- `SessionClient` is `ScrapeClient` (routing/scrape_client.py) over an aiohttp session: for the
  backends the keep-alive client does not speak to (https, user info in the URL), and for every
  backend when the poller's caller passes a session. Same answers, same error classes; one task
  per request. The session is the caller's: `close` leaves it open.
- `client_for` picks: the session's client when a session is given, else the keep-alive client
  for plain http URLs, else None (the poller then opens a session of its own). A backend's
  `api_key` goes as `Authorization: Bearer` on each of its scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from routing.scrape_client import (
    MAX_BODY_BYTES,
    Done,
    KeepAliveClient,
    ScrapeClient,
    ScrapeConnectError,
    ScrapeError,
    ScrapeTimeout,
)

__all__ = ["SessionClient", "client_for"]

_IDENTITY = {"Accept-Encoding": "identity"}


def client_for(
    base_url: str, session: aiohttp.ClientSession | None, *, max_body: int = MAX_BODY_BYTES,
    api_key: str | None = None,
) -> ScrapeClient | None:
    """The client for one backend: `SessionClient` over `session` when one is given, else the
    keep-alive client for plain http URLs; None when the URL needs a session (https, user info)
    and none was given."""
    if session is not None:
        return SessionClient(session, base_url, max_body=max_body, api_key=api_key)
    if KeepAliveClient.supports(base_url):
        return KeepAliveClient(base_url, max_body=max_body, api_key=api_key)
    return None


class SessionClient:
    """The same interface over an aiohttp session (https backends, or a session the caller
    passed in), one task per request. The session is the caller's: `close` leaves it open."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, *, max_body: int = MAX_BODY_BYTES,
        api_key: str | None = None,
    ) -> None:
        self._session = session
        self._headers = _IDENTITY if api_key is None else {
            **_IDENTITY, "Authorization": f"Bearer {api_key}"}
        self._base_url = base_url
        self._max_body = max_body
        self._task: asyncio.Task[bytes] | None = None

    def fetch(self, path: str, timeout: float, done: Done) -> None:
        if self._task is not None:
            raise RuntimeError("a request is already in flight on this client")
        task = self._task = asyncio.get_running_loop().create_task(self._get(path, timeout))

        def finished(task: asyncio.Task[bytes]) -> None:
            self._task = None
            if task.cancelled():  # closed: abandoned
                return
            error = task.exception()
            if error is None:
                done(task.result())
            elif isinstance(error, ScrapeError):
                done(error)
            else:  # a bug, not a backend's misbehaviour: surface it rather than hide it
                done(ScrapeError(f"{type(error).__name__}: {error}"))

        task.add_done_callback(finished)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _get(self, path: str, timeout: float) -> bytes:
        url = self._base_url + path
        try:
            async with asyncio.timeout(timeout):
                async with self._session.get(
                    url, allow_redirects=False, headers=self._headers
                ) as resp:
                    if resp.status != 200:
                        reason = f"HTTP {resp.status} {resp.reason or ''}".rstrip()
                        raise ScrapeError(reason, status=resp.status)
                    return await self._read(resp)
        except TimeoutError as exc:
            raise ScrapeTimeout("no complete answer within the timeout") from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise ScrapeConnectError(f"{type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise ScrapeError(f"{type(exc).__name__}: {exc}") from exc

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        length = resp.content_length
        if length is not None and length > self._max_body:
            raise ScrapeError(f"the body is {length} bytes, over the {self._max_body} limit")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > self._max_body:
                raise ScrapeError(f"the body is over the {self._max_body} bytes limit")
            chunks.append(chunk)
        return b"".join(chunks)
