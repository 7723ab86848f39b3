"""A fleet's measured capacity for a workload: the request rate it sustains when saturated.

Each distinct preset is measured once, alone: one engine is kept saturated (its waiting queue
never runs dry) with the workload's requests in session order, and its completions per second of
virtual time are counted over a window after a warm-up. The fleet's capacity is the sum over its
backends. This is the ceiling of throughput under vLLM's own scheduler for that request mix; a
router cannot exceed it, and `--load 0.85` means 85% of it. Prefix sharing counts as a single
backend sees it (every group lands on it), which is what a perfect affinity router would get.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from loadtest.sim.engine import Engine, SimRequest
from loadtest.sim.presets import Preset
from loadtest.workloads import SessionSource, WorkItem, Workload

WARMUP_S = 30.0
WINDOW_S = 120.0
_QUEUE_FLOOR = 16  # waiting requests kept in front of the scheduler at every step


def preset_capacity(preset: Preset, requests: Callable[[], Iterator[WorkItem]], *,
                    warmup_s: float = WARMUP_S, window_s: float = WINDOW_S) -> float:
    """Requests per second one saturated engine of `preset` completes (module docstring), fed
    from a fresh `requests()` iterator (endless, or long enough for the window)."""
    engine = Engine(preset)
    source = requests()
    added = completed = 0
    now = 0.0
    end = warmup_s + window_s
    while now < end:
        waiting = engine.stats().waiting
        while waiting < _QUEUE_FLOOR:
            item = next(source, None)
            if item is None:
                break
            try:
                engine.add(SimRequest(f"c{added}", item.prompt_ids(), item.max_tokens,
                                      item.output_tokens, ignore_eos=item.ignore_eos))
            except ValueError:
                continue  # too long for this preset: the fleet would reject it too
            added += 1
            waiting += 1
        if not engine.has_work():
            break
        result = engine.step()
        now += result.duration
        if now > warmup_s:
            completed += sum(1 for ev in result.events if ev.finish_reason is not None)
    if now <= warmup_s:
        raise ValueError(f"too few requests to measure the capacity of {preset.name}")
    return completed / (min(now, end) - warmup_s)


def workload_requests(spec: Workload, seed: int) -> Iterator[WorkItem]:
    """The workload's requests in session order, endlessly (from a stream of its own)."""
    source = SessionSource(spec, seed=seed, stream=9_999)
    while True:
        yield from source.next_session()
