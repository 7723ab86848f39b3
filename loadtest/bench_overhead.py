"""The overhead benchmark of record: what a proxy in front of an inference server costs, kvgate
against a bare relay and its peers, on loopback.

    python -m loadtest.bench_overhead [--rounds 2] [--scale 1] [--peers auto|none]
        [--json FILE] [--no-record]

Every piece is a process of its own (loadtest/bench_overhead_procs.py), so each proxy's CPU is
read from its own CPU clock (`/proc/PID/stat`, its threads and children included): a
fixed-timing streaming mock backend with vLLM-format /metrics, the load generator, and the paths
measured: `direct` (no proxy), `relay` (a bare aiohttp relay), `kvgate` (the default
configuration), `kvgate+cache` (the response cache on, every request a miss, memory store,
hashing embedder, semantic tier on) and, when they install from PyPI into venvs of their own
under /tmp (loadtest/bench_overhead_peers.py), LiteLLM's proxy, vllm-router and sglang-router;
a peer that does not is skipped with a one-line note. The phases (each run by every path, the
paths interleaved within a round, each (path, phase) keeping its round of least CPU):

- `c1-json`, `c1-stream`: one request at a time, whole and streamed (16 tokens, unpaced);
- `paced-64`, `paced-1000`: 64 streams at 50 tokens/s, 1,000 idle streams at 2 tokens/s;
- `sat-64`: 64 whole requests at a time, as fast as the path goes;
- `coalesce-200`: 200 streams at 50 tokens/s through kvgate with `stream_flush_interval_ms`
  0, 20, 50 and 100 (and `direct`, the baseline of each token's delay).

Figures: CPU per request and per relayed chunk, added TTFT p50/p99 over `direct`, content
events per second delivered of those offered, saturation requests/s, peak RSS, and the ratios
the targets are stated in. `--scale` multiplies every request count and concurrency (the test
runs it tiny). The record goes to `loadtest/results/bench_overhead.json`.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadtest.bench_overhead_peers import (
    BenchProc,
    Started,
    kvgate_proc,
    peer_procs,
    relay_proc,
    run_load,
    start_mock,
)
from loadtest.results import Table, add_arguments, command, save

FLUSH_INTERVALS_MS = (0, 20, 50, 100)


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    mode: str  # json | stream
    concurrency: int
    requests: int
    tokens: int
    pace_ms: float
    coalescing: bool = False  # run only by direct and the kvgate flush variants

    def scaled(self, scale: float) -> Phase:
        concurrency = max(1, round(self.concurrency * scale)) if self.concurrency > 1 else 1
        requests = max(concurrency, round(self.requests * scale))
        tokens = self.tokens if scale >= 1 else max(4, round(self.tokens * scale))
        return Phase(self.name, self.mode, concurrency, requests, tokens, self.pace_ms,
                     self.coalescing)


PHASES = (
    Phase("c1-json", "json", 1, 400, 16, 0),
    Phase("c1-stream", "stream", 1, 200, 16, 0),
    Phase("paced-64", "stream", 64, 128, 50, 20),
    Phase("paced-1000", "stream", 1000, 1000, 10, 500),
    Phase("sat-64", "json", 64, 1000, 16, 0),
    Phase("coalesce-200", "stream", 200, 200, 50, 20, coalescing=True),
)


@dataclass(slots=True)
class Run:
    cpu_s: float | None
    wall_s: float
    done: int
    failed: int
    latencies: list[float]
    delays: list[float]
    events: int
    rss_mb: float | None
    failures: dict[str, int]  # the failed requests' statuses (or errors): how many


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


def _better(new: Run, old: Run | None) -> bool:
    if old is None:
        return True
    if new.cpu_s is None or old.cpu_s is None:
        return new.wall_s < old.wall_s
    return new.cpu_s / max(1, new.done) < old.cpu_s / max(1, old.done)


def measure(proc: BenchProc | None, url: str, phase: Phase) -> Run:
    out, cpu, rss = run_load(proc, url, phase.mode, phase.concurrency, phase.requests,
                             phase.tokens, phase.pace_ms)
    return Run(cpu, out["wall_s"], out["done"], out["failed"], out["latencies"],
               out["delays"], out["events"], rss, out.get("failures", {}))


def bench(rounds: int, scale: float, peers: str,
          workdir: Path) -> tuple[list[Table], dict[str, Any]]:
    phases = [p.scaled(scale) for p in PHASES]
    notes: list[str] = []
    with Started() as started:
        mock = started.add(start_mock(workdir))
        paths: dict[str, BenchProc | None] = {"direct": None}
        paths["relay"] = started.add(relay_proc(workdir, mock.url))
        paths["kvgate"] = started.add(kvgate_proc(workdir, mock.url, "kvgate"))
        paths["kvgate+cache"] = started.add(kvgate_proc(workdir, mock.url, "kvgate+cache",
                                                        cache=True))
        if peers == "auto":
            for name, proc, note in peer_procs(workdir, mock.url):
                if proc is None:
                    notes.append(f"{name}: skipped, {note}")
                    print(f"  {name}: skipped, {note}", flush=True)
                else:
                    paths[name] = started.add(proc)
        flush: dict[int, BenchProc | None] = {0: paths["kvgate"]}
        for ms in FLUSH_INTERVALS_MS[1:]:
            flush[ms] = started.add(kvgate_proc(workdir, mock.url, f"kvgate-flush{ms}",
                                                flush_ms=ms))
        best: dict[tuple[str, str], Run] = {}
        for round_ in range(rounds):
            for phase in phases:
                if phase.coalescing:
                    runs = [("direct", None), *((f"flush {ms} ms", p) for ms, p in flush.items())]
                else:
                    runs = list(paths.items())
                for name, proc in runs:
                    url = mock.url if proc is None else proc.url
                    run = measure(proc, url, phase)
                    print(f"  round {round_ + 1} {phase.name:13} {name:14} "
                          f"{run.done:5} done {run.failed:3} failed {run.wall_s:7.2f} s"
                          + (f" cpu {run.cpu_s:6.2f} s" if run.cpu_s is not None else "")
                          + (f" ({run.failures})" if run.failures else ""), flush=True)
                    if _better(run, best.get((name, phase.name))):
                        best[(name, phase.name)] = run
    tables, figures = _tables(best, phases, [n for n in paths], notes)
    return tables, figures


def _per(run: Run | None, what: str) -> float | None:
    if run is None or run.cpu_s is None:
        return None
    count = run.done if what == "request" else run.events
    return run.cpu_s / count * 1e6 if count else None


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 2)


def _tables(best: dict[tuple[str, str], Run], phases: list[Phase], names: list[str],
            notes: list[str]) -> tuple[list[Table], dict[str, Any]]:
    by = {p.name: p for p in phases}
    direct_ttft = best.get(("direct", "c1-stream"))
    rows: list[list[Any]] = []
    figures: dict[str, dict[str, Any]] = {}
    for name in names:
        get = {p.name: best.get((name, p.name)) for p in phases if not p.coalescing}
        c1s, paced, idle, sat = (get["c1-stream"], get["paced-64"], get["paced-1000"],
                                 get["sat-64"])
        f: dict[str, Any] = {
            "cpu_us_per_request": _per(get["c1-json"], "request"),
            "cpu_us_per_stream": _per(c1s, "request"),
            "cpu_us_per_chunk": _per(paced, "chunk"),
            "ttft_p50_ms": None, "ttft_p99_ms": None,
            "delivered_64": _delivered(paced, by["paced-64"]),
            "delivered_1000": _delivered(idle, by["paced-1000"]),
            "saturation_rps": sat.done / sat.wall_s if sat and sat.wall_s else None,
            "rss_mb_1000": idle.rss_mb if idle else None,
            "rss_mb_peak": max((r.rss_mb for r in get.values() if r and r.rss_mb), default=None),
            "failed": sum(r.failed for r in get.values() if r),
        }
        if c1s and direct_ttft and name != "direct":
            for q in (50, 99):
                mine, base = pct(c1s.latencies, q), pct(direct_ttft.latencies, q)
                if mine is not None and base is not None:
                    f[f"ttft_p{q}_ms"] = (mine - base) * 1e3
        figures[name] = f
        rows.append([name, _r(f["cpu_us_per_request"]), _r(f["cpu_us_per_stream"]),
                     _r(f["cpu_us_per_chunk"], 2), _r(f["ttft_p50_ms"], 3),
                     _r(f["ttft_p99_ms"], 3), _r(f["delivered_64"], 3),
                     _r(f["delivered_1000"], 3), _r(f["saturation_rps"]),
                     _r(f["rss_mb_1000"]), _r(f["rss_mb_peak"]), f["failed"]])
    paths = Table(
        "Each path's cost (best round of least CPU)",
        ["path", "CPU µs/request (c=1)", "CPU µs/stream (c=1)", "CPU µs/chunk (64 paced)",
         "added TTFT p50 ms", "added TTFT p99 ms", "delivered of offered (64)",
         "delivered of offered (1,000)", "saturation req/s (c=64)", "RSS MB (1,000 streams)",
         "peak RSS MB", "failed"], rows,
        "CPU is the proxy process's own (user + system, threads and children), divided by the "
        "requests or the content events it relayed; TTFT is added over `direct`'s at c=1; "
        "delivered is content events per second received over those the streams offered.")
    coalesce = _coalesce_table(best, by["coalesce-200"])
    targets = _targets_table(figures, coalesce[1])
    extra = "; ".join(notes)
    if extra:
        targets = Table(targets.title, targets.columns, targets.rows,
                        targets.notes + " Peers not measured: " + extra + ".")
    return [paths, coalesce[0], targets], {"paths": figures, "coalescing": coalesce[1]}


def _delivered(run: Run | None, phase: Phase) -> float | None:
    if run is None or not run.wall_s:
        return None
    offered = phase.requests * phase.tokens
    return run.events / offered if offered else None


def _coalesce_table(best: dict[tuple[str, str], Run],
                    phase: Phase) -> tuple[Table, dict[int, Any]]:
    base = best.get(("direct", phase.name))
    base_p99 = pct(base.delays, 99) if base else None
    rows: list[list[Any]] = []
    figures: dict[int, Any] = {}
    zero = _per(best.get(("flush 0 ms", phase.name)), "chunk")
    for ms in FLUSH_INTERVALS_MS:
        run = best.get((f"flush {ms} ms", phase.name))
        per = _per(run, "chunk")
        p99 = pct(run.delays, 99) if run else None
        added = (p99 - base_p99) * 1e3 if p99 is not None and base_p99 is not None else None
        figures[ms] = {"cpu_us_per_token": per, "vs_interval_0": _ratio(per, zero),
                       "added_itl_p99_ms": added}
        rows.append([ms, _r(per, 2), _ratio(per, zero), _r(added, 1),
                     run.failed if run else None])
    return Table(
        f"Token coalescing: {phase.concurrency} streams at {1000 / phase.pace_ms:g} tokens/s "
        "through kvgate", ["stream_flush_interval_ms", "CPU µs per relayed token",
                           "vs interval 0", "added token delay p99 ms", "failed"], rows,
        "A token's delay is from the mock writing it to the client reading it; the added "
        "delay is its p99 over `direct`'s, the most the inter-token latency grows."), figures


def _targets_table(f: dict[str, dict[str, Any]], co: dict[int, Any]) -> Table:
    kv, relay, cache = f.get("kvgate", {}), f.get("relay", {}), f.get("kvgate+cache", {})
    vr = f.get("vllm-router")
    rows: list[list[Any]] = []

    def add(what: str, value: float | None, limit: float, above: bool = False) -> None:
        met = None if value is None else (value >= limit if above else value <= limit)
        rows.append([what, _r(value, 2), ("≥ " if above else "≤ ") + f"{limit:g}",
                     "-" if met is None else ("met" if met else "missed")])

    add("CPU/request, kvgate / relay", _ratio(kv.get("cpu_us_per_request"),
                                              relay.get("cpu_us_per_request")), 1.5)
    add("CPU/chunk, kvgate / relay", _ratio(kv.get("cpu_us_per_chunk"),
                                            relay.get("cpu_us_per_chunk")), 1.3)
    add("CPU/request, cache on / kvgate", _ratio(cache.get("cpu_us_per_request"),
                                                 kv.get("cpu_us_per_request")), 1.2)
    add("saturation, kvgate / vllm-router", None if vr is None else _ratio(
        kv.get("saturation_rps"), vr.get("saturation_rps")), 0.8, above=True)
    ttft = (None if kv.get("ttft_p50_ms") is None or relay.get("ttft_p50_ms") is None
            else kv["ttft_p50_ms"] - relay["ttft_p50_ms"])
    add("added TTFT p50 at c=1 over the relay's, ms", ttft, 0.5)
    add("RSS at 1,000 idle streams, MB", kv.get("rss_mb_1000"), 200)
    add("coalescing 50 ms: CPU/token vs interval 0", co.get(50, {}).get("vs_interval_0"), 0.4)
    add("coalescing 50 ms: added token delay p99, ms", co.get(50, {}).get("added_itl_p99_ms"),
        60)
    for name in ("litellm", "vllm-router", "sglang-router"):
        if name in f:
            rows.append([f"CPU/request, kvgate / {name}", _ratio(
                kv.get("cpu_us_per_request"), f[name].get("cpu_us_per_request")), "-", "-"])
    return Table("Targets", ["what", "measured", "target", ""], rows,
                 "Each ratio is of the figures in the table above, from the same run.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies every request count and concurrency (0 < scale <= 4)")
    parser.add_argument("--peers", choices=("auto", "none"), default="auto",
                        help="auto: LiteLLM, vllm-router and sglang-router when installable")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kvgate-bench-overhead"))
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1 or not 0 < args.scale <= 4:
        parser.error("--rounds must be >= 1 and --scale in (0, 4]")
    args.workdir.mkdir(parents=True, exist_ok=True)
    tables, figures = bench(args.rounds, args.scale, args.peers, args.workdir)
    for table in tables:
        print(f"\n{table.title}")
        print("  " + " | ".join(table.columns))
        for row in table.rows:
            print("  " + " | ".join("-" if c is None else str(c) for c in row))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2
                                           | orjson.OPT_NON_STR_KEYS))
    save(args, "bench_overhead", title="What a proxy costs: kvgate, a bare relay and peers",
         command=command("loadtest.bench_overhead", sys.argv[1:] if argv is None else argv),
         tables=tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
