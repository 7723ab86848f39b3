"""A paged KV-cache block pool with prefix caching, after vLLM V1's `BlockPool`.

- Block 0 is the reserved null block: it is never handed out and counts as used, so
  `num_free + num_used == num_blocks` and usage is `1 - num_free / (num_blocks - 1)` as in vLLM.
- A block is either referenced by at least one request (`ref_cnt > 0`) or in the free queue.
- A full block may carry a hash identifying its tokens and everything before them (a hash chain,
  see `chain_hashes`). Freed hashed blocks stay findable by that hash until they are handed out
  again: the free queue is ordered least-recently-used first, and allocation takes from its head,
  dropping the block's hash then. Unhashed blocks hold nothing reusable, so they are freed to the
  head (vLLM appends them to the tail as well; reusing them first only spares cached blocks).
  So the queue is always its unhashed blocks followed by its hashed ones, and is kept as two
  parts: a list of unhashed blocks used as a stack (its top is the head, so taking and freeing
  them are slices and appends) and an ordered dict of hashed blocks to their hashes (evicting one
  is a `popitem` that already knows which hash to forget).
- Only the first block registered under a hash is findable by it; a later duplicate (two requests
  computing the same prefix at once) simply stays unhashed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from operator import itemgetter

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
        # Block id -> its hash, None for unhashed blocks (a list: indexing beats a dict lookup).
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> block id
        # The free queue in two parts (module docstring): unhashed blocks, the queue's head, as a
        # stack whose top is the head; then hashed blocks, least recently used first, -> hash.
        self._unhashed: list[int] = list(range(num_blocks - 1, NULL_BLOCK, -1))
        self._lru: OrderedDict[int, int] = OrderedDict()

    @property
    def num_free(self) -> int:
        return len(self._unhashed) + len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._unhashed) - len(self._lru)

    def usage(self) -> float:
        return 1.0 - (len(self._unhashed) + len(self._lru)) / (self.num_blocks - 1)

    def free_queue(self) -> list[int]:
        """The free blocks in allocation order (the head first), for tests."""
        return [*reversed(self._unhashed), *self._lru]

    def lookup(self, hashes: Iterable[int]) -> list[int]:
        """Blocks holding the longest cached run of `hashes`, from the first one."""
        found: list[int] = []
        if not self.enable_caching:
            return found
        get, append = self.cached.get, found.append
        for h in hashes:
            block = get(h)
            if block is None:
                break
            append(block)
        return found

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` sit in the free queue (taking them shrinks the free count)."""
        ref_cnt = self.ref_cnt
        n = 0
        for b in blocks:
            if not ref_cnt[b]:
                n += 1
        return n

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cached blocks found by `lookup`."""
        ref_cnt, lru = self.ref_cnt, self._lru
        for b in blocks:
            count = ref_cnt[b]
            if not count:
                del lru[b]  # a found block is hashed: free, it is in the LRU part
            ref_cnt[b] = count + 1

    def allocate(self, n: int) -> list[int]:
        """`n` blocks from the head of the free queue; their old hashes are forgotten."""
        stack = self._unhashed
        have = len(stack)
        if n <= have:
            out = stack[have - n:]
            del stack[have - n:]
            out.reverse()
        else:
            lru = self._lru
            if n > have + len(lru):
                raise ValueError(f"cannot allocate {n} blocks, {have + len(lru)} free")
            out = stack[::-1]
            stack.clear()
            append, popitem = out.append, lru.popitem
            block_hash, cached = self.block_hash, self.cached
            for _ in range(n - have):
                b, h = popitem(False)
                del cached[h]
                block_hash[b] = None
                append(b)
        ref_cnt = self.ref_cnt
        for b in out:
            ref_cnt[b] = 1
        return out

    def allocate_one(self) -> int:
        """One block; the decode path's common case, without list building."""
        if self._unhashed:
            b = self._unhashed.pop()
        else:
            b, h = self._lru.popitem(False)
            del self.cached[h]
            self.block_hash[b] = None
        self.ref_cnt[b] = 1
        return b

    def register(self, block: int, block_hash: int) -> None:
        """Record that full `block` holds the tokens identified by `block_hash`."""
        if (not self.enable_caching or self.block_hash[block] is not None
                or block_hash in self.cached):
            return
        self.block_hash[block] = block_hash
        self.cached[block_hash] = block

    def register_range(self, blocks: Sequence[int], hashes: Sequence[int], start: int,
                       end: int) -> None:
        """`register(blocks[i], hashes[i])` for i in [start, end), in that order."""
        if not self.enable_caching:
            return
        block_hash, cached = self.block_hash, self.cached
        if end - start > 2:
            # In bulk when no block and no hash is taken yet (the usual case); a chain's hashes
            # are distinct (each identifies a longer prefix), and so are a request's blocks.
            bs, hs = blocks[start:end], hashes[start:end]
            if cached.keys().isdisjoint(hs) and itemgetter(*bs)(block_hash).count(None) == len(bs):
                for b, h in zip(bs, hs, strict=True):
                    block_hash[b] = h
                cached.update(zip(hs, bs, strict=True))
                return
        for i in range(start, end):
            b, h = blocks[i], hashes[i]
            if block_hash[b] is not None or h in cached:
                continue
            block_hash[b] = h
            cached[h] = b

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each of a request's blocks, given in block-table order.

        The tail of a sequence is the least likely to be shared, so blocks go to the free queue in
        reverse order and the tail is evicted first.
        """
        ref_cnt, lru, hash_of = self.ref_cnt, self._lru, self.block_hash
        push = self._unhashed.append
        for b in reversed(blocks):
            left = ref_cnt[b] - 1
            ref_cnt[b] = left
            if not left:
                h = hash_of[b]
                if h is None:
                    push(b)  # to the head: the last pushed, this request's first, is taken first
                else:
                    lru[b] = h

    def invariant_violations(self) -> list[str]:
        """Consistency problems, for tests: an empty list when the pool is sound."""
        problems: list[str] = []
        queue = self.free_queue()
        free = set(queue)
        if len(free) != len(queue):
            problems.append("a block is in the free queue twice")
        if self.ref_cnt[NULL_BLOCK] != 1 or NULL_BLOCK in free:
            problems.append("the null block was handed out")
        for b in range(1, self.num_blocks):
            if (self.ref_cnt[b] == 0) != (b in free):
                problems.append(f"block {b}: ref_cnt {self.ref_cnt[b]} but in free queue "
                                f"{b in free}")
            if self.ref_cnt[b] < 0:
                problems.append(f"block {b}: negative ref_cnt")
        for b in self._unhashed:
            if self.block_hash[b] is not None:
                problems.append(f"block {b}: hashed but with the unhashed free blocks")
        for b, h in self._lru.items():
            if self.block_hash[b] != h:
                problems.append(f"block {b}: in the cached free blocks without its hash")
        for h, b in self.cached.items():
            if self.block_hash[b] != h:
                problems.append(f"cached hash of block {b} does not match the block's hash")
        if len(self.cached) != self.num_blocks - self.block_hash.count(None):
            problems.append("hashed blocks and cached hashes do not match one to one")
        return problems
