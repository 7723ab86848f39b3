"""Which server wrote a metrics payload, told from the names of its series.

Each server family has signature series that only it exposes; the first signature sample line in
the payload decides. The vLLM family's two variants (V1 "vllm", V0 "vllm-v0") are then told apart
from the samples themselves (routing/metrics/vllm.py).
"""

from __future__ import annotations

import re

from routing.metrics.prom import MetricsError

# Family → its signature series. Only names no other server uses.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_requests_running",
             "vllm:num_requests_waiting"),
    "sglang": ("sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "tgi": ("tgi_queue_size", "tgi_batch_current_size"),
    "trtllm": ("nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics"),
    "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
}
_FAMILY_OF = {name: family for family, names in SIGNATURES.items() for name in names}
_NAME = "(" + "|".join(re.escape(n) for n in sorted(_FAMILY_OF, key=len, reverse=True)) + ")[{ \t]"
_SIGNATURE_LINE = re.compile(("\n" + _NAME).encode())
_SIGNATURE_FIRST_LINE = re.compile(_NAME.encode())


def detect_family(payload: bytes | str) -> str:
    """"vllm" (either variant), "sglang", "tgi", "trtllm" or "llamacpp"; MetricsError if none."""
    if isinstance(payload, str):
        payload = payload.encode()
    match = _SIGNATURE_FIRST_LINE.match(payload) or _SIGNATURE_LINE.search(payload)
    if match is None:
        raise MetricsError("unrecognised metrics payload: no vLLM, SGLang, TGI, TensorRT-LLM or "
                           "llama.cpp load series")
    return _FAMILY_OF[match.group(1).decode()]
