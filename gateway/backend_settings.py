"""The `backends` section: one entry per inference server, and the URL rule they follow."""

from __future__ import annotations

from types import MappingProxyType
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from routing.state import METRICS_FORMATS, BackendSpec


class BackendSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    id: str | None = None  # default: b0, b1, ... by position
    models: tuple[str, ...] = ()  # empty = discover from the backend's /v1/models
    metrics_format: str = "auto"
    weight: float = Field(default=1.0, gt=0)
    labels: dict[str, str] = Field(default_factory=dict)
    max_batch_total_tokens: int | None = Field(default=None, ge=1)  # TGI's launcher setting
    kv_unified: bool = False  # llama.cpp: one KV cache shared by its slots (routing/state.py)

    def to_spec(self, default_id: str) -> BackendSpec:
        return BackendSpec(
            id=self.id or default_id, url=self.url, models=self.models,
            metrics_format=None if self.metrics_format == "auto" else self.metrics_format,
            weight=self.weight, labels=MappingProxyType(dict(self.labels)),
            max_batch_total_tokens=self.max_batch_total_tokens, kv_unified=self.kv_unified)

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return normalise_backend_url(value)

    @field_validator("metrics_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        allowed = ("auto", *METRICS_FORMATS)
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value


def normalise_backend_url(value: str) -> str:
    """`http(s)://host[:port][/prefix]` without a trailing slash or `/v1` (clients often paste
    their OpenAI base_url, which ends in /v1; kvgate appends the API paths itself)."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{value!r} is not an http(s) URL")
    if not parts.hostname:
        raise ValueError(f"{value!r} has no host")
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ValueError(f"{value!r} has a bad port") from exc
    if parts.query or parts.fragment:
        raise ValueError(f"{value!r} must not have a query or fragment")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"
