"""`kvgate simulate`: replay a workload against a simulated fleet under each routing policy.

    kvgate simulate [--backends 4xllama-3-8b-h100,4xllama-3-8b-l40s] [--policies all]
                    [--workload mixed | --trace FILE [--trace-format auto] [--trace-limit N]]
                    [--load 0.85[,0.9...] | --rate R[,...] | --rate-scale X]
                    [--arrival poisson|bursty] [--duration 600] [--seeds 0[,1,...]]
                    [--scrape-interval 0.25] [--replicas 1] [--json FILE|-] [--plot FILE.png]

Discrete-event, virtual time: the simulator's engines (`kvgate sim`'s) behind the gateway's own
routing, ledger and admission objects (routing/dispatch.py), with metrics scraped at the given
interval. Every policy sees the identical request schedule; the same seed gives the same numbers
(and the same --json document). Baseline policies run bare, as the gateways they stand for route;
policies named in --admission (default: kvgate's default policy) also run kvgate's admission
control (KV high-water filter, SLO admission and gateway queue), labelled "+adm".

A trace (kvgate's JSONL, the Azure LLM inference CSV, Mooncake's JSONL or BurstGPT's CSV; read by
loadtest/fleetsim/trace.py) is replayed as recorded, `--rate-scale` times faster, or with its
timeline scaled to `--load`'s or `--rate`'s rate (loadtest/fleetsim/trace_replay.py); the summary
says which part of it ran and at what rate, native and scaled.

`python -m loadtest.simulate_cli ...` runs the same command without the gateway's other commands.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

from gateway.cli import UsageError
from loadtest.fleetsim.backends import FleetSpec, parse_fleet, preset_names
from loadtest.fleetsim.experiment import Contender, Experiment, Report, run_experiment
from loadtest.fleetsim.progress import simulation_progress
from loadtest.fleetsim.report import load_pyplot, plot, table
from loadtest.fleetsim.results import Slo
from loadtest.fleetsim.trace import Trace, read_trace
from loadtest.fleetsim.trace_formats import FORMATS
from loadtest.workloads import ARRIVALS, WORKLOADS, Limits, SharedPrefix, workload
from routing.dispatch import DispatchConfig
from routing.policies import DEFAULT_POLICY, POLICIES, scorer_names
from routing.slo import SloTargets

DEFAULT_FLEET = "4xllama-3-8b-h100,4xllama-3-8b-l40s"
DESCRIPTION = ("Offline, virtual-time fleet simulation: replays a workload against simulated "
               "backends under each routing policy, with the gateway's real routing code.")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate", help="compare routing policies on a simulated fleet (virtual time)",
        description=DESCRIPTION)
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--backends", default=DEFAULT_FLEET, metavar="FLEET",
      help=f"comma-separated [Nx]PRESET items, or a count of default backends (default "
           f"{DEFAULT_FLEET}); presets: {', '.join(preset_names())}")
    a("--policies", default="all", metavar="LIST",
      help=f"policies to compare, comma-separated, or 'all': {', '.join(POLICIES)}")
    a("--admission", default=DEFAULT_POLICY, metavar="LIST",
      help="policies that also run kvgate's admission control, comma-separated, 'all' or "
           f"'none' (default {DEFAULT_POLICY})")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--workload", default="mixed", choices=WORKLOADS,
                     help="synthetic workload (default mixed)")
    src.add_argument("--trace", metavar="FILE",
                     help="replay a recorded trace: kvgate's JSONL of {arrival_s, prompt_tokens, "
                          "output_tokens, prefix_group?, prefix_tokens?, max_tokens?} records, "
                          "the Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,"
                          "GeneratedTokens), Mooncake's JSONL (timestamp, input_length, "
                          "output_length, hash_ids: its 512-token blocks shared as recorded) or "
                          "BurstGPT's CSV (rows with 0 response tokens, failures, are skipped)")
    a("--trace-format", choices=("auto", *FORMATS), metavar="FORMAT",
      help="the trace's format: auto (told by its header line or first record; the default), "
           f"{', '.join(FORMATS)}")
    a("--trace-limit", type=int, metavar="N", help="a trace: replay its first N requests only")
    level = parser.add_mutually_exclusive_group()
    level.add_argument("--load", metavar="LIST",
                       help="offered load as fractions of the fleet's measured capacity, "
                            "comma-separated (default 0.85; a trace: its own rate). A trace's "
                            "timeline is scaled by one factor so that what is replayed arrives "
                            "at that rate")
    level.add_argument("--rate", metavar="LIST",
                       help="offered load in requests/s, comma-separated (a trace: its timeline "
                            "scaled to that rate)")
    level.add_argument("--rate-scale", type=float, metavar="X",
                       help="a trace: X times its own arrival rate (its timeline compressed X "
                            "times; 0.5 stretches it)")
    a("--arrival", default="poisson", choices=ARRIVALS, help="arrival process (default poisson)")
    a("--burstiness", type=float, default=2.0, metavar="CV",
      help="bursty arrivals: coefficient of variation of the gaps (default 2)")
    a("--duration", type=float, metavar="S",
      help="seconds of arrivals (default 600; a trace: its whole span, or its first S seconds "
           "once scaled; with --load or --rate, the first rate x S requests in S seconds)")
    a("--seeds", default="0", metavar="LIST", help="comma-separated seeds (default 0)")
    a("--scrape-interval", type=float, default=0.25, metavar="S",
      help="seconds between metrics scrapes of each backend (default 0.25)")
    a("--max-snapshot-age", type=float, metavar="S",
      help="a scrape older than this is stale (default max(1, 4 x the scrape interval))")
    a("--replicas", type=int, default=1, metavar="N",
      help="gateway replicas, each with its own ledger and scrapes (default 1)")
    a("--slo-ttft", type=float, default=1.0, metavar="S", help="goodput's TTFT SLO (default 1)")
    a("--slo-tpot", type=float, default=0.05, metavar="S",
      help="goodput's TPOT SLO (default 0.05)")
    a("--queue-timeout", type=float, default=30.0, metavar="S",
      help="gateway queue timeout with admission (default 30)")
    a("--slo-admission", choices=("on", "off"), default="on",
      help="with admission, also refuse (429) what no backend can take within the TPOT SLO "
           "(--slo-tpot), as the gateway does by default (default on)")
    a("--slo-wait", type=float, default=0.0, metavar="S",
      help="SLO admission: seconds a request may wait for a backend within the SLO (default 0)")
    a("--offload", choices=("on", "off"), default="on",
      help="cost: send prompts over twice the recent median to slower backends that can take "
           "them within the SLOs, as the gateway does by default "
           "(routing/scheduling/offload.py; default on)")
    a("--weights", action="append", default=[], metavar="POLICY:NAME=W[,NAME=W...]",
      help="override a policy's scorer weights (repeatable), e.g. cost:prefill_load=6,ttft=2")
    a("--prefix-groups", type=int, default=16, metavar="N",
      help="shared-prefix: groups sharing a document (default 16)")
    a("--prefix-tokens", type=int, default=6000, metavar="N",
      help="shared-prefix: tokens of the shared document (default 6000)")
    a("--question-tokens", type=int, default=1200, metavar="N",
      help="shared-prefix: median tokens of a question (default 1200)")
    a("--json", metavar="FILE", help="write the results as JSON to FILE ('-': stdout, no table)")
    a("--plot", metavar="FILE.png", help="plot TTFT p99 and goodput against load (matplotlib)")
    a("--jobs", type=int, default=1, metavar="N",
      help="run the simulations in N processes (default 1; results do not depend on it)")
    a("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(func=run)


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise UsageError(f"{what} must be comma-separated numbers, got {text!r}") from exc
    if not values or any(not v > 0 for v in values):
        raise UsageError(f"{what} must be numbers > 0, got {text!r}")
    return values


def _names(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    if text == "all":
        return known
    if text == "none":
        return ()
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown policy {unknown[0]!r} in {what}; known: {', '.join(known)}")
    return names


def _weights(items: list[str], policies: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """--weights items as {policy: {scorer: weight}}; UsageError naming the first problem."""
    out: dict[str, dict[str, float]] = {}
    for item in items:
        policy, sep, pairs = item.partition(":")
        policy = policy.strip()
        if not sep or policy not in POLICIES:
            raise UsageError(f"--weights {item!r}: expected POLICY:NAME=W[,NAME=W...] with a "
                             f"known policy ({', '.join(POLICIES)})")
        if policy not in policies:
            raise UsageError(f"--weights names {policy!r}, which --policies does not compare")
        known = scorer_names(policy)
        for pair in pairs.split(","):
            name, eq, value = (x.strip() for x in pair.partition("="))
            if name not in known:
                raise UsageError(f"--weights: {policy!r} has no scorer {name!r} (its scorers: "
                                 f"{', '.join(known) or 'none'})")
            try:
                weight = float(value) if eq else math.nan
            except ValueError:
                weight = math.nan
            if not weight >= 0.0 or math.isinf(weight):
                raise UsageError(f"--weights: {policy}:{name} needs a weight >= 0, got {value!r}")
            out.setdefault(policy, {})[name] = weight
    return out


def build_experiment(args: argparse.Namespace) -> Experiment:
    """The experiment the arguments describe; UsageError naming the first problem."""
    try:
        fleet: FleetSpec = parse_fleet(args.backends)
    except ValueError as exc:
        raise UsageError(f"--backends: {exc}") from exc
    known = tuple(POLICIES)  # the registry's order: baselines first, kvgate's own last
    policies = _names(args.policies, known, "--policies")
    if not policies:
        raise UsageError("--policies names no policy")
    admitted = set(_names(args.admission, known, "--admission"))
    contenders = tuple(Contender(p, p in admitted) for p in policies)
    weights = _weights(args.weights, policies)
    try:
        seeds = tuple(int(x) for x in args.seeds.split(",") if x.strip())
    except ValueError as exc:
        raise UsageError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from exc
    if not seeds:
        raise UsageError("--seeds names no seed")
    for flag, value in (("--duration", args.duration), ("--scrape-interval", args.scrape_interval),
                        ("--max-snapshot-age", args.max_snapshot_age),
                        ("--burstiness", args.burstiness), ("--queue-timeout", args.queue_timeout)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be > 0, got {value:g}")
    for flag, value in (("--slo-ttft", args.slo_ttft), ("--slo-tpot", args.slo_tpot)):
        if not value > 0:
            raise UsageError(f"{flag} must be > 0, got {value:g}")
    if not args.slo_wait >= 0:
        raise UsageError(f"--slo-wait must be >= 0, got {args.slo_wait:g}")
    if args.replicas < 1:
        raise UsageError(f"--replicas must be >= 1, got {args.replicas}")
    for flag, n in (("--prefix-groups", args.prefix_groups),
                    ("--prefix-tokens", args.prefix_tokens),
                    ("--question-tokens", args.question_tokens)):
        if n < 1:
            raise UsageError(f"{flag} must be >= 1, got {n}")
    limits = Limits(max_context=min(p.max_model_len for p in fleet.presets))
    loads = _floats(args.load, "--load") if args.load else ()
    rates = _floats(args.rate, "--rate") if args.rate else ()
    trace: Trace | None = None
    spec = None
    if args.trace:
        trace = _load_trace(args, limits, scaled=bool(loads or rates))
        duration = args.duration
    else:
        for flag, value in (("--trace-format", args.trace_format),
                            ("--trace-limit", args.trace_limit), ("--rate-scale", args.rate_scale)):
            if value is not None:
                raise UsageError(f"{flag} needs --trace")
        spec = workload(args.workload, limits=limits, shared_prefix=SharedPrefix(
            args.prefix_groups, args.prefix_tokens, args.question_tokens))
        duration = args.duration if args.duration is not None else 600.0
        if not loads and not rates:
            loads = (0.85,)
    max_age = args.max_snapshot_age or max(1.0, 4 * args.scrape_interval)
    try:
        return Experiment(
            fleet=fleet, contenders=contenders, workload=spec,
            trace=trace.items if trace is not None else None,
            trace_info=trace.info if trace is not None else None, loads=loads,
            rates=rates, arrival=args.arrival, burstiness=args.burstiness, duration_s=duration,
            seeds=seeds, scrape_interval_s=args.scrape_interval, max_snapshot_age_s=max_age,
            replicas=args.replicas, slo=Slo(args.slo_ttft, args.slo_tpot),
            dispatch=DispatchConfig(
                queue_timeout_s=args.queue_timeout, slo_wait_s=args.slo_wait,
                slo=SloTargets(args.slo_ttft, args.slo_tpot),
                slo_admission=args.slo_admission == "on"),
            weights=weights, offload_long_prompts=args.offload == "on")
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _load_trace(args: argparse.Namespace, limits: Limits, *, scaled: bool) -> Trace:
    """The --trace file's requests. Replayed as recorded or at --rate-scale, reading stops at the
    end of --duration; UsageError naming the first problem (a malformed record's line)."""
    if args.trace_limit is not None and args.trace_limit < 1:
        raise UsageError(f"--trace-limit must be >= 1, got {args.trace_limit}")
    if args.rate_scale is not None and not (args.rate_scale > 0 and math.isfinite(args.rate_scale)):
        raise UsageError(f"--rate-scale must be > 0, got {args.rate_scale:g}")
    scale = args.rate_scale or 1.0
    horizon = args.duration * scale if args.duration and not scaled else None
    try:
        with open(args.trace, encoding="utf-8-sig", newline="") as f:
            trace = read_trace(f, fmt=args.trace_format or "auto", limits=limits,
                               limit=args.trace_limit, horizon_s=horizon, rate_scale=scale)
    except OSError as exc:
        raise UsageError(f"--trace: cannot read {args.trace}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a malformed record, or bytes that are not UTF-8
        raise UsageError(f"--trace: {args.trace}: {exc}") from exc
    trace = replace(trace, info=replace(trace.info, source=Path(args.trace).name))
    if not trace.items:
        raise UsageError(f"--trace: {args.trace} has no requests"
                         + (f" ({trace.info.describe()})" if trace.info.requests == 0 and (
                             trace.info.failed or trace.info.too_long) else ""))
    return trace


def run(args: argparse.Namespace) -> int:
    experiment = build_experiment(args)
    if args.plot:
        try:
            load_pyplot()
        except ImportError as exc:
            raise UsageError(str(exc)) from exc
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    # On a terminal (the table on stdout): the run time's estimate and a bar; else the plain
    # lines, the estimate among them.
    with simulation_progress(experiment, jobs=args.jobs, quiet=args.quiet,
                             bar=sys.stderr.isatty() and args.json != "-") as progress:
        report: Report = run_experiment(experiment, progress, jobs=args.jobs)
    document = json.dumps(report.as_json(), indent=2, sort_keys=False) + "\n"
    if args.json == "-":
        sys.stdout.write(document)
    else:
        print(table(report))
        if args.json:
            Path(args.json).write_text(document, encoding="utf-8")
    if args.plot:
        plot(report, args.plot)
        if not args.quiet:
            print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`kvgate simulate` on its own (`python -m loadtest.simulate_cli`), through the one CLI
    dispatcher, so arguments and exit codes are the same."""
    from gateway.cli import main as kvgate_main

    return kvgate_main(["simulate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
