"""`kvgate demo`'s routing alias end to end, on the demo's own config (its default classifier:
the local MiniLM model when installed, else the hashed one): a greeting goes to the small model,
a long multi-step coding task and a short hard arithmetic question go to the large one, and the
reason header says why (the verdict, its score and the threshold in force)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import orjson
import pytest

from gateway.demo import AUTO_MODEL, demo_settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, SMALL_PRESET

LARGE = PRESETS[DEFAULT_PRESET].model_name
SMALL = PRESETS[SMALL_PRESET].model_name
TASK = ("I need a small inventory service for our warehouse. First, design the database tables "
        "for products, stock locations and stock movements, with the constraints that keep the "
        "stock from going negative. Then write the HTTP handlers in Python for receiving goods, "
        "moving them between locations and shipping orders, each in one transaction. After "
        "that, add a nightly job that reconciles the counted stock with the recorded one and "
        "reports the differences. Finally, write the tests for the concurrent shipping case, "
        "where two orders race for the last unit, and explain how the code keeps them from both "
        "succeeding.")


@asynccontextmanager
async def demo() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(running_sim(preset=DEFAULT_PRESET,
                                                            time_scale=20.0)),
                await stack.enter_async_context(running_sim(preset=SMALL_PRESET,
                                                            time_scale=20.0, seed=1))]
        settings = demo_settings(urls, host="127.0.0.1", port=0)
        url = await stack.enter_async_context(running_gateway(settings))
        yield url, await stack.enter_async_context(aiohttp.ClientSession())


@pytest.mark.parametrize(
    ("content", "model", "verdict"),
    [
        pytest.param("Hello! How are you today?", SMALL, "easy", id="a greeting goes small"),
        pytest.param(TASK, LARGE, "hard", id="a long multi-step coding task goes large"),
        pytest.param("what is 3^47 mod 11", LARGE, "hard",
                     id="a short hard arithmetic question goes large"),
    ],
)
async def test_the_demo_alias_routes_by_the_text(content: str, model: str, verdict: str) -> None:
    async with demo() as (url, http):
        body = {"model": AUTO_MODEL, "messages": [{"role": "user", "content": content}]}
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert orjson.loads(await resp.read())["model"] == model
            reason = resp.headers["x-kvgate-model-reason"]
        assert resp.headers["x-kvgate-model"] == model
        said, score, threshold = reason.split("; ")
        assert said == verdict
        assert score.startswith("score=") and threshold.startswith("threshold=")
        assert (float(score[6:]) < float(threshold[10:])) is (verdict == "easy")
