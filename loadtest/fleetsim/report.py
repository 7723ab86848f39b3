"""An experiment's report: the text table, and the plot (matplotlib, an optional extra).

The table shows each figure's mean over seeds; with several seeds a second table gives the spread
(min to max) of the headline figures. The plot draws TTFT p99 and goodput against load, one line
per policy, with the seeds' range as error bars.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from loadtest.fleetsim.experiment import Point, Report
from loadtest.fleetsim.results import Spread
from loadtest.fleetsim.trace_replay import describe_level

PLOT_EXTRA_HINT = "pip install 'kvgate[plot]' (or: pip install matplotlib)"

_Fmt = Callable[[float], str]


def _ms(v: float) -> str:
    return f"{v * 1000:.0f}" if v < 10 else f"{v:.1f}s"


def _num(v: float) -> str:
    return f"{v:.0f}"


def _rate(v: float) -> str:
    return f"{v:.2f}"


def _pct(v: float) -> str:
    return f"{v:.1%}"


def _ratio(v: float) -> str:
    return f"{v:.2f}"


# (figure, column header, format)
COLUMNS: tuple[tuple[str, str, _Fmt], ...] = (
    ("completed", "done", _num),
    ("rejected", "rej", _num),
    ("ttft_p50_s", "TTFT p50", _ms),
    ("ttft_p90_s", "p90", _ms),
    ("ttft_p99_s", "p99", _ms),
    ("tpot_p50_s", "TPOT p50", _ms),
    ("tpot_p99_s", "p99", _ms),
    ("e2e_p99_s", "E2E p99", _ms),
    ("output_tokens_per_s", "tok/s", _num),
    ("goodput_rps", "goodput", _rate),
    ("slo_misses", "SLO miss", _num),
    ("preemptions", "preempt", _num),
    ("reservation_misses", "miss", _num),
    ("prefix_hit_rate", "hit", _pct),
    ("peak_queue", "peak q", _num),
    ("load_imbalance", "imbal", _ratio),
)
SPREAD_FIGURES: tuple[tuple[str, str, _Fmt], ...] = (
    ("ttft_p90_s", "TTFT p90", _ms),
    ("ttft_p99_s", "TTFT p99", _ms),
    ("goodput_rps", "goodput", _rate),
    ("preemptions", "preempt", _num),
    ("reservation_misses", "miss", _num),
)


def _cell(spread: Spread, fmt: _Fmt) -> str:
    return "-" if spread.mean is None else fmt(spread.mean)


def _range(spread: Spread, fmt: _Fmt) -> str:
    if spread.low is None or spread.high is None:
        return "-"
    return f"{fmt(spread.low)} .. {fmt(spread.high)}"


def _grid(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in
                     enumerate(zip(header, widths, strict=True)))
    out = [line, "-" * len(line)]
    for row in rows:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                             enumerate(zip(row, widths, strict=True))))
    return out


def _point_title(report: Report, point: Point) -> str:
    load = f"load {point.load:.0%} of capacity, " if point.load is not None else ""
    return f"{load}{point.rate_rps:.2f} requests/s"


def table(report: Report) -> str:
    """The report as text: a header naming the experiment, then one table per load level."""
    e = report.experiment
    source = e.workload.name if e.workload is not None else "trace"
    lines = [
        f"fleet {e.fleet.describe()} ({e.fleet.model}); workload {source}"
        + (f", {e.arrival} arrivals; " if e.trace is None else "; ") +
        f"{f'{e.duration_s:g} s' if e.duration_s is not None else 'its whole span'}; seeds "
        f"{','.join(map(str, e.seeds))}; scrape every {e.scrape_interval_s:g} s; "
        f"{e.replicas} gateway replica{'s' if e.replicas > 1 else ''}",
        f"SLO: TTFT <= {e.slo.ttft_s:g} s, TPOT <= {e.slo.tpot_s * 1000:g} ms; times in ms"
        + ("" if report.capacity_rps is None
           else f"; measured capacity {report.capacity_rps:.2f} requests/s"),
    ]
    if e.trace_info is not None:
        lines.append(e.trace_info.describe())
    header = ["policy", *(h for _, h, _ in COLUMNS)]
    for point in report.points:
        lines += ["", _point_title(report, point)
                  + (f" (means over {len(e.seeds)} seeds)" if len(e.seeds) > 1 else "")]
        replayed = e.trace_replay(point)
        if e.trace_info is not None and replayed is not None:
            lines.append(describe_level(e.trace_info, replayed))
        rows = []
        for c in e.contenders:
            s = point.spread_of(c)
            rows.append([c.label, *(_cell(s[name], fmt) for name, _, fmt in COLUMNS)])
        lines += _grid(header, rows)
        if len(e.seeds) > 1:
            lines += ["", "spread over seeds (min .. max)"]
            rows = []
            for c in e.contenders:
                s = point.spread_of(c)
                rows.append([c.label, *(_range(s[name], fmt) for name, _, fmt in SPREAD_FIGURES)])
            lines += _grid(["policy", *(h for _, h, _ in SPREAD_FIGURES)], rows)
    return "\n".join(lines)


def load_pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive Agg backend; ImportError with the fix."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib: {PLOT_EXTRA_HINT}") from exc
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plot(report: Report, path: str) -> None:
    """TTFT p99 and goodput against load (or rate), one line per policy, to a PNG file."""
    plt = load_pyplot()
    e = report.experiment
    by_load = all(p.load is not None for p in report.points)
    xs = [(p.load if by_load and p.load is not None else p.rate_rps) for p in report.points]
    fig, (ax_ttft, ax_good) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c in e.contenders:
        for ax, name, scale in ((ax_ttft, "ttft_p99_s", 1.0), (ax_good, "goodput_rps", 1.0)):
            spreads = [p.spread_of(c)[name] for p in report.points]
            pts = [(x, s) for x, s in zip(xs, spreads, strict=True) if s.mean is not None]
            if not pts:
                continue
            x = [xv * (100 if by_load else 1) for xv, _ in pts]
            y = [(s.mean or 0.0) * scale for _, s in pts]
            err = [[(s.mean or 0.0) - (s.low or 0.0) for _, s in pts],
                   [(s.high or 0.0) - (s.mean or 0.0) for _, s in pts]]
            ax.errorbar(x, y, yerr=err if len(e.seeds) > 1 else None, marker="o", capsize=3,
                        label=c.label)
    xlabel = "load (% of measured capacity)" if by_load else "offered rate (requests/s)"
    ax_ttft.set(title="TTFT p99", xlabel=xlabel, ylabel="seconds", yscale="log")
    ax_good.set(title=f"goodput (TTFT <= {e.slo.ttft_s:g} s, TPOT <= "
                      f"{e.slo.tpot_s * 1000:g} ms)", xlabel=xlabel, ylabel="requests/s")
    for ax in (ax_ttft, ax_good):
        ax.grid(True, alpha=0.3)
    ax_good.legend(fontsize=8)
    source = e.workload.name if e.workload is not None else "trace"
    fig.suptitle(f"kvgate simulate: {source} on {e.fleet.describe()}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
