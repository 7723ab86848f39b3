"""What became of one request: the values telemetry records beside its timing.

Built once by the recorder (gateway/observe.py) at the end of a request. Free-text fields
(models, backend, policy, reasons) become metric labels only through a bound on distinct values;
`request_id`, `tenant` and `prompt` never become labels.
"""

from __future__ import annotations

from dataclasses import dataclass

# `admission` values: admitted at once, admitted after waiting in the gateway queue, or refused.
ADMISSION_RESULTS: tuple[str, ...] = ("admitted", "queued", "rejected")
# `cache` values, as in the x-kvgate-cache header; a tier name from the settings means a hit there.
CACHE_MISS = "miss"
CACHE_BYPASS = "bypass"


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    request_id: str
    operation: str  # gen_ai.operation.name: "chat" or "text_completion"
    request_model: str  # the model the client asked for
    status: int  # HTTP status sent to the client
    stream: bool = False
    response_model: str | None = None  # the model that served it
    backend: str | None = None  # None on a cache hit or before routing
    policy: str | None = None  # routing policy that chose `backend`
    cache: str = CACHE_BYPASS  # "miss", "bypass" or the tier that hit ("exact", "semantic")
    input_tokens: int | None = None
    output_tokens: int | None = None
    tenant: str | None = None
    admission: str | None = None  # one of ADMISSION_RESULTS; None if admission was not reached
    rejection_reason: str | None = None  # why admission refused, e.g. "queue_full", "timeout"
    small_model: bool | None = None  # small-model routing chose the small model; None = no choice
    error_type: str | None = None  # low-cardinality failure class, e.g. "upstream_timeout"
    prompt: str | None = None  # logged only when the settings allow it; never a label or attribute

    @property
    def error_label(self) -> str | None:
        """error.type per the conventions: our class if we have one, else the status code."""
        if self.error_type is not None:
            return self.error_type
        if self.status >= 400:
            return str(self.status)
        return None
