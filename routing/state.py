"""What the gateway knows about one backend, as plain immutable values.

- `BackendSpec` is static: where the backend is and what it serves, from config or discovery.
- `BackendSnapshot` is one scrape of its load endpoint. It is frozen and replaced whole by its one
  writer (the poller); a field the server does not expose is `None`, never a guess. Staleness is a
  check on `taken_at`, not a flag anyone has to clear.
- `Candidate` is what a routing policy sees for one backend at decision time: the spec, the last
  snapshot (if any), health, and the gateway's own ledger figures (in-flight requests and the KV
  blocks it expects them to hold).

Times are seconds on a monotonic clock that the caller passes in; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

METRICS_FORMATS: tuple[str, ...] = (
    "vllm",  # vLLM V1 engine (also llm-d-inference-sim, which has no reserved block)
    "vllm-v0",
    "sglang",
    "tgi",
    "trtllm",
    "llamacpp",
)


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A backend as configured: identity, address and what it serves."""

    id: str
    url: str  # base URL without the /v1 suffix, e.g. "http://127.0.0.1:8001"
    models: tuple[str, ...] = ()
    metrics_format: str | None = None  # one of METRICS_FORMATS; None = auto-detect
    weight: float = 1.0
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # TGI exposes no KV metric; its batch budget comes from this launcher setting.
    max_batch_total_tokens: int | None = None
    # llama.cpp: its slots share one KV cache (llama-server's default without -np, or -kvu), so
    # each slot's n_ctx in /slots is the whole context, not its share.
    kv_unified: bool = False
    # Sent as `Authorization: Bearer` on requests and scrapes (a vLLM started with --api-key);
    # a secret: kept out of repr, so out of logs.
    api_key: str | None = field(default=None, repr=False)


class BackendSnapshot(NamedTuple):
    """One scrape of a backend's load endpoint, as the server reported it.

    A NamedTuple rather than a frozen dataclass: the poller makes one per scrape (~320 a second
    for 32 backends) and the fleet simulator far more; one costs ~0.9 µs to make against ~4.
    Replace fields with `_replace`."""

    taken_at: float
    format: str
    kv_total_blocks: int | None = None
    kv_free_blocks: int | None = None
    kv_usage: float | None = None  # fraction in [0, 1]
    block_size: int | None = None  # tokens per block (1 for token-granular servers)
    running: int | None = None
    waiting: int | None = None
    preemptions: int | None = None  # cumulative counter
    prefix_cache_hit_rate: float | None = None
    models: tuple[str, ...] | None = None  # models / LoRA adapters, where exposed

    def age(self, now: float) -> float:
        return now - self.taken_at

    def is_stale(self, now: float, max_age: float) -> bool:
        return now - self.taken_at > max_age


@dataclass(frozen=True, slots=True)
class Candidate:
    """A backend as a routing policy sees it at the moment of one decision."""

    spec: BackendSpec
    healthy: bool
    snapshot: BackendSnapshot | None  # None until the first successful scrape
    stale: bool  # the snapshot is older than the configured maximum age (or missing)
    inflight: int  # requests the gateway has dispatched here and not yet finished
    reserved_blocks: int  # KV blocks the gateway expects its in-flight requests to hold
    dispatched_since_scrape: int = 0  # requests dispatched after `snapshot.taken_at`
    blocks_since_scrape: int = 0  # their expected KV blocks, not yet visible in the snapshot

    @property
    def id(self) -> str:
        return self.spec.id
