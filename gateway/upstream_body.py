"""A request body on its way to a backend, a slice at a time when it is big.

aiohttp sends a body given as bytes in one write: it joins the request's head and the whole
body into one buffer (a copy of the body, holding the event loop for tens of milliseconds at
30 MB), and slices a bytearray to its length first (another copy). `upstream_body` gives a body
past `SLICE_BYTES` as a payload of the same length that writes `SLICE_BYTES` at a time, each
write waiting for the connection to drain, so that relaying every other stream goes on between
two slices; the backend sees the same bytes and the same Content-Length.
"""

from __future__ import annotations

from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

SLICE_BYTES = 256 * 1024


class SlicedPayload(Payload):
    """`value` written in slices of `SLICE_BYTES`, never copied whole."""

    _value: bytes | bytearray

    def __init__(self, value: bytes | bytearray) -> None:
        super().__init__(value, content_type="application/json")
        self._size = len(value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._value.decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter,
                                content_length: int | None) -> None:
        view = memoryview(self._value)
        end = len(view) if content_length is None else min(content_length, len(view))
        for start in range(0, end, SLICE_BYTES):
            await writer.write(view[start:min(start + SLICE_BYTES, end)])


def upstream_body(body: bytes | bytearray) -> bytes | bytearray | SlicedPayload:
    """What the client session is given to send `body`."""
    if len(body) <= SLICE_BYTES:
        return body
    return SlicedPayload(body)
