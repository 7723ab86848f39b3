"""The KV reservation benchmark: kvgate (`cost` with admission) on workloads whose reply lengths
the reservation must bound, printed against its targets.

    .venv/bin/python -m loadtest.bench_reservation [--duration 60] [--seeds 0,1,2,3,4]
                                                   [--baseline FILE] [--jobs 1] [--json FILE]
                                                   [--no-record]

Scenarios, on the fleet of `loadtest.bench_fleet` (4 x llama-3-8b on H100, 4 x on L40S), Poisson
arrivals at 85% and 90% of the fleet's measured capacity for each workload:
- mixed: kvgate's general mix;
- ignore-eos: every reply runs to its max_tokens (sent with vLLM's ignore_eos);
- heavy-tail: natural replies log-normal with sigma 1.5, capped at max_tokens 4096.

Targets: zero preemptions on mixed and ignore-eos at both loads, in every seed; at most one
preemption per 10,000 requests on heavy-tail; goodput on mixed no lower than the baseline's.
The baseline is a `kvgate simulate --json` document of the same mixed runs made with the code
before the change (`--baseline`, e.g. `kvgate simulate --policies cost --workload mixed --load
0.85,0.9 --duration 60 --seeds 0,1,2,3,4 --json FILE` in a checkout of it;
`loadtest/baselines/reservation_mixed_before.json` is that document, made so with the routing
code as it was before censored reply lengths and the reservation quantile, and the simulator's
engine physics (routing/physics.py) of today: a baseline must share the engine model, since the
offered rate follows the fleet's measured capacity); without one, the goodput target is not
judged. Reservation misses count the completed requests whose reply needed more KV blocks
than their lease reserved at dispatch (streams then grow their leases).
Exit code 0 whatever the outcome (`--strict`: 1 when a target is missed). The tables go to
`loadtest/results/bench_reservation.json` (`--no-record`: nowhere).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from loadtest.bench_fleet import FLEET, KVGATE
from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.experiment import Experiment, Point, Report, run_experiment
from loadtest.results import Table, add_arguments, command, save
from loadtest.workloads import workload

WORKLOADS = ("mixed", "ignore-eos", "heavy-tail")
LOADS = (0.85, 0.9)
DEFAULT_DURATION_S = 60.0
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
HEAVY_TAIL_MAX_PER_10K = 1.0


def _runs(point: Point) -> list[dict[str, Any]]:
    return [r.summary.as_dict() for r in point.runs_of(KVGATE)]


def _baseline_goodput(doc: dict[str, Any] | None, load: float) -> list[float] | None:
    """The baseline's cost+adm goodput per seed at `load`, if its document has that point."""
    if doc is None:
        return None
    for point in doc.get("points", ()):
        if abs(point.get("load", -1.0) - load) < 1e-9:
            runs = point["policies"].get(KVGATE.label, {}).get("runs", ())
            return [float(r["goodput_rps"]) for r in runs] or None
    return None


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    mean = sum(values) / len(values)
    return f"{fmt.format(mean)} ({fmt.format(min(values))} .. {fmt.format(max(values))})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_reservation", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S,
                        help="seconds of arrivals per run")
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)),
                        help="comma-separated seeds")
    parser.add_argument("--baseline", type=Path,
                        help="`kvgate simulate --json` of the mixed runs from the code before")
    parser.add_argument("--jobs", type=int, default=1, help="processes (results do not change)")
    parser.add_argument("--json", help="write every scenario's report as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    add_arguments(parser)
    args = parser.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    fleet = parse_fleet(FLEET)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    reports: dict[str, Report] = {}
    for name in WORKLOADS:
        say(f"== {name} at {', '.join(f'{x:.0%}' for x in LOADS)}")
        reports[name] = run_experiment(Experiment(fleet=fleet, contenders=(KVGATE,),
                                                  workload=workload(name), loads=LOADS,
                                                  duration_s=args.duration, seeds=seeds),
                                       say, jobs=args.jobs)

    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    figures: list[list[str]] = []
    checks: list[list[str]] = []
    for name, report in reports.items():
        for point in report.points:
            runs = _runs(point)
            load = f"{point.load:.0%}" if point.load is not None else "-"
            requests = sum(int(r["requests"]) for r in runs)
            preempt = [int(r["preemptions"]) for r in runs]
            misses = sum(int(r["reservation_misses"]) for r in runs)
            completed = sum(int(r["completed"]) for r in runs)
            goodput = [float(r["goodput_rps"]) for r in runs]
            base = _baseline_goodput(baseline, point.load) if name == "mixed" and \
                point.load is not None else None
            figures.append([
                name, load, str(requests), _span(goodput),
                _span(base) if base else "-",
                f"{sum(goodput) / sum(base):.3f}" if base else "-",
                " ".join(map(str, preempt)), f"{1e4 * sum(preempt) / max(1, requests):.2f}",
                f"{misses} ({misses / max(1, completed):.1%})",
                _span([float(r["ttft_p99_s"] or 0.0) for r in runs], "{:.3f}"),
                str(sum(int(r["rejected"]) for r in runs)),
            ])
            if name == "heavy-tail":
                per_10k = 1e4 * sum(preempt) / max(1, requests)
                checks.append([f"{name} {load}: preemptions per 10,000 requests",
                               f"<= {HEAVY_TAIL_MAX_PER_10K:g}", f"{per_10k:.2f}",
                               "PASS" if per_10k <= HEAVY_TAIL_MAX_PER_10K else "MISS"])
            else:
                checks.append([f"{name} {load}: preemptions", "0 in every seed",
                               " ".join(map(str, preempt)),
                               "PASS" if not any(preempt) else "MISS"])
            if base:
                mean, base_mean = sum(goodput) / len(goodput), sum(base) / len(base)
                checks.append([f"{name} {load}: goodput vs before", f">= {base_mean:.2f}",
                               f"{mean:.2f} ({mean / base_mean:.3f}x)",
                               "PASS" if mean >= base_mean else "MISS"])
    missed = sum(1 for c in checks if c[-1] != "PASS")
    header = ["workload", "load", "requests", "goodput", "goodput before", "ratio",
              "preempt by seed", "preempt/10k", "reservation misses", "TTFT p99 s", "rejected"]
    print(" | ".join(header))
    for row in figures:
        print(" | ".join(row))
    print()
    for row in checks:
        print(" | ".join(row))
    print(f"\n{len(checks) - missed} of {len(checks)} targets met")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {name: r.as_json() for name, r in reports.items()}, indent=2) + "\n",
            encoding="utf-8")
    tables = [
        Table(f"Targets: {len(checks) - missed} of {len(checks)} met (cost+adm, seeds "
              f"{args.seeds})", ["target", "required", "measured", "result"], checks,
              "Goodput in requests/s, means over the seeds."),
        Table("Reservation: figures by workload and load (cost+adm)", header, figures,
              "Goodput and TTFT p99: mean (min .. max) over the seeds; `goodput before` is the "
              "same runs with the code before the change (its --json), `ratio` the total "
              "goodput against it. Preemptions are per seed; reservation misses are summed over "
              "the seeds, with their share of completed requests."),
    ]
    save(args, "bench_reservation", title="KV reservation: preemptions and goodput (simulated)",
         command=command("loadtest.bench_reservation", sys.argv[1:] if argv is None else argv),
         tables=tables,
         notes=f"Fleet {FLEET}, {args.duration:g} s of Poisson arrivals per run, seeds "
               f"{args.seeds}, virtual time (the figures do not depend on the machine).")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
