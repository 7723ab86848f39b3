"""The paged block pool: conservation, the null block, LRU reuse of hashed blocks."""

from __future__ import annotations

import pytest

from loadtest.sim.kvcache import NULL_BLOCK, BlockPool, chain_hashes


def test_a_new_pool_has_every_block_free_except_the_null_block() -> None:
    pool = BlockPool(10)
    assert (pool.num_free, pool.num_used) == (9, 1)
    assert pool.usage() == 0.0
    assert pool.invariant_violations() == []


def test_the_null_block_is_never_handed_out() -> None:
    pool = BlockPool(10)
    blocks = pool.allocate(9)
    assert NULL_BLOCK not in blocks
    assert sorted(blocks) == list(range(1, 10))
    assert (pool.num_free, pool.num_used, pool.usage()) == (0, 10, 1.0)


def test_usage_leaves_the_null_block_out_as_vllm_v1_does() -> None:
    pool = BlockPool(11)
    pool.allocate(4)
    assert pool.usage() == pytest.approx(1 - 6 / 10)


def test_allocating_more_than_is_free_raises() -> None:
    pool = BlockPool(4)
    with pytest.raises(ValueError, match="cannot allocate 4 blocks"):
        pool.allocate(4)


def test_too_small_a_pool_is_rejected() -> None:
    with pytest.raises(ValueError, match="null block"):
        BlockPool(1)


def test_freed_hashed_blocks_stay_findable_until_reallocated() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    for block, h in zip(blocks, (101, 102), strict=True):
        pool.register(block, h)
    pool.free(blocks)
    assert pool.num_free == 3
    assert pool.lookup([101, 102, 103]) == blocks
    pool.allocate(3)  # takes the unhashed block, then evicts both cached ones
    assert pool.lookup([101]) == []
    assert pool.invariant_violations() == []


def test_lookup_stops_at_the_first_missing_hash() -> None:
    pool = BlockPool(5)
    a, b, c = pool.allocate(3)
    pool.register(a, 1)
    pool.register(c, 3)
    assert pool.lookup([1, 2, 3]) == [a]


@pytest.mark.parametrize(
    ("hashed", "expected_first"),
    [
        pytest.param((True, True, True), 2, id="a freed sequence's tail block is evicted first"),
        pytest.param((True, False, True), 1, id="an unhashed block is reused before cached ones"),
    ],
)
def test_allocation_order_after_free(hashed: tuple[bool, ...], expected_first: int) -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    for i, (block, is_hashed) in enumerate(zip(blocks, hashed, strict=True)):
        if is_hashed:
            pool.register(block, 1000 + i)
    pool.free(blocks)
    assert pool.allocate_one() == blocks[expected_first]


def test_least_recently_freed_cached_block_is_evicted_first() -> None:
    pool = BlockPool(3)
    old, new = pool.allocate(2)
    pool.register(old, 1)
    pool.register(new, 2)
    pool.free([old])
    pool.free([new])
    assert pool.allocate_one() == old
    assert pool.lookup([2]) == [new]


def test_touching_a_cached_free_block_takes_it_out_of_the_free_queue() -> None:
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.register(block, 7)
    pool.free([block])
    found = pool.lookup([7])
    assert pool.num_evictable(found) == 1
    pool.touch(found)
    assert pool.num_free == 2
    assert pool.num_evictable(found) == 0
    assert pool.invariant_violations() == []


def test_a_shared_block_is_free_only_when_its_last_holder_frees_it() -> None:
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.register(block, 7)
    pool.touch(pool.lookup([7]))  # a second request shares it
    pool.free([block])
    assert pool.num_free == 2
    pool.free([block])
    assert pool.num_free == 3
    assert pool.invariant_violations() == []


def test_a_second_block_with_the_same_hash_stays_unregistered() -> None:
    pool = BlockPool(4)
    first, second = pool.allocate(2)
    pool.register(first, 9)
    pool.register(second, 9)
    assert pool.lookup([9]) == [first]
    assert pool.invariant_violations() == []


def test_without_caching_nothing_is_found() -> None:
    pool = BlockPool(4, enable_caching=False)
    (block,) = pool.allocate(1)
    pool.register(block, 9)
    pool.free([block])
    assert pool.lookup([9]) == []


@pytest.mark.parametrize(
    ("tokens", "num_hashes"),
    [
        pytest.param(list(range(15)), 0, id="a partial block has no hash"),
        pytest.param(list(range(16)), 1, id="one full block"),
        pytest.param(list(range(40)), 2, id="the partial tail is left out"),
    ],
)
def test_only_full_blocks_are_hashed(tokens: list[int], num_hashes: int) -> None:
    assert len(chain_hashes(0, tokens, 16)) == num_hashes


def test_block_hashes_chain_on_everything_before_them() -> None:
    base = list(range(48))
    changed_first = [999, *base[1:]]
    changed_last = [*base[:-1], 999]
    hashes = chain_hashes(0, base, 16)
    assert chain_hashes(0, base, 16) == hashes
    assert all(a != b for a, b in zip(chain_hashes(0, changed_first, 16), hashes, strict=True))
    assert chain_hashes(0, changed_last, 16)[:2] == hashes[:2]
    assert chain_hashes(1, base, 16)[0] != hashes[0]  # another root key: another cache
    assert chain_hashes(hashes[0], base[16:], 16) == hashes[1:]  # resumable from a parent
