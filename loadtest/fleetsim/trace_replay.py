"""How a trace is replayed at a load level: its timeline scaled to a rate and cut to a window.

The trace's times are those it was loaded with (already divided by `--rate-scale`). With
`--load` or `--rate` a level has a target rate r; `--duration` gives a window D:

- neither: the trace as recorded; the window ends at its last arrival.
- D only: the first D seconds as recorded.
- r only: the whole trace, its timeline scaled by one factor so that its mean rate is r.
- r and D: the first D seconds of the trace scaled so that they hold r x D requests: the first
  r x D requests, their timeline stretched or compressed by one factor to span D. A trace with
  fewer requests is replayed whole at rate r, in a shorter window.

One factor for the whole replay keeps the trace's own burstiness: only the time axis changes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace

from loadtest.fleetsim.trace import TraceInfo
from loadtest.workloads import WorkItem

_END = 1e-9  # the window ends just after the last arrival, so that request is in it


@dataclass(frozen=True, slots=True)
class Replay:
    """The first `count` requests, each at its time x `factor`, in a window of `window_s`."""

    count: int
    factor: float
    window_s: float

    @property
    def rate_rps(self) -> float:
        return self.count / self.window_s

    def trace_window_s(self, rate_scale: float = 1.0) -> float:
        """The window in the trace's own time (before `--rate-scale` and this factor)."""
        return self.window_s / self.factor * rate_scale


def plan(arrivals: Sequence[float], duration_s: float | None, rate: float | None) -> Replay:
    """The replay of a trace with these (sorted) arrival times (module docstring)."""
    if not arrivals:
        raise ValueError("the trace has no requests")
    if rate is None:
        if duration_s is None:
            return Replay(len(arrivals), 1.0, arrivals[-1] + _END)
        return Replay(bisect_left(arrivals, duration_s), 1.0, duration_s)
    if not rate > 0:
        raise ValueError("the rate must be > 0")
    if duration_s is not None:
        wanted = round(rate * duration_s)
        if wanted < len(arrivals) and arrivals[wanted] > 0:
            cut = arrivals[wanted]  # the first request left out
            return Replay(bisect_left(arrivals, cut), duration_s / cut, duration_s)
    span = arrivals[-1] + _END
    factor = len(arrivals) / span / rate
    return Replay(len(arrivals), factor, span * factor)


def replay(trace: Sequence[WorkItem], duration_s: float | None, rate: float | None
           ) -> tuple[tuple[WorkItem, ...], float]:
    """The requests of `plan`'s replay, at their scaled times, and its window."""
    p = plan([item.arrival_s for item in trace], duration_s, rate)
    items = trace[:p.count]
    if p.factor != 1.0:
        return tuple(replace(item, arrival_s=item.arrival_s * p.factor) for item in items), (
            p.window_s)
    return tuple(items), p.window_s


def level_json(info: TraceInfo, p: Replay) -> dict[str, float | int]:
    """A level's replay, for the JSON report."""
    own = p.trace_window_s(info.rate_scale)
    return {"requests": p.count, "trace_window_s": round(own, 3), "window_s": round(p.window_s, 3),
            "native_rate_rps": round(p.count / own, 4) if own > 0 else 0.0,
            "rate_rps": round(p.rate_rps, 4), "compression": round(own / p.window_s, 4)}


def describe_level(info: TraceInfo, p: Replay) -> str:
    """A level's replay in words: what part of the trace, and how its timeline was scaled."""
    own = p.trace_window_s(info.rate_scale)
    native = p.count / own if own > 0 else 0.0
    speed = own / p.window_s
    how = ("as recorded" if abs(speed - 1.0) < 1e-9
           else f"timeline compressed {speed:.3g}x" if speed > 1
           else f"timeline stretched {1 / speed:.3g}x")
    return (f"trace replay: {p.count} requests, the first {own:.1f} s of the trace "
            f"({native:.2f} requests/s native), in {p.window_s:.1f} s: {how}, "
            f"{p.rate_rps:.2f} requests/s")
