"""Where kvgate's CPU goes per request and per relayed chunk: a sampling profile of the gateway
process under the overhead benchmark's load.

    python -m loadtest.profile_overhead [--requests 2000] [--streams 400] [--tokens 100]
        [--rate 250] [--no-record]

The mock backend and a `kvgate serve` with its default configuration run as processes of their
own (as in `loadtest.bench_overhead`); py-spy (`pip install py-spy`) samples the gateway process
while the load generator sends, first whole requests 8 at a time (the cost per request), then
unpaced streams of `--tokens` content events 8 at a time (the cost per chunk). Each sample's
innermost frame is charged its self time; the tables list the functions of most self time, and
the shares by package (aiohttp, the event loop, the gateway, routing, the rest).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from loadtest.bench_overhead_peers import Started, kvgate_proc, run_load, start_mock
from loadtest.results import Table, add_arguments, command, save

TOP = 15
# The package a frame's file is in, by the start of its path (as `_short` writes it); the event
# loop's own C code and the system calls it makes show as the frame that entered it.
PACKAGES = (("aiohttp", ("aiohttp/",)), ("yarl, multidict", ("yarl/", "multidict/")),
            ("asyncio, uvloop (C: epoll, sockets)", ("asyncio/", "uvloop/")),
            ("gateway", ("gateway/",)), ("routing", ("routing/",)),
            ("opentelemetry", ("opentelemetry/",)), ("logging", ("logging/",)),
            ("pydantic", ("pydantic",)))


def _spy(pid: int, out: Path, rate: int) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw", "--rate",
                             str(rate), "--nonblocking", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def self_times(raw: str) -> Counter[str]:
    """Samples per innermost frame (`function (file)`, lines merged) of py-spy's raw output."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        function, _, where = leaf.partition(" (")
        path = where.rsplit(":", 1)[0]
        counts[f"{function} ({_short(path)})"] += int(n)
    return counts


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3", "/work/"):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[-1] if marker == "/lib/python3" \
                else path.split(marker, 1)[1]
    return path


def package_of(frame: str) -> str:
    path = frame.rpartition(" (")[2]
    if path.startswith("<string>"):
        return "dataclasses' generated methods"
    for name, prefixes in PACKAGES:
        if path.startswith(prefixes):
            return name
    return "other"


def profile(kind: str, requests: int, tokens: int, rate: int, workdir: Path) -> Counter[str]:
    with Started() as started:
        mock = started.add(start_mock(workdir))
        gateway = started.add(kvgate_proc(workdir, mock.url, "kvgate-profiled"))
        mode = "json" if kind == "request" else "stream"
        run_load(gateway, gateway.url, mode, 8, max(8, requests // 10), tokens, 0)  # warm-up
        out = workdir / f"profile-{kind}.txt"
        spy = _spy(gateway.popen.pid, out, rate)
        time.sleep(1.0)  # py-spy attaches
        run_load(gateway, gateway.url, mode, 8, requests, tokens, 0)
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    return self_times(out.read_text()) if out.exists() else Counter()


def _tables(kind: str, counts: Counter[str]) -> list[Table]:
    total = sum(counts.values()) or 1
    top = [[name, round(100 * n / total, 1)] for name, n in counts.most_common(TOP)]
    shares: Counter[str] = Counter()
    for name, n in counts.items():
        shares[package_of(name)] += n
    by_package = [[name, round(100 * n / total, 1)] for name, n in shares.most_common()]
    return [Table(f"Per {kind}: the {TOP} functions of most self time ({total} samples)",
                  ["function (file)", "% of samples"], top),
            Table(f"Per {kind}: self time by package", ["package", "% of samples"],
                  by_package)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.profile_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="whole requests profiled")
    parser.add_argument("--streams", type=int, default=400, help="streams profiled")
    parser.add_argument("--tokens", type=int, default=100, help="content events per stream")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kvgate-profile-overhead"))
    add_arguments(parser)
    args = parser.parse_args(argv)
    if shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists():
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    tables: list[Table] = []
    for kind, count, tokens in (("request", args.requests, 16),
                                ("chunk", args.streams, args.tokens)):
        counts = profile(kind, count, tokens, args.rate, args.workdir)
        tables.extend(_tables(kind, counts))
    for table in tables:
        print(f"\n{table.title}")
        for row in table.rows:
            print(f"  {row[1]:5}%  {row[0]}")
    save(args, "profile_overhead", title="Where kvgate's CPU goes: a profile per request and "
         "per chunk", command=command("loadtest.profile_overhead",
                                      sys.argv[1:] if argv is None else argv), tables=tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
