"""Run the locust load test headless, for a bounded time, against `kvgate demo` (or a gateway).

    .venv/bin/python -m loadtest.run_locust [--users 16] [--spawn-rate 8] [--run-time 60s]
        [--workload chat] [--seed 0] [--think-scale 1.0] [--out loadtest/raw/locust]
        [--host URL | --backends 3 --time-scale 1] [--no-record]

Without --host it starts `kvgate demo` on a free loopback port (--backends simulators at
--time-scale) and waits until the gateway is ready; then it runs locust (loadtest/locustfile.py)
in a subprocess, so gevent's monkey-patching stays there, writes locust's CSV files under the
--out prefix, the final figures (`<out>_final.json`, after in-flight replies finished) and a
summary (`<out>_summary.txt`) of every request type (chat, TTFT, TPOT, ITL): count, failures and
percentiles in milliseconds. A run that succeeds also records its summary in
`loadtest/results/run_locust.json` (`--no-record`: nowhere); the raw files under --out (by default
`loadtest/raw/`) are not committed. With a --time-scale above 1 the simulated GPUs run that much
faster than modeled, so times are that much shorter than a real fleet's.

Exit code: 0 when locust succeeded and no request failed; 1 when any request failed, no reply
completed, locust failed or the demo died; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from loadtest.results import Table, add_arguments, command, save
from loadtest.workloads import WORKLOADS

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
READY_DEADLINE_S = 60.0
STOP_DEADLINE_S = 20.0
TYPES = ("chat", "TTFT", "TPOT", "ITL")
PERCENTILES = ("50%", "90%", "99%")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _wait_ready(url: str, demo: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_DEADLINE_S
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            raise RuntimeError(f"kvgate demo exited with code {demo.returncode} before it was "
                               "ready")
        with contextlib.suppress(urllib.error.URLError, OSError):  # not listening yet
            with urllib.request.urlopen(f"{url}/ready", timeout=2.0) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.1)
    raise RuntimeError(f"kvgate demo was not ready within {READY_DEADLINE_S:g} s")


def start_demo(backends: int, time_scale: float) -> tuple[subprocess.Popen[bytes], str]:
    """`kvgate demo` on a free port, once its gateway answers /ready."""
    port = _free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", str(port), "--backends",
         str(backends), "--time-scale", str(time_scale)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, demo)
    except BaseException:
        stop(demo)
        raise
    return demo, url


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (the demo's clean shutdown), then SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_locust(host: str, args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
           "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
           "--run-time", args.run_time, "--stop-timeout", args.stop_timeout,
           "--csv", args.out, "--only-summary", "--loglevel", "WARNING",
           "--exit-code-on-error", "1",
           "--workload", args.workload, "--seed", str(args.seed),
           "--think-scale", str(args.think_scale), "--model", args.model,
           "--summary-json", f"{args.out}_final.json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode


HEADER = ("type", "count", "failures", "p50 ms", "p90 ms", "p99 ms", "mean ms")


def rows(figures: dict[str, dict[str, float]]) -> list[list[str | int | float | None]]:
    """One row per request type (HEADER's columns) from the locustfile's final figures."""
    out: list[list[str | int | float | None]] = []
    for kind in TYPES:
        row = figures.get("POST chat" if kind == "chat" else f"{kind} chat")
        if row is None:
            out.append([kind, 0, 0, None, None, None, None])
        else:
            out.append([kind, int(row["count"]), int(row["failures"]),
                        *(round(row[k]) for k in ("p50_ms", "p90_ms", "p99_ms")),
                        round(row["mean_ms"], 1)])
    return out


def summarize(figures: dict[str, dict[str, float]]) -> tuple[str, int, int]:
    """(summary text, failures, completed chat replies) from the locustfile's final figures."""
    table = rows(figures)
    failures = sum(int(r[2] or 0) for r in table)
    completed = int(table[0][1] or 0) - int(table[0][2] or 0)
    lines = [list(HEADER)] + [["-" if c is None else str(c) for c in r] for r in table]
    widths = [max(len(r[i]) for r in lines) for i in range(len(HEADER))]
    text = "\n".join("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in lines)
    return text, failures, completed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_locust", description=__doc__.split("\n")[0])
    parser.add_argument("--host", help="an already running gateway (default: start kvgate demo)")
    parser.add_argument("--backends", type=int, default=3, help="demo simulators (default 3)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="demo simulators' time scale (default 1)")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--spawn-rate", type=float, default=8.0)
    parser.add_argument("--run-time", default="60s", help="locust's --run-time (default 60s)")
    parser.add_argument("--stop-timeout", default="30s",
                        help="locust's --stop-timeout: time replies in flight get to finish at "
                             "the end (default 30s)")
    parser.add_argument("--workload", default="chat", choices=WORKLOADS)
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--think-scale", type=float, default=1.0)
    parser.add_argument("--out", default="loadtest/raw/locust",
                        help="CSV and summary path prefix (default loadtest/raw/locust)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.users < 1 or not args.spawn_rate > 0 or args.think_scale < 0:
        print("run_locust: --users >= 1, --spawn-rate > 0 and --think-scale >= 0 are required",
              file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    demo = None
    try:
        host = args.host
        if host is None:
            demo, host = start_demo(args.backends, args.time_scale)
        code = run_locust(host, args)
        demo_died = demo is not None and demo.poll() is not None
    except RuntimeError as exc:
        print(f"run_locust: {exc}", file=sys.stderr)
        return 1
    finally:
        if demo is not None:
            stop(demo)
    final = Path(f"{args.out}_final.json")
    if not final.exists():
        print(f"run_locust: locust wrote no {final} (exit code {code})", file=sys.stderr)
        return 1
    figures = json.loads(final.read_text(encoding="utf-8"))
    text, failures, completed = summarize(figures)
    summary = (f"locust {args.workload} workload, {args.users} users, {args.run_time} against "
               f"{'kvgate demo' if demo is not None else host}"
               + (f" (time scale {args.time_scale:g})" if demo is not None else "")
               + f"\n{text}\n")
    Path(f"{args.out}_summary.txt").write_text(summary, encoding="utf-8")
    print(summary, end="")
    if demo_died:
        print("run_locust: kvgate demo died during the run", file=sys.stderr)
    if failures or not completed or code != 0 or demo_died:
        print(f"run_locust: FAILED ({failures} failures, {completed} replies, locust exit code "
              f"{code})", file=sys.stderr)
        return 1
    save(args, "run_locust", title=f"Locust against {'kvgate demo' if demo else 'a gateway'}",
         command=command("loadtest.run_locust", sys.argv[1:] if argv is None else argv),
         tables=[Table(f"{args.workload} workload, {args.users} users, {args.run_time}",
                       list(HEADER), rows(figures),
                       "`chat` is locust's own timer (it stops at the response headers, which "
                       "the gateway sends with the first token); TTFT, TPOT and ITL (every gap "
                       "between content chunks) are reported by the users.")],
         notes=summary.splitlines()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
