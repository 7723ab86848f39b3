"""The simulation's exact view of the engines' prefix caches (routing/scheduling/peers.py
`CacheView`), for the peers' policies that read the engines' own cache state (llm-d's precise
prefix-cache scorer, Dynamo's KV router with KV events).

The gateway's router sees a request as its prefix chain (routing/prefix.py); the simulation
knows the token ids behind it. Before a request reaches a gateway replica the loop tells the
view the request's text and how to get its token ids (`expect`); the first time a policy asks
about a chain, the view hashes the texts announced since (the gateway's chain, with the
gateway's block size) and keeps chain -> ids. An answer is each engine's prefix-cache lookup
of the prompt's block hash chain as its admission does it (`Engine.cached_prefix_tokens`):
exactly the tokens it would not prefill if the request arrived now. Nothing is computed for
a policy that never asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from loadtest.sim.engine import Engine, root_key
from loadtest.sim.kvcache import chain_hashes
from routing.prefix import PrefixChain, prefix_chain

_Key = tuple[int, tuple[int, ...], int]
_KEPT_HASHES = 256  # prompts whose block hashes are kept for the next question
# Requests announced whose ids are kept: far more than are ever queued or in a decision at once;
# a policy that never asks keeps only this many texts.
_KEPT_REQUESTS = 8192


class ExactCacheView:
    def __init__(self, engines: Mapping[str, Engine], *, model: str, block_chars: int) -> None:
        self._engines = engines
        self._model = model
        self._block_chars = block_chars
        self._pending: list[tuple[str, Callable[[], Sequence[int]]]] = []
        self._ids: dict[_Key, Callable[[], Sequence[int]]] = {}
        self._hashes: dict[tuple[_Key, int], list[int]] = {}  # by (request, block size)

    def expect(self, text: str, prompt_ids: Callable[[], Sequence[int]]) -> None:
        """A request with this canonical prompt text is about to be routed."""
        pending = self._pending
        pending.append((text, prompt_ids))
        if len(pending) > 2 * _KEPT_REQUESTS:
            del pending[:-_KEPT_REQUESTS]

    def _drain(self) -> None:
        ids_of = self._ids
        for text, ids in self._pending:
            chain = prefix_chain(text, model=self._model, block_chars=self._block_chars)
            key = (chain.root, chain.blocks, len(text))
            ids_of.pop(key, None)
            ids_of[key] = ids  # the newest last, so the oldest go first
        self._pending.clear()
        while len(ids_of) > _KEPT_REQUESTS:
            del ids_of[next(iter(ids_of))]

    def cached_tokens(self, chain: PrefixChain, prompt_chars: int,
                      backend_ids: Sequence[str]) -> Mapping[str, int]:
        if self._pending:
            self._drain()
        key = (chain.root, chain.blocks, prompt_chars)
        ids = self._ids.get(key)
        if ids is None:
            return {}
        out: dict[str, int] = {}
        for backend in backend_ids:
            engine = self._engines.get(backend)
            if engine is None:
                continue
            size = engine.block_size
            hashes = self._hashes.get((key, size))
            if hashes is None:
                if len(self._hashes) >= _KEPT_HASHES:
                    self._hashes.clear()  # a request is asked about again only while queued
                prompt = ids()
                full = (len(prompt) - 1) // size * size  # the last token is always computed
                hashes = self._hashes[(key, size)] = chain_hashes(root_key(), prompt[:full],
                                                                  size)
            out[backend] = engine.cached_prefix_tokens(hashes)
        return out
