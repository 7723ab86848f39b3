"""The easy/hard workload: labelled prompts through a small-model routing alias, in virtual time.

    python -m loadtest.easy_hard [--rate 12] [--duration 300] [--seeds 0,1,2]
        [--large 1xllama-3-8b-l40s] [--small 1xllama-3.2-1b-l40s] [--policy cost]
        [--reservation-quantiles 0.9] [--no-record]

The workload `easy-hard` (also `kvgate simulate --workload easy-hard`, which replays it on one
pool: the everything-large baseline) draws each request from the eval split of
`tests/data/routing_prompts.jsonl` (prompts the shipped classifier was not trained on): an easy
one asks a short question and gets a short reply (median 80 tokens, max_tokens 256), a hard one
gets a long one (median 600, max_tokens 2048), each after one of four shared system prompts. The
alias `auto` (the hashed classifier at its defaults: rules, then the score against the threshold
meeting max_hard_share 0.05) decides each request once, when the workload is built; the request's
kind records the label and the decision (`easy-small`, `hard-large`, ...).

This runner replays the same schedule twice: everything to the large pool, and routed by the
alias (what it sends small to the small pool, the rest to the large one: two pools serving two
models, each simulated with the gateway's own routing, ledger and admission). Reported per run:
the share served small, the hard prompts sent small, the large pool's mean KV usage and the hard
requests' TTFT and TPOT p99 on it (what the easy ones stop costing them; of the hard requests
served, beside how many the gateway refused, its queue timing out), the large pool's
preemptions, and goodput (both SLOs met, requests a second) of all requests, routed against
all-large. Each of --reservation-quantiles (routing.reservation_quantile: the quantile of the
model's learned reply lengths a request's KV reservation holds) is one pair of runs. Into
`loadtest/results/bench_easy_hard.json` unless --no-record.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.fleetsim.backends import FleetSpec, parse_fleet
from loadtest.fleetsim.loop import RunOutcome, SimConfig, simulate
from loadtest.fleetsim.results import Slo, percentile
from loadtest.results import Table, add_arguments, command, save
from loadtest.workloads import (
    SYSTEM,
    USER,
    WorkItem,
    Workload,
    _Ctx,
    _lognormal,
    schedule,
    segment,
    shared_offset,
    shared_tag,
)
from routing.difficulty.calibrate import thresholds
from routing.difficulty.labelled import read_prompts
from routing.difficulty.model import score
from routing.difficulty.weights import shipped
from routing.model_select import Ask, SmallModelRoute, certain
from routing.output_length import DEFAULT_RESERVATION_QUANTILE

NAME = "easy-hard"
DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "routing_prompts.jsonl"
ROUTE = SmallModelRoute(alias="auto", large="large", small="small")
MAX_HARD_SHARE = 0.05  # the alias's default
EASY_REPLY, HARD_REPLY = (80, 256), (600, 2048)  # (median tokens, max_tokens)
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Labelled:
    text: str
    hard: bool
    small: bool  # the alias sends it small


@functools.cache
def labelled_prompts() -> tuple[Labelled, ...]:
    """The eval split, each prompt with the alias's decision (hashed classifier, defaults)."""
    weights = shipped("hashed")
    threshold = thresholds(weights.hard_scores, max_hard_share=MAX_HARD_SHARE, threshold=None,
                           step=0.0, pressure_max_hard_share=MAX_HARD_SHARE).base
    out = []
    for prompt in read_prompts(DATA.read_text(encoding="utf-8")):
        if prompt.split != "eval":
            continue
        ruled = certain(ROUTE, Ask(text=prompt.text, max_tokens=None, turns=1)) is not None
        small = not ruled and score(weights, prompt.text) < threshold
        out.append(Labelled(prompt.text, prompt.hard, small))
    return tuple(out)


def kind_of(prompt: Labelled) -> str:
    return f"{'hard' if prompt.hard else 'easy'}-{'small' if prompt.small else 'large'}"


def easy_hard_session(ctx: _Ctx) -> list[WorkItem]:
    """One request: a labelled prompt (its length in tokens, estimated) after a system prompt."""
    rng = ctx.rng
    prompts = labelled_prompts()
    prompt = prompts[rng.randrange(len(prompts))]
    k = rng.randrange(4)
    segments = [segment(SYSTEM, shared_tag("e", k), shared_offset("e", k), 60),
                ctx.unique(USER, max(8, len(prompt.text) // CHARS_PER_TOKEN))]
    median, cap = HARD_REPLY if prompt.hard else EASY_REPLY
    item = ctx.item(0.0, kind_of(prompt), segments, _lognormal(rng, median, 0.8, 1, cap), cap,
                    None)
    return [item] if item is not None else []


def sent_small(item: WorkItem) -> bool:
    return item.kind.endswith("-small")


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    small_share: float  # of all requests, served by the small pool
    hard: int
    hard_small: int  # hard requests sent small
    hard_refused: int  # hard requests the large pool's gateway refused (its queue timed out)
    large_kv: float  # the large pool's mean KV usage
    large_preemptions: int
    hard_ttft_p99_s: float | None  # hard requests (on the large pool)
    hard_tpot_p99_s: float | None
    goodput_rps: float  # every request meeting both SLOs, a second


def figures(items: Sequence[WorkItem], runs: Sequence[RunOutcome], slo: Slo,
            duration_s: float, *, routed: bool) -> Figures:
    """The figures of `items` served by `runs` (the large pool's first, then the small's; or
    the large pool's alone, everything sent to it, when not `routed`)."""
    large = runs[0]
    requests = [r for run in runs for r in run.requests]
    every_hard = [r for r in large.requests if r.kind.startswith("hard")]
    hard = [r for r in every_hard if r.rejected is None]
    small = sum(sent_small(item) for item in items) if routed else 0
    good = sum(1 for r in requests if r.rejected is None and slo.met(r, r.tpot_s))
    usage = [b.mean_kv_usage for b in large.backends]
    tpots = sorted(t for t in (r.tpot_s for r in hard) if t is not None)
    return Figures(
        requests=len(items), small_share=small / len(items) if items else 0.0,
        hard=sum(item.kind.startswith("hard") for item in items),
        hard_small=sum(item.kind == "hard-small" for item in items) if routed else 0,
        hard_refused=len(every_hard) - len(hard),
        large_kv=statistics.fmean(usage) if usage else 0.0,
        large_preemptions=sum(b.preemptions for b in large.backends),
        hard_ttft_p99_s=percentile(sorted(r.ttft_s for r in hard), 0.99),
        hard_tpot_p99_s=percentile(tpots, 0.99), goodput_rps=good / duration_s)


def spec() -> Workload:
    from loadtest.workloads import workload

    return workload(NAME)


def compare(large: FleetSpec, small: FleetSpec, *, rate: float, duration_s: float, seed: int,
            policy: str = "cost", slo: Slo | None = None,
            reservation_quantile: float = DEFAULT_RESERVATION_QUANTILE,
            ) -> tuple[Figures, Figures]:
    """(everything large, routed by the alias) on one seed's schedule of the workload."""
    slo = slo or Slo()
    items = schedule(spec(), rate=rate, duration_s=duration_s, seed=seed)
    config = SimConfig(policy=policy, admission=True, seed=seed,
                       reservation_quantile=reservation_quantile)
    everything = simulate(items, large, config, duration_s=duration_s)
    big = tuple(item for item in items if not sent_small(item))
    little = tuple(item for item in items if sent_small(item))
    runs = [simulate(big, large, config, duration_s=duration_s)]
    if little:
        runs.append(simulate(little, small, config, duration_s=duration_s))
    return (figures(items, [everything], slo, duration_s, routed=False),
            figures(items, runs, slo, duration_s, routed=True))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f}"


def row(label: str, quantile: float, seed: int, f: Figures) -> list[object]:
    return [label, f"{quantile:g}", seed, f.requests, f"{100 * f.small_share:.1f}%",
            f"{f.hard_small}/{f.hard}", f.hard_refused, f"{100 * f.large_kv:.1f}%",
            f.large_preemptions, _ms(f.hard_ttft_p99_s), _ms(f.hard_tpot_p99_s),
            f"{f.goodput_rps:.2f}"]


COLUMNS = ("run", "reservation q", "seed", "requests", "served small", "hard sent small",
           "hard refused", "large KV", "large preemptions", "hard TTFT p99 ms",
           "hard TPOT p99 ms", "goodput rps")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.easy_hard",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=float, default=12.0, help="requests/s (default 12)")
    parser.add_argument("--duration", type=float, default=300.0,
                        help="seconds of arrivals (default 300)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    parser.add_argument("--large", default="1xllama-3-8b-l40s",
                        help="the large pool (default 1xllama-3-8b-l40s)")
    parser.add_argument("--small", default="1xllama-3.2-1b-l40s",
                        help="the small pool (default 1xllama-3.2-1b-l40s)")
    parser.add_argument("--policy", default="cost", help="routing policy (default cost)")
    parser.add_argument("--reservation-quantiles", default=f"{DEFAULT_RESERVATION_QUANTILE:g}",
                        help="comma-separated routing.reservation_quantile values, one pair of "
                        f"runs each (default {DEFAULT_RESERVATION_QUANTILE:g})")
    add_arguments(parser)
    args = parser.parse_args(argv)
    large, small = parse_fleet(args.large), parse_fleet(args.small)
    rows: list[list[object]] = []
    quantiles = [float(x) for x in args.reservation_quantiles.split(",") if x.strip()]
    for quantile in quantiles:
        for seed in (int(x) for x in args.seeds.split(",") if x.strip()):
            base, routed = compare(large, small, rate=args.rate, duration_s=args.duration,
                                   seed=seed, policy=args.policy, reservation_quantile=quantile)
            rows += [row("all large", quantile, seed, base), row("auto", quantile, seed, routed)]
    table = Table("Easy and hard prompts: everything large, or routed by the alias", COLUMNS,
                  rows, f"{args.rate:g} requests/s for {args.duration:g} s (Poisson), large pool "
                  f"{args.large}, small pool {args.small}, policy {args.policy} with admission; "
                  "hard TTFT/TPOT are those of the hard requests the large pool served, hard "
                  "refused those whose wait in its gateway queue timed out (30 s); reservation "
                  "q is routing.reservation_quantile; goodput counts requests meeting TTFT 1 s "
                  "and TPOT 50 ms.")
    width = [max(len(str(cell)) for cell in column) for column in zip(COLUMNS, *rows,
                                                                        strict=True)]
    for line in (COLUMNS, *rows):
        print("  ".join(str(cell).rjust(w) for cell, w in zip(line, width, strict=True)))
    save(args, "bench_easy_hard", title="Small-model routing in the simulator: easy and hard "
         "prompts", command=command("loadtest.easy_hard", sys.argv[1:] if argv is None
                                    else argv), tables=[table])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
