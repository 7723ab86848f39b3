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

import os
from collections.abc import Mapping
from pathlib import Path
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
from gateway.backend_settings import BackendSettings
from gateway.routing_settings import (
    AdvancedSettings,
    RoutingSettings,
    SloSettings,
    policy_context,
)
from gateway.server_settings import HealthSettings, ServerSettings, TelemetryConfig
from gateway.small_model_settings import SmallModelRouteSettings
from routing.model_select import SmallModelRoute
from routing.policies import build_router
from routing.state import BackendSpec

ENV_PREFIX = "KVGATE_"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ApiKeySettings(_Section):
    """One API key: the key itself or its SHA-256 (hex), exactly one of the two."""

    name: str = Field(min_length=1, description="The key's name, for logs.")
    key: str | None = Field(default=None, min_length=16, description="The key itself.")
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-fA-F]{64}$",
        description="The key's SHA-256 in hex instead of the key (`printf %s KEY | sha256sum`).")
    tenant: str | None = Field(
        default=None, min_length=1,
        description="The tenant of its requests (fair-share queue, tenant cache scope); "
        "null: the key's name.")
    admin: bool = Field(default=False, description="May use the admin views (`/admin/*`).")
    rpm: int | None = Field(
        default=None, ge=1,
        description="Completion requests a minute, per replica (a token bucket holding as "
        "many); null: no limit.")
    tpm: int | None = Field(
        default=None, ge=1,
        description="Model tokens computed a minute, per replica: a request is charged its "
        "estimate when sent to a backend and settled against its usage when it ends; null: no "
        "limit.")

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
    """API keys. None listed: no authentication. Once one is listed every request needs a listed
    key (`Authorization: Bearer KEY` or `api-key: KEY`), except `GET /health`, `GET /ready` and,
    unless protected, `GET /metrics`."""

    keys: tuple[ApiKeySettings, ...] = Field(default=(), description="The accepted keys.")
    protect_metrics: bool = Field(default=False,
                                  description="true: `GET /metrics` needs a key too.")

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
    # The second tier. off: exact matches only (the default: a near question is not always the
    # same question, so an operator measures first); shadow: would-be semantic hits are computed
    # and recorded with whether the answers agreed (`kvgate cache shadow-report`), never served;
    # on: served, each hit having passed the near-miss guard (gateway/cache/guard.py).
    semantic: Literal["off", "shadow", "on"] = "off"
    # auto: the local model when `kvgate[semantic]` is installed, else hashing (surface variants
    # only); minilm (all-MiniLM-L6-v2 on onnxruntime; `local` is read as minilm); openai (a
    # /v1/embeddings endpoint); hashing.
    embedder: Literal["auto", "minilm", "openai", "hashing"] = "auto"
    embedder_path: Path | None = None  # local: another copy of the model files (same sha256)
    embedder_url: str | None = None  # openai: the endpoint or its base URL
    embedder_model: str = ""  # openai: the embedding model's name
    # Cosine for a semantic candidate (the guard then vets it); null: the embedder's own default.
    similarity_threshold: float | None = Field(default=None, gt=0, le=1)
    # A request sampled hotter than this (an absent temperature is OpenAI's 1.0) bypasses the
    # cache unless it sets a `seed`: it is neither answered from the cache nor stored in it.
    # Null caches every temperature. The semantic tier serves only temperature 0 or a seed.
    max_temperature: float | None = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=0.25, gt=0)  # a slower store call counts as a miss
    # global: one cache for every client; tenant: each tenant (its API key's, else the tenant
    # header's, else its bearer token's) sees only the answers it was given itself.
    scope: Literal["global", "tenant"] = "global"

    @field_validator("semantic", mode="before")
    @classmethod
    def _semantic_mode(cls, value: object) -> object:
        """The boolean of earlier versions still reads: true is on, false is off."""
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str) and value.lower() in ("true", "false"):  # from the environment
            return "on" if value.lower() == "true" else "off"
        if not isinstance(value, str) or value not in ("off", "shadow", "on"):
            raise ValueError(f"must be off, shadow or on (or a boolean), not {value!r}")
        return value

    @field_validator("embedder", mode="before")
    @classmethod
    def _embedder_name(cls, value: object) -> object:
        """`local`, the local model's earlier name, still reads: it is `minilm`."""
        return "minilm" if value == "local" else value

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
        if self.embedder == "openai" and not self.embedder_url:
            raise ValueError("embedder 'openai' needs embedder_url")
        return self


class Settings(_Section):
    """The whole configuration: every section, each optional."""

    server: ServerSettings = Field(default=ServerSettings(), description="The HTTP server.")
    backends: tuple[BackendSettings, ...] = Field(
        default=(), description="The inference servers, one entry each.")
    health: HealthSettings = Field(default=HealthSettings(),
                                   description="Passive outlier ejection of backends.")
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Model names clients may send, each mapped to a model a backend serves "
        "(`{gpt-4o-mini: llama-3-8b}`).")
    routing: RoutingSettings = Field(default=RoutingSettings(),
                                     description="The policy, admission, queue and scrapes.")
    slo: SloSettings = Field(default=SloSettings(), description="The latency targets.")
    advanced: AdvancedSettings = Field(default=AdvancedSettings(),
                                       description="Expert knobs of the routing.")
    telemetry: TelemetryConfig = Field(default=TelemetryConfig(),
                                       description="Metrics, traces, access log.")
    cache: CacheSettings = Field(default=CacheSettings(), description="The response cache.")
    auth: AuthSettings = Field(default=AuthSettings(), description="API keys.")
    small_model: tuple[SmallModelRouteSettings, ...] = Field(
        default=(), description="Routing aliases choosing between a large and a small model.")

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

    @field_validator("advanced")
    @classmethod
    def _policy_weights(cls, value: AdvancedSettings, info: ValidationInfo) -> AdvancedSettings:
        routing = info.data.get("routing")
        if routing is None:  # the routing section itself was invalid; that error is reported
            return value
        try:  # ValueError naming a weight the policy has no scorer for
            build_router(routing.policy, policy_context(routing, SloSettings(), value))
        except ValueError as exc:
            raise ValueError(f"advanced.weights: {exc}") from exc
        return value

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
        return tuple(b.to_spec(f"b{i}") for i, b in enumerate(self.backends))


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
