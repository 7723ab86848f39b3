"""A paged KV-cache block pool with prefix caching, after vLLM V1's `BlockPool`.

- Block 0 is the reserved null block: it is never handed out and counts as used, so
  `num_free + num_used == num_blocks` and usage is `1 - num_free / (num_blocks - 1)` as in vLLM.
- A block is either referenced by at least one request (`ref_cnt > 0`) or in the free queue.
- A full block may carry a hash identifying its tokens and everything before them (a hash chain,
  see `chain_hashes`). Freed hashed blocks stay findable by that hash until they are handed out
  again: the free queue is ordered least-recently-used first, and allocation takes from its head,
  dropping the block's hash then. Unhashed blocks hold nothing reusable, so they are freed to the
  head (vLLM appends them to the tail as well; reusing them first only spares cached blocks).
- Only the first block registered under a hash is findable by it; a later duplicate (two requests
  computing the same prefix at once) simply stays unhashed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

NULL_BLOCK = 0


def chain_hashes(parent: int, tokens: Sequence[int], block_size: int) -> list[int]:
    """Hashes of the full blocks of `tokens`, each chained to the one before it.

    `parent` is the hash of the block before `tokens[0]`, or the root key (model, adapter, salt)
    at the start of a sequence. Python's hash of a tuple of ints is the same in every process.
    """
    out: list[int] = []
    append = out.append
    # Full blocks only, as tuples: zip stops at the partial last one.
    for block in zip(*[iter(tokens)] * block_size, strict=False):
        parent = hash((parent, block))
        append(parent)
    return out


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError("a block pool needs 2 blocks or more (one is the reserved null block)")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt: list[int] = [0] * num_blocks
        self.ref_cnt[NULL_BLOCK] = 1
        self.block_hash: dict[int, int] = {}  # block id -> hash, for hashed blocks
        self.cached: dict[int, int] = {}  # hash -> block id
        # Free blocks, least recently used first; values unused (an ordered set).
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / (self.num_blocks - 1)

    def lookup(self, hashes: Iterable[int]) -> list[int]:
        """Blocks holding the longest cached run of `hashes`, from the first one."""
        found: list[int] = []
        if not self.enable_caching:
            return found
        cached = self.cached
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` sit in the free queue (taking them shrinks the free count)."""
        ref_cnt = self.ref_cnt
        return sum(1 for b in blocks if ref_cnt[b] == 0)

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cached blocks found by `lookup`."""
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> list[int]:
        """`n` blocks from the head of the free queue; their old hashes are forgotten."""
        if n > len(self.free_queue):
            raise ValueError(f"cannot allocate {n} blocks, {len(self.free_queue)} free")
        out: list[int] = []
        append, popitem, ref_cnt = out.append, self.free_queue.popitem, self.ref_cnt
        drop_hash, cached = self.block_hash.pop, self.cached
        for _ in range(n):
            b = popitem(False)[0]
            h = drop_hash(b, None)
            if h is not None and cached.get(h) == b:
                del cached[h]
            ref_cnt[b] = 1
            append(b)
        return out

    def allocate_one(self) -> int:
        """One block; the decode path's common case, without list building."""
        b = self.free_queue.popitem(False)[0]
        if self.block_hash:
            h = self.block_hash.pop(b, None)
            if h is not None and self.cached.get(h) == b:
                del self.cached[h]
        self.ref_cnt[b] = 1
        return b

    def register(self, block: int, block_hash: int) -> None:
        """Record that full `block` holds the tokens identified by `block_hash`."""
        if not self.enable_caching or block in self.block_hash or block_hash in self.cached:
            return
        self.block_hash[block] = block_hash
        self.cached[block_hash] = block

    def register_range(self, blocks: Sequence[int], hashes: Sequence[int], start: int,
                       end: int) -> None:
        """`register(blocks[i], hashes[i])` for i in [start, end), in that order."""
        if not self.enable_caching:
            return
        block_hash, cached = self.block_hash, self.cached
        for i in range(start, end):
            b, h = blocks[i], hashes[i]
            if b in block_hash or h in cached:
                continue
            block_hash[b] = h
            cached[h] = b

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each of a request's blocks, given in block-table order.

        The tail of a sequence is the least likely to be shared, so blocks go to the free queue in
        reverse order and the tail is evicted first.
        """
        ref_cnt, queue, block_hash = self.ref_cnt, self.free_queue, self.block_hash
        to_head = queue.move_to_end
        for b in reversed(blocks):
            left = ref_cnt[b] - 1
            ref_cnt[b] = left
            if not left:
                queue[b] = None
                if b not in block_hash:
                    to_head(b, False)

    def invariant_violations(self) -> list[str]:
        """Consistency problems, for tests: an empty list when the pool is sound."""
        problems: list[str] = []
        if self.ref_cnt[NULL_BLOCK] != 1 or NULL_BLOCK in self.free_queue:
            problems.append("the null block was handed out")
        for b in range(1, self.num_blocks):
            if (self.ref_cnt[b] == 0) != (b in self.free_queue):
                problems.append(f"block {b}: ref_cnt {self.ref_cnt[b]} but in free queue "
                                f"{b in self.free_queue}")
            if self.ref_cnt[b] < 0:
                problems.append(f"block {b}: negative ref_cnt")
        for h, b in self.cached.items():
            if self.block_hash.get(b) != h:
                problems.append(f"cached hash of block {b} does not match the block's hash")
        return problems
