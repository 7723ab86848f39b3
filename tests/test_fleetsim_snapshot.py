"""The fleet simulation's direct scrape equals what the gateway parses from the simulator's
/metrics text for the same engine state."""

from __future__ import annotations

import pytest

from loadtest.fleetsim.snapshot import snapshot
from loadtest.sim.engine import Engine, EngineStats, SimRequest
from loadtest.sim.exposition import FORMATS, ProcessSample, ServerInfo
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from routing.metrics import parse_metrics

PRESET = PRESETS[DEFAULT_PRESET]


def _parsed(stats: EngineStats, taken_at: float) -> object:
    fmt = FORMATS["vllm"]
    text = fmt.render(stats, fmt.new_recorder(), ServerInfo(PRESET.model_name,
                                                            PRESET.max_model_len),
                      ProcessSample(cpu_seconds=1.5, start_time=1.7e9))
    return parse_metrics(text, taken_at=taken_at)


def _states(num_gpu_blocks: int) -> list[EngineStats]:
    """Engine states along a run that fills the cache, shares prefixes and preempts."""
    engine = Engine(PRESET, num_gpu_blocks=num_gpu_blocks)
    states = [engine.stats()]
    for i in range(40):
        shared = tuple(range(1000 * (i % 3), 1000 * (i % 3) + 200))  # three shared prefixes
        engine.add(SimRequest(f"r{i}", shared + tuple(range(10**6 + 97 * i, 10**6 + 97 * i + i)),
                              max_tokens=120, natural_len=30 + 3 * i))
        for _ in range(4):
            engine.step()
            states.append(engine.stats())
    while engine.has_work():
        engine.step()
    states.append(engine.stats())
    return states


@pytest.mark.parametrize("blocks", [64, 300, 5000], ids=["preempting", "tight", "roomy"])
def test_direct_snapshot_equals_the_parsed_exposition(blocks: int) -> None:
    states = _states(blocks)
    assert any(s.preemptions_total for s in states) or blocks > 64
    assert any(s.prefix_hits_tokens for s in states)
    for i, stats in enumerate(states):
        direct = snapshot(stats, model=PRESET.model_name, taken_at=float(i))
        assert direct == _parsed(stats, float(i)), f"state {i}: {stats}"
