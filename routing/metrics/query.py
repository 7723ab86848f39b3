"""Asking a server for only the series a format reads: `/metrics?name[]=a&name[]=b...`.

vLLM and SGLang serve /metrics with prometheus_client (`make_asgi_app`), which answers repeated
`name[]` query parameters with only the samples of those names (`CollectorRegistry.
restricted_registry`: by sample name, `x_total` rather than the family `x`; HELP and TYPE kept
for each family that has a matching sample). A vLLM V1 answer then shrinks from ~50 KB and ~500
lines to ~3 KB: less to copy, compare and search in the gateway, and less for the backend to
render on every scrape, which costs it more CPU than it costs us.

The names asked for are the format module's `SAMPLE_NAMES`, every name its reader may read
(current and older), so a filtered payload reads exactly as the whole one does. Servers that do
not know the parameter (TGI, TensorRT-LLM/Triton, llama.cpp, Go servers such as
llm-d-inference-sim, vLLM versions whose own /metrics route shadows prometheus_client's) answer
with the whole payload, which reads the same. A prometheus_client registry in multiprocess mode
(SGLang always, vLLM with several API servers) cannot filter: its collector declares no names,
so it answers with an empty payload; the poller then goes back to plain /metrics
(routing/poller.py).

Tiers: of a filtered vLLM answer's ~30 lines, only the load series move from scrape to scrape;
the cache config, the LoRA adapters and the success counter (read only to tell the simulator)
seldom do. `hot_path` asks for the moving names alone (the format module's `HOT_NAMES`), and a
hot answer's groups completed with the last full answer's other groups (`completed`) read as a
full answer would while those have not changed. The poller (routing/poller.py) says how often
it asks for everything. SGLang has no hot tier: its multiprocess registry cannot filter at all.
"""

from __future__ import annotations

from types import MappingProxyType
from urllib.parse import urlencode

from routing.metrics import Reading, sglang, vllm
from routing.metrics.prom import Groups

__all__ = [
    "HOT_NAMES", "METRICS_PATH", "SAMPLE_NAMES", "completed", "filtered_path", "hot_path",
    "slow_groups",
]

METRICS_PATH = "/metrics"

# The formats whose servers render /metrics with prometheus_client → the sample names to ask for.
SAMPLE_NAMES = MappingProxyType({
    "vllm": vllm.SAMPLE_NAMES,
    "vllm-v0": vllm.SAMPLE_NAMES,
    "sglang": sglang.SAMPLE_NAMES,
})
# The formats with a hot tier → the sample names that move with the load (of SAMPLE_NAMES).
HOT_NAMES = MappingProxyType({
    "vllm": vllm.HOT_NAMES,
    "vllm-v0": vllm.HOT_NAMES,
})


def _path(names: tuple[str, ...]) -> str:
    # Percent-encoded (`name%5B%5D=vllm%3Akv_cache_usage_perc`): what browsers and HTTP clients
    # send; prometheus_client's parse_qs decodes it, and the literal form, alike.
    return METRICS_PATH + "?" + urlencode([("name[]", name) for name in names])


_PATHS = {family: _path(names) for family, names in SAMPLE_NAMES.items()}
_HOT_PATHS = {family: _path(names) for family, names in HOT_NAMES.items()}
_HOT_SETS = {family: frozenset(names) for family, names in HOT_NAMES.items()}


def filtered_path(family: str) -> str | None:
    """The /metrics path asking for only the samples `family`'s reader reads (a format as
    configured, or a detected `Reading.family`); None for formats whose servers do not render
    their metrics with prometheus_client."""
    return _PATHS.get(family)


def hot_path(family: str) -> str | None:
    """The /metrics path asking for only `family`'s moving samples (`HOT_NAMES`); None for
    formats without a hot tier."""
    return _HOT_PATHS.get(family)


def slow_groups(family: str, groups: Groups) -> Groups:
    """The groups of a full answer's reading that are not `family`'s hot names: what the hot
    answers until the next full one are completed with. `family` must have a hot tier."""
    hot = _HOT_SETS[family]
    return {name: group for name, group in groups.items() if name not in hot}


def completed(hot: Reading, slow: Groups) -> Reading:
    """A hot answer's reading with the `slow` groups added: the reading of the full answer, as
    long as those groups are unchanged. A group the hot answer carries itself (a server that
    ignores the query answers everything) is the fresher one and is kept."""
    return Reading(hot.family, hot.format, {**slow, **hot.groups})
