"""Passive outlier ejection: what requests' outcomes say of a backend's health, as pure rules.

A backend's `Health` is a frozen value; each event (a request's success or failure, a refused
connection, an answer that says nothing of health, a Retry-After hold) gives the next one. The
Fleet (routing/fleet.py) keeps one per backend and asks `cap_allows` before an ejection. Nothing
here reads a clock or does I/O: every step takes `now` (monotonic seconds).

Rules
- Reachability: a backend is reachable once anything reached it (a scrape answered, even with an
  error or a payload of no known format; model discovery answered; a request answered). A refused
  connection (`on_unreachable`) makes it unreachable whatever the cap, until something reaches it
  again. A backend nothing has reached yet is not in rotation.
- Ejection: `consecutive_failures` request failures in a row (5xx, timeouts, resets, idle
  streams; never a 4xx or a client disconnect) eject it for `base_ejection_s` times its ejection
  multiplier, at most `max_ejection_factor` times `base_ejection_s` (Envoy's
  `max_ejection_time`). The multiplier is the number of its ejections so far, less one for every
  `base_ejection_s` it has spent back in rotation since its last ejection ended (Envoy takes one
  off at every detection interval the host is not ejected); it never goes below zero.
- Only a request's success resets the failures in a row. A good scrape or discovery never does,
  nor ends an ejection. The count is kept through an ejection: once back in rotation, one failure
  before a success ejects the backend again, for longer.
- The cap: an ejection is made only while every model the backend serves keeps at most
  `max_ejected_fraction` of its reachable backends ejected, this one counted (`cap_allows`); an
  ejection beyond the cap is not made (`Event.CAPPED`, counted by the caller), and the next
  failure tries again. Unreachable backends are out whatever the cap and do not count in it.
- Hold-off: a 429 or 503 with Retry-After holds the backend out of rotation until then without
  ejecting it; a later hold never shortens an earlier one.
- In rotation (`in_rotation`): reachable and not ejected. Available for a new request
  (`available`): in rotation and not held.
- Back in (`back_in`): for a model with no backend available, the time until the first of its
  reachable backends' ejections or holds ends; None when none will end by itself (every backend
  unreachable).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

# Why a request failed at a backend: a 5xx answer, no first byte in time, a connection reset or
# closed mid-answer, a stream idle past its timeout.
FAILURE_REASONS = frozenset({"status_5xx", "timeout", "reset", "stream_idle"})


@dataclass(frozen=True, slots=True)
class OutlierRules:
    """The ejection parameters (the gateway's `health:` settings)."""

    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejected_fraction: float = 0.5
    max_ejection_factor: int = 10

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be at least 1")
        if not self.base_ejection_s > 0.0:
            raise ValueError("base_ejection_s must be positive")
        if not 0.0 <= self.max_ejected_fraction <= 1.0:
            raise ValueError("max_ejected_fraction must be in [0, 1]")
        if self.max_ejection_factor < 1:
            raise ValueError("max_ejection_factor must be at least 1")


class Event(enum.Enum):
    """What a failure did."""

    COUNTED = "counted"  # below the threshold, or already ejected
    EJECTED = "ejected"
    CAPPED = "capped"  # at the threshold, but the cap refused the ejection


@dataclass(frozen=True, slots=True)
class Health:
    """One backend's health by the module's rules."""

    reachable: bool = False
    failures: int = 0  # request failures in a row
    ejected_until: float = -math.inf  # out of rotation before this
    multiplier: int = 0  # the last ejection's, before decay
    ejections: int = 0  # every ejection so far
    held_until: float = -math.inf  # a Retry-After: no new request before this


def ejected(health: Health, now: float) -> bool:
    return now < health.ejected_until


def in_rotation(health: Health, now: float) -> bool:
    return health.reachable and now >= health.ejected_until


def available(health: Health, now: float) -> bool:
    return health.reachable and now >= health.ejected_until and now >= health.held_until


def multiplier(health: Health, now: float, rules: OutlierRules) -> int:
    """The ejection multiplier as of `now`: the last one, decayed by the time since that
    ejection ended (module rule)."""
    if health.multiplier == 0 or now < health.ejected_until:
        return health.multiplier
    spent = math.floor((now - health.ejected_until) / rules.base_ejection_s)
    return max(0, health.multiplier - spent)


def on_success(health: Health) -> Health:
    """A request answered: reachable, and the failures in a row start over."""
    if health.reachable and health.failures == 0:
        return health
    return replace(health, reachable=True, failures=0)


def on_reached(health: Health) -> Health:
    """A call that says nothing of health answered (a scrape, discovery): reachable, nothing
    else changes."""
    return health if health.reachable else replace(health, reachable=True)


def on_unreachable(health: Health) -> Health:
    return replace(health, reachable=False) if health.reachable else health


def on_hold(health: Health, until: float) -> Health:
    return replace(health, held_until=until) if until > health.held_until else health


def would_eject(health: Health, now: float, rules: OutlierRules) -> bool:
    """Whether one more failure at `now` reaches the threshold of a backend in rotation (the
    caller then checks the cap)."""
    return not ejected(health, now) and health.failures + 1 >= rules.consecutive_failures


def on_failure(
    health: Health, now: float, reason: str, rules: OutlierRules, *, cap_allows: bool
) -> tuple[Health, Event]:
    """A request failed for `reason` (one of FAILURE_REASONS). `cap_allows`: whether the cap
    leaves room to eject this backend now (`cap_allows` below; read only when `would_eject`)."""
    if reason not in FAILURE_REASONS:
        raise ValueError(f"unknown failure reason {reason!r}")
    reachable = health.reachable or reason == "status_5xx"  # a 5xx is an answer
    if not would_eject(health, now, rules):
        return replace(health, reachable=reachable, failures=health.failures + 1), Event.COUNTED
    counted = replace(health, reachable=reachable, failures=health.failures + 1)
    if not cap_allows:
        return counted, Event.CAPPED
    factor = multiplier(health, now, rules) + 1
    duration = rules.base_ejection_s * min(factor, rules.max_ejection_factor)
    return replace(counted, ejected_until=now + duration, multiplier=factor,
                   ejections=health.ejections + 1), Event.EJECTED


def cap_allows(groups: Iterable[tuple[int, int]], fraction: float) -> bool:
    """Whether one more ejection keeps every group within the cap. `groups`: per model the
    backend serves, (backends ejected now, reachable backends), this one among the latter."""
    return all(ejected_now + 1 <= fraction * reachable + 1e-9
               for ejected_now, reachable in groups)


def back_in(healths: Iterable[Health], now: float) -> float | None:
    """Seconds until the first of these backends is available again by an ejection or a hold
    ending; 0.0 when one is available now; None when none will be by itself."""
    soonest: float | None = None
    for health in healths:
        if not health.reachable:
            continue
        wait = max(health.ejected_until, health.held_until) - now
        if wait <= 0.0:
            return 0.0
        if soonest is None or wait < soonest:
            soonest = wait
    return soonest
