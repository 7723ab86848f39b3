"""An approximate radix tree of the request text each worker was sent, as the SGLang and vLLM
routers' `cache_aware` policy keeps one, at the granularity of the prefix chain's blocks.

Block i of a prompt's chain (routing/prefix.py) stands for the whole text up to the end of that
block, so the set of chain hashes a worker was sent is exactly a radix tree of its texts cut at
block boundaries: a shared node is a shared hash, a branch is where two chains' hashes part. Each
worker's tree is an LRU over its hashes, deepest blocks inserted first so that the leading blocks
are the most recent and evicted last (a router's tree evicts leaves first); past `max_chars`
characters (blocks x block characters) the least recently used go. The size of a worker's tree,
which `cache_aware` reads to send unmatched text to the emptiest worker, is its characters held.
Pure: values in, values out; the tree is the policy's own state, written by its dispatch hook.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from routing.prefix import PrefixChain

DEFAULT_MAX_TREE_CHARS = 1 << 26  # the SGLang router's --max-tree-size, in characters


class ApproxTree:
    def __init__(self, max_chars: int = DEFAULT_MAX_TREE_CHARS) -> None:
        if max_chars < 1:
            raise ValueError("max_chars must be >= 1")
        self._max_chars = max_chars
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._block_chars: dict[str, int] = {}

    def insert(self, worker: str, chain: PrefixChain) -> None:
        """The text of `chain` was routed to `worker`."""
        if not chain.blocks:
            return
        lru = self._blocks.get(worker)
        if lru is None:
            lru = self._blocks[worker] = OrderedDict()
        self._block_chars[worker] = chain.block_chars
        move = lru.move_to_end
        for h in reversed(chain.blocks):
            if h in lru:
                move(h)
            else:
                lru[h] = None
        cap = max(1, self._max_chars // chain.block_chars)
        while len(lru) > cap:
            lru.popitem(last=False)

    def matched_chars(self, worker: str, chain: PrefixChain) -> int:
        """Characters of the chain's leading blocks the worker's tree holds."""
        lru = self._blocks.get(worker)
        if not lru:
            return 0
        depth = 0
        for h in chain.blocks:
            if h not in lru:
                break
            depth += 1
        return depth * chain.block_chars

    def size_chars(self, worker: str) -> int:
        """Characters the worker's tree holds (0 for a worker sent nothing yet)."""
        lru = self._blocks.get(worker)
        return len(lru) * self._block_chars[worker] if lru else 0

    def forget(self, workers: Iterable[str]) -> None:
        for w in workers:
            self._blocks.pop(w, None)
            self._block_chars.pop(w, None)
