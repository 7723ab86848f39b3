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
  reads (the dict, the conversation, the prompt text) in which every long string and every
  long list (a conversation of thousands of messages) is a reference; in a second segment the
  long strings come as UTF-8 cut into `PIECE_CHARS` pieces, each decoded on its own, then
  joined (one copy), and the long lists as pickles of `BATCH_ITEMS` items, unpickled one by
  one.

No step costs other streams more than the time of one piece or batch, or of one join of a
string.
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
LONG_CHARS = 1 << 14  # a string this long travels as UTF-8 pieces, outside the pickle
PIECE_CHARS = 1 << 20  # characters per piece: a piece decodes in about a millisecond
BATCH_ITEMS = 256  # a longer list travels as pickles of this many items each
YIELD_BYTES = 1 << 20  # the loop runs again after about this much decoding


@dataclass(frozen=True, slots=True)
class Answer:
    """The worker's answer for a body it accepted: the small parts, a pickle with the long
    strings and lists left out, and where those are in `segment`: each string's pieces' and
    each list's batches' byte lengths, one after the other."""

    fields: Fields
    prompt_tokens: int | None
    skeleton: bytes  # pickle of (data, conversation, prompt_text), long objects by reference
    segment: str | None
    strings: tuple[tuple[int, ...], ...]
    lists: tuple[tuple[int, ...], ...]


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


class _Refs:
    """The objects that travel outside a pickle: strings of LONG_CHARS or more (as UTF-8
    pieces) and lists of more than BATCH_ITEMS (as pickles of BATCH_ITEMS items each), each
    object once, by (kind, index)."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.lists: list[list[Any]] = []
        self._ids: dict[int, tuple[str, int]] = {}  # the tables keep the objects, so ids hold

    def ref(self, obj: object) -> tuple[str, int] | None:
        kind = type(obj)
        if kind is str and len(obj) >= LONG_CHARS:  # type: ignore[arg-type]
            table: list[Any] = self.strings
        elif kind is list and len(obj) > BATCH_ITEMS:  # type: ignore[arg-type]
            table = self.lists
        else:
            return None
        ref = self._ids.get(id(obj))
        if ref is None:
            ref = self._ids[id(obj)] = ("s" if table is self.strings else "l", len(table))
            table.append(obj)
        return ref


class _Pickler(pickle.Pickler):
    def __init__(self, out: io.BytesIO, refs: _Refs) -> None:
        super().__init__(out, pickle.HIGHEST_PROTOCOL)
        self._refs = refs

    def persistent_id(self, obj: Any) -> tuple[str, int] | None:  # noqa: ANN401 - pickle's hook
        return self._refs.ref(obj)


def _dumps(obj: object, refs: _Refs) -> bytes:
    out = io.BytesIO()
    _Pickler(out, refs).dump(obj)
    return out.getvalue()


def answer(fields: Fields, prompt_tokens: int | None, parts: tuple[Any, ...]) -> Answer:
    """The worker's side: `parts` as a small skeleton pickle, and a segment holding the long
    strings' UTF-8 pieces, then the long lists' batches (the segment is left for the gateway
    to unlink)."""
    refs = _Refs()
    skeleton = _dumps(parts, refs)
    batches: list[list[bytes]] = []
    while len(batches) < len(refs.lists):  # a batch can name further lists
        items = refs.lists[len(batches)]
        batches.append([_dumps(items[at:at + BATCH_ITEMS], refs)
                        for at in range(0, len(items), BATCH_ITEMS)])
    encoded = [[text[at:at + PIECE_CHARS].encode("utf-8", "surrogatepass")
                for at in range(0, len(text), PIECE_CHARS)] for text in refs.strings]
    if not encoded and not batches:
        return Answer(fields, prompt_tokens, skeleton, None, (), ())
    blobs = [blob for group in (*encoded, *batches) for blob in group]
    segment = shared_memory.SharedMemory(create=True, size=max(1, sum(map(len, blobs))))
    try:
        at, target = 0, _view(segment)
        for blob in blobs:
            target[at:at + len(blob)] = blob
            at += len(blob)
    except BaseException:
        _discard(segment)
        raise
    name = segment.name
    segment.close()
    def lengths(groups: list[list[bytes]]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(len(blob) for blob in group) for group in groups)

    return Answer(fields, prompt_tokens, skeleton, name, lengths(encoded), lengths(batches))


class _Resolved(pickle.Unpickler):
    def __init__(self, data: bytes, strings: Sequence[str], lists: Sequence[list[Any]]) -> None:
        super().__init__(io.BytesIO(data))
        self._tables = {"s": strings, "l": lists}

    def persistent_load(self, pid: Any) -> Any:  # noqa: ANN401 - pickle's hook
        kind, index = pid
        return self._tables[kind][index]


async def parts_of(reply: Answer) -> tuple[Any, ...]:
    """The gateway's side: the parts back, the long strings decoded a piece at a time and the
    long lists unpickled a batch at a time, the loop let run after every YIELD_BYTES of
    either; the answer's segment is unlinked."""
    strings: list[str] = []
    lists: list[list[Any]] = [[] for _ in reply.lists]  # filled below, in any order
    if reply.segment is not None:
        segment = shared_memory.SharedMemory(name=reply.segment)
        try:
            at, source, done = 0, _view(segment), 0
            for lengths in reply.strings:
                pieces = []
                for length in lengths:
                    with source[at:at + length] as view:
                        pieces.append(str(view, "utf-8", "surrogatepass"))
                    at, done = at + length, done + length
                    if done >= YIELD_BYTES:
                        done = 0
                        await asyncio.sleep(0)
                strings.append(pieces[0] if len(pieces) == 1 else "".join(pieces))
            for items, lengths in zip(lists, reply.lists, strict=True):
                for length in lengths:
                    items.extend(_Resolved(bytes(source[at:at + length]), strings, lists).load())
                    at, done = at + length, done + length
                    if done >= YIELD_BYTES:
                        done = 0
                        await asyncio.sleep(0)
        finally:
            discard_segment(segment)
    parts: tuple[Any, ...] = _Resolved(reply.skeleton, strings, lists).load()
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
