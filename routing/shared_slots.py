"""Versioned slots in a shared buffer: one writer per slot, any number of readers, no torn reads.

A slot is a seqlock: a 64-bit sequence number, the payload's length, then the payload. The writer
makes the sequence odd, writes length and payload, then makes it even again; a reader copies the
payload between two reads of the sequence and keeps the copy only when both read the same even
number. A reader never blocks the writer and never sees half of one write and half of another.
A writer that died in the middle of a write leaves the sequence odd: readers then get None after a
bounded number of tries (the slot reads as empty), never a hang.

The buffer is any writable memoryview (a `multiprocessing.shared_memory` segment's `buf` between
processes, a bytearray in tests); the slots own `nbytes(count, size)` bytes of it from `offset`.
"""

from __future__ import annotations

import struct

_SEQ = struct.Struct("<Q")
_LEN = struct.Struct("<I")
HEADER = 16  # sequence (8), length (4), padding (4): payloads start 8-byte aligned
TRIES = 1000


class SlotTooSmall(ValueError):
    """A payload larger than the slot's capacity."""


class Slots:
    """`count` slots of `size` payload bytes each, in `buf` from `offset`."""

    __slots__ = ("_buf", "_offset", "_count", "_size")

    def __init__(self, buf: memoryview, count: int, size: int, offset: int = 0) -> None:
        if count < 0 or size < 1:
            raise ValueError("need count >= 0 and size >= 1")
        if offset % 8 or offset + self.nbytes(count, size) > len(buf):
            raise ValueError("the slots do not fit the buffer (or are not 8-byte aligned)")
        self._buf = buf
        self._offset = offset
        self._count = count
        self._size = size

    @staticmethod
    def nbytes(count: int, size: int) -> int:
        return count * _stride(size)

    @property
    def count(self) -> int:
        return self._count

    def _at(self, i: int) -> int:
        if not 0 <= i < self._count:
            raise IndexError(f"slot {i} of {self._count}")
        return self._offset + i * _stride(self._size)

    def write(self, i: int, payload: bytes) -> int:
        """Stores `payload` in slot `i` (only one process may write a given slot); returns the
        slot's new sequence number."""
        if len(payload) > self._size:
            raise SlotTooSmall(f"{len(payload)} bytes for a slot of {self._size}")
        at, buf = self._at(i), self._buf
        seq: int = _SEQ.unpack_from(buf, at)[0]
        if seq & 1:  # a writer before this one died mid-write: start from the next even
            seq += 1
        _SEQ.pack_into(buf, at, seq + 1)  # odd: a write is under way
        _LEN.pack_into(buf, at + 8, len(payload))
        buf[at + HEADER : at + HEADER + len(payload)] = payload
        _SEQ.pack_into(buf, at, seq + 2)  # even: done
        return seq + 2

    def sequence(self, i: int) -> int:
        """Slot `i`'s sequence number: 0 never written, odd while a write is under way."""
        seq: int = _SEQ.unpack_from(self._buf, self._at(i))[0]
        return seq

    def read(self, i: int) -> tuple[int, bytes] | None:
        """(sequence, payload) of slot `i`'s last whole write; None when it was never written or
        a write stayed under way for every try."""
        at, buf = self._at(i), self._buf
        for _ in range(TRIES):
            before = _SEQ.unpack_from(buf, at)[0]
            if before & 1:
                continue
            if before == 0:
                return None
            length = _LEN.unpack_from(buf, at + 8)[0]
            if length > self._size:  # read across a write: the sequence below cannot match
                continue
            payload = bytes(buf[at + HEADER : at + HEADER + length])
            if _SEQ.unpack_from(buf, at)[0] == before:
                return before, payload
        return None


def _stride(size: int) -> int:
    return HEADER + (size + 7) // 8 * 8
