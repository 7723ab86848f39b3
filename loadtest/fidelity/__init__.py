"""The fidelity table: published engine benchmarks against the simulator's figures for the same
configuration.

`published.json` holds the rows, each a published figure with its configuration and the page it
was read from. `simulate(row)` runs the simulator's engine (`loadtest.sim.engine`, the physics of
`routing.physics`) through the same benchmark:

- `batch` (vLLM's latency benchmark): `concurrency` requests arrive together; the figure is the
  time until the last one finishes.
- `closed` (NVIDIA NIM's genai-perf runs): `concurrency` clients each send a request and the next
  one as soon as it completes; the figures are means over the requests that start after the
  first round (TTFT; ITL as (end-to-end - TTFT) / (output tokens - 1)) and the output tokens/s
  over the same window.
- `poisson` (SGLang's and vLLM's serving benchmarks): `num_prompts` requests arrive at
  `request_rate` per second (Poisson, seeded), prompt and output lengths drawn uniformly from
  [`range_ratio` x length, length] as their `random` dataset does; the figures are the median
  TTFT and the median gap between consecutive tokens of a request (ITL) over all requests.

Prompts are distinct token sequences (the benchmarks' random prompts share no prefix) and every
request generates exactly its output tokens. `python -m loadtest.fidelity` writes the comparison
as a benchmark record; `tests/test_fidelity.py` holds every row within `TOLERANCE`.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.sim.engine import Engine, SimRequest
from routing.physics import GPUS, MODELS, ModelSpec, Preset

PUBLISHED = Path(__file__).resolve().parent / "published.json"
TOLERANCE = 0.20  # each simulated figure within 20% of the published one
METRICS = ("e2e_latency_ms", "ttft_ms", "itl_ms", "output_tokens_per_s", "median_ttft_ms",
           "median_itl_ms")
MODES = ("batch", "closed", "poisson")
_CLOSED_REQUESTS = 4  # rounds of a closed loop measured after the first


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    engine: str
    model: str
    gpu: str
    num_gpus: int
    fp8_weights: bool
    fp8_kv_cache: bool
    mode: str  # "batch" | "closed"
    concurrency: int
    input_tokens: int
    output_tokens: int
    metric: str
    published: float
    source: str
    quote: str
    request_rate: float = 0.0  # poisson
    num_prompts: int = 0  # poisson
    range_ratio: float = 1.0  # poisson: lengths uniform in [ratio x length, length]

    def preset(self) -> Preset:
        """The deployment the row describes, at vLLM's defaults; the model's context is made long
        enough for the row's requests."""
        model = MODELS[self.model]
        need = self.input_tokens + self.output_tokens
        if need > model.max_model_len:
            model = ModelSpec(model.name, model.num_params, model.num_layers,
                              model.num_attention_heads, model.num_kv_heads, model.head_dim,
                              model.bytes_per_param, model.kv_bytes_per_element, need,
                              model.hidden_size, model.intermediate_size, model.vocab_size)
        return Preset(self.id, model, GPUS[self.gpu], num_gpus=self.num_gpus,
                      fp8_weights=self.fp8_weights, fp8_kv_cache=self.fp8_kv_cache)

    def describe(self) -> str:
        precision = "fp8" if self.fp8_weights else "bf16"
        shape = f"{self.model} {self.num_gpus}x{self.gpu} {precision}, {self.input_tokens} in /" \
            f" {self.output_tokens} out"
        if self.mode == "poisson":
            return (f"{shape} (up to), {self.num_prompts} requests at {self.request_rate:g}/s"
                    " Poisson")
        return f"{shape}, {self.mode} of {self.concurrency}"


def load_rows(path: Path = PUBLISHED) -> tuple[Row, ...]:
    """The rows of the table; ValueError naming a malformed one."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    rows = []
    for n, item in enumerate(raw["rows"]):
        try:
            row = Row(**item)
        except TypeError as exc:
            raise ValueError(f"{path.name} row {n}: {exc}") from exc
        if row.metric not in METRICS or row.mode not in MODES or (
                row.mode == "poisson" and not (row.request_rate > 0 and row.num_prompts > 0)):
            raise ValueError(f"{path.name} row {row.id}: unknown metric or mode")
        if row.model not in MODELS or row.gpu not in GPUS:
            raise ValueError(f"{path.name} row {row.id}: unknown model or GPU")
        if not (row.published > 0 and row.source.startswith("https://")):
            raise ValueError(f"{path.name} row {row.id}: needs a figure > 0 and a source URL")
        rows.append(row)
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class Measured:
    e2e_latency_ms: float  # batch: until the last request finishes
    ttft_ms: float  # mean
    itl_ms: float  # mean over requests of (end-to-end - TTFT) / (output - 1)
    output_tokens_per_s: float
    median_ttft_ms: float = 0.0  # poisson
    median_itl_ms: float = 0.0  # poisson

    def figure(self, metric: str) -> float:
        return float(getattr(self, metric))


def simulate(row: Row) -> Measured:
    """The row's benchmark on the simulated engine (module docstring)."""
    if row.mode == "poisson":
        return _open_loop(row)
    engine = Engine(row.preset(), enable_prefix_caching=False, every_token=False)
    rounds = 1 if row.mode == "batch" else 1 + _CLOSED_REQUESTS
    total = rounds * row.concurrency
    start: dict[str, float] = {}
    first: dict[str, float] = {}
    done: list[tuple[str, float]] = []
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        rid = f"r{sent}"
        prompt = tuple(range(sent * row.input_tokens, (sent + 1) * row.input_tokens))
        engine.add(SimRequest(rid, prompt, row.output_tokens, row.output_tokens,
                              ignore_eos=True))
        start[rid] = now
        sent += 1

    now = 0.0
    for _ in range(row.concurrency):
        send(now)
    while engine.has_work():
        result = engine.step()
        now += result.duration
        for ev in result.events:
            if ev.token_index == 0:
                first[ev.request_id] = now
            if ev.finish_reason is not None:
                done.append((ev.request_id, now))
                if sent < total:
                    send(now)
    measured = [rid for rid, _ in done if int(rid[1:]) >= (row.concurrency if rounds > 1 else 0)]
    ends = dict(done)
    window_start = min(start[rid] for rid in measured)
    window_end = max(ends[rid] for rid in measured)
    tokens = len(measured) * row.output_tokens
    return Measured(
        e2e_latency_ms=1e3 * max(ends.values()),
        ttft_ms=1e3 * _mean([first[r] - start[r] for r in measured]),
        itl_ms=1e3 * _mean([(ends[r] - first[r]) / max(row.output_tokens - 1, 1)
                            for r in measured]),
        output_tokens_per_s=tokens / (window_end - window_start),
    )


def _open_loop(row: Row) -> Measured:
    engine = Engine(row.preset(), enable_prefix_caching=False, every_token=True)
    rng = random.Random(f"fidelity-{row.id}")

    def length(n: int) -> int:
        return rng.randint(max(int(n * row.range_ratio), 1), n)

    arrivals, t = [], 0.0
    for _ in range(row.num_prompts):
        t += rng.expovariate(row.request_rate)
        arrivals.append((t, length(row.input_tokens), length(row.output_tokens)))
    last: dict[str, float] = {}
    ttfts: list[float] = []
    gaps: list[float] = []
    outputs = 0
    now, sent = 0.0, 0
    while sent < len(arrivals) or engine.has_work():
        if not engine.has_work() and arrivals[sent][0] > now:
            now = arrivals[sent][0]
        while sent < len(arrivals) and arrivals[sent][0] <= now:
            arrival, prompt, output = arrivals[sent]
            rid = f"r{sent}"
            base = sent * (row.input_tokens + 1)
            engine.add(SimRequest(rid, tuple(range(base, base + prompt)), output, output,
                                  ignore_eos=True))
            last[rid] = arrival
            sent += 1
        result = engine.step()
        now += result.duration
        for ev in result.events:
            if ev.token_index == 0:
                ttfts.append(now - last[ev.request_id])
            else:
                gaps.append(now - last[ev.request_id])
            last[ev.request_id] = now
            outputs += 1
    return Measured(e2e_latency_ms=1e3 * now, ttft_ms=1e3 * _mean(ttfts),
                    itl_ms=1e3 * _mean(gaps), output_tokens_per_s=outputs / now,
                    median_ttft_ms=1e3 * statistics.median(ttfts),
                    median_itl_ms=1e3 * statistics.median(gaps))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@dataclass(frozen=True, slots=True)
class Compared:
    row: Row
    simulated: float

    @property
    def ratio(self) -> float:
        return self.simulated / self.row.published

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE


def compare(rows: Sequence[Row] | None = None) -> list[Compared]:
    """Every row with the simulator's figure for it."""
    return [Compared(r, simulate(r).figure(r.metric)) for r in (rows or load_rows())]
