"""TelemetrySettings fail at construction, naming the field."""

from __future__ import annotations

import pytest

from gateway.telemetry import TelemetryConfigError, TelemetrySettings


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        pytest.param({"service_name": ""}, "service_name", id="empty service name"),
        pytest.param({"otlp_protocol": "thrift"}, "otlp_protocol", id="unknown OTLP protocol"),
        pytest.param({"otlp_endpoint": "  "}, "otlp_endpoint", id="blank endpoint"),
        pytest.param({"trace_sample_ratio": 1.5}, "trace_sample_ratio", id="ratio above 1"),
        pytest.param({"access_log_sample_rate": -0.1}, "access_log_sample_rate",
                     id="negative sample rate"),
        pytest.param({"max_label_values": 0}, "max_label_values", id="no label values allowed"),
        pytest.param({"cache_tiers": ("exact", "miss")}, "cache_tiers",
                     id="a tier named like a cache result"),
        pytest.param({"cache_tiers": ("exact", "exact")}, "cache_tiers", id="repeated tier"),
    ],
)  # fmt: skip
def test_invalid_settings_name_the_field(fields: dict[str, object], field_name: str) -> None:
    with pytest.raises(TelemetryConfigError, match=f"telemetry.{field_name}"):
        TelemetrySettings(**fields)  # type: ignore[arg-type]


def test_defaults_are_valid_and_trace_nothing() -> None:
    settings = TelemetrySettings()
    assert settings.otlp_endpoint is None
    assert settings.access_log_prompts is False
