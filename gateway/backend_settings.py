"""The `backends` section: one entry per inference server, and the URL rule they follow."""

from __future__ import annotations

from types import MappingProxyType
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from routing.state import METRICS_FORMATS, BackendSpec


class BackendSettings(BaseModel):
    """One inference server. Its load is read from its `/metrics`, in the format given or
    detected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(
        description="`http(s)://host[:port][/prefix]`; a trailing `/v1` is dropped (kvgate "
        "appends the API paths itself).")
    id: str | None = Field(
        default=None,
        description="The name in headers, metrics and logs; null: b0, b1, ... by position.")
    models: tuple[str, ...] = Field(
        default=(),
        description="The models it serves; empty: discovered from its `GET /v1/models`.")
    metrics_format: str = Field(
        default="auto",
        description=f"One of {', '.join(('auto', *METRICS_FORMATS))}; auto: detected from what "
        "its /metrics answers.")
    weight: float = Field(default=1.0, gt=0,
                          description="Its share of the prefix_hash policy's hash ring.")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="Free-form labels carried in its spec; no built-in "
                                   "policy reads them.")
    max_batch_total_tokens: int | None = Field(
        default=None, ge=1,
        description="TGI: the launcher's `--max-batch-total-tokens`, its KV budget in tokens.")
    kv_unified: bool = Field(
        default=False,
        description="llama.cpp: one KV cache shared by its slots (llama-server without `-np`, "
        "or with `-kvu`): each slot's context is then the whole capacity, not a share.")
    model_revision: str | None = Field(
        default=None,
        description="The weights it serves, as the operator names them: part of the response "
        "cache's key, so new weights under the same model name never serve the old ones' "
        "answers.")
    api_key: SecretStr | None = Field(
        default=None,
        description="The backend's own API key (a vLLM started with `--api-key`), sent as "
        "`Authorization: Bearer` on requests and on scrapes of its `/metrics` and `/v1/models`; "
        "never shown in logs or `/admin/backends`. The client's own key is never forwarded.")

    def to_spec(self, default_id: str) -> BackendSpec:
        return BackendSpec(
            id=self.id or default_id, url=self.url, models=self.models,
            metrics_format=None if self.metrics_format == "auto" else self.metrics_format,
            weight=self.weight, labels=MappingProxyType(dict(self.labels)),
            max_batch_total_tokens=self.max_batch_total_tokens, kv_unified=self.kv_unified,
            api_key=self.api_key.get_secret_value() if self.api_key is not None else None)

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return normalise_backend_url(value)

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, value: SecretStr | None) -> SecretStr | None:
        """A key goes into a header line: printable ASCII without spaces (never echoed)."""
        if value is not None:
            key = value.get_secret_value()
            if not key or not all("!" <= c <= "~" for c in key):
                raise ValueError("must be printable ASCII without spaces")
        return value

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
