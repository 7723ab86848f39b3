"""kvgate's telemetry: OpenTelemetry traces and metrics, Prometheus text, the access log.

The gateway builds one `Telemetry` from `TelemetrySettings` and calls it at a request's arrival,
dispatch and end; see `gateway.telemetry.telemetry` for the calls and `timing` for what TTFT and
its parts mean.
"""

from gateway.telemetry.gauges import BackendGauges
from gateway.telemetry.outcome import RequestOutcome
from gateway.telemetry.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from gateway.telemetry.settings import TelemetryConfigError, TelemetrySettings
from gateway.telemetry.telemetry import Telemetry
from gateway.telemetry.timing import RequestTiming, server_timing
from gateway.telemetry.tracing import NOOP_TRACE, RequestTrace

__all__ = [
    "NOOP_TRACE",
    "PROMETHEUS_CONTENT_TYPE",
    "BackendGauges",
    "RequestOutcome",
    "RequestTiming",
    "RequestTrace",
    "Telemetry",
    "TelemetryConfigError",
    "TelemetrySettings",
    "server_timing",
]
