"""The OTLP span exporter, imported only when an endpoint is configured.

The exporter packages are an optional extra, not dependencies: a gateway without an endpoint never
imports them, and one with an endpoint but without the package fails at start-up with a message
that says what to install.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from opentelemetry.sdk.trace.export import SpanExporter

from gateway.telemetry.settings import TelemetryConfigError, TelemetrySettings

# The exporter module and the package that provides it, per OTLP protocol.
_OTLP_EXPORTERS: dict[str, tuple[str, str]] = {
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry-exporter-otlp-proto-http",
    ),
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
    ),
}


def otlp_endpoint(settings: TelemetrySettings) -> str:
    """The endpoint the exporter is given: for http, a bare base URL gets "/v1/traces"."""
    endpoint = (settings.otlp_endpoint or "").strip()
    if settings.otlp_protocol == "http/protobuf" and urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def load_otlp_exporter(settings: TelemetrySettings) -> SpanExporter:
    """Imports the OTLP exporter lazily: it is an optional extra, not a dependency."""
    module_name, package = _OTLP_EXPORTERS[settings.otlp_protocol]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TelemetryConfigError(
            f"telemetry.otlp_endpoint is set but the OTLP exporter is not installed:"
            f" pip install 'kvgate[otlp]' (or the package {package})"
        ) from exc
    exporter = module.OTLPSpanExporter(
        endpoint=otlp_endpoint(settings), headers=dict(settings.otlp_headers)
    )
    if not isinstance(exporter, SpanExporter):
        raise TelemetryConfigError(f"{module_name}.OTLPSpanExporter is not a SpanExporter")
    return exporter
