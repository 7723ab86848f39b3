"""The gateway's own sections of the configuration: `server` (its HTTP server and its connections
to the backends) and `telemetry` (metrics, traces, the access log)."""

from __future__ import annotations

import os
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gateway.telemetry import TelemetrySettings
from gateway.telemetry.otlp import load_otlp_exporter
from gateway.telemetry.settings import OTLP_PROTOCOLS

MIB = 1024 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerSettings(_Section):
    """The gateway's HTTP server and its connections to the backends."""

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=0, le=65535,
                      description="Port to listen on; 0 takes any free port.")
    workers: int | Literal["auto"] = Field(
        default=1,
        description="Worker processes accepting on the one port (SO_REUSEPORT), deciding as one "
        "gateway: one poller per host, the in-flight ledger and the scrapes shared. `auto`: "
        "one per core available to the process. Each worker has its share of the queue depth "
        "and of the connection caps.")

    @field_validator("workers")
    @classmethod
    def _some_workers(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("workers must be at least 1 (or auto)")
        return value

    def worker_count(self) -> int:
        """`workers` as a number: `auto` is the cores this process may run on."""
        if self.workers == "auto":
            return max(1, len(os.sched_getaffinity(0)))
        return self.workers
    max_body_bytes: int = Field(
        default=32 * MIB, ge=1024,
        description="Largest request body accepted (413 above it). aiohttp's own default "
        "(1 MiB) rejects ordinary image requests; OpenAI accepts far more.")
    connect_timeout_s: float = Field(default=5.0, gt=0,
                                     description="Connecting to a backend, at most.")
    first_byte_timeout_s: float = Field(
        default=60.0, gt=0,
        description="Per attempt: from sending a request to a backend to its response headers "
        "and, for streams, the first body chunk (it covers the backend's own queue and prefill). "
        "Past it the attempt is aborted upstream and the request tried once on another backend.")
    stream_idle_timeout_s: float = Field(
        default=60.0, gt=0,
        description="A stream with no bytes from its backend for this long is aborted upstream "
        "and ended for the client with an SSE error event and `[DONE]`; streams have no total "
        "timeout.")
    max_upstream_connections: int = Field(
        default=8192, ge=0,
        description="Upstream connections open at once across all backends (one per in-flight "
        "request); 0 = no cap.")
    discovery_timeout_s: float = Field(
        default=5.0, gt=0,
        description="Each backend's `GET /v1/models` at start-up, for backends listed without "
        "`models`.")
    shutdown_timeout_s: float = Field(
        default=10.0, ge=0,
        description="On SIGINT or SIGTERM, after the drain grace: how long requests in flight may "
        "take to finish; streams still running then end with an SSE error event and `[DONE]`.")
    drain_grace_s: float = Field(
        default=5.0, ge=0,
        description="On SIGTERM, `/ready` answers 503 at once and the listener keeps accepting "
        "for this long (new completions get 503 with Retry-After), so load balancers see the "
        "503 before connections are refused.")
    client_header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="A client's whole request head must have arrived within this, or its "
        "connection is closed.")
    client_body_timeout_s: float = Field(
        default=30.0, gt=0,
        description="A client's whole request body must have arrived within this, or its "
        "connection is closed.")
    client_write_timeout_s: float = Field(
        default=60.0, gt=0,
        description="A client that reads nothing of its stream for this long is cut off and "
        "the upstream aborted.")
    keepalive_timeout_s: float = Field(
        default=75.0, ge=0,
        description="Idle keep-alive client connections are closed after this.")
    max_connections: int = Field(
        default=10_000, ge=1,
        description="Open client connections at most; beyond it new connections wait in the "
        "listen backlog.")
    max_messages: int = Field(
        default=10_000, ge=1,
        description="Messages in one conversation at most (400 beyond it).")
    stream_usage: bool = Field(
        default=True,
        description="Ask backends for usage on every stream (`stream_options.include_usage`), "
        "dropping the usage event from streams whose client did not ask for it: output lengths "
        "and each backend's speed are learned from it. false sends the client's bytes unchanged, "
        "for a server that refuses the field; streams are then timed per event.")
    stream_flush_interval_ms: int = Field(
        default=0, ge=0, le=1000,
        description="Token coalescing: after a stream's first content event, which is always "
        "sent at once, each stream is read from its backend and written to its client at most "
        "about once per this interval, several tokens per read and write, which cuts the "
        "gateway's CPU per relayed token; each token reaches the client at most this much later. "
        "0 relays every event as it comes.")

class HealthSettings(_Section):
    """Passive outlier ejection: what requests' outcomes say of a backend's health. Metrics
    freshness is apart from it: a backend whose `/metrics` is stale or broken but which answers
    requests stays in rotation, routed by the gateway's own ledger."""

    consecutive_failures: int = Field(
        default=5, ge=1,
        description="Failures in a row (5xx, timeouts, resets; never a 4xx or a client "
        "disconnect) that eject a backend.")
    base_ejection_s: float = Field(
        default=30.0, gt=0,
        description="An ejection lasts this times the number of the backend's ejections so far.")
    max_ejected_fraction: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="At most this share of a model's answering backends is ejected at once "
        "(a backend that refuses connections is out whatever the cap).")


class TelemetryConfig(_Section):
    """Metrics, traces and the access log. Metrics are always on (`GET /metrics`); traces are
    exported over OTLP only when `otlp_endpoint` is set (needs the `otlp` extra)."""

    service_name: str = Field(default="kvgate", min_length=1,
                              description="`service.name` of the exported traces.")
    otlp_protocol: str = Field(  # before the endpoint, whose check reads it
        default="http/protobuf", description="`http/protobuf` or `grpc`.")
    otlp_endpoint: str | None = Field(
        default=None,
        description="Where traces go. http/protobuf: a base URL (`http://collector:4318`; "
        "`/v1/traces` is appended) or the full traces URL; grpc: `host:port`. null: no tracing, "
        "nothing exported, near-zero cost.")
    otlp_headers: dict[str, str] = Field(
        default_factory=dict, description="Headers sent with every export (credentials, say).")
    trace_sample_ratio: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="Fraction of new traces sampled; a client's `traceparent` decision is kept.")
    access_log_sample_rate: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="Fraction of requests written to the access log (JSON lines).")
    access_log_prompts: bool = Field(
        default=False, description="The prompt text goes into the access log only when true.")
    max_label_values: int = Field(
        default=200, ge=1,
        description="Distinct values per metric label; later newcomers are counted as `_OTHER`.")

    @field_validator("otlp_protocol")
    @classmethod
    def _known_protocol(cls, value: str) -> str:
        if value not in OTLP_PROTOCOLS:
            raise ValueError(f"must be one of {', '.join(OTLP_PROTOCOLS)}")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _exporter_installed(cls, value: str | None, info: ValidationInfo) -> str | None:
        """At start-up, not at the first request: the exporter is an optional extra."""
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be blank; leave it out to turn tracing off")
        protocol = info.data.get("otlp_protocol", "http/protobuf")
        settings = TelemetrySettings(otlp_endpoint=value, otlp_protocol=protocol)
        load_otlp_exporter(settings).shutdown()
        return value

    def to_settings(self) -> TelemetrySettings:
        """The plain settings `gateway.telemetry.Telemetry` is built from."""
        return TelemetrySettings(
            service_name=self.service_name,
            otlp_endpoint=self.otlp_endpoint,
            otlp_protocol=self.otlp_protocol,
            otlp_headers=MappingProxyType(dict(self.otlp_headers)),
            trace_sample_ratio=self.trace_sample_ratio,
            access_log_sample_rate=self.access_log_sample_rate,
            access_log_prompts=self.access_log_prompts,
            max_label_values=self.max_label_values,
        )
