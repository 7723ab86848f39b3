"""The two clocks of one relayed stream: a backend gone silent, and a client that stopped reading.

- The backend sent no byte for `idle_s` while the relay waited on it: the upstream body gets a
  `StreamIdle` error, so the relay's pending read raises it and the stream ends with an SSE error
  event and `[DONE]` (the relay then closes the upstream connection: the backend frees its KV).
- A write to the client has been blocked for `write_s` (its socket buffers are full: it reads
  nothing): the client's connection is aborted, which ends the relay's write and its handler as a
  client disconnect. Time spent blocked on the client never counts as the backend's silence.
- `stop(message)` ends the stream the same way from outside (a `StreamStopped` error, e.g. at
  shutdown).

One timer per stream, rescheduled only when it fires, never per chunk: the relay's hot loop only
stamps two floats (`read_since` after each chunk, `write_since` around each write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

_SLACK_S = 0.001  # the loop's timers tick in milliseconds


class StreamCut(Exception):  # noqa: N818 - the stream was cut, not an error of the caller's
    """Ends a relayed stream: raised by the upstream body's pending read."""


class StreamIdle(StreamCut):
    """The backend sent nothing for the stream idle timeout."""


class StreamStopped(StreamCut):
    """The gateway ended the stream itself (`StreamWatch.stop`); `code` is the error event's."""

    def __init__(self, message: str, code: str = "stream_stopped") -> None:
        super().__init__(message)
        self.code = code


class StreamWatch:
    """Watches one stream from the relay's first read to `close`."""

    __slots__ = ("_content", "_handle", "_idle_s", "_idled", "_loop", "_on_client_stuck",
                 "_write_s", "client_stuck", "read_since", "write_since")

    def __init__(self, loop: asyncio.AbstractEventLoop, content: aiohttp.StreamReader, *,
                 idle_s: float, write_s: float, on_client_stuck: Callable[[], None]) -> None:
        self._loop = loop
        self._content = content
        self._idle_s = idle_s
        self._write_s = write_s
        self._on_client_stuck = on_client_stuck
        self.read_since = loop.time()  # the relay waits on the backend from then on
        self.write_since: float | None = None  # a write to the client started then, pending
        self.client_stuck = False  # the client was cut off for reading nothing
        self._idled = False  # the backend's silence ended the stream
        self._handle: asyncio.TimerHandle | None = loop.call_at(
            self.read_since + min(idle_s, write_s), self._check)

    def stop(self, message: str, code: str = "stream_stopped") -> None:
        """Ends the stream: the relay's next (or pending) read raises `StreamStopped`."""
        self._content.set_exception(StreamStopped(message, code))

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        now = self._loop.time()
        writing = self.write_since
        if writing is not None:
            if now - writing >= self._write_s - _SLACK_S:
                self._handle = None
                self.client_stuck = True
                self._on_client_stuck()
                return
            # The write may end soon: the backend's silence is looked at again by then.
            due = min(writing + self._write_s, now + self._idle_s)
        elif self._idled:  # only the writes of the stream's end are left to watch
            due = now + self._write_s
        else:
            if now - self.read_since >= self._idle_s - _SLACK_S:
                self._idled = True
                self._content.set_exception(
                    StreamIdle(f"no bytes from the backend for {self._idle_s:g} s"))
                due = now + self._write_s
            else:
                due = self.read_since + self._idle_s
        self._handle = self._loop.call_at(due, self._check)
