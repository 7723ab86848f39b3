"""`kvgate plan`: capacity planning for one request shape, from model and GPU specs.

    kvgate plan [--model NAME | --params-b B --layers N --heads N --kv-heads N --head-dim N]
                [--gpu h100|a100|l40s|l4 | --gpu-memory-gb G --gpu-bandwidth-tbs T --gpu-tflops F]
                [--gpus-per-replica N] [--prompt-tokens 1000] [--output-tokens 250] [--rate R]
                [--tpot-slo-ms 50] [--ttft-slo-ms 1000] [--memory-utilization 0.9] [--fp8] [--json]
    kvgate plan --fleet | --trace FILE | --price GPU=$/h | --power GPU=W  [--model NAME]
                [--rate R] [--prompt-tokens N --output-tokens N] [--max-load 0.8] [--fp8] ...

The figures are `routing.physics`, the simulator's roofline model, not a second one: a step
takes overhead + max(weight bytes / bandwidth, 2 x params x tokens / FLOP/s) + KV bytes read /
bandwidth + attention FLOPs / FLOP/s, at the kernel efficiencies there. A saturated replica
decoding B sequences makes r = (D / output) / (1 + (D / output) x prompt / prefill tokens/s)
requests/s, D = B / decode step(B) (`routing.plan`); the plan takes the best B, and the best within
the TPOT SLO. It is a steady-state estimate for one request shape: `kvgate simulate` checks a plan
under real arrivals, queueing and a mix of sizes.

With `--fleet` (or a trace, prices or power figures) it plans the cheapest fleet over the known
GPUs instead (`routing.fleet_plan`, `gateway.plan_fleet_cli`), and prints the `kvgate simulate`
command that checks it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from gateway import plan_fleet_cli
from gateway.cli import UsageError
from routing.fleet_plan import FleetPlan, plan_fleet
from routing.physics import GPUS, LLAMA_3_8B, MODELS, GpuSpec, ModelSpec
from routing.plan import Operating, Plan, plan

DEFAULT_MODEL = LLAMA_3_8B.name
_CUSTOM_MODEL = ("params_b", "layers", "heads", "kv_heads", "head_dim")
_CUSTOM_GPU = ("gpu_memory_gb", "gpu_bandwidth_tbs", "gpu_tflops")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan", help="capacity planning from model and GPU specs (roofline, steady state)",
        description="Per-replica KV, throughput and concurrency for one request shape, and the "
                    "fleet size for a request rate, from the simulator's roofline model.")
    a = parser.add_argument
    a("--model", metavar="NAME", help=f"a known model: {', '.join(MODELS)} (default "
                                      f"{DEFAULT_MODEL}), or give the five custom-model flags")
    a("--params-b", type=float, metavar="B", help="custom model: parameters, in billions")
    a("--layers", type=int, metavar="N", help="custom model: layers")
    a("--heads", type=int, metavar="N", help="custom model: attention heads")
    a("--kv-heads", type=int, metavar="N", help="custom model: KV heads")
    a("--head-dim", type=int, metavar="N", help="custom model: head dimension")
    a("--max-model-len", type=int, metavar="N",
      help="the model's context limit (default: the known model's, 8192 for a custom one)")
    a("--gpu", metavar="NAME", help=f"a known GPU: {'|'.join(GPUS)} (default h100), or give the "
                                    "three custom-GPU flags")
    a("--gpu-memory-gb", type=float, metavar="G", help="custom GPU: memory, GB")
    a("--gpu-bandwidth-tbs", type=float, metavar="T", help="custom GPU: memory bandwidth, TB/s")
    a("--gpu-tflops", type=float, metavar="F", help="custom GPU: dense bf16 TFLOP/s")
    a("--gpus-per-replica", type=int, default=1, metavar="N",
      help="GPUs per replica, tensor parallel (default 1)")
    a("--prompt-tokens", type=int, default=1000, metavar="N", help="prompt tokens (default 1000)")
    a("--output-tokens", type=int, default=250, metavar="N", help="output tokens (default 250)")
    a("--rate", type=float, metavar="R", help="requests/s to size a fleet for")
    a("--tpot-slo-ms", type=float, default=50.0, metavar="MS", help="TPOT SLO (default 50)")
    a("--ttft-slo-ms", type=float, default=1000.0, metavar="MS", help="TTFT SLO (default 1000)")
    a("--memory-utilization", type=float, default=0.9, metavar="X",
      help="GPU memory share for weights and KV, as vLLM's (default 0.9)")
    a("--json", action="store_true", help="print the plan as JSON")
    plan_fleet_cli.add_arguments(parser)
    parser.set_defaults(func=run)


def _custom(args: argparse.Namespace, fields: tuple[str, ...], named: str | None,
            what: str) -> bool:
    """Whether the custom-`what` flags `fields` are given: all of them, positive, and not with
    the flag that names a known one (`named`); UsageError otherwise."""
    given = [f for f in fields if getattr(args, f) is not None]
    if not given:
        return False
    if named is not None:
        raise UsageError(f"give --{what.lower()} or the custom-{what} flags, not both")
    if len(given) < len(fields):
        missing = [f for f in fields if f not in given]
        raise UsageError(f"a custom {what} needs all of {_flags(list(fields))}; missing "
                         f"{_flags(missing)}")
    _positive(args, fields)
    return True


def _model(args: argparse.Namespace) -> ModelSpec:
    if _custom(args, _CUSTOM_MODEL, args.model, "model"):
        if args.heads % args.kv_heads:
            raise UsageError(f"--heads ({args.heads}) must be a multiple of --kv-heads "
                             f"({args.kv_heads})")
        model = ModelSpec("custom", num_params=args.params_b * 1e9, num_layers=args.layers,
                          num_attention_heads=args.heads, num_kv_heads=args.kv_heads,
                          head_dim=args.head_dim)
    else:
        name = args.model if args.model is not None else DEFAULT_MODEL
        if name not in MODELS:
            raise UsageError(f"unknown model {name!r}; known: {', '.join(MODELS)} (or give "
                             "the custom-model flags)")
        model = MODELS[name]
    if args.max_model_len is not None:
        _positive(args, ("max_model_len",))
        model = dataclasses.replace(model, max_model_len=args.max_model_len)
    return model


def _gpu(args: argparse.Namespace) -> GpuSpec:
    if _custom(args, _CUSTOM_GPU, args.gpu, "GPU"):
        return GpuSpec(f"custom GPU {args.gpu_memory_gb:g}GB", hbm_bytes=args.gpu_memory_gb * 1e9,
                       bandwidth=args.gpu_bandwidth_tbs * 1e12, flops=args.gpu_tflops * 1e12)
    name = (args.gpu if args.gpu is not None else "h100").lower()
    if name not in GPUS:
        raise UsageError(f"unknown GPU {args.gpu!r}; known: {', '.join(GPUS)} (or give the "
                         "custom-GPU flags)")
    return GPUS[name]


def _flags(dests: list[str]) -> str:
    return ", ".join("--" + d.replace("_", "-") for d in dests)


def _positive(args: argparse.Namespace, dests: tuple[str, ...]) -> None:
    for dest in dests:
        value = getattr(args, dest)
        if value is not None and not value > 0:
            raise UsageError(f"{_flags([dest])} must be > 0, got {value:g}")


def build_plan(args: argparse.Namespace) -> Plan:
    """The plan the arguments describe; UsageError naming the first problem."""
    model, gpu = _model(args), _gpu(args)
    _positive(args, ("gpus_per_replica", "prompt_tokens", "output_tokens", "rate",
                     "tpot_slo_ms", "ttft_slo_ms", "memory_utilization"))
    if args.memory_utilization > 1:
        raise UsageError(f"--memory-utilization must be at most 1, got {args.memory_utilization:g}")
    try:
        return plan(model, gpu, gpus_per_replica=args.gpus_per_replica,
                    prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                    rate=args.rate, tpot_slo_s=args.tpot_slo_ms / 1e3,
                    ttft_slo_s=args.ttft_slo_ms / 1e3, memory_utilization=args.memory_utilization,
                    fp8=args.fp8)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def build_fleet_plan(args: argparse.Namespace) -> FleetPlan:
    """The fleet plan the arguments describe (`--fleet`); UsageError naming the first problem."""
    model = _model(args)
    if args.gpu is not None or _custom(args, _CUSTOM_GPU, None, "GPU"):
        raise UsageError("a fleet plan considers every known GPU: give --price for the types "
                         "to consider, not --gpu or the custom-GPU flags")
    _positive(args, ("prompt_tokens", "output_tokens", "rate", "tpot_slo_ms", "ttft_slo_ms",
                     "memory_utilization", "max_load"))
    prompt, output, longest, rate = args.prompt_tokens, args.output_tokens, None, args.rate
    if args.trace:
        trace_rate, prompt, output, longest, _ = plan_fleet_cli.trace_shape(args.trace)
        rate = rate if rate is not None else trace_rate
    if rate is None:
        raise UsageError("a fleet plan needs --rate (or a --trace to take it from)")
    try:
        return plan_fleet(model, GPUS, rate=rate, prompt_tokens=prompt, output_tokens=output,
                          longest_tokens=longest, tpot_slo_s=args.tpot_slo_ms / 1e3,
                          ttft_slo_s=args.ttft_slo_ms / 1e3,
                          prices=plan_fleet_cli.pairs(args.price, "--price"),
                          power=plan_fleet_cli.pairs(args.power, "--power"),
                          fp8=(False, True) if args.fp8 else (False,),
                          memory_utilization=args.memory_utilization, max_load=args.max_load)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def as_json(p: Plan) -> dict[str, Any]:
    """The plan as a JSON document: per-replica figures, the two capacities, the fleet."""
    def point(o: Operating | None) -> dict[str, Any] | None:
        return None if o is None else {
            "concurrency": o.concurrency, "requests_per_s": o.requests_per_s,
            "output_tokens_per_s": o.output_tokens_per_s, "tpot_s": o.tpot_s,
            "prefill_fraction": o.prefill_fraction}

    return {
        "model": p.model.name, "gpu": p.gpu.name, "gpus_per_replica": p.gpus_per_replica,
        "fp8": p.fp8,
        "prompt_tokens": p.prompt_tokens, "output_tokens": p.output_tokens,
        "tpot_slo_s": p.tpot_slo_s, "ttft_slo_s": p.ttft_slo_s,
        "replica": {
            "weights_gb": p.weights_bytes / 1e9, "kv_cache_gb": p.kv_cache_bytes / 1e9,
            "kv_bytes_per_token": p.kv_bytes_per_token,
            "kv_tokens_capacity": p.kv_tokens_capacity,
            "sequences_that_fit": p.sequences_that_fit,
            "single_stream_tokens_per_s": p.single_stream_tokens_per_s,
            "bandwidth_ceiling_tokens_per_s": p.bandwidth_ceiling_tokens_per_s,
            "prefill_tokens_per_s": p.prefill_tokens_per_s, "idle_ttft_s": p.idle_ttft_s,
            "saturated": point(p.saturated), "within_slo": point(p.slo),
        },
        "fleet": None if p.fleet is None else {
            "rate": p.fleet.rate, "replicas": p.fleet.replicas, "gpus": p.fleet.gpus,
            "requests_per_s_per_replica": p.fleet.requests_per_s_per_replica,
            "load": p.fleet.load},
        "warnings": list(p.warnings),
    }


def report(p: Plan) -> str:
    """The plan as a readable text report, with units."""
    gpus = f"{p.gpus_per_replica} x {p.gpu.name}"
    seq = p.prompt_tokens + p.output_tokens
    s = p.saturated
    lines = [
        f"{p.model.name} on {gpus} per replica{', FP8 weights and KV cache' if p.fp8 else ''};"
        f" requests of {p.prompt_tokens} prompt + {p.output_tokens} output tokens",
        f"  weights          {p.weights_bytes / 1e9:.1f} GB; KV cache {p.kv_cache_bytes / 1e9:.1f}"
        f" GB at memory utilization {p.memory_utilization:g}",
        f"  KV per token     {p.kv_bytes_per_token:,} bytes ({p.kv_bytes_per_token / 1024:g} KiB);"
        f" capacity {p.kv_tokens_capacity:,} tokens = {p.sequences_that_fit:,}"
        f" request{'s' if p.sequences_that_fit != 1 else ''} of {seq:,} tokens",
        f"  decode           {p.single_stream_tokens_per_s:,.0f} tokens/s single stream"
        f" (bandwidth ceiling {p.bandwidth_ceiling_tokens_per_s:,.0f} tokens/s)",
        f"  prefill          {p.prefill_tokens_per_s:,.0f} tokens/s for the prompt; idle TTFT"
        f" {p.idle_ttft_s * 1e3:.1f} ms",
        f"  saturated        {s.requests_per_s:.2f} requests/s, {s.output_tokens_per_s:,.0f}"
        f" output tokens/s at concurrency {s.concurrency} (TPOT {s.tpot_s * 1e3:.1f} ms)",
    ]
    if p.tpot_slo_s is not None:
        label = f"TPOT <= {p.tpot_slo_s * 1e3:g} ms".ljust(16)
        o = p.slo
        lines.append(f"  {label} " + (
            "none: even batch 1 is over the SLO" if o is None else
            f"{o.requests_per_s:.2f} requests/s, {o.output_tokens_per_s:,.0f} output tokens/s at"
            f" concurrency {o.concurrency} (TPOT {o.tpot_s * 1e3:.1f} ms)"))
    f = p.fleet
    if f is not None:
        lines.append(
            f"  fleet            {f.replicas} replica{'s' if f.replicas != 1 else ''}"
            f" ({f.gpus} GPU{'s' if f.gpus != 1 else ''}) for {f.rate:g} requests/s, each at"
            f" {f.requests_per_s_per_replica:.2f} ({f.load:.0%} of its SLO capacity)")
    lines += [f"  warning: {w}" for w in p.warnings]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if plan_fleet_cli.wanted(args):
        fp = build_fleet_plan(args)
        if args.json:
            sys.stdout.write(json.dumps(plan_fleet_cli.as_json(fp), indent=2) + "\n")
        else:
            print(plan_fleet_cli.report(fp, args.trace))
        return 0 if fp.groups else 1
    p = build_plan(args)
    if args.json:
        sys.stdout.write(json.dumps(as_json(p), indent=2) + "\n")
    else:
        print(report(p))
    return 0
