"""A big body's way to the parse worker and its parts' way back, in steps the event loop can
interleave with every other stream.

Everything between the gateway and the worker that is proportional to the body goes through
shared memory, never through the pool's pipe: the pipe pickles a call and its answer in one
step each, and unpickling a 30 MB answer holds the GIL (so stalls the loop) for about a tenth of
a second. Nor does a thread do the copying: a thread that computes takes the GIL back each time
the loop makes a system call, so every send and receive of every stream waits for it. The
gateway's side runs on the loop, one bounded step at a time, and lets the loop run between
two steps:

- the body is copied into a segment one `COPY_BYTES` slice at a time;
- the worker decodes and checks it there, and sends back a small pickle of what the gateway
  reads (the dict, the conversation, the prompt text) in which every long string is a
  reference; the long strings come as UTF-8 in a second segment, cut into `PIECE_CHARS`
  pieces, each decoded on its own, then joined (one copy).

No step costs other streams more than the time of one piece, or of one join of a string.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

from gateway.schemas import Fields

COPY_BYTES = 1 << 20  # the body is copied into shared memory a MiB at a time
LONG_CHARS = 1 << 16  # a string this long travels as UTF-8 pieces, outside the pickle
PIECE_CHARS = 1 << 20  # characters per piece: a piece decodes in about a millisecond


@dataclass(frozen=True, slots=True)
class Answer:
    """The worker's answer for a body it accepted: the small parts, a pickle with the long
    strings left out, and where those are (`segment`, each string's pieces' byte lengths)."""

    fields: Fields
    prompt_tokens: int | None
    skeleton: bytes  # pickle of (data, conversation, prompt_text), long strings by reference
    segment: str | None
    pieces: tuple[tuple[int, ...], ...]


async def body_segment(raw: bytes | bytearray) -> shared_memory.SharedMemory:
    """A new segment holding `raw`, copied a slice at a time (the caller unlinks it)."""
    segment = shared_memory.SharedMemory(create=True, size=max(1, len(raw)))
    try:
        source, target = memoryview(raw), _view(segment)
        for start in range(0, len(raw), COPY_BYTES):
            target[start:start + COPY_BYTES] = source[start:start + COPY_BYTES]
            await asyncio.sleep(0)
    except BaseException:
        _discard(segment)
        raise
    return segment


def read_segment(name: str, size: int) -> bytes:
    """The worker's copy of the body in segment `name` (one copy, in the worker)."""
    segment = shared_memory.SharedMemory(name=name)
    try:
        return bytes(_view(segment)[:size])
    finally:
        segment.close()


class _LongStrings(pickle.Pickler):
    """Pickles with every string of LONG_CHARS or more replaced by its index in `long`
    (the same string object once)."""

    def __init__(self, out: io.BytesIO) -> None:
        super().__init__(out, pickle.HIGHEST_PROTOCOL)
        self.long: list[str] = []
        self._index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:  # noqa: ANN401 - pickle's hook
        if type(obj) is not str or len(obj) < LONG_CHARS:
            return None
        index = self._index.get(id(obj))
        if index is None:
            index = self._index[id(obj)] = len(self.long)
            self.long.append(obj)
        return index


def answer(fields: Fields, prompt_tokens: int | None, parts: tuple[Any, ...]) -> Answer:
    """The worker's side: `parts` as a skeleton pickle and a segment of UTF-8 pieces (the
    segment is left for the gateway to unlink)."""
    out = io.BytesIO()
    pickler = _LongStrings(out)
    pickler.dump(parts)
    encoded = [[text[at:at + PIECE_CHARS].encode("utf-8", "surrogatepass")
                for at in range(0, len(text), PIECE_CHARS)] for text in pickler.long]
    total = sum(len(piece) for pieces in encoded for piece in pieces)
    if not pickler.long:
        return Answer(fields, prompt_tokens, out.getvalue(), None, ())
    segment = shared_memory.SharedMemory(create=True, size=max(1, total))
    try:
        at, target = 0, _view(segment)
        for pieces in encoded:
            for piece in pieces:
                target[at:at + len(piece)] = piece
                at += len(piece)
    except BaseException:
        _discard(segment)
        raise
    name = segment.name
    segment.close()
    return Answer(fields, prompt_tokens, out.getvalue(), name,
                  tuple(tuple(len(piece) for piece in pieces) for pieces in encoded))


class _Resolved(pickle.Unpickler):
    def __init__(self, skeleton: bytes, long: Sequence[str]) -> None:
        super().__init__(io.BytesIO(skeleton))
        self._long = long

    def persistent_load(self, pid: Any) -> str:  # noqa: ANN401 - pickle's hook
        return self._long[int(pid)]


async def parts_of(reply: Answer) -> tuple[Any, ...]:
    """The gateway's side: the parts back, the long strings decoded a piece at a time; the
    answer's segment is unlinked."""
    long: list[str] = []
    if reply.segment is not None:
        segment = shared_memory.SharedMemory(name=reply.segment)
        try:
            at, source = 0, _view(segment)
            for lengths in reply.pieces:
                pieces = []
                for length in lengths:
                    with source[at:at + length] as view:
                        pieces.append(str(view, "utf-8", "surrogatepass"))
                    at += length
                    await asyncio.sleep(0)
                long.append(pieces[0] if len(pieces) == 1 else "".join(pieces))
                await asyncio.sleep(0)
        finally:
            discard_segment(segment)
    parts: tuple[Any, ...] = _Resolved(reply.skeleton, long).load()
    return parts


def discard_segment(segment: shared_memory.SharedMemory) -> None:
    """Closes and unlinks `segment` off the event loop: unmapping and freeing tens of MB takes
    milliseconds, in system calls a thread waits out without the GIL."""
    asyncio.get_running_loop().run_in_executor(None, _discard, segment)


def discard_answer(reply: object) -> None:
    """Unlinks the segment of an answer nobody reads (its request went away meanwhile)."""
    if isinstance(reply, Answer) and reply.segment is not None:
        with contextlib.suppress(FileNotFoundError):
            _discard(shared_memory.SharedMemory(name=reply.segment))


def _view(segment: shared_memory.SharedMemory) -> memoryview:
    view = segment.buf
    if view is None:  # only once closed
        raise ValueError(f"shared memory segment {segment.name} is closed")
    return view


def _discard(segment: shared_memory.SharedMemory) -> None:
    segment.close()
    with contextlib.suppress(FileNotFoundError):
        segment.unlink()
