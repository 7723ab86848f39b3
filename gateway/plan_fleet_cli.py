"""`kvgate plan` for a fleet: the arguments that ask for one, the request shape from a trace, and
the report. The planning is `routing.fleet_plan`; `gateway.plan_cli` dispatches here when
`--fleet`, `--trace`, `--price` or `--power` is given."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from gateway.cli import UsageError
from routing.fleet_plan import FleetPlan
from routing.physics import GPUS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--fleet", action="store_true",
      help="plan the cheapest fleet over the known GPUs (count per type, replicas, TP degree) "
           "for --rate; implied by --trace, --price and --power")
    a("--trace", metavar="FILE",
      help="take the request rate and the prompt and output lengths from a trace (the formats "
           "kvgate simulate --trace reads)")
    a("--price", action="append", default=[], metavar="GPU=$/h",
      help="a GPU type's price per GPU-hour (repeatable, or comma-separated); with prices, "
           "only the priced types are considered and the fleet is the cheapest in $/h")
    a("--power", action="append", default=[], metavar="GPU=W",
      help="a GPU type's power draw in watts (repeatable, or comma-separated)")
    a("--max-load", type=float, default=0.8, metavar="X",
      help="fleet: the share of each replica's SLO capacity it is planned at (default 0.8)")
    a("--fp8", action="store_true",
      help="FP8 weights and KV cache; for a fleet, also consider FP8 deployments")


def wanted(args: argparse.Namespace) -> bool:
    return bool(args.fleet or args.trace or args.price or args.power)


def pairs(items: list[str], flag: str) -> dict[str, float]:
    """`GPU=VALUE` items (comma-separated or repeated) as {gpu: value}; UsageError naming a bad
    one."""
    out: dict[str, float] = {}
    for item in ",".join(items).split(","):
        if not item.strip():
            continue
        key, sep, value = (x.strip() for x in item.partition("="))
        try:
            number = float(value) if sep else -1.0
        except ValueError:
            number = -1.0
        if key.lower() not in GPUS or not number > 0:
            raise UsageError(f"{flag} {item.strip()!r}: expected GPU=NUMBER > 0 with a known "
                             f"GPU ({', '.join(GPUS)})")
        out[key.lower()] = number
    return out


def trace_shape(path: str) -> tuple[float, int, int, int, int]:
    """(rate, mean prompt, mean output, longest prompt + output, requests) of a trace file."""
    from loadtest.fleetsim.trace import load_trace  # the simulator's readers, only when asked

    try:
        with open(path, encoding="utf-8") as f:
            items = load_trace(f)
    except OSError as exc:
        raise UsageError(f"--trace: cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise UsageError(f"--trace: {exc}") from exc
    if len(items) < 2:
        raise UsageError(f"--trace: {path} needs at least two requests to give a rate")
    span = items[-1].arrival_s - items[0].arrival_s
    if not span > 0:
        raise UsageError(f"--trace: the requests of {path} all arrive at once: give --rate")
    prompts = [item.prompt_tokens for item in items]
    outputs = [item.output_tokens for item in items]
    return ((len(items) - 1) / span, round(statistics.fmean(prompts)),
            round(statistics.fmean(outputs)), max(p + o for p, o in zip(prompts, outputs,
                                                                         strict=True)),
            len(items))


def as_json(p: FleetPlan) -> dict[str, Any]:
    return {
        "model": p.model.name, "rate": p.rate, "prompt_tokens": p.prompt_tokens,
        "output_tokens": p.output_tokens, "tpot_slo_s": p.tpot_slo_s,
        "ttft_slo_s": p.ttft_slo_s, "max_load": p.max_load,
        "fleet": [{"deployment": g.candidate.name, "gpu": g.candidate.gpu_key,
                   "gpus_per_replica": g.candidate.gpus_per_replica, "fp8": g.candidate.fp8,
                   "replicas": g.replicas, "gpus": g.gpus,
                   "requests_per_s_per_replica": g.candidate.capacity} for g in p.groups],
        "gpus": p.gpus, "replicas": p.replicas, "capacity_requests_per_s": p.capacity,
        "backends": p.backends, "cost_per_hour": p.cost_per_hour,
        "cost_per_million_output_tokens": p.cost_per_million_output_tokens,
        "power_w": p.power_w, "kwh_per_million_output_tokens": p.kwh_per_million_output_tokens,
        "candidates": [{"deployment": c.name, "requests_per_s_per_replica": c.capacity,
                        "tpot_s": c.replica.slo.tpot_s if c.replica.slo else None,
                        "idle_ttft_s": c.replica.idle_ttft_s} for c in p.candidates],
        "warnings": list(p.warnings),
    }


def report(p: FleetPlan, trace: str | None = None) -> str:
    """The fleet plan as text; its `kvgate simulate` check replays `trace` when one was read."""
    lines = [f"{p.model.name}: {p.rate:g} requests/s of {p.prompt_tokens} prompt + "
             f"{p.output_tokens} output tokens (means); TTFT <= {p.ttft_slo_s * 1e3:g} ms, "
             f"TPOT <= {p.tpot_slo_s * 1e3:g} ms; replicas planned at {p.max_load:.0%} of their "
             "SLO capacity"]
    for g in p.groups:
        c = g.candidate
        lines.append(f"  {g.replicas} x {c.name:<28} {g.gpus} GPU{'s' if g.gpus != 1 else ''}, "
                     f"{c.capacity:.2f} requests/s each (TP {c.gpus_per_replica}"
                     f"{', FP8' if c.fp8 else ''})")
    if p.groups:
        lines.append(f"  fleet            {p.replicas} replicas, {p.gpus} GPUs, "
                     f"{p.capacity:.2f} requests/s planned capacity")
        if p.cost_per_hour is not None:
            lines.append(f"  cost             ${p.cost_per_hour:,.2f}/h, "
                         f"${p.cost_per_million_output_tokens:,.3f} per million output tokens")
        if p.power_w is not None:
            lines.append(f"  power            {p.power_w / 1e3:,.1f} kW, "
                         f"{p.kwh_per_million_output_tokens:,.3f} kWh per million output tokens")
        source = f"--trace {trace}" if trace else f"--rate {p.rate:g} --workload WORKLOAD"
        lines.append(f"  check it         kvgate simulate --backends {p.backends} {source} "
                     f"--slo-ttft {p.ttft_slo_s:g} --slo-tpot {p.tpot_slo_s:g}")
    lines.append(f"  candidates       {len(p.candidates)} deployments meet the SLOs: "
                 + ", ".join(f"{c.name} {c.capacity:.2f}/s" for c in p.candidates[:8])
                 + (" ..." if len(p.candidates) > 8 else ""))
    lines += [f"  warning: {w}" for w in p.warnings]
    return "\n".join(lines)
