"""`kvgate sim` honours vLLM's `min_tokens`: no end of sequence before that many tokens, the
reply's `max_tokens` still the cap."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI

from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name


async def natural_and_floored(min_tokens: int, max_tokens: int) -> tuple[int, int, str | None]:
    """(the reply's natural length, its length with min_tokens, that reply's finish reason)."""
    messages = [{"role": "user", "content": "Say something short."}]
    async with running_sim(time_scale=1000.0) as url, AsyncOpenAI(
            base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        free = await client.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                                    max_tokens=max_tokens)
        held = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens,  # type: ignore[arg-type]
            extra_body={"min_tokens": min_tokens})
    assert free.usage is not None and held.usage is not None
    return (free.usage.completion_tokens, held.usage.completion_tokens,
            held.choices[0].finish_reason)


@pytest.mark.parametrize(("min_tokens", "max_tokens"), [(0, 4000), (3000, 4000), (4000, 4000),
                                                        (5000, 4000)],
                         ids=["no-floor", "floor-past-the-natural-end", "floor-at-the-cap",
                              "floor-past-the-cap"])
async def test_min_tokens_is_a_floor_and_max_tokens_the_cap(min_tokens: int,
                                                            max_tokens: int) -> None:
    natural, floored, reason = await natural_and_floored(min_tokens, max_tokens)
    assert natural < 3000  # the prompt's natural reply is shorter than the floors
    assert floored == min(max_tokens, max(natural, min_tokens))
    assert reason == ("length" if floored == max_tokens else "stop")
