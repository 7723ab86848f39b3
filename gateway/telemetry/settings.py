"""Telemetry settings: a plain frozen dataclass the gateway's pydantic config maps onto.

Validation happens here, at construction, so a bad value fails at start-up with a message naming
the field, never at the first request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

OTLP_PROTOCOLS: tuple[str, ...] = ("http/protobuf", "grpc")


class TelemetryConfigError(ValueError):
    """A telemetry setting is invalid or needs an optional extra that is not installed."""


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    service_name: str = "kvgate"
    # Traces are exported over OTLP when this is set; with no endpoint (and no span processor
    # injected by a test or benchmark) tracing is off and costs nothing per request.
    # http/protobuf: a base URL ("http://127.0.0.1:4318", "/v1/traces" is appended when the URL
    # has no path) or the full traces URL. grpc: "host:port" or "http://host:port".
    otlp_endpoint: str | None = None
    otlp_protocol: str = "http/protobuf"
    otlp_headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    trace_sample_ratio: float = 1.0  # for new traces; a client traceparent's decision is kept
    access_log_sample_rate: float = 1.0  # fraction of requests logged, in [0, 1]
    access_log_prompts: bool = False  # the prompt text is logged only when this is True
    # The cache tiers a lookup walks, in order, until one hits ("miss" = all of them missed).
    cache_tiers: tuple[str, ...] = ("exact", "semantic")
    # At most this many distinct values per metric label; later newcomers are counted as "_OTHER".
    max_label_values: int = 200

    def __post_init__(self) -> None:
        if not self.service_name:
            raise TelemetryConfigError("telemetry.service_name must not be empty")
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise TelemetryConfigError(
                f"telemetry.otlp_protocol must be one of {', '.join(OTLP_PROTOCOLS)},"
                f" not {self.otlp_protocol!r}"
            )
        if self.otlp_endpoint is not None and not self.otlp_endpoint.strip():
            raise TelemetryConfigError("telemetry.otlp_endpoint must not be blank; omit it")
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise TelemetryConfigError(
                f"telemetry.trace_sample_ratio must be in [0, 1], not {self.trace_sample_ratio}"
            )
        if not 0.0 <= self.access_log_sample_rate <= 1.0:
            raise TelemetryConfigError(
                "telemetry.access_log_sample_rate must be in [0, 1],"
                f" not {self.access_log_sample_rate}"
            )
        if self.max_label_values < 1:
            raise TelemetryConfigError(
                f"telemetry.max_label_values must be >= 1, not {self.max_label_values}"
            )
        reserved = {"miss", "bypass"} & set(self.cache_tiers)
        if reserved or len(set(self.cache_tiers)) != len(self.cache_tiers):
            raise TelemetryConfigError(
                "telemetry.cache_tiers must be distinct names other than 'miss' and 'bypass',"
                f" not {self.cache_tiers!r}"
            )
