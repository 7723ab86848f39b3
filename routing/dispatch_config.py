"""The Dispatcher's settings: admission, the gateway queue, the prefix index, the session table
and the one SLO (routing/slo.py `SloTargets`), validated when made."""

from __future__ import annotations

from dataclasses import dataclass, field

from routing.prefix import DEFAULT_BLOCK_CHARS
from routing.scheduling.admission import DEFAULT_MAX_RISK, AdmissionParams
from routing.slo import SloTargets
from routing.ttft import DEFAULT_HIGH_WATER


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    admission: bool = True
    high_water: float = DEFAULT_HIGH_WATER  # fraction of a backend's KV blocks a request may fill
    max_preemption_risk: float = DEFAULT_MAX_RISK
    queue_max_depth: int = 1024  # per model
    queue_timeout_s: float = 30.0
    queue_max_per_tenant: int | None = None  # per model
    drain_tau_s: float = 10.0  # time constant of the queue's measured drain rate (Retry-After)
    prefix_block_chars: int = DEFAULT_BLOCK_CHARS
    prefix_index_blocks: int = 8192  # per backend
    sessions: int = 65_536  # sessions remembered (LRU)
    slo: SloTargets = field(default_factory=SloTargets)
    # SLO admission (routing/scheduling/admission.py), with admission on, against `slo.tpot_s`.
    slo_admission: bool = True
    # How long a request may wait for a backend within the SLO. 0 (refuse at once) by default:
    # a waiting head holds up every arrival behind it.
    slo_wait_s: float = 0.0
    # Requests of this priority class or higher are not SLO-gated; None: every class is.
    slo_exempt_priority: int | None = None

    def __post_init__(self) -> None:
        if self.queue_timeout_s <= 0 or self.queue_max_depth < 0 or self.sessions < 1:
            raise ValueError("queue_timeout_s must be > 0, queue_max_depth >= 0, sessions >= 1")
        if not self.slo_wait_s >= 0.0:
            raise ValueError("slo_wait_s must be >= 0")
        self.admission_params()  # ValueError naming a bad admission figure

    @property
    def slo_gated(self) -> bool:
        return self.admission and self.slo_admission

    def admission_params(self) -> AdmissionParams:
        return AdmissionParams(
            enabled=self.admission, high_water=self.high_water,
            max_preemption_risk=self.max_preemption_risk,
            slo_tpot_s=self.slo.tpot_s if self.slo_admission else None,
            exempt_priority=self.slo_exempt_priority)
