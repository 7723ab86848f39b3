"""The routing-quality benchmark: kvgate's `cost` policy against the baselines, printed against
its targets.

    .venv/bin/python -m loadtest.bench_fleet [--duration 600] [--seeds 0,1,2,3,4] [--jobs 2]
                                             [--json FILE] [--plot FILE.png] [--no-record]
    .venv/bin/python -m loadtest.bench_fleet --peers [--duration 60] ...

`--peers` runs the peers' benchmark instead (loadtest/bench_peers.py): cost with admission
against SGLang's, Dynamo's, llm-d's, the Inference Extension's and AIBrix's policies, each bare
and with the same admission, on five workloads.

Scenarios, all on 8 heterogeneous backends (4 x llama-3-8b on H100, 4 x the same model on L40S),
Poisson arrivals, default scrape interval and one gateway replica:
- mixed at 85% of the fleet's measured capacity, every policy; and `cost` with admission at 50%,
  70% and 90% (the zero-preemption target holds "up to 90% load");
- shared-prefix at 85%, every policy;
- chat at 85%, every policy.
Baselines run bare (as the gateways they stand for route); `cost+adm` is kvgate as it ships
(the cost policy with admission control); bare `cost` is shown for the routing alone. The
"best baseline" of a figure is the best of the bare baselines on that figure. Every figure is
the mean over the seeds; the spread is printed with the tables.

Targets:
- mixed 85%: cost p99 TTFT <= 0.5 x round_robin's and <= 0.8 x the best baseline's; goodput
  >= 1.2 x round_robin's; zero preemptions at every load up to 90%.
- shared-prefix: prefix-cache hit rate within 10% of the best baseline's (>= 0.9 x); p90 TTFT
  <= 0.5 x kv_util's.
- chat: no reported figure more than 5% worse than the best baseline's (a count whose best is 0
  must be 0).
Exit code 0 whatever the outcome (this is a measurement, not a gate); `--strict` makes a missed
target exit 1. The targets and every scenario's table go to `loadtest/results/bench_fleet.json`
(`--no-record`: nowhere); `--json` writes every figure of every seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadtest import bench_peers
from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.experiment import Contender, Experiment, Point, Report, run_experiment
from loadtest.fleetsim.report import COLUMNS, SPREAD_FIGURES, plot, table
from loadtest.results import Table, add_arguments, command, save
from loadtest.workloads import workload

FLEET = "4xllama-3-8b-h100,4xllama-3-8b-l40s"
BASELINES = ("round_robin", "random", "least_request", "power_of_two", "kv_util", "prefix_hash")
KVGATE = Contender("cost", admission=True)
CONTENDERS = (*(Contender(p, False) for p in BASELINES), Contender("cost", False), KVGATE)
SWEEP_LOADS = (0.5, 0.7, 0.9)
DEFAULT_DURATION_S = 600.0
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
# Figures where lower is better; the others (completed, throughput, goodput, hit rate) are higher.
LOWER_IS_BETTER = frozenset({
    "rejected", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "e2e_p99_s", "preemptions", "peak_queue", "load_imbalance",
})
CHAT_FIGURES = ("completed", "rejected", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s",
                "tpot_p99_s", "e2e_p99_s", "output_tokens_per_s", "goodput_rps", "preemptions",
                "prefix_hit_rate", "peak_queue", "load_imbalance")


@dataclass(frozen=True, slots=True)
class Check:
    target: str
    required: str
    measured: str
    ok: bool


def _mean(point: Point, contender: Contender, figure: str) -> float | None:
    return point.spread_of(contender)[figure].mean


def _best_baseline(point: Point, figure: str) -> tuple[str, float] | None:
    values = [(b, _mean(point, Contender(b, False), figure)) for b in BASELINES]
    known = [(b, v) for b, v in values if v is not None]
    if not known:
        return None
    pick: Callable[..., tuple[str, float]] = min if figure in LOWER_IS_BETTER else max
    return pick(known, key=lambda bv: bv[1])


def _ratio_check(target: str, point: Point, figure: str, other: tuple[str, float] | None,
                 bound: float, lower: bool) -> Check:
    mine = _mean(point, KVGATE, figure)
    if mine is None or other is None:
        return Check(target, "-", "no data", False)
    name, theirs = other
    ok = mine <= bound * theirs if lower else mine >= bound * theirs
    sign = "<=" if lower else ">="
    ratio = f"{mine / theirs:.2f}x" if theirs else "n/a"
    return Check(target, f"{sign} {bound:g} x {name} ({theirs:.4g})", f"{mine:.4g} ({ratio})", ok)


def mixed_checks(point: Point, sweep: Report) -> list[Check]:
    rr = _mean(point, Contender("round_robin", False), "ttft_p99_s")
    rr_good = _mean(point, Contender("round_robin", False), "goodput_rps")
    checks = [
        _ratio_check("mixed: cost p99 TTFT vs round_robin", point, "ttft_p99_s",
                     None if rr is None else ("round_robin", rr), 0.5, True),
        _ratio_check("mixed: cost p99 TTFT vs best baseline", point, "ttft_p99_s",
                     _best_baseline(point, "ttft_p99_s"), 0.8, True),
        _ratio_check("mixed: cost goodput vs round_robin", point, "goodput_rps",
                     None if rr_good is None else ("round_robin", rr_good), 1.2, False),
    ]
    counts = []
    for p in (*sweep.points, point):
        runs = p.runs_of(KVGATE)
        if runs and p.load is not None:
            counts.append((p.load, max(r.summary.preemptions for r in runs)))
    counts.sort()
    worst = max((n for _, n in counts), default=0)
    checks.append(Check("mixed: cost preemptions up to 90% load", "0 in every seed",
                        ", ".join(f"{load:.0%}: {n}" for load, n in counts), worst == 0))
    return checks


def shared_prefix_checks(point: Point) -> list[Check]:
    kv = _mean(point, Contender("kv_util", False), "ttft_p90_s")
    return [
        _ratio_check("shared-prefix: cost hit rate vs best baseline", point, "prefix_hit_rate",
                     _best_baseline(point, "prefix_hit_rate"), 0.9, False),
        _ratio_check("shared-prefix: cost p90 TTFT vs kv_util", point, "ttft_p90_s",
                     None if kv is None else ("kv_util", kv), 0.5, True),
    ]


def chat_checks(point: Point) -> list[Check]:
    checks = []
    for figure in CHAT_FIGURES:
        best = _best_baseline(point, figure)
        lower = figure in LOWER_IS_BETTER
        if best is not None and best[1] == 0 and lower:
            mine = _mean(point, KVGATE, figure)
            checks.append(Check(f"chat: {figure}", f"0 (as {best[0]})", f"{mine:.4g}"
                                if mine is not None else "no data", mine == 0))
            continue
        checks.append(_ratio_check(f"chat: {figure}", point, figure, best,
                                   1.05 if lower else 0.95, lower))
    return checks


def checks_table(checks: list[Check]) -> str:
    rows = [["target", "required", "measured", "result"]] + [
        [c.target, c.required, c.measured, "PASS" if c.ok else "MISS"] for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def scenario_tables(name: str, report: Report) -> list[Table]:
    """One table of means per load level, and the spread over seeds when there are several."""
    e = report.experiment
    seeds = len(e.seeds)
    capacity = ("" if report.capacity_rps is None
                else f"; measured capacity {report.capacity_rps:.2f} requests/s")
    out = []
    for point in report.points:
        where = ((f"{point.load:.0%} of capacity, " if point.load is not None else "")
                 + f"{point.rate_rps:.2f} requests/s")
        rows = [[c.label, *(("-" if (m := point.spread_of(c)[f].mean) is None else fmt(m))
                            for f, _, fmt in COLUMNS)] for c in e.contenders]
        out.append(Table(f"{name} at {where}"
                         + (f", means over {seeds} seeds" if seeds > 1 else ""),
                         ["policy", *(f"{f.split('_')[0].upper()} {h}" if h in ("p90", "p99")
                                      else h for f, h, _ in COLUMNS)], rows,
                         f"Times in ms, or seconds where marked `s`{capacity}."))
        if seeds > 1:
            spread = []
            for c in e.contenders:
                cells = [c.label]
                for f, _, fmt in SPREAD_FIGURES:
                    low, high = point.spread_of(c)[f].low, point.spread_of(c)[f].high
                    cells.append("-" if low is None or high is None
                                 else f"{fmt(low)} .. {fmt(high)}")
                spread.append(cells)
            out.append(Table(f"{name} at {where}: spread over seeds (min .. max)",
                             ["policy", *(h for _, h, _ in SPREAD_FIGURES)], spread))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_fleet", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=None,
                        help=f"seconds of arrivals (default {DEFAULT_DURATION_S:g}; --peers: "
                             f"{bench_peers.DEFAULT_DURATION_S:g})")
    parser.add_argument("--peers", action="store_true",
                        help="the peers' benchmark (loadtest/bench_peers.py)")
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)),
                        help="comma-separated seeds")
    parser.add_argument("--jobs", type=int, default=1, help="processes (results do not change)")
    parser.add_argument("--json", help="write every scenario's report as JSON")
    parser.add_argument("--plot", help="plot the mixed sweep (TTFT p99, goodput vs load)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    add_arguments(parser)
    args = parser.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    fleet = parse_fleet(FLEET)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.peers:
        return bench_peers.run(args, fleet, seeds, argv, say)
    if args.duration is None:
        args.duration = DEFAULT_DURATION_S

    def experiment(name: str, contenders: tuple[Contender, ...], loads: tuple[float, ...]
                   ) -> Report:
        say(f"== {name} at {', '.join(f'{x:.0%}' for x in loads)}")
        return run_experiment(Experiment(fleet=fleet, contenders=contenders,
                                         workload=workload(name), loads=loads,
                                         duration_s=args.duration, seeds=seeds),
                              say, jobs=args.jobs)

    reports = {
        "mixed": experiment("mixed", CONTENDERS, (0.85,)),
        "mixed-sweep": experiment("mixed", (Contender("round_robin", False), KVGATE),
                                  SWEEP_LOADS),
        "shared-prefix": experiment("shared-prefix", CONTENDERS, (0.85,)),
        "chat": experiment("chat", CONTENDERS, (0.85,)),
    }
    for name, report in reports.items():
        print(f"### {name}\n{table(report)}\n")
    checks = (mixed_checks(reports["mixed"].points[0], reports["mixed-sweep"])
              + shared_prefix_checks(reports["shared-prefix"].points[0])
              + chat_checks(reports["chat"].points[0]))
    print(f"### targets (cost+adm; means over seeds {args.seeds})\n{checks_table(checks)}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {name: r.as_json() for name, r in reports.items()}, indent=2) + "\n",
            encoding="utf-8")
    if args.plot:
        plot(reports["mixed-sweep"], args.plot)
    missed = sum(1 for c in checks if not c.ok)
    print(f"\n{len(checks) - missed} of {len(checks)} targets met")
    tables = [Table(f"Targets: {len(checks) - missed} of {len(checks)} met (cost+adm, means "
                    f"over seeds {args.seeds})", ["target", "required", "measured", "result"],
                    [[c.target, c.required, c.measured, "PASS" if c.ok else "MISS"]
                     for c in checks],
                    "Figures as the targets compare them: times in seconds, goodput in "
                    "requests/s, rates as fractions. The measured figure's ratio (in "
                    "parentheses) is to the baseline's figure in the required column.")]
    for name, report in reports.items():
        tables += scenario_tables(name, report)
    save(args, "bench_fleet", title="Routing quality: cost against the baselines (simulated)",
         command=command("loadtest.bench_fleet", sys.argv[1:] if argv is None else argv),
         tables=tables,
         notes=f"Fleet {FLEET}, {args.duration:g} s of Poisson arrivals per run, seeds "
               f"{args.seeds}, virtual time (the figures do not depend on the machine). "
               "`cost+adm` is kvgate as it ships (the cost policy with admission control); "
               "bare `cost` is the routing alone; the baselines run bare. The best baseline of a "
               "figure is the best bare baseline on it."
               + ("" if (args.duration, seeds) == (DEFAULT_DURATION_S, DEFAULT_SEEDS) else
                  " A reduced configuration: the full benchmark runs "
                  f"{DEFAULT_DURATION_S:g} s on seeds {','.join(map(str, DEFAULT_SEEDS))}, and "
                  "shorter runs give noisier tails (p99) and a smaller backlog to the "
                  "baselines that overload the slow backends."))
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
