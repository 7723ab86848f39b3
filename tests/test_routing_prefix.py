"""Prefix affinity: hash chains over character blocks, the per-backend LRU index of served
blocks, and consistent hashing with bounded load."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.prefix import (
    HashRing,
    PrefixChain,
    PrefixIndex,
    conversation_text,
    prefix_chain,
)

MODEL = "llama-3-8b"
BLOCK = 8


def chain(
    text: str, *, model: str = MODEL, cache_salt: str | None = None, max_blocks: int = 128
) -> PrefixChain:
    return prefix_chain(text, model=model, cache_salt=cache_salt, block_chars=BLOCK,
                        max_blocks=max_blocks)


def text_of(blocks: str) -> str:
    """One block of BLOCK characters per letter, e.g. "abc" -> "aaaaaaaabbbbbbbbcccccccc"."""
    return "".join(letter * BLOCK for letter in blocks)


@pytest.mark.parametrize(
    ("chars", "max_blocks", "blocks"),
    [(0, 128, 0), (BLOCK - 1, 128, 0), (BLOCK, 128, 1), (5 * BLOCK + 3, 128, 5),
     (40 * BLOCK, 8, 8)],
    ids=["empty", "short-of-a-block", "one-block", "partial-tail-not-hashed", "capped"],
)
def test_chain_has_one_hash_per_full_block_up_to_the_cap(
    chars: int, max_blocks: int, blocks: int
) -> None:
    assert len(chain("x" * chars, max_blocks=max_blocks).blocks) == blocks


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [("abcd", "abcd", 4), ("abcd", "abxy", 2), ("abcd", "xbcd", 0), ("ab", "abcd", 2)],
    ids=["same-prompt", "diverges-at-block-2", "first-block-differs", "extension"],
)
def test_chains_agree_exactly_on_the_shared_leading_blocks(a: str, b: str, shared: int) -> None:
    ca, cb = chain(text_of(a)), chain(text_of(b))
    agree = [x == y for x, y in zip(ca.blocks, cb.blocks, strict=False)]
    assert agree == [True] * shared + [False] * (min(len(a), len(b)) - shared)


@given(st.text(max_size=60), st.text(max_size=60), st.text(max_size=60))
@settings(max_examples=200, deadline=None)
def test_a_block_hash_identifies_the_whole_prefix_before_it(
    common: str, tail_a: str, tail_b: str
) -> None:
    ca, cb = chain(common + tail_a), chain(common + tail_b)
    full = len(common) // BLOCK
    assert ca.blocks[:full] == cb.blocks[:full]
    for i, (x, y) in enumerate(zip(ca.blocks, cb.blocks, strict=False)):
        same_prefix = (common + tail_a)[: (i + 1) * BLOCK] == (common + tail_b)[: (i + 1) * BLOCK]
        assert (x == y) == same_prefix


@pytest.mark.parametrize(
    ("model", "salt"),
    [("llama-3-70b", "tenant-a"), (MODEL, "tenant-b"), (MODEL, None), (MODEL, "")],
    ids=["other-model", "other-salt", "no-salt", "empty-salt"],
)
def test_model_and_cache_salt_key_the_root_so_nothing_is_shared(
    model: str, salt: str | None
) -> None:
    text = text_of("abcdef")
    base, other = chain(text, cache_salt="tenant-a"), chain(text, model=model, cache_salt=salt)
    assert base.root != other.root
    assert not set(base.blocks) & set(other.blocks)


def test_an_empty_salt_is_not_the_same_as_no_salt() -> None:
    assert chain("x", cache_salt="").root != chain("x", cache_salt=None).root


def test_roles_are_part_of_a_conversation_prefix_and_turns_extend_it() -> None:
    first = [("system", "You are terse. " * 8), ("user", "What is KV cache? " * 4)]
    turn = [*first, ("assistant", "A cache of keys and values. " * 4), ("user", "Why? " * 8)]
    short, long = chain(conversation_text(first)), chain(conversation_text(turn))
    assert long.blocks[: len(short.blocks)] == short.blocks
    swapped = chain(conversation_text([("user", c) for _, c in first]))
    assert swapped.blocks[0] != short.blocks[0]


def test_chain_hashes_do_not_depend_on_the_process() -> None:
    code = (
        "from routing.prefix import prefix_chain;"
        "print(prefix_chain('x' * 600, model='m', cache_salt='s').blocks)"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert outputs == {f"{prefix_chain('x' * 600, model='m', cache_salt='s').blocks}\n"}


@pytest.mark.parametrize(
    ("key_depth", "expected_block"),
    [(0, None), (1, 0), (3, 2), (99, 3)],
    ids=["zero-is-root", "first-block", "third-block", "deeper-than-chain-is-last"],
)
def test_routing_key_is_the_hash_at_the_requested_depth(
    key_depth: int, expected_block: int | None
) -> None:
    c = chain(text_of("abcd"))
    assert c.key(key_depth) == (c.root if expected_block is None else c.blocks[expected_block])
    assert chain("short").key(key_depth) == chain("short").root


@pytest.mark.parametrize(
    ("served", "query", "blocks"),
    [
        (["abcd"], "abcd", 4),
        (["abcd"], "abxy", 2),
        (["ab"], "abcd", 2),
        (["xbcd"], "abcd", 0),
        (["ab", "abcdef"], "abcdxy", 4),
        ([], "abcd", 0),
    ],
    ids=["whole-prompt", "shared-head", "served-shorter", "only-leading-blocks-count",
         "longest-served-wins", "never-served"],
)
def test_index_counts_leading_blocks_a_backend_served(
    served: list[str], query: str, blocks: int
) -> None:
    index = PrefixIndex()
    for text in served:
        index.record("b0", chain(text_of(text)))
    assert index.matched_blocks("b0", chain(text_of(query))) == blocks
    assert index.matches(chain(text_of(query))) == ({"b0": blocks} if blocks else {})


def test_matches_answers_for_every_backend_at_once() -> None:
    index = PrefixIndex()
    index.record("b0", chain(text_of("abcdef")))
    index.record("b1", chain(text_of("abxy")))
    index.record("b2", chain(text_of("zzzz")))
    index.record("b3", chain(text_of("a")))
    assert index.matches(chain(text_of("abcdq"))) == {"b0": 4, "b1": 2, "b3": 1}


@given(
    st.lists(st.tuples(st.sampled_from(["b0", "b1", "b2"]), st.text("ab", max_size=6)),
             max_size=20),
    st.text("ab", max_size=7),
    st.integers(1, 12),
)
@settings(max_examples=200, deadline=None)
def test_matches_agrees_with_asking_each_backend(
    served: list[tuple[str, str]], query: str, cap: int
) -> None:
    index = PrefixIndex(blocks_per_backend=cap)
    for backend_id, text in served:
        index.record(backend_id, chain(text_of(text)))
    q = chain(text_of(query))
    expected = {b: index.matched_blocks(b, q) for b in ("b0", "b1", "b2")}
    assert index.matches(q) == {b: n for b, n in expected.items() if n}
    assert len(index) <= 3 * cap


def test_index_evicts_least_recently_served_prefixes_first() -> None:
    index = PrefixIndex(blocks_per_backend=4)
    index.record("b0", chain(text_of("ab")))
    index.record("b0", chain(text_of("cd")))
    index.record("b0", chain(text_of("ab")))  # refreshed: now more recent than "cd"
    index.record("b0", chain(text_of("ef")))
    assert [index.matched_blocks("b0", chain(text_of(t))) for t in ("ab", "cd", "ef")] == [2, 0, 2]


def test_an_evicted_chain_keeps_its_leading_blocks_longest() -> None:
    index = PrefixIndex(blocks_per_backend=2)
    index.record("b0", chain(text_of("abcd")))
    assert index.matched_blocks("b0", chain(text_of("abcd"))) == 2
    assert len(index) == 2


def test_forgetting_a_backend_drops_only_its_entries() -> None:
    index = PrefixIndex()
    for backend_id in ("b0", "b1"):
        index.record(backend_id, chain(text_of("abc")))
    index.forget("b0")
    assert index.matches(chain(text_of("abc"))) == {"b1": 3}
    assert len(index) == 3


NODES = [f"b{i}" for i in range(8)]


def test_ring_maps_a_key_to_the_same_node_for_any_replica() -> None:
    keys = [chain(text_of(t)).key(1) for t in "abcdefghijklmnop"]
    first, second = HashRing(NODES), HashRing(list(reversed(NODES)))
    assert [first.owner(k) for k in keys] == [second.owner(k) for k in keys]


def test_adding_a_node_moves_only_the_keys_it_takes() -> None:
    keys = [chain(f"{i:08d}").key(1) for i in range(4000)]
    before, after = HashRing(NODES), HashRing([*NODES, "b8"])
    moved = [k for k in keys if before.owner(k) != after.owner(k)]
    assert all(after.owner(k) == "b8" for k in moved)
    assert 0.05 < len(moved) / len(keys) < 0.2  # about 1/9


def test_weights_scale_a_nodes_share_of_keys() -> None:
    ring = HashRing({"heavy": 3.0, "light": 1.0}, vnodes=128)
    owners = Counter(ring.owner(chain(f"{i:08d}").key(1)) for i in range(8000))
    assert 2.0 < owners["heavy"] / owners["light"] < 4.5


@pytest.mark.parametrize(
    ("loads", "bound", "expected"),
    [
        ({n: 0 for n in NODES}, 1.25, "owner"),
        ({n: 4 for n in NODES}, 1.25, "owner"),
        ({**{n: 4 for n in NODES}, "OWNER": 9}, 1.25, "next"),
        ({**{n: 4 for n in NODES}, "OWNER": 5}, 1.25, "owner"),
    ],
    ids=["idle-fleet", "even-load", "owner-over-bound-spills", "owner-within-bound-keeps"],
)
def test_bounded_load_spills_a_key_past_an_overloaded_owner(
    loads: dict[str, int], bound: float, expected: str
) -> None:
    ring = HashRing(NODES)
    key = chain(text_of("hot")).key(1)
    owner = ring.owner(key)
    assert owner is not None
    if "OWNER" in loads:
        loads = {**loads, owner: loads.pop("OWNER")}
    picked = ring.pick(key, loads, bound=bound)
    if expected == "owner":
        assert picked == owner
    else:
        assert picked != owner
        assert picked == HashRing([n for n in NODES if n != owner]).owner(key)


def test_a_hot_key_never_pushes_a_node_past_the_bound() -> None:
    ring = HashRing(NODES)
    key = chain(text_of("hot")).key(1)
    loads = dict.fromkeys(NODES, 0)
    for _ in range(400):
        node = ring.pick(key, loads, bound=1.25)
        assert node is not None
        loads[node] += 1
        assert max(loads.values()) <= -(-1.25 * sum(loads.values()) // len(NODES))
    # With no releases, each node fills to the bound before the key spills on: at least
    # ceil(400 / 63) nodes are needed, where 63 = ceil(1.25 * 400 / 8).
    assert sum(1 for n in loads.values() if n) >= 7


def test_only_eligible_nodes_are_picked() -> None:
    ring = HashRing(NODES)
    key = chain(text_of("k")).key(1)
    assert ring.pick(key, {"b3": 0, "b5": 0, "unknown": 0}) in {"b3", "b5"}
    assert ring.pick(key, {}) is None
    assert HashRing([]).owner(key) is None
