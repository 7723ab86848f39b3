"""Prometheus text exposition of the simulator's state, in the exact format of a real server.

Five formats, chosen with `kvgate sim --metrics-format`:
- "vllm": the vLLM V1 engine. `vllm:kv_cache_usage_perc` uses V1's formula, which leaves out the
  one reserved null block: `1 - free / (num_gpu_blocks - 1)`. Every `vllm:` series carries
  `engine="0"` and counters and histograms have their `_created` gauges, as prometheus_client
  writes them for vLLM.
- "vllm-v0": the vLLM V0 engine: `vllm:gpu_cache_usage_perc = 1 - free / num_gpu_blocks`.
- "sglang": SGLang in multiprocess mode: token-granular (`sglang:token_usage` over
  `sglang:max_total_num_tokens`, pages of `sglang:page_size` tokens), histograms written sum first.
- "tgi": the Hugging Face TGI router, written by Rust's metrics-exporter-prometheus: counters,
  then gauges, then histograms, each by name; counters without `_total`; `le` after the other
  labels; numbers as Rust prints an f64 (`TgiFormat`). No KV series, as TGI.
- "llamacpp": llama.cpp's `llama-server`: one `llamacpp:` sample per family, numbers as a C++
  stream prints a double (`%g`: 6 significant digits). No KV series, as current builds: the KV
  figures are in its `GET /slots` (loadtest/sim/slots.py).

Filtering, as prometheus_client answers `/metrics?name[]=a&name[]=b` (`names`): only the samples
whose names are asked for (sample names: `x_total`, `x_bucket`, `x_created`, not the family `x`),
each family's HELP and TYPE lines kept when it has a matching sample; a counter or histogram
whose only match is its `_created` sample keeps its (empty) header before the `_created` gauge.
The vLLM formats serve the default registry, which filters. SGLang's multiprocess registry
cannot: its collector declares no names, so any `name[]` gets an empty payload, as from SGLang.
TGI and llama.cpp do not use prometheus_client and ignore the query: the whole payload.

A format writes only the series the simulator has a true value for; a real server's series the
engine does not model (TGI's queue and validation times, llama.cpp's throughput gauges, ...)
are left out rather than made up.

Names, types, HELP lines, label sets and bucket bounds are copied from the real servers' output
(see /work/shared/fixtures), and numbers are formatted as each server's writer formats them
(prometheus_client's for vLLM and SGLang), so a parser tested on those fixtures reads the
simulator's output the same way. Rendering is pure: the
caller passes the engine stats, the latency histograms and the process figures in.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Protocol

from loadtest.sim.engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket upper bounds, exactly as each server declares them.
VLLM_V1_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_V1_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
VLLM_V1_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_V0_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0)
VLLM_V0_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
VLLM_V0_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
               100.0, 200.0, 400.0)
SGLANG_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
              200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)


def _tgi_duration_bounds() -> tuple[float, ...]:
    # TGI's router (server.rs): every `*duration` histogram has 35 bounds, from 0.0001 growing by
    # 1.5 each, computed by repeated multiplication, which gives these exact doubles.
    bounds: list[float] = []
    value = 0.0001
    for _ in range(35):
        value *= 1.5
        bounds.append(value)
    return tuple(bounds)


TGI_DURATION = _tgi_duration_bounds()


class Histogram:
    """A cumulative-on-render histogram with fixed upper bounds (an implicit +Inf bucket)."""

    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; last is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # `le` is inclusive: a value equal to a bound falls in that bound's bucket.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[int]:
        out: list[int] = []
        running = 0
        for c in self.counts:
            running += c
            out.append(running)
        return out


class LatencyRecorder:
    """Per-request latencies in simulated seconds: time to first token, gaps between tokens and
    end-to-end. The server observes; a format renders what its real server exposes."""

    __slots__ = ("ttft", "itl", "e2e")

    def __init__(self, ttft: tuple[float, ...], itl: tuple[float, ...],
                 e2e: tuple[float, ...]) -> None:
        self.ttft = Histogram(ttft)
        self.itl = Histogram(itl)
        self.e2e = Histogram(e2e)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Static facts about the simulated server that some formats expose."""

    model_name: str
    max_model_len: int
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """The simulator process's own figures (prometheus_client's process collector)."""

    cpu_seconds: float  # user + system CPU time so far
    start_time: float  # unix seconds


class MetricsFormat(Protocol):
    """One server's exposition: its histogram buckets and its text."""

    name: str

    def new_recorder(self) -> LatencyRecorder: ...

    def render(self, stats: EngineStats, latency: LatencyRecorder, info: ServerInfo,
               process: ProcessSample, names: Collection[str] | None = None) -> str:
        """The payload; `names`: only those samples, as prometheus_client filters (module
        docstring); None: everything."""
        ...


def format_value(value: float) -> str:
    """A sample value as prometheus_client writes it (Go-style exponents for large numbers)."""
    d = float(value)
    if math.isnan(d):
        return "NaN"
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    """`{a="x",b="y"}` with names sorted, as in the fixtures; empty string for no labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


class _Text:
    """Accumulates exposition lines. `created` (unix seconds), when set, adds the `_created`
    gauge family prometheus_client writes after every counter and histogram. `names`, when set,
    keeps only those samples, as prometheus_client's `name[]` filter does."""

    def __init__(self, created: float | None, names: Collection[str] | None = None) -> None:
        self.lines: list[str] = []
        self.created = created
        self.names = None if names is None else frozenset(names)

    def _wanted(self, *samples: str) -> list[bool]:
        return [self.names is None or name in self.names for name in samples]

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def gauge(self, name: str, help_text: str, labels: Mapping[str, str], value: float) -> None:
        if not any(self._wanted(name)):
            return
        self.family(name, "gauge", help_text)
        self.lines.append(f"{name}{_labels(labels)} {format_value(value)}")

    def counter(self, name: str, help_text: str, series: list[tuple[Mapping[str, str], float]]
                ) -> None:
        """`name` ends in `_total`; one sample per label set in `series`."""
        created_name = name.removesuffix("_total") + "_created"
        total, created = self._wanted(name, created_name)
        created = created and self.created is not None
        if not (total or created):
            return
        self.family(name, "counter", help_text)
        if total:
            for labels, value in series:
                self.lines.append(f"{name}{_labels(labels)} {format_value(value)}")
        if created:
            self.family(created_name, "gauge", help_text)
            for labels, _ in series:
                self.lines.append(f"{created_name}{_labels(labels)} "
                                  f"{format_value(self.created or 0.0)}")

    def histogram(self, name: str, help_text: str, labels: Mapping[str, str], hist: Histogram,
                  *, sum_first: bool = False) -> None:
        buckets, count, total, created = self._wanted(
            f"{name}_bucket", f"{name}_count", f"{name}_sum", f"{name}_created")
        created = created and self.created is not None
        if not (buckets or count or total or created):
            return
        self.family(name, "histogram", help_text)
        lab = _labels(labels)
        sum_line = f"{name}_sum{lab} {format_value(hist.total)}"
        if sum_first and total:
            self.lines.append(sum_line)
        if buckets:
            bounds = [format_value(b) for b in hist.bounds] + ["+Inf"]
            for le, cum in zip(bounds, hist.cumulative(), strict=True):
                self.lines.append(
                    f"{name}_bucket{_labels({**labels, 'le': le})} {format_value(cum)}")
        if count:
            self.lines.append(f"{name}_count{lab} {format_value(hist.count)}")
        if not sum_first and total:
            self.lines.append(sum_line)
        if created:
            self.family(f"{name}_created", "gauge", help_text)
            self.lines.append(f"{name}_created{lab} {format_value(self.created or 0.0)}")

    def process(self, process: ProcessSample) -> None:
        self.gauge("process_start_time_seconds",
                   "Start time of the process since unix epoch in seconds.", {},
                   process.start_time)
        # The process collector's counter has no `_created` sample.
        if any(self._wanted("process_cpu_seconds_total")):
            self.family("process_cpu_seconds_total", "counter",
                        "Total user and system CPU time spent in seconds.")
            self.lines.append(f"process_cpu_seconds_total {format_value(process.cpu_seconds)}")

    def text(self) -> str:
        # prometheus_client writes nothing at all when no family matches.
        return "\n".join(self.lines) + "\n" if self.lines else ""


def _hit_rate(stats: EngineStats) -> float:
    if stats.prefix_queries_tokens == 0:
        return 0.0
    return stats.prefix_hits_tokens / stats.prefix_queries_tokens


class VllmV1Format:
    name = "vllm"

    def new_recorder(self) -> LatencyRecorder:
        return LatencyRecorder(VLLM_V1_TTFT, VLLM_V1_ITL, VLLM_V1_E2E)

    def render(self, stats: EngineStats, latency: LatencyRecorder, info: ServerInfo,
               process: ProcessSample, names: Collection[str] | None = None) -> str:
        t = _Text(created=process.start_time, names=names)
        t.process(process)
        lab = {"engine": "0", "model_name": info.model_name}
        t.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                lab, stats.running)
        t.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                lab, stats.waiting)
        t.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                lab, stats.kv_usage)
        t.counter("vllm:prefix_cache_queries_total",
                  "Prefix cache queries, in terms of number of queried tokens.",
                  [(lab, stats.prefix_queries_tokens)])
        t.counter("vllm:prefix_cache_hits_total",
                  "Prefix cache hits, in terms of number of cached tokens.",
                  [(lab, stats.prefix_hits_tokens)])
        t.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
                  [(lab, stats.preemptions_total)])
        t.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                  [(lab, stats.prompt_tokens_total)])
        t.counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
                  [(lab, stats.generation_tokens_total)])
        t.counter("vllm:request_success_total", "Count of successfully processed requests.",
                  [({**lab, "finished_reason": reason}, stats.finished.get(reason, 0))
                   for reason in ("stop", "length", "abort", "error")])
        t.histogram("vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.", lab, latency.ttft)
        t.histogram("vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.", lab, latency.itl)
        t.histogram("vllm:e2e_request_latency_seconds",
                    "Histogram of e2e request latency in seconds.", lab, latency.e2e)
        # An info-style gauge: the data is in the labels (no model_name label, as in vLLM).
        t.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", {
            "block_size": str(stats.block_size), "cache_dtype": "auto",
            "calculate_kv_scales": "False", "cpu_offload_gb": "0",
            "enable_prefix_caching": str(info.enable_prefix_caching), "engine": "0",
            "gpu_memory_utilization": str(info.gpu_memory_utilization),
            "is_attention_free": "False", "kv_cache_memory_bytes": "None",
            "kv_offloading_backend": "None", "kv_offloading_size": "None",
            "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
            "mamba_cache_dtype": "auto", "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None",
            "num_gpu_blocks": str(stats.num_gpu_blocks), "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256", "sliding_window": "None", "swap_space": "4",
        }, 1.0)
        return t.text()


class VllmV0Format:
    name = "vllm-v0"

    def new_recorder(self) -> LatencyRecorder:
        return LatencyRecorder(VLLM_V0_TTFT, VLLM_V0_TPOT, VLLM_V0_E2E)

    def render(self, stats: EngineStats, latency: LatencyRecorder, info: ServerInfo,
               process: ProcessSample, names: Collection[str] | None = None) -> str:
        t = _Text(created=None, names=names)
        t.process(process)
        lab = {"model_name": info.model_name}
        total = stats.num_gpu_blocks
        t.gauge("vllm:num_requests_running", "Number of requests currently running on GPU.",
                lab, stats.running)
        t.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                lab, stats.waiting)
        t.gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", lab, 0)
        # V0 has no reserved null block in its usage formula.
        t.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                lab, 1.0 - stats.free_blocks / total if total else 0.0)
        t.gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.",
                lab, 0.0)
        t.gauge("vllm:cpu_prefix_cache_hit_rate", "CPU prefix cache block hit rate.", lab, -1.0)
        t.gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", lab,
                _hit_rate(stats) if info.enable_prefix_caching else -1.0)
        t.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
                  [(lab, stats.preemptions_total)])
        t.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                  [(lab, stats.prompt_tokens_total)])
        t.counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
                  [(lab, stats.generation_tokens_total)])
        t.counter("vllm:tokens_total", "Number of prefill plus generation tokens processed.",
                  [(lab, stats.prompt_tokens_total + stats.generation_tokens_total)])
        t.histogram("vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.", lab, latency.ttft)
        t.histogram("vllm:time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.", lab, latency.itl)
        t.histogram("vllm:e2e_request_latency_seconds",
                    "Histogram of end to end request latency in seconds.", lab, latency.e2e)
        # V0 counts only requests that finished by themselves; aborts are not successes there.
        t.counter("vllm:request_success_total", "Count of successfully processed requests.",
                  [({**lab, "finished_reason": reason}, stats.finished.get(reason, 0))
                   for reason in ("stop", "length")])
        t.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", {
            "block_size": str(stats.block_size), "cache_dtype": "auto",
            "calculate_kv_scales": "False", "cpu_offload_gb": "0",
            "enable_prefix_caching": str(info.enable_prefix_caching),
            "gpu_memory_utilization": str(info.gpu_memory_utilization),
            "is_attention_free": "False", "num_cpu_blocks": "2048",
            "num_gpu_blocks": str(total), "num_gpu_blocks_override": "None",
            "sliding_window": "None", "swap_space_bytes": "4294967296",
        }, 1.0)
        return t.text()


class SglangFormat:
    name = "sglang"

    def new_recorder(self) -> LatencyRecorder:
        # SGLang exposes no inter-token histogram in this version; the recorder still needs one.
        return LatencyRecorder(SGLANG_TTFT, VLLM_V1_ITL, SGLANG_E2E)

    def render(self, stats: EngineStats, latency: LatencyRecorder, info: ServerInfo,
               process: ProcessSample, names: Collection[str] | None = None) -> str:
        if names is not None:
            return ""  # a multiprocess registry cannot filter (module docstring)
        t = _Text(created=None)
        # Scheduler-side series carry the parallelism labels; tokenizer-side only model_name.
        sched = {"engine_type": "unified", "model_name": info.model_name, "moe_ep_rank": "0",
                 "pp_rank": "0", "tp_rank": "0"}
        lab = {"model_name": info.model_name}
        page = stats.block_size
        total_tokens = stats.num_gpu_blocks * page
        used_tokens = (stats.num_gpu_blocks - stats.free_blocks) * page
        t.gauge("sglang:num_running_reqs", "The number of running requests.", sched,
                stats.running)
        t.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sched,
                stats.waiting)
        t.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", sched, _hit_rate(stats))
        t.gauge("sglang:token_usage", "The token usage.", sched,
                used_tokens / total_tokens if total_tokens else 0.0)
        t.gauge("sglang:num_used_tokens", "The number of used tokens.", sched, used_tokens)
        t.counter("sglang:num_retracted_requests_total", "Total number of retracted requests.",
                  [(sched, stats.preemptions_total)])
        t.gauge("sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.", sched, total_tokens)
        t.gauge("sglang:page_size", "KV cache page size in tokens.", sched, page)
        t.gauge("sglang:num_pages", "Number of KV cache pages.", sched, stats.num_gpu_blocks)
        t.gauge("sglang:context_len", "Maximum context length.", sched, info.max_model_len)
        t.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                  [(lab, stats.prompt_tokens_total)])
        t.counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                  [(lab, stats.generation_tokens_total)])
        t.counter("sglang:num_requests_total", "Number of requests processed.",
                  [(lab, sum(stats.finished.values()))])
        t.histogram("sglang:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.", lab, latency.ttft,
                    sum_first=True)
        t.histogram("sglang:e2e_request_latency_seconds",
                    "Histogram of End-to-end request latency in seconds", lab, latency.e2e,
                    sum_first=True)
        return t.text()


def format_rust(value: float) -> str:
    """A number as Rust's `Display` prints an f64 (metrics-exporter-prometheus writes gauges,
    sums and bucket bounds so): the shortest digits that round-trip, never an exponent, no
    trailing `.0`; `NaN`, `inf`, `-inf`."""
    d = float(value)
    if math.isnan(d):
        return "NaN"
    if math.isinf(d):
        return "inf" if d > 0 else "-inf"
    s = repr(d)
    if "e" in s:  # the same shortest digits, written out
        s = format(Decimal(s), "f")
    return s.removesuffix(".0")


def format_cpp(value: float) -> str:
    """A number as a C++ `std::ostream` prints a double by default (`%g`, 6 significant
    digits), as llama-server writes its metrics: `48213`, `21.387`, `1.23457e+06`."""
    return f"{float(value):g}"


class TgiFormat:
    """The TGI router's /metrics (router/src/server.rs and the batching task).

    What the simulator has true values for:
    - `tgi_queue_size` (waiting) and `tgi_batch_current_size` (running).
    - `tgi_batch_current_max_tokens`, the tokens of KV the running batch has claimed, read by
      the gateway against the launcher's `--max-batch-total-tokens`: here the tokens in the
      blocks the running sequences hold, `(used_blocks - 1) * block_size` (the null block is
      no one's). TGI reserves a request's prompt plus max new tokens up front; the simulated
      engine allocates as it goes, as vLLM does, so what its batch holds is what it claims. The
      matching budget is the whole cache, `(num_gpu_blocks - 1) * block_size` tokens, as TGI's
      warm-up sets `max_batch_total_tokens` from the KV memory.
    - `tgi_request_success`: requests that ended by themselves (stop or length); an aborted
      stream is no success in TGI either. With it, `tgi_request_duration`, the end-to-end
      latency TGI records at the same point, from the recorder's e2e histogram.
    Left out: the batch and per-request timing histograms the engine does not time (queue,
    validation, inference, forward, decode), the per-request token histograms the recorder
    does not keep, `tgi_request_count` and `tgi_request_failure` (TGI counts requests that fail
    validation, which the simulator does not count), and `tgi_batch_concat`.

    TGI sets its queue gauge when the first request is queued and its batch gauges when the
    first batch runs, so a router that has served nothing writes none of the three (the gateway
    reads that as idle when the backend is configured as TGI: routing/metrics/tgi.py). The
    simulator leaves them out likewise until the engine has been sent a request; after that they
    are written always (0 when idle, as TGI sets them after each batch).
    """

    name = "tgi"

    def new_recorder(self) -> LatencyRecorder:
        # Only the e2e histogram is written; TGI has no time-to-first-token or per-gap one.
        return LatencyRecorder(TGI_DURATION, TGI_DURATION, TGI_DURATION)

    def render(self, stats: EngineStats, latency: LatencyRecorder, info: ServerInfo,
               process: ProcessSample, names: Collection[str] | None = None) -> str:
        lines: list[str] = []
        successes = stats.finished.get("stop", 0) + stats.finished.get("length", 0)
        _rust_family(lines, "tgi_request_success", "counter", "Number of successful requests")
        lines.append(f"tgi_request_success {successes}")
        held = max(0, stats.used_blocks - 1) * stats.block_size
        seen = stats.running or stats.waiting or stats.prompt_tokens_total or any(
            stats.finished.values())
        for name, help_text, value in (
                ("tgi_batch_current_max_tokens", "Maximum tokens for the current batch", held),
                ("tgi_batch_current_size", "Current batch size", stats.running),
                ("tgi_queue_size", "Current queue size", stats.waiting)):
            if seen:
                _rust_family(lines, name, "gauge", help_text)
                lines.append(f"{name} {format_rust(value)}")
        hist = latency.e2e
        _rust_family(lines, "tgi_request_duration", "histogram",
                     "Total time spent processing the request")
        bounds = [format_rust(b) for b in hist.bounds] + ["+Inf"]
        for le, cum in zip(bounds, hist.cumulative(), strict=True):
            lines.append(f'tgi_request_duration_bucket{{le="{le}"}} {cum}')
        lines.append(f"tgi_request_duration_sum {format_rust(hist.total)}")
        lines.append(f"tgi_request_duration_count {hist.count}")
        return "\n".join(lines) + "\n"


def _rust_family(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


class LlamacppFormat:
    """llama-server's /metrics (tools/server: one sample per family, counters then gauges).

    What the simulator has true values for:
    - `llamacpp:requests_processing` (running) and `llamacpp:requests_deferred` (waiting).
    - `llamacpp:prompt_tokens_total` (prompt tokens computed, excluding those found in the
      cache) and `llamacpp:prompt_tokens_cached_total`: with prefix caching, the engine's
      prefix-cache queries less hits, and hits, both counted at a request's first admission,
      so their ratio is the engine's hit rate; without it, every prompt token, counted when
      its prefill ends, and none cached.
    - `llamacpp:tokens_predicted_total`: output tokens, counted as they are generated
      (llama-server adds a request's when it ends).
    - The speculative-decoding counters: 0, as the simulator does not speculate.
    Left out: the time counters and throughput gauges (the engine keeps no time totals),
    `n_decode_total`, `n_tokens_max`, `n_busy_slots_per_decode`.
    """

    name = "llamacpp"

    def new_recorder(self) -> LatencyRecorder:
        # llama-server exposes no latency histogram; the recorder still needs bounds.
        return LatencyRecorder(VLLM_V1_TTFT, VLLM_V1_ITL, VLLM_V1_E2E)

    def render(self, stats: EngineStats, latency: LatencyRecorder, info: ServerInfo,
               process: ProcessSample, names: Collection[str] | None = None) -> str:
        if info.enable_prefix_caching:
            cached = stats.prefix_hits_tokens
            processed = stats.prefix_queries_tokens - cached
        else:
            cached, processed = 0, stats.prompt_tokens_total
        lines: list[str] = []
        for name, kind, help_text, value in (
                ("prompt_tokens_total", "counter",
                 "Number of prompt tokens processed, excluding cached tokens", processed),
                ("prompt_tokens_cached_total", "counter",
                 "Number of prompt tokens reused from the cache", cached),
                ("tokens_predicted_total", "counter", "Number of generation tokens processed",
                 stats.generation_tokens_total),
                ("spec_decode_num_draft_tokens_total", "counter",
                 "Speculative: Total draft tokens generated", 0),
                ("spec_decode_num_accepted_tokens_total", "counter",
                 "Speculative: Total draft tokens accepted by the target model", 0),
                ("spec_decode_num_drafts_total", "counter",
                 "Speculative: Total speculative decoding verification steps", 0),
                ("requests_processing", "gauge", "Number of requests processing", stats.running),
                ("requests_deferred", "gauge", "Number of requests deferred", stats.waiting)):
            lines.append(f"# HELP llamacpp:{name} {help_text}")
            lines.append(f"# TYPE llamacpp:{name} {kind}")
            lines.append(f"llamacpp:{name} {format_cpp(value)}")
        return "\n".join(lines) + "\n"


FORMATS: Mapping[str, MetricsFormat] = MappingProxyType({
    f.name: f for f in (VllmV1Format(), VllmV0Format(), SglangFormat(), TgiFormat(),
                        LlamacppFormat())
})
