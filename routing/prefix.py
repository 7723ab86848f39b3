"""Prefix affinity: hash chains over a prompt's blocks, a "who served which block" index, and a
consistent-hash ring with bounded load.

Blocks are of CHARACTERS, not tokens: the gateway has no tokenizer on the hot path, and a chain
must not change when the per-model tokens-per-character calibration moves. The default block of
256 characters is about 64 tokens (four vLLM blocks of 16) at ~4 characters per token; only full
blocks are hashed, as servers only cache full blocks. `RequestCost.prefix_tokens(chars)` turns a
matched length back into tokens.

Block i's hash identifies the root material followed by the UTF-8 of the prompt's first
(i+1) * block_chars characters, so it stands for the whole prefix up to the end of block i. The
root material is keyed by the model and the request's cache_salt: two tenants with different
salts, or two models, never share a hash. Hashes are stable across processes and gateway replicas
(no Python `hash()`, which is randomised per process).

The hash is 64 bits: zlib's CRC-32 (high half) and Adler-32 (low half), both running over the
root material and the prefix, one C call each per block. A chain is only a routing hint (which
backend probably holds a prefix; no KV is ever reused on its say-so), so it need not be
cryptographic; SHA-256, with a copy and a digest per block, took 1.7 times as long for a 32k-
character prompt, on every routing decision. Two CRC-32s with different seeds would not do: CRC
is affine, so the second would add nothing but the length. Ring points, built once per fleet,
still use SHA-256.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from hashlib import sha256
from zlib import adler32, crc32

DEFAULT_BLOCK_CHARS = 256
DEFAULT_MAX_BLOCKS = 128  # the first 32k characters decide affinity; hashing more costs time


def _int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True, slots=True)
class PrefixChain:
    """The hash chain of one prompt: `blocks[i]` stands for characters [0, (i+1) * block_chars)."""

    root: int
    blocks: tuple[int, ...]
    block_chars: int

    def key(self, depth: int) -> int:
        """The hash of the first `depth` blocks (the root for a prompt shorter than one block): the
        routing key for consistent hashing, where `depth` sets how much prefix must agree."""
        if not self.blocks or depth <= 0:
            return self.root
        return self.blocks[min(depth, len(self.blocks)) - 1]

    def chars(self, blocks: int) -> int:
        """Characters covered by the first `blocks` blocks."""
        return blocks * self.block_chars


def conversation_text(messages: Iterable[tuple[str, str]]) -> str:
    """One canonical string for a chat conversation, given (role, content) pairs. Roles are part of
    the prefix; ASCII unit and record separators, which chat text practically never contains,
    keep the role/content boundaries unambiguous. A later turn extends an earlier one's string."""
    return "".join(f"{role}\x1f{content}\x1e" for role, content in messages)


def prefix_chain(
    text: str,
    *,
    model: str,
    cache_salt: str | None = None,
    block_chars: int = DEFAULT_BLOCK_CHARS,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
) -> PrefixChain:
    if block_chars < 1:
        raise ValueError("block_chars must be >= 1")
    salt = b"" if cache_salt is None else b"\x01" + cache_salt.encode()
    material = b"kvgate-prefix\x00" + model.encode() + b"\x00" + salt + b"\x00"
    crc, adler = crc32(material), adler32(material)
    root = crc << 32 | adler
    end = min(len(text) // block_chars, max_blocks) * block_chars
    if not end:
        return PrefixChain(root, (), block_chars)
    blocks: list[int] = []
    append = blocks.append
    head = text[:end]
    if head.isascii():  # one byte per character: encode once, hash byte slices
        data = head.encode()
        for start in range(0, end, block_chars):
            block = data[start : start + block_chars]
            crc, adler = crc32(block, crc), adler32(block, adler)
            append(crc << 32 | adler)
    else:
        for start in range(0, end, block_chars):
            block = head[start : start + block_chars].encode()
            crc, adler = crc32(block, crc), adler32(block, adler)
            append(crc << 32 | adler)
    return PrefixChain(root, tuple(blocks), block_chars)


class PrefixIndex:
    """Which backend recently served which prefix block: a guess at what each one has cached.

    One LRU per backend, capped at `blocks_per_backend` entries: set it near a backend's KV
    capacity in chain blocks (kv_total_blocks * block_size / (block_chars * tokens per char)),
    beyond which the backend has evicted them too. The default, 8,192 blocks of 256 characters,
    is about 500k tokens. The router records a chain against the backend it picked; `matches`
    answers, for every backend at once, how many LEADING blocks of a chain it likely holds.
    Memory is bounded by backends x the cap.
    """

    def __init__(self, blocks_per_backend: int = 8192) -> None:
        if blocks_per_backend < 1:
            raise ValueError("blocks_per_backend must be >= 1")
        self._cap = blocks_per_backend
        self._lru: dict[str, OrderedDict[int, None]] = {}
        # Owners of each block, as a bit mask over backends: every record and eviction updates
        # it, and a small int is built, tested and combined far faster than a set of ids. Each
        # backend with entries has a bit; a forgotten backend's bit is cleared everywhere and
        # handed to the next newcomer, so masks stay as wide as the live fleet.
        self._holders: dict[int, int] = {}
        self._bits: dict[str, int] = {}  # backend id -> its bit (a power of two)
        self._ids: dict[int, str] = {}  # and back
        self._spare_bits: list[int] = []
        self._next_bit = 1

    def __len__(self) -> int:
        return sum(len(lru) for lru in self._lru.values())

    def _bit(self, backend_id: str) -> int:
        bit = self._bits.get(backend_id)
        if bit is None:
            if self._spare_bits:
                bit = self._spare_bits.pop()
            else:
                bit, self._next_bit = self._next_bit, self._next_bit << 1
            self._bits[backend_id] = bit
            self._ids[bit] = backend_id
        return bit

    def _owners(self, mask: int) -> list[str]:
        """The backend ids of the bits set in `mask`."""
        ids: list[str] = []
        while mask:
            bit = mask & -mask  # the lowest set bit
            ids.append(self._ids[bit])
            mask ^= bit
        return ids

    def record(self, backend_id: str, chain: PrefixChain) -> None:
        lru = self._lru.get(backend_id)
        if lru is None:
            lru = self._lru[backend_id] = OrderedDict()
        mine = self._bit(backend_id)
        holders = self._holders
        move, owners_of = lru.move_to_end, holders.get
        # Deepest block first, so the leading blocks are the most recent and evicted last: losing
        # the tail of a prefix costs a little, losing its head costs every block after it.
        for h in reversed(chain.blocks):
            if h in lru:
                move(h)
            else:
                lru[h] = None
                holders[h] = owners_of(h, 0) | mine
        excess = len(lru) - self._cap
        if excess > 0:
            evict, others = lru.popitem, ~mine
            for _ in range(excess):
                old = evict(False)[0]
                owners = holders[old] & others  # every block in a backend's LRU names it
                if owners:
                    holders[old] = owners
                else:
                    del holders[old]

    def forget(self, backend_id: str) -> None:
        """Drop a backend's entries (it restarted, or left the fleet: its cache is gone)."""
        lru = self._lru.pop(backend_id, None)
        bit = self._bits.pop(backend_id, None)
        if bit is None:
            return
        holders, others = self._holders, ~bit
        for h in lru or ():
            owners = holders[h] & others  # every block in a backend's LRU names it
            if owners:
                holders[h] = owners
            else:
                del holders[h]
        del self._ids[bit]
        self._spare_bits.append(bit)

    def matched_blocks(self, backend_id: str, chain: PrefixChain) -> int:
        lru = self._lru.get(backend_id)
        if lru is None:
            return 0
        depth = 0
        for h in chain.blocks:
            if h not in lru:
                break
            depth += 1
        return depth

    def matches(self, chain: PrefixChain) -> dict[str, int]:
        """Leading blocks of `chain` each backend likely holds; backends with none are absent."""
        result: dict[str, int] = {}
        blocks = chain.blocks
        owners_of = self._holders.get
        if not blocks or not (alive := owners_of(blocks[0], 0)):
            return result
        # `alive`: the backends holding every block so far.
        for depth in range(1, len(blocks)):
            gone = alive & ~owners_of(blocks[depth], 0)
            if not gone:
                continue
            for backend_id in self._owners(gone):
                result[backend_id] = depth
            alive ^= gone
            if not alive:
                return result
        for backend_id in self._owners(alive):
            result[backend_id] = len(blocks)
        return result


def _point(label: str) -> int:
    return _int64(sha256(b"kvgate-ring\x00" + label.encode()).digest())


class HashRing:
    """Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018).

    `pick` walks clockwise from the key and takes the first eligible node whose load stays within
    `ceil(bound * (total load + 1) / eligible nodes)`, so a hot key spills to its next nodes rather
    than piling onto one. Nodes get `vnodes * weight` points (at least one). Immutable: build a new
    ring when the fleet changes (cheap: one hash per point).
    """

    def __init__(self, nodes: Mapping[str, float] | Iterable[str], *, vnodes: int = 64) -> None:
        weights = dict(nodes) if isinstance(nodes, Mapping) else dict.fromkeys(nodes, 1.0)
        points = sorted(
            (_point(f"{node}#{i}"), node)
            for node, weight in weights.items()
            for i in range(max(1, round(vnodes * weight)))
        )
        self._hashes = [h for h, _ in points]
        self._owners = [node for _, node in points]
        self.nodes = frozenset(weights)

    def owner(self, key: int) -> str | None:
        """The node a key maps to with no load bound (None for an empty ring)."""
        if not self._hashes:
            return None
        return self._owners[bisect_right(self._hashes, key) % len(self._hashes)]

    def pick(self, key: int, loads: Mapping[str, float], *, bound: float = 1.25) -> str | None:
        """`loads` maps the ELIGIBLE nodes (healthy, serving the model) to their current load,
        e.g. in-flight requests. Nodes not on the ring are ignored. None when none is eligible."""
        eligible = [n for n in loads if n in self.nodes]
        if not eligible:
            return None
        cap = math.ceil(bound * (sum(loads[n] for n in eligible) + 1) / len(eligible))
        seen: set[str] = set()
        count = len(self._hashes)
        start = bisect_right(self._hashes, key)
        for step in range(count):
            node = self._owners[(start + step) % count]
            if node in seen or node not in loads:
                continue
            if loads[node] + 1 <= cap:
                return node
            seen.add(node)
            if len(seen) == len(eligible):
                break
        # Every eligible node is at its bound (only possible with bound < 1): least loaded wins.
        return min(eligible, key=lambda n: (loads[n], n))
