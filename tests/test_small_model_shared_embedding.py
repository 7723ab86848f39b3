"""One embedding per request: while the semantic cache runs the local MiniLM model, small-model
routing's classifier reads the cache's embedder, and the cache's lookup finds the question's
vector remembered instead of running the model a second time."""

from __future__ import annotations

from contextlib import AsyncExitStack

import aiohttp
import numpy as np
import pytest

from gateway.cache.embedders.choice import local_installed
from gateway.config import Settings
from gateway.keys import CACHE
from gateway.lifecycle import serving
from gateway.small_model import SMALL_MODEL
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, SMALL_PRESET

pytestmark = pytest.mark.skipif(not local_installed(), reason="needs kvgate[semantic]")
LARGE = PRESETS[DEFAULT_PRESET].model_name
SMALL = PRESETS[SMALL_PRESET].model_name


async def test_remembered_vectors_are_the_models_and_it_forgets_the_oldest() -> None:
    from gateway.cache.embedders.local import LocalEmbedder
    from gateway.cache.embedders.remembered import Remembered

    model = LocalEmbedder()
    remembered = Remembered(LocalEmbedder(model.model), size=2)
    try:
        first = await remembered.embed(["hello there", "what is 3^47 mod 11"])
        again = await remembered.embed(["what is 3^47 mod 11", "hello there"])
        assert (remembered.computed, remembered.recalled) == (2, 2)
        assert np.array_equal(again, first[::-1])
        assert np.allclose(first, await model.embed(["hello there", "what is 3^47 mod 11"]),
                           atol=1e-6)
        await remembered.embed(["a third question"])  # the oldest, "what is ...", is forgotten
        await remembered.embed(["what is 3^47 mod 11"])
        assert remembered.computed == 4
    finally:
        remembered.close()
        model.close()


@pytest.mark.parametrize("semantic", ["on", "off"])
async def test_the_classifier_shares_the_caches_embedding(semantic: str) -> None:
    async with AsyncExitStack() as stack:
        backends = [
            {"id": "large", "url": await stack.enter_async_context(
                running_sim(preset=DEFAULT_PRESET, time_scale=20.0))},
            {"id": "small", "url": await stack.enter_async_context(
                running_sim(preset=SMALL_PRESET, time_scale=20.0, seed=1))},
        ]
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": backends, "routing": {"poll_interval_s": 0.05},
            "small_model": [{"alias": "auto", "large": LARGE, "small": SMALL}],
            "cache": {"enabled": True, "semantic": semantic},
        })
        gateway = await stack.enter_async_context(serving(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        body = {"model": "auto", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of Peru?"}]}
        async with http.post(gateway.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            reason = resp.headers["x-kvgate-model-reason"]
        assert reason.startswith("easy; score=")
        kinds = {c.weights.kind for c in gateway.app[SMALL_MODEL].by_alias.values()}
        questions = gateway.app[CACHE].embedder
        if semantic == "off":
            # No cache embedding to share: auto is the hashed classifier, nothing is embedded.
            assert kinds == {"hashed"} and questions is None
            return
        assert kinds == {"minilm"}
        remembered = getattr(questions, "embedder", None)
        # The classifier embedded the question; the cache's lookup found it remembered.
        assert (remembered.computed, remembered.recalled) == (1, 1)  # type: ignore[union-attr]
