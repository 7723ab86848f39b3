"""The peers' benchmark (`python -m loadtest.bench_fleet --peers`): kvgate as it ships (`cost`
with admission) against the peers' routing policies, each run bare and with the same admission.

Peers (routing/scheduling/peers.py): cache_aware (SGLang / vLLM router), dynamo_kv (NVIDIA
Dynamo's KV router), precise_prefix (llm-d's precise prefix-cache scorer, on the simulation's
exact cache view), gie_default (the Gateway API Inference Extension's default, kvgate's
`kv_util`) and least_kv (AIBrix's least-kv-cache). Scenarios, all at 85% of the fleet's
measured capacity on bench_fleet's fleet: mixed, shared-prefix, chat and multi-turn with Poisson
arrivals, and mixed with bursty arrivals.

Targets, each against the best peer WITH admission (the comparison of routing alone, every
contender behind the same admission), on every scenario:
- p99 TTFT <= 0.6 x the best peer's;
- SLO misses (requests not meeting both SLOs, refusals included) <= 0.5 x the best peer's;
- median TPOT <= 1.05 x kv_util's (gie_default+adm).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from loadtest.fleetsim.backends import FleetSpec
from loadtest.fleetsim.experiment import Contender, Experiment, Point, Report, run_experiment
from loadtest.fleetsim.report import COLUMNS, table
from loadtest.results import Table, command, save
from loadtest.workloads import workload

PEERS = ("cache_aware", "dynamo_kv", "precise_prefix", "gie_default", "least_kv")
KVGATE = Contender("cost", admission=True)
CONTENDERS = (*(Contender(p, a) for p in PEERS for a in (False, True)), KVGATE)
KV_UTIL = Contender("gie_default", admission=True)
# (scenario, workload, arrival process)
SCENARIOS = (("mixed", "mixed", "poisson"), ("shared-prefix", "shared-prefix", "poisson"),
             ("chat", "chat", "poisson"), ("multi-turn", "multi-turn", "poisson"),
             ("bursty", "mixed", "bursty"))
LOAD = 0.85
DEFAULT_DURATION_S = 60.0


def _mean(point: Point, contender: Contender, figure: str) -> float | None:
    return point.spread_of(contender)[figure].mean


def _best_peer(point: Point, figure: str) -> tuple[str, float] | None:
    known = [(f"{p}+adm", v) for p in PEERS
             if (v := _mean(point, Contender(p, True), figure)) is not None]
    return min(known, key=lambda pv: pv[1]) if known else None


def _check(scenario: str, point: Point, figure: str, label: str,
           other: tuple[str, float] | None, bound: float) -> list[str]:
    mine = _mean(point, KVGATE, figure)
    if mine is None or other is None:
        return [scenario, label, "-", "no data", "-", "MISS"]
    name, theirs = other
    ratio = mine / theirs if theirs else (0.0 if mine == 0 else float("inf"))
    ok = mine <= bound * theirs
    return [scenario, label, f"<= {bound:g} x {name} ({theirs:.4g})", f"{mine:.4g}",
            f"{ratio:.2f}x", "PASS" if ok else "MISS"]


def checks(scenario: str, point: Point) -> list[list[str]]:
    kv = _mean(point, KV_UTIL, "tpot_p50_s")
    return [
        _check(scenario, point, "ttft_p99_s", "p99 TTFT", _best_peer(point, "ttft_p99_s"), 0.6),
        _check(scenario, point, "slo_misses", "SLO misses", _best_peer(point, "slo_misses"), 0.5),
        _check(scenario, point, "tpot_p50_s", "median TPOT",
               None if kv is None else (KV_UTIL.label, kv), 1.05),
    ]


HEADLINE = ("ttft_p99_s", "slo_misses", "tpot_p50_s", "goodput_rps", "rejected",
            "prefix_hit_rate")


def headline_table(scenario: str, report: Report) -> Table:
    point = report.points[0]
    formats = {f: (h, fmt) for f, h, fmt in COLUMNS}
    rows = [[c.label, *(("-" if (m := _mean(point, c, f)) is None else formats[f][1](m))
                        for f in HEADLINE)] for c in report.experiment.contenders]
    return Table(f"{scenario} at {LOAD:.0%} of capacity, {point.rate_rps:.2f} requests/s, means "
                 f"over {len(report.experiment.seeds)} seeds",
                 ["policy", "TTFT p99", "SLO misses", "TPOT p50", "goodput", "refused", "hit"],
                 rows, "Times in ms, or seconds where marked `s`; goodput in requests/s.")


def run(args: argparse.Namespace, fleet: FleetSpec, seeds: tuple[int, ...],
        argv: list[str] | None, say: Callable[[str], None]) -> int:
    duration = args.duration if args.duration is not None else DEFAULT_DURATION_S
    rows: list[list[str]] = []
    tables: list[Table] = []
    for scenario, name, arrival in SCENARIOS:
        say(f"== {scenario} at {LOAD:.0%}")
        report = run_experiment(Experiment(fleet=fleet, contenders=CONTENDERS,
                                           workload=workload(name), loads=(LOAD,),
                                           arrival=arrival, duration_s=duration, seeds=seeds),
                                say, jobs=args.jobs)
        print(f"### {scenario}\n{table(report)}\n")
        rows += checks(scenario, report.points[0])
        tables.append(headline_table(scenario, report))
    header = ["scenario", "target", "required", "measured", "ratio", "result"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("### targets (cost+adm against the best peer with admission)")
    for r in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    missed = sum(1 for r in rows if r[-1] != "PASS")
    print(f"\n{len(rows) - missed} of {len(rows)} targets met")
    seeds_text = ",".join(map(str, seeds))
    save(args, "bench_fleet_peers",
         title="Routing quality: cost against the peers' policies (simulated)",
         command=command("loadtest.bench_fleet", sys.argv[1:] if argv is None else argv),
         tables=[Table(f"Targets: {len(rows) - missed} of {len(rows)} met (cost+adm against the "
                       "best peer with admission)", header, rows,
                       "Times in seconds, SLO misses in requests (means over the seeds). The "
                       "ratio is cost+adm's figure over the one in the required column."),
                 *tables],
         notes=f"Fleet {fleet.describe()}, {duration:g} s of arrivals per run at {LOAD:.0%} of "
               f"the measured capacity, seeds {seeds_text}, virtual time (the figures do not "
               "depend on the machine). Each peer runs bare and with kvgate's admission "
               "(`+adm`); precise_prefix and dynamo_kv read the engines' exact prefix caches, "
               "as llm-d's KV events and Dynamo's do. Short runs, chosen to finish in minutes "
               "on a loaded 2-core host: each run starts cold, so start-up (speeds not yet "
               "learned) weighs more in the tails than in a long run.")
    return 1 if args.strict and missed else 0
