"""Admission control: admit now, wait in the gateway queue, or reject with a Retry-After.

`AdmissionQueue` is the gateway queue as a pure data structure: strict priority between classes
(higher number first), round-robin between tenants within a class, FIFO within a tenant. Entries
are opaque hashable values (request ids, futures); the async waiting around it is the gateway's.
Every pushed entry leaves exactly once: by `pop_next`, `remove` or `expired`.

`admit` is the decision for one arriving request, and `timed_out` the answer for a request whose
wait exceeded the queue timeout; `DrainRate` measures how fast the queue empties, for Retry-After.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

E = TypeVar("E", bound=Hashable)

RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 60
RETRY_AFTER_UNKNOWN_S = 5  # when nothing has left the queue recently to measure its pace by


@dataclass(frozen=True, slots=True)
class _Waiting:
    priority: int
    tenant: str
    enqueued_at: float


class AdmissionQueue(Generic[E]):
    """Bounded priority queue, fair between tenants. Not thread-safe; no clock (times passed in).

    `now` must not go backwards between calls (a monotonic clock): an earlier value counts as the
    latest seen, which keeps arrival order and expiry order the same.
    """

    def __init__(self, max_depth: int, *, max_per_tenant: int | None = None) -> None:
        if max_depth < 0 or (max_per_tenant is not None and max_per_tenant < 0):
            raise ValueError("queue limits must be >= 0")
        self.max_depth = max_depth
        self.max_per_tenant = max_per_tenant
        self._arrivals: OrderedDict[E, _Waiting] = OrderedDict()  # oldest first
        # priority -> tenants in round-robin order -> that tenant's entries, FIFO
        self._classes: dict[int, OrderedDict[str, OrderedDict[E, None]]] = {}
        self._priorities: list[int] = []  # classes with entries, highest first
        self._class_depth: dict[int, int] = {}
        self._tenant_depth: dict[str, int] = {}
        self._latest = -math.inf

    def __len__(self) -> int:
        return len(self._arrivals)

    def __contains__(self, entry: object) -> bool:
        return entry in self._arrivals

    @property
    def depth(self) -> int:
        return len(self._arrivals)

    def tenant_depth(self, tenant: str) -> int:
        return self._tenant_depth.get(tenant, 0)

    def depth_at_or_above(self, priority: int) -> int:
        """Entries that would leave before a new entry of `priority`."""
        return sum(n for p, n in self._class_depth.items() if p >= priority)

    def oldest_wait(self, now: float) -> float:
        """Seconds the longest-waiting entry has waited (0 when empty)."""
        for waiting in self._arrivals.values():
            return max(0.0, now - waiting.enqueued_at)
        return 0.0

    def push(self, entry: E, *, priority: int, tenant: str, now: float) -> bool:
        """Enqueue; False (and nothing changes) when the queue or the tenant's share is full."""
        if entry in self._arrivals:
            raise ValueError("entry is already queued")
        if len(self._arrivals) >= self.max_depth:
            return False
        if self.max_per_tenant is not None and self.tenant_depth(tenant) >= self.max_per_tenant:
            return False
        self._latest = max(self._latest, now)
        self._arrivals[entry] = _Waiting(priority, tenant, self._latest)
        tenants = self._classes.get(priority)
        if tenants is None:
            tenants = self._classes[priority] = OrderedDict()
            self._priorities = sorted(self._classes, reverse=True)
        fifo = tenants.get(tenant)
        if fifo is None:
            fifo = tenants[tenant] = OrderedDict()
        fifo[entry] = None
        self._class_depth[priority] = self._class_depth.get(priority, 0) + 1
        self._tenant_depth[tenant] = self._tenant_depth.get(tenant, 0) + 1
        return True

    def peek_next(self) -> E | None:
        """The entry `pop_next` would return, left in place."""
        if not self._priorities:
            return None
        fifo = next(iter(self._classes[self._priorities[0]].values()))
        return next(iter(fifo))

    def pop_next(self) -> E | None:
        """Highest class first; within it the next tenant in turn, then that tenant's oldest."""
        if not self._priorities:
            return None
        priority = self._priorities[0]
        tenants = self._classes[priority]
        tenant, fifo = next(iter(tenants.items()))
        entry, _ = fifo.popitem(last=False)
        if fifo:
            tenants.move_to_end(tenant)  # its turn is over: the other tenants go first
        self._discard(entry)
        return entry

    def remove(self, entry: E) -> bool:
        """Take out an entry whose client went away; False if it is not queued."""
        if entry not in self._arrivals:
            return False
        self._discard(entry)
        return True

    def expired(self, now: float, timeout: float) -> list[E]:
        """Take out and return, oldest first, every entry that has waited longer than `timeout`."""
        out: list[E] = []
        for entry, waiting in self._arrivals.items():
            if now - waiting.enqueued_at <= timeout:
                break
            out.append(entry)
        for entry in out:
            self._discard(entry)
        return out

    def _discard(self, entry: E) -> None:
        waiting = self._arrivals.pop(entry)
        priority, tenant = waiting.priority, waiting.tenant
        tenants = self._classes[priority]
        fifo = tenants[tenant]
        fifo.pop(entry, None)
        if not fifo:
            del tenants[tenant]
        if not tenants:
            del self._classes[priority]
            self._priorities = sorted(self._classes, reverse=True)
        self._class_depth[priority] -= 1
        if not self._class_depth[priority]:
            del self._class_depth[priority]
        self._tenant_depth[tenant] -= 1
        if not self._tenant_depth[tenant]:
            del self._tenant_depth[tenant]


class QueueState(Protocol):
    """What `admit` reads from the queue."""

    max_depth: int
    max_per_tenant: int | None

    @property
    def depth(self) -> int: ...

    def tenant_depth(self, tenant: str) -> int: ...

    def depth_at_or_above(self, priority: int) -> int: ...


class Verdict(StrEnum):
    ADMIT = "admit"  # dispatch now
    QUEUE = "queue"  # push onto the gateway queue and wait for capacity
    REJECT = "reject"  # answer `status` with Retry-After at once


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    verdict: Verdict
    reason: str
    status: int | None = None  # HTTP status of a rejection
    retry_after_s: int | None = None  # Retry-After header of a rejection


def retry_after_s(ahead: int, drain_per_s: float | None) -> int:
    """Whole seconds until `ahead` queued requests have left at the measured pace, clamped to
    [RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S]; RETRY_AFTER_UNKNOWN_S when no pace is known."""
    if drain_per_s is None or drain_per_s <= 0.0:
        return RETRY_AFTER_UNKNOWN_S
    seconds = math.ceil(max(1, ahead) / drain_per_s)
    return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, seconds))


def admit(
    *,
    any_fits: bool,
    all_oversized: bool,
    priority: int,
    tenant: str,
    queue: QueueState,
    drain_per_s: float | None,
) -> AdmissionDecision:
    """Decide for one arriving request, given the candidates' predictions.

    `any_fits`: some candidate can take it under its KV high-water mark now. `all_oversized`: none
    could even when empty, so waiting cannot help and the backend's own limits decide. A request
    that fits still queues behind waiting entries of its class or higher, so it cannot overtake.
    Having no candidate at all (no healthy backend) is the caller's 503, not an admission matter.
    """
    ahead = queue.depth_at_or_above(priority)
    if all_oversized:
        return AdmissionDecision(Verdict.ADMIT, "larger than any backend's high-water mark")
    if any_fits and ahead == 0:
        return AdmissionDecision(Verdict.ADMIT, "fits now")
    if queue.depth >= queue.max_depth:
        return AdmissionDecision(Verdict.REJECT, "gateway queue full", 429,
                                 retry_after_s(ahead, drain_per_s))
    if queue.max_per_tenant is not None and queue.tenant_depth(tenant) >= queue.max_per_tenant:
        return AdmissionDecision(Verdict.REJECT, "tenant's share of the gateway queue full", 429,
                                 retry_after_s(queue.tenant_depth(tenant), drain_per_s))
    reason = "requests waiting ahead" if any_fits else "no backend fits"
    return AdmissionDecision(Verdict.QUEUE, reason)


def timed_out(ahead: int, drain_per_s: float | None) -> AdmissionDecision:
    """The answer for an entry `expired` returned: 503, with a Retry-After for the `ahead` entries
    still queued (a retry joins the back) to drain."""
    return AdmissionDecision(Verdict.REJECT, "waited longer than the queue timeout", 503,
                             retry_after_s(ahead, drain_per_s))


class DrainRate:
    """Requests leaving the queue per second: an exponentially weighted rate with time constant
    `tau_s` (an event counts 1/tau_s and fades by e every tau_s). None before the first event."""

    __slots__ = ("_tau", "_value", "_at")

    def __init__(self, tau_s: float = 10.0) -> None:
        self._tau = tau_s
        self._value = 0.0
        self._at: float | None = None

    def record(self, now: float, count: int = 1) -> None:
        self._value = self.per_second(now) or 0.0
        self._value += count / self._tau
        self._at = now if self._at is None else max(self._at, now)

    def per_second(self, now: float) -> float | None:
        if self._at is None:
            return None
        return self._value * math.exp(-max(0.0, now - self._at) / self._tau)
