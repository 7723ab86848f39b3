"""Where one policy's requests went and how well the gateway predicted them: a diagnostic for
tuning the cost model, on one `kvgate simulate` run.

    python -m loadtest.probe --policy cost [every kvgate simulate option] [--after 15]

For one policy, one seed and one load level (the first of each given), it prints
- per backend preset: the share of requests, their TTFT p50/p90/p99, TPOT p50/p99 and mean prompt
  and reply tokens;
- per workload kind and backend preset: the share of requests that met both SLOs (what goodput
  counts), missed the TTFT SLO and missed the TPOT SLO: which requests a policy loses, and where;
- per backend: the predicted TTFT (dispatch to first token) and TPOT against the actual, as means
  and as a correlation over requests. A prediction that does not track the actual misleads every
  scorer built on it;
- how many requests waited over 1 s for their first token, by 5 s window of arrival: a cluster in
  the first window is the cold start, before the gateway knows its backends' speeds.
- the refused requests by reason, by workload kind and by 5 s window of arrival: whom admission
  sheds, and whether it sheds at the cold start.
`--after S` leaves out requests that arrived in the first S seconds from the accuracy figures.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence

from gateway.cli import UsageError
from loadtest.fleetsim.experiment import measure_capacity, run_one
from loadtest.fleetsim.loop import RequestOutcome, RunOutcome
from loadtest.fleetsim.results import Slo, percentile
from loadtest.simulate_cli import add_arguments, build_experiment

Row = tuple[str, ...]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:.0f}"


def _pct(values: Sequence[float], q: float) -> float | None:
    return percentile(sorted(values), q)


def _corr(pairs: Sequence[tuple[float, float]]) -> str:
    if len(pairs) < 3:
        return "-"
    try:
        return f"{statistics.correlation([p for p, _ in pairs], [a for _, a in pairs]):.2f}"
    except statistics.StatisticsError:  # constant predictions or actuals
        return "-"


def _table(header: Row, rows: list[Row]) -> str:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(r, widths, strict=True))) for r in (header, *rows)]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def by_preset(run: RunOutcome) -> str:
    """Share and latency of the completed requests, by the preset of the backend they ran on."""
    preset_of = {b.id: b.preset for b in run.backends}
    done = [r for r in run.requests if r.rejected is None and r.backend is not None]
    rows: list[Row] = []
    for preset in dict.fromkeys(b.preset for b in run.backends):
        rs = [r for r in done if preset_of[r.backend or ""] == preset]
        if not rs:
            continue
        ttft = [r.ttft_s for r in rs]
        tpot = [t for r in rs if (t := r.tpot_s) is not None]
        rows.append((preset, f"{len(rs) / len(done):.1%}", _ms(_pct(ttft, 0.5)),
                     _ms(_pct(ttft, 0.9)), _ms(_pct(ttft, 0.99)), _ms(_pct(tpot, 0.5)),
                     _ms(_pct(tpot, 0.99)),
                     f"{statistics.fmean(r.prompt_tokens for r in rs):.0f}",
                     f"{statistics.fmean(r.output_tokens for r in rs):.0f}"))
    return _table(("preset", "share", "TTFT p50", "p90", "p99", "TPOT p50", "p99", "prompt",
                   "reply"), rows)


def by_kind(run: RunOutcome, slo: Slo) -> str:
    """Per workload kind and backend preset: how many requests went there and the share that met
    both SLOs (goodput's count), missed the TTFT SLO, and missed the TPOT SLO (a request can miss
    both). Where a policy's goodput is lost: which kinds of request, on which cards."""
    preset_of = {b.id: b.preset for b in run.backends}
    groups: dict[tuple[str, str], list[RequestOutcome]] = {}
    for r in run.requests:
        if r.rejected is None and r.backend is not None:
            groups.setdefault((r.kind, preset_of[r.backend]), []).append(r)
    rows: list[Row] = []
    for (kind, preset), rs in sorted(groups.items()):
        tpots = [r.tpot_s for r in rs]
        n = len(rs)
        met = sum(slo.met(r, t) for r, t in zip(rs, tpots, strict=True))
        rows.append((kind, preset, str(n), f"{met / n:.1%}",
                     f"{sum(slo.ttft_missed(r) for r in rs) / n:.1%}",
                     f"{sum(slo.tpot_missed(t) for t in tpots) / n:.1%}"))
    return _table(("kind", "preset", "requests", "met SLOs", "TTFT missed", "TPOT missed"), rows)


def _from_dispatch(r: RequestOutcome) -> float:
    return r.first_token_s - r.arrival_s - r.queue_wait_s


def accuracy(run: RunOutcome, after_s: float = 0.0) -> str:
    """Predicted against actual TTFT (from dispatch) and TPOT, per backend and overall."""
    rs = [r for r in run.requests if r.rejected is None and r.backend is not None
          and r.arrival_s >= after_s and not math.isnan(r.predicted_ttft_s)]
    rows: list[Row] = []
    groups: list[tuple[str, Callable[[RequestOutcome], bool]]] = [
        *((b.id, lambda r, b=b.id: r.backend == b) for b in run.backends),
        ("all", lambda r: True)]
    for name, keep in groups:
        mine = [r for r in rs if keep(r)]
        if not mine:
            continue
        ttft = [(r.predicted_ttft_s, _from_dispatch(r)) for r in mine]
        tpot = [(r.predicted_tpot_s, t) for r in mine if (t := r.tpot_s) is not None]
        rows.append((name, str(len(mine)), _ms(statistics.fmean(p for p, _ in ttft)),
                     _ms(statistics.fmean(a for _, a in ttft)), _corr(ttft),
                     _ms(statistics.fmean(p for p, _ in tpot)) if tpot else "-",
                     _ms(statistics.fmean(a for _, a in tpot)) if tpot else "-", _corr(tpot)))
    return _table(("backend", "requests", "TTFT pred", "actual", "corr", "TPOT pred", "actual",
                   "corr"), rows)


def slow_starts(run: RunOutcome, over_s: float = 1.0, window_s: float = 5.0) -> str:
    counts = Counter(int(r.arrival_s // window_s) for r in run.requests
                     if r.rejected is None and r.ttft_s > over_s)
    if not counts:
        return f"no request waited over {over_s:g} s for its first token"
    spans = ", ".join(f"{k * window_s:g}-{(k + 1) * window_s:g} s: {n}"
                      for k, n in sorted(counts.items()))
    return f"requests with TTFT over {over_s:g} s, by arrival: {spans}"


def rejections(run: RunOutcome, window_s: float = 5.0) -> str:
    """Refused requests by reason, by workload kind and by window of arrival: whom admission
    sheds, and whether it sheds at the cold start (before the backends' speeds are measured)."""
    refused = [r for r in run.requests if r.rejected is not None]
    if not refused:
        return "no request was refused"
    reasons = Counter(r.rejected for r in refused)
    kinds = Counter(r.kind for r in refused)
    totals = Counter(r.kind for r in run.requests)
    windows = Counter(int(r.arrival_s // window_s) for r in refused)
    return "\n".join([
        f"refused {len(refused)} of {len(run.requests)}: "
        + ", ".join(f"{code} {n}" for code, n in reasons.most_common()),
        "by kind: " + ", ".join(f"{k} {n} ({n / totals[k]:.1%})" for k, n in sorted(kinds.items())),
        "by arrival: " + ", ".join(f"{k * window_s:g}-{(k + 1) * window_s:g} s: {n}"
                                   for k, n in sorted(windows.items())),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--policy", default="cost", help="the policy to probe (default cost)")
    parser.add_argument("--after", type=float, default=0.0, metavar="S",
                        help="accuracy over requests arriving after S seconds (default 0)")
    args = parser.parse_args(argv)
    args.policies = args.policy
    try:
        experiment = build_experiment(args)
    except UsageError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 2
    seed = experiment.seeds[0]
    if experiment.loads:
        rate: float | None = experiment.loads[0] * measure_capacity(experiment, seed)
    else:
        rate = experiment.rates[0] if experiment.rates else None
    contender = experiment.contenders[0]
    run = run_one(experiment, rate, seed, contender).outcome
    print(f"{contender.label} on {experiment.fleet.describe()}, seed {seed}, "
          f"{len(run.requests)} requests")
    print(by_preset(run))
    print()
    print(by_kind(run, experiment.slo))
    print()
    print(accuracy(run, args.after))
    print()
    print(slow_starts(run))
    print()
    print(rejections(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
