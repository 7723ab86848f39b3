"""The gateway's configuration: one frozen pydantic tree, validated once at start-up.

Sources, later ones winning: built-in defaults < the YAML file < `KVGATE_*` environment variables
< command-line flags. A bad value fails at start with one line naming the field
(`ConfigError`; the command line exits with code 2), never at the first request.

Environment rule: every variable whose name starts with `KVGATE_` sets one field. The rest of the
name is the field's path, sections separated by a double underscore and lower-cased:
`KVGATE_SERVER__PORT=8080` sets `server.port`, `KVGATE_ROUTING__POLICY=round_robin` sets
`routing.policy`, `KVGATE_BACKENDS__0__WEIGHT=2` sets the first backend's weight (a list index
one past the end appends a new entry). A value starting with `[` or `{` is parsed as a YAML/JSON
list or mapping (`KVGATE_MODEL_ALIASES='{"gpt-4o": "llama-3-8b"}'`); any other value is a string
that pydantic converts to the field's type. An unknown name is an error like an unknown key.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.auth import digest
from gateway.telemetry import TelemetrySettings
from gateway.telemetry.otlp import load_otlp_exporter
from gateway.telemetry.settings import OTLP_PROTOCOLS
from routing.model_select import DEFAULT_HARD_MARKERS, SmallModelRoute
from routing.policies import DEFAULT_POLICY
from routing.policy import PolicyContext, build_router, policy_names
from routing.state import METRICS_FORMATS, BackendSpec

ENV_PREFIX = "KVGATE_"
MIB = 1024 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)  # 0 = any free port
    # aiohttp's own default (1 MiB) rejects ordinary image requests; OpenAI accepts far more.
    max_body_bytes: int = Field(default=32 * MIB, ge=1024)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    # From sending the request to the response headers and, for streams, the first body chunk.
    # Covers the backend's queue and prefill, so it is generous; streams have no total timeout.
    first_byte_timeout_s: float = Field(default=300.0, gt=0)
    # Upstream connections open at once across all backends (one per in-flight request); 0 = no cap.
    max_upstream_connections: int = Field(default=8192, ge=0)
    discovery_timeout_s: float = Field(default=5.0, gt=0)  # GET /v1/models at start-up
    shutdown_timeout_s: float = Field(default=10.0, ge=0)
    # Ask backends for usage on every stream (`stream_options.include_usage`), dropping the usage
    # event from streams whose client did not ask: output lengths and each backend's speed are
    # learned from it. Off for a server that refuses the field; streams are then timed per event.
    stream_usage: bool = True


class BackendSettings(_Section):
    url: str
    id: str | None = None  # default: b0, b1, ... by position
    models: tuple[str, ...] = ()  # empty = discover from the backend's /v1/models
    metrics_format: str = "auto"
    weight: float = Field(default=1.0, gt=0)
    labels: dict[str, str] = Field(default_factory=dict)
    max_batch_total_tokens: int | None = Field(default=None, ge=1)  # TGI's launcher setting
    kv_unified: bool = False  # llama.cpp: one KV cache shared by its slots (routing/state.py)

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


class QueueSettings(_Section):
    """The gateway queue, per model: requests wait here while no backend can take them under its
    KV high-water mark."""

    max_depth: int = Field(default=1024, ge=0)  # beyond this, 429 with Retry-After at once
    timeout_s: float = Field(default=30.0, gt=0)  # waiting longer answers 503 with Retry-After
    max_per_tenant: int | None = Field(default=None, ge=1)  # one tenant's share of the queue


class RoutingSettings(_Section):
    policy: str = DEFAULT_POLICY
    # Scorer weights of the chosen policy, by scorer name (routing/policies.py), e.g. for cost:
    # {"ttft": 2, "goodput": 2, "prefill_load": 4.5, "preemption": 1, "prefix": 0.3,
    # "session": 0.3}. Unnamed ones keep their defaults.
    weights: dict[str, float] = Field(default_factory=dict)
    # Admission: a backend takes a request only if its peak KV stays under this fraction of the
    # backend's blocks and the predicted preemption risk is at most max_preemption_risk; when no
    # backend can, the request waits in the gateway queue. admission: false turns both off.
    admission: bool = True
    high_water: float = Field(default=0.9, gt=0, le=1)
    max_preemption_risk: float = Field(default=0.1, ge=0, le=1)
    # SLO admission (routing/dispatch.py), with admission on: a backend takes a request only while
    # the replies decoding there are predicted to stay within tpot_slo_s seconds per token with it;
    # when none can, the request gets 429 with Retry-After (after waiting up to slo_wait_s for one;
    # 0, the default, measured best: a waiting request holds up those behind it), so past the
    # fleet's SLO capacity the excess is shed instead of every reply slowing down. A backend with
    # none of the gateway's requests in flight, or whose speed has not been read yet (no first
    # token or reply measured), is never gated; one too slow for the SLO even alone is held to 2x
    # its idle TPOT instead. null turns it off. Requests of priority class slo_exempt_priority or
    # higher (priority_header) are never refused for it: the lower classes are shed first.
    tpot_slo_s: float | None = Field(default=0.05, gt=0)
    slo_wait_s: float = Field(default=0.0, ge=0)
    slo_exempt_priority: int | None = None
    # cost: a prompt of over twice the recent median goes to a slower backend (a bare decode step
    # 1.5x the fastest's) when one can give it its first token within 0.3 s and keep its replies
    # within the TPOT target: the fast backends' decodes are spared the long prefills
    # (routing/offload.py). false: long prompts go where the scores say, mostly the fastest.
    offload_long_prompts: bool = True
    queue: QueueSettings = QueueSettings()
    priority_header: str = Field(default="x-kvgate-priority", min_length=1)  # integer class
    tenant_header: str = Field(default="x-kvgate-tenant", min_length=1)
    session_header: str | None = None  # session affinity key; the body's `user` field otherwise
    # model -> tokenizer.json for exact prompt counts (needs the optional `tokenizers` package).
    tokenizers: dict[str, str] = Field(default_factory=dict)
    # ~3-4.3% of a core per 32 vLLM backends; ~3.5-8% for servers that send their whole payload
    poll_interval_s: float = Field(default=0.1, gt=0)
    # Backends scraped in the same instant (routing/poller.py): larger groups cost less CPU, but
    # each group's answers are parsed in one burst that delays the gateway's other work (32 busy
    # vLLM backends: the loop up to ~6-8 ms late once per interval; groups of 8: ~2 points of a
    # core more, up to ~3-4 ms).
    poll_group_size: int = Field(default=32, ge=1)
    # vLLM backends are asked for every series they expose about this often, and for the load
    # gauges alone in between (routing/poller.py, tiers): the counters, the cache config (KV
    # capacity) and the LoRA adapters in a snapshot are at most this old. At or below
    # `poll_interval_s`: every series at every scrape.
    full_scrape_interval_s: float = Field(default=1.0, gt=0)
    scrape_timeout_s: float = Field(default=0.5, gt=0)  # one /metrics scrape, connect to body
    max_snapshot_age_s: float = Field(default=1.0, gt=0)
    # Failed scrapes or connections in a row that make a backend unhealthy.
    failure_threshold: int = Field(default=3, ge=1)
    seed: int | None = None  # seeds the policy's random.Random (tests, reproducible runs)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        names = policy_names()
        if value not in names:
            raise ValueError(f"unknown policy {value!r}; known: {', '.join(names)}")
        return value

    @field_validator("weights")
    @classmethod
    def _policy_weights(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        policy = info.data.get("policy")
        if policy is None:  # the policy itself was invalid; that error is reported
            return value
        for name, weight in value.items():
            if weight < 0:
                raise ValueError(f"weight {name!r} must be >= 0")
        build_router(policy, PolicyContext(weights=value))  # ValueError naming a bad scorer
        return value

    @field_validator("tokenizers")
    @classmethod
    def _tokenizer_files(cls, value: dict[str, str]) -> dict[str, str]:
        if value and importlib.util.find_spec("tokenizers") is None:
            raise ValueError("exact tokenizers need the optional 'tokenizers' package "
                             "(pip install tokenizers), which is not installed")
        for model, path in value.items():
            if not Path(path).is_file():
                raise ValueError(f"{model}: {path} is not a readable tokenizer.json file")
        return value


class TelemetryConfig(_Section):
    """The `telemetry` section; `to_settings()` is what `Telemetry` takes. Metrics are always on
    (GET /metrics); traces are exported only when `otlp_endpoint` is set (the `otlp` extra)."""

    service_name: str = Field(default="kvgate", min_length=1)
    otlp_protocol: str = "http/protobuf"  # or "grpc"; before the endpoint, whose check reads it
    # http/protobuf: a base URL (http://collector:4318; /v1/traces is appended) or the full
    # traces URL; grpc: host:port. None: no tracing, nothing exported, near-zero cost.
    otlp_endpoint: str | None = None
    otlp_headers: dict[str, str] = Field(default_factory=dict)
    trace_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)  # of new traces
    access_log_sample_rate: float = Field(default=1.0, ge=0.0, le=1.0)  # JSON lines, per request
    access_log_prompts: bool = False  # the prompt text goes into the access log only when true
    max_label_values: int = Field(default=200, ge=1)  # distinct values per metric label

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


class SmallModelRouteSettings(_Section):
    """A routing alias choosing between a large and a small model (routing/model_select.py)."""

    alias: str = Field(min_length=1)
    large: str = Field(min_length=1)
    small: str = Field(min_length=1)
    mode: Literal["easy", "overflow"] = "easy"
    max_prompt_tokens: int = Field(default=1024, ge=1)
    max_output_tokens: int = Field(default=512, ge=1)
    max_turns: int = Field(default=6, ge=1)
    hard_markers: tuple[str, ...] = DEFAULT_HARD_MARKERS

    @model_validator(mode="after")
    def _distinct_models(self) -> SmallModelRouteSettings:
        if self.large == self.small:
            raise ValueError(f"route {self.alias!r}: large and small are both {self.large!r}")
        if self.alias in (self.large, self.small):
            raise ValueError(f"route {self.alias!r}: the alias must not be one of its models")
        return self

    def to_route(self) -> SmallModelRoute:
        return SmallModelRoute(
            alias=self.alias, large=self.large, small=self.small, mode=self.mode,
            max_prompt_tokens=self.max_prompt_tokens, max_output_tokens=self.max_output_tokens,
            max_turns=self.max_turns,
            hard_markers=tuple(marker.lower() for marker in self.hard_markers if marker))


class ApiKeySettings(_Section):
    """One API key: the key itself or its SHA-256 (hex), a name for logs, its tenant."""

    name: str = Field(min_length=1)
    key: str | None = Field(default=None, min_length=16)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    tenant: str | None = Field(default=None, min_length=1)  # default: the name
    admin: bool = False  # may read /admin/*
    rpm: int | None = Field(default=None, ge=1)  # completion requests a minute, per replica
    tpm: int | None = Field(default=None, ge=1)  # model tokens a minute (gateway/ratelimit.py)

    @model_validator(mode="after")
    def _one_secret(self) -> ApiKeySettings:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError(f"key {self.name!r}: give exactly one of key and sha256")
        return self

    def digest(self) -> str:
        if self.sha256 is not None:
            return self.sha256.lower()
        assert self.key is not None
        return digest(self.key)


class AuthSettings(_Section):
    """API keys (gateway/auth.py); none listed: no authentication."""

    keys: tuple[ApiKeySettings, ...] = ()
    protect_metrics: bool = False  # true: GET /metrics needs a key too

    @field_validator("keys")
    @classmethod
    def _distinct(cls, value: tuple[ApiKeySettings, ...]) -> tuple[ApiKeySettings, ...]:
        names, digests = set(), set()
        for key in value:
            if key.name in names:
                raise ValueError(f"two keys are named {key.name!r}")
            if key.digest() in digests:
                raise ValueError(f"key {key.name!r} is listed twice")
            names.add(key.name)
            digests.add(key.digest())
        return value


class CacheSettings(_Section):
    """The response cache (gateway/cache): exact, then semantic, over one store. Off unless
    enabled (`kvgate demo` and `kvgate serve --redis URL` turn it on)."""

    enabled: bool = False
    store: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None  # redis://[:password@]host:port/db; the `redis` store's server
    key_prefix: str = Field(default="kvgate:cache:", min_length=1)  # every Redis key starts so
    ttl_s: float | None = Field(default=3600.0, gt=0)  # an answer's lifetime; null = forever
    max_entries: int = Field(default=10_000, ge=1)  # the memory store's LRU bound
    # Semantic lookups compare a question with this many newest entries of its namespace.
    max_per_namespace: int = Field(default=256, ge=1)
    semantic: bool = True  # the second tier; false = exact matches only
    embedder: Literal["hashing"] = "hashing"  # built in: near-duplicate questions, no model
    similarity_threshold: float = Field(default=0.9, gt=0, le=1)  # cosine, for a semantic hit
    # Requests sampled hotter than this are not cached (an absent temperature is OpenAI's 1.0);
    # null caches every temperature.
    max_temperature: float | None = Field(default=None, ge=0)
    timeout_s: float = Field(default=0.25, gt=0)  # a slower store call counts as a miss
    # global: one cache for every client; tenant: each tenant (its API key's, else the tenant
    # header's, else its bearer token's) sees only the answers it was given itself.
    scope: Literal["global", "tenant"] = "global"

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"{value!r} is not a redis://, rediss:// or unix:// URL")
        return value

    @model_validator(mode="after")
    def _store_reachable(self) -> CacheSettings:
        if self.store == "redis" and self.redis_url is None:
            raise ValueError("store 'redis' needs redis_url")
        return self


class Settings(_Section):
    server: ServerSettings = ServerSettings()
    backends: tuple[BackendSettings, ...] = ()
    model_aliases: dict[str, str] = Field(default_factory=dict)  # alias -> real model name
    routing: RoutingSettings = RoutingSettings()
    telemetry: TelemetryConfig = TelemetryConfig()
    cache: CacheSettings = CacheSettings()
    auth: AuthSettings = AuthSettings()
    small_model: tuple[SmallModelRouteSettings, ...] = ()  # routing aliases: large or small

    @model_validator(mode="after")
    def _routes_distinct(self) -> Settings:
        seen: set[str] = set()
        for route in self.small_model:
            if route.alias in seen:
                raise ValueError(f"small_model: two routes are named {route.alias!r}")
            if route.alias in self.model_aliases:
                raise ValueError(f"small_model: {route.alias!r} is also a model_aliases entry")
            seen.add(route.alias)
        return self

    def small_model_routes(self) -> dict[str, SmallModelRoute]:
        return {route.alias: route.to_route() for route in self.small_model}

    @field_validator("backends")
    @classmethod
    def _unique_ids(cls, value: tuple[BackendSettings, ...]) -> tuple[BackendSettings, ...]:
        seen: set[str] = set()
        for i, backend in enumerate(value):
            backend_id = backend.id or f"b{i}"
            if backend_id in seen:
                raise ValueError(f"duplicate backend id {backend_id!r}")
            seen.add(backend_id)
        return value

    @field_validator("model_aliases")
    @classmethod
    def _no_self_alias(cls, value: dict[str, str]) -> dict[str, str]:
        for alias, target in value.items():
            if alias == target:
                raise ValueError(f"alias {alias!r} maps to itself")
        return value

    def backend_specs(self) -> tuple[BackendSpec, ...]:
        return tuple(
            BackendSpec(
                id=b.id or f"b{i}",
                url=b.url,
                models=b.models,
                metrics_format=None if b.metrics_format == "auto" else b.metrics_format,
                weight=b.weight,
                labels=MappingProxyType(dict(b.labels)),
                max_batch_total_tokens=b.max_batch_total_tokens,
                kv_unified=b.kv_unified,
            )
            for i, b in enumerate(self.backends)
        )


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


class ConfigError(Exception):
    """A bad configuration: its message is one line naming the file, variable or field."""


def load_settings(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Settings from the YAML file (if any), then `KVGATE_*` variables, then `overrides` (the
    command line's flags, as a nested mapping). Raises ConfigError naming the bad field."""
    raw: dict[str, Any] = _read_file(Path(path)) if path is not None else {}
    env_paths = _apply_env(raw, os.environ if environ is None else environ)
    if overrides:
        _deep_merge(raw, overrides)
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(error["loc"])
        where = f"config {path}" if path is not None else "config"
        for var, var_path in env_paths.items():
            if loc[: len(var_path)] == var_path:
                where = var
        field = ".".join(str(part) for part in loc) or "(top level)"
        raise ConfigError(f"{where}: {field}: {error['msg']}") from exc


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config {path}: invalid YAML{at}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: the top level must be a mapping of sections")
    return data


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, tuple[str | int, ...]]:
    """Writes every KVGATE_* variable into `raw`; returns variable -> field path (for errors)."""
    paths: dict[str, tuple[str | int, ...]] = {}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or len(var) == len(ENV_PREFIX):
            continue
        segments = var[len(ENV_PREFIX) :].lower().split("__")
        if any(not s for s in segments):
            raise ConfigError(f"{var}: empty section name (use a double underscore between names)")
        path: tuple[str | int, ...] = tuple(int(s) if s.isdigit() else s for s in segments)
        _set_path(raw, path, _env_value(environ[var]), var)
        paths[var] = path
    return paths


def _env_value(text: str) -> Any:
    if text.lstrip().startswith(("[", "{")):
        return yaml.safe_load(text)
    return text


def _set_path(root: dict[str, Any], path: tuple[str | int, ...], value: Any, var: str) -> None:
    node: Any = root
    for depth, key in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(key, int):
            if not isinstance(node, list):
                raise ConfigError(f"{var}: {key} indexes something that is not a list")
            if key > len(node):
                raise ConfigError(f"{var}: index {key} is past the end of a {len(node)}-item list")
            if key == len(node):
                node.append({})
        elif not isinstance(node, dict):
            raise ConfigError(f"{var}: {key!r} names a field of something that is not a section")
        if last:
            node[key] = value
            return
        child = node.get(key) if isinstance(node, dict) else node[key]
        if child is None:
            child = [] if isinstance(path[depth + 1], int) else {}
            node[key] = child
        node = child


def _deep_merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        current = into.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict):
            _deep_merge(current, value)
        else:
            into[key] = value
