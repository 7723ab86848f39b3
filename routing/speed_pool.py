"""Speeds pooled by class: what one backend's learned speed may say, given its siblings'.

Backends of one class (the same engine serving the same models on the same KV capacity:
`speed_class`) are, until their replies show otherwise, the same hardware: the speed a policy
reads for one of them rests on the whole class's evidence, and on its own only as far as its own
evidence reaches. Empirical-Bayes shrinkage, in log-scale space (a speed scale multiplies step
times, so it is averaged as a log):

- each backend's own estimate is a robust one (routing/speed.py: the median of its recent
  readings), with `n` the readings behind it and the sampling variance of that median (from the
  readings' median absolute deviation);
- the class's pooled estimate is the mean of its members' own estimates, each weighing its `n`
  up to `shrink` (no one member's long history outweighs the rest of its class), with the
  slow-start guess weighing `prior_weight` readings (a class nobody measured yet reads as the
  slow start);
- the spread between members that their own sampling noise does not explain, tau^2, says how
  far they really differ: the members' estimates' variance less `NOISE_MARGIN` times their mean
  sampling variance, at least 0 (positive-part James-Stein, made conservative: a few members'
  variance scatters widely, and alike backends would otherwise be read apart by chance about
  one time in three; at three times the noise, about one in twenty, and then by little);
- a member's weight on its own estimate is the smaller of its confidence, `n / (n + shrink)`,
  and tau^2 / (tau^2 + its sampling variance); its deviation is that fraction of the gap
  between its own estimate and the pooled one, the gap first clamped to `max_log_spread`. So
  the deviation cannot leave a band of `confidence x max_log_spread`: one reply (n = 1) moves
  it by at most 1/(1 + shrink) of the largest spread; members whose estimates differ by no more
  than their noise read as one, however many replies they have; members that really differ
  (two GPUs of equal memory) come to keep what their replies show. `shrink` is large because a
  gateway's replies come in correlated bunches (a burst's streams share one batch and one
  moment of the host's contention): n of them are worth far fewer independent readings;
- a deviation within `tolerance` is dropped: the member reads the pooled estimate exactly.
  Alike backends then make alike predictions and a burst is split by their loads alone: a
  policy that ranks by predicted latency turns a few percent of speed into a lopsided split
  (on a card far from saturation, batching is nearly free, so the faster-read card wins nearly
  every request), and the loaded card's readings then drift (the model of a reply's load is
  taken at its dispatch), which would feed the split back.

A class of one is its own pool: the shrinkage then only eases it off the slow start. Pure: the
readings are passed in and the result returned; `SpeedClasses` only records membership.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from routing.state import Candidate
from routing.ttft import SLOW_START_SCALE

SHRINK_READINGS = 200.0  # readings at which a member's own estimate weighs as its class's
MAX_CLASS_SPREAD = 4.0  # the most a well-measured member may read away from its class (factor)
CLASS_TOLERANCE = 1.15  # a member's deviation from its class's speed within this factor is dropped
PRIOR_WEIGHT = 0.5  # readings the slow-start guess weighs in a class's pooled estimate
NOISE_MARGIN = 3.0  # times their sampling noise members must differ by before it counts as real


class SpeedReading(NamedTuple):
    """One backend's own robust estimate of its log speed scale, the readings behind it
    (`log_scale` is None with none) and the estimate's sampling variance (log units squared;
    0 when its readings agree)."""

    log_scale: float | None
    readings: int
    variance: float = 0.0


@dataclass(frozen=True, slots=True)
class PoolParams:
    prior_log_scale: float = math.log(SLOW_START_SCALE)
    prior_weight: float = PRIOR_WEIGHT
    shrink: float = SHRINK_READINGS
    max_log_spread: float = math.log(MAX_CLASS_SPREAD)
    log_tolerance: float = math.log(CLASS_TOLERANCE)

    def __post_init__(self) -> None:
        if not (self.prior_weight > 0.0 and self.shrink > 0.0 and self.max_log_spread >= 0.0
                and self.log_tolerance >= 0.0):
            raise ValueError("prior_weight and shrink must be > 0, the spread and tolerance >= 0")


def confidence(readings: int, params: PoolParams) -> float:
    """How far a backend's own estimate counts against its class's: n / (n + shrink), 0..1."""
    return readings / (readings + params.shrink) if readings > 0 else 0.0


def class_log_scale(members: Iterable[SpeedReading], params: PoolParams) -> float:
    """The class's pooled log scale: its members' own estimates, each weighing its readings (up
    to `shrink` of them), with the slow-start guess weighing `prior_weight` readings."""
    weight = params.prior_weight
    total = weight * params.prior_log_scale
    for m in members:
        if m.log_scale is not None and m.readings > 0:
            w = min(float(m.readings), params.shrink)
            weight += w
            total += w * m.log_scale
    return total / weight


def between_variance(members: Sequence[SpeedReading]) -> float | None:
    """tau^2: the variance of the measured members' estimates less `NOISE_MARGIN` times their
    mean sampling variance, at least 0; None with fewer than two measured members."""
    logs = [m.log_scale for m in members if m.log_scale is not None and m.readings > 0]
    if len(logs) < 2:
        return None
    mean = sum(logs) / len(logs)
    spread = sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)
    noise = sum(m.variance for m in members if m.log_scale is not None and m.readings > 0)
    return max(0.0, spread - NOISE_MARGIN * noise / len(logs))


def own_weight(own: SpeedReading, tau2: float | None, params: PoolParams) -> float:
    """How far a member reads its own estimate rather than its class's (0..1): its confidence,
    and no more than the share of its estimate's variance that the class's real spread
    explains."""
    weight = confidence(own.readings, params)
    if tau2 is not None and own.variance > 0.0:
        weight = min(weight, tau2 / (tau2 + own.variance))
    return weight


def shrunk_log_scale(own: SpeedReading, pooled: float, params: PoolParams,
                     tau2: float | None = None) -> float:
    """The log scale a policy reads for a backend: the class's moved toward its own by its
    weight (`own_weight`), the gap first clamped to `max_log_spread`; the class's exactly when
    that move is within the tolerance."""
    if own.log_scale is None or own.readings <= 0:
        return pooled
    spread = params.max_log_spread
    gap = min(spread, max(-spread, own.log_scale - pooled))
    deviation = own_weight(own, tau2, params) * gap
    return pooled if abs(deviation) <= params.log_tolerance else pooled + deviation


def pooled_log_scales(members: Sequence[SpeedReading], params: PoolParams) -> list[float]:
    """Every member's log scale as a policy reads it, in `members`' order."""
    pooled = class_log_scale(members, params)
    tau2 = between_variance(members)
    return [shrunk_log_scale(m, pooled, params, tau2) for m in members]


def speed_class(candidate: Candidate) -> Hashable:
    """The class a backend's speed is pooled in: its metrics format, the models it serves and
    its KV capacity (blocks and block size) as its last scrape reported them. Two servers alike
    in all of these are taken as the same deployment until their replies show otherwise."""
    snap = candidate.snapshot
    if snap is None:
        return (None, candidate.spec.models, None, None)
    return (snap.format, snap.models or candidate.spec.models, snap.kv_total_blocks,
            snap.block_size)


class SpeedClasses:
    """Which backends share a class. `assign` returns the class a backend left (None when it
    had none or stays), so its old siblings are pooled again without it."""

    __slots__ = ("_class_of", "_members")

    def __init__(self) -> None:
        self._class_of: dict[str, Hashable] = {}
        self._members: dict[Hashable, list[str]] = {}

    def assign(self, backend_id: str, key: Hashable) -> tuple[bool, Hashable | None]:
        """Put `backend_id` in class `key`: (whether its class changed, the class it left)."""
        old = self._class_of.get(backend_id, _NONE)
        if old is not _NONE and old == key:
            return False, None
        left: Hashable | None = None
        if old is not _NONE:
            members = self._members[old]
            members.remove(backend_id)
            if members:
                left = old
            else:
                del self._members[old]
        self._class_of[backend_id] = key
        self._members.setdefault(key, []).append(backend_id)
        return True, left

    def class_of(self, backend_id: str) -> Hashable:
        """Its class; unassigned, a class of its own (its id)."""
        return self._class_of.get(backend_id, ("unassigned", backend_id))

    def siblings(self, backend_id: str) -> tuple[str, ...]:
        """The backends in `backend_id`'s class, itself included (alone when unassigned)."""
        key = self._class_of.get(backend_id, _NONE)
        return (backend_id,) if key is _NONE else tuple(self._members[key])

    def members(self, key: Hashable) -> tuple[str, ...]:
        return tuple(self._members.get(key, ()))


_NONE: Hashable = object()
