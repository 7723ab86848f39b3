"""Sparse, L2-normalised embedding vectors: the one shape the embedders produce and the stores keep.

A vector is a `dict[int, float]` from dimension to value, normalised to unit length, so cosine
similarity is a plain dot product over the smaller vector's entries. The hashing embedder's vectors
have a few hundred entries in a space of 2**20; an embedding model's dense vector is stored the
same way, one entry per dimension.

On the wire (Redis) a vector is its count, then its indices as little-endian uint32, then its values
as little-endian float32.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array

Vector = dict[int, float]

_COUNT = struct.Struct("<I")


def normalised(vector: Vector) -> Vector:
    """`vector` scaled to unit length, zero entries dropped; empty when it has no length."""
    norm = math.sqrt(sum(value * value for value in vector.values()))
    if norm == 0.0:
        return {}
    return {index: value / norm for index, value in vector.items() if value != 0.0}


def cosine(a: Vector, b: Vector) -> float:
    """Cosine similarity of two normalised vectors (0.0 when either is empty)."""
    if len(a) > len(b):
        a, b = b, a
    get = b.get
    return sum(value * get(index, 0.0) for index, value in a.items())


def encode_vector(vector: Vector) -> bytes:
    indices = array("I", vector.keys())
    values = array("f", vector.values())
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        indices.byteswap()
        values.byteswap()
    return _COUNT.pack(len(vector)) + indices.tobytes() + values.tobytes()


def decode_vector(raw: bytes) -> Vector:
    """The vector `encode_vector` wrote; ValueError when `raw` is not one."""
    if len(raw) < _COUNT.size:
        raise ValueError("a vector needs its 4-byte count")
    (count,) = _COUNT.unpack_from(raw)
    if len(raw) != _COUNT.size + 8 * count:
        raise ValueError(f"a vector of {count} entries needs {_COUNT.size + 8 * count} bytes,"
                         f" not {len(raw)}")
    indices = array("I")
    indices.frombytes(raw[_COUNT.size:_COUNT.size + 4 * count])
    values = array("f")
    values.frombytes(raw[_COUNT.size + 4 * count:])
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        indices.byteswap()
        values.byteswap()
    return dict(zip(indices, values, strict=True))
