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
"""

from __future__ import annotations

from types import MappingProxyType
from urllib.parse import urlencode

from routing.metrics import sglang, vllm

__all__ = ["METRICS_PATH", "SAMPLE_NAMES", "filtered_path"]

METRICS_PATH = "/metrics"

# The formats whose servers render /metrics with prometheus_client → the sample names to ask for.
SAMPLE_NAMES = MappingProxyType({
    "vllm": vllm.SAMPLE_NAMES,
    "vllm-v0": vllm.SAMPLE_NAMES,
    "sglang": sglang.SAMPLE_NAMES,
})


def _path(names: tuple[str, ...]) -> str:
    # Percent-encoded (`name%5B%5D=vllm%3Akv_cache_usage_perc`): what browsers and HTTP clients
    # send; prometheus_client's parse_qs decodes it, and the literal form, alike.
    return METRICS_PATH + "?" + urlencode([("name[]", name) for name in names])


_PATHS = {family: _path(names) for family, names in SAMPLE_NAMES.items()}


def filtered_path(family: str) -> str | None:
    """The /metrics path asking for only the samples `family`'s reader reads (a format as
    configured, or a detected `Reading.family`); None for formats whose servers do not render
    their metrics with prometheus_client."""
    return _PATHS.get(family)
