"""What the simulator itself costs: engine CPU per sequence-step, and the CPU one `kvgate sim`
process burns to serve many concurrent streams in real time.

    .venv/bin/python -m loadtest.bench_sim [--streams 256] [--duration 20] [--preset NAME]
        [--engine-only] [--no-record]

1. Engine: `--streams` requests (512-token prompts, 512 output tokens) run to completion in
   virtual time in this process; CPU time of `step()` per sequence-step (one sequence advanced by
   one token) and per step at full batch.
2. Server: `kvgate sim --time-scale 1` (as `python -m loadtest.sim.cli`) in a subprocess, and a
   load generator in another (a bounded aiohttp streaming client keeping `--streams` chat streams
   open, each new request as soon as one ends). After a warm-up, the server's own CPU time
   (`process_cpu_seconds_total` from its /metrics) over `--duration` seconds of wall time gives the
   cores it uses. Its mean inter-token latency is compared with the same closed-loop load run on
   the engine in virtual time: the difference is how far the real-time server fell behind the
   modeled GPU.

Loopback only, bounded in streams and time. The tables go to `loadtest/results/bench_sim.json`
(`--no-record`: nowhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadtest.results import Table, add_arguments, command, save
from loadtest.sim.api import ChatMessage, render_chat
from loadtest.sim.engine import Engine, SimRequest
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from loadtest.sim.tokens import natural_output_length

MAX_STREAMS = 1024
MAX_DURATION_S = 120.0
WARMUP_S = 4.0
FILLER = ("The gateway routes each request to the backend with the most free cache blocks and "
          "the shortest queue, then streams the answer back token by token. ")
MAX_TOKENS = 1024
VIRTUAL_S = 60.0  # simulated seconds of the closed-loop reference run


def user_text(worker: int, i: int) -> str:
    """The load's request number `i` of `worker` (~740 prompt tokens once templated)."""
    return f"Worker {worker} request {i}. " + FILLER * 20


@dataclass(frozen=True, slots=True)
class EngineFigures:
    us_per_seq_step: float
    us_per_full_step: float
    modeled_full_step_ms: float


def bench_engine(preset_name: str, streams: int) -> EngineFigures:
    preset = PRESETS[preset_name]
    engine = Engine(preset)
    for i in range(streams):
        prompt = tuple(range(i * 1000, i * 1000 + 512))  # distinct prompts: no prefix sharing
        engine.add(SimRequest(f"r{i}", prompt, max_tokens=512, natural_len=512, ignore_eos=True))
    seq_steps = 0
    cpu = 0.0
    full_cpu, full_steps, full_modeled = 0.0, 0, 0.0
    while engine.has_work():
        t0 = time.process_time()
        result = engine.step()
        dt = time.process_time() - t0
        cpu += dt
        seq_steps += len(result.events)
        if result.num_decode_seqs == streams:
            full_cpu += dt
            full_steps += 1
            full_modeled += result.duration
    return EngineFigures(
        us_per_seq_step=1e6 * cpu / max(seq_steps, 1),
        us_per_full_step=1e6 * full_cpu / max(full_steps, 1),
        modeled_full_step_ms=1e3 * full_modeled / max(full_steps, 1),
    )


def closed_loop_itl(preset_name: str, streams: int) -> float:
    """Mean inter-token latency (s) the model gives the server benchmark's closed-loop load:
    `streams` users, each sending its next request when the last one ends, in virtual time."""
    engine = Engine(PRESETS[preset_name])
    sent = [0] * streams
    last: dict[str, float] = {}

    def send(worker: int) -> None:
        prompt = render_chat([ChatMessage(role="user", content=user_text(worker, sent[worker]))])
        request_id = f"{worker}-{sent[worker]}"
        sent[worker] += 1
        engine.add(SimRequest(request_id, prompt.tokens, MAX_TOKENS,
                              natural_output_length(prompt.key, 0)))

    for w in range(streams):
        send(w)
    now, gaps, count = 0.0, 0.0, 0
    while now < VIRTUAL_S:
        result = engine.step()
        now += result.duration
        for ev in result.events:
            if ev.token_index > 0 and now > VIRTUAL_S / 4:  # skip the start-up transient
                gaps += now - last[ev.request_id]
                count += 1
            last[ev.request_id] = now
            if ev.finish_reason is not None:
                del last[ev.request_id]
                send(int(ev.request_id.split("-")[0]))
    return gaps / max(count, 1)


async def _scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if "le" not in s.labels and "finished_reason" not in s.labels}


async def _stream_worker(session: aiohttp.ClientSession, base: str, worker: int, stop_at: float,
                         counts: dict[str, int]) -> None:
    i = 0
    while time.monotonic() < stop_at:
        body = {"messages": [{"role": "user", "content": user_text(worker, i)}],
                "max_tokens": MAX_TOKENS, "stream": True}
        i += 1
        try:
            async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    counts["errors"] += 1
                    continue
                async for data in resp.content.iter_any():
                    counts["chunks"] += data.count(b"\n\n")
                    if time.monotonic() >= stop_at:
                        return
            counts["requests"] += 1
        except aiohttp.ClientError:
            counts["errors"] += 1


async def run_load(base: str, streams: int, seconds: float) -> dict[str, float]:
    """The load generator: `streams` workers for `seconds`; prints counts as JSON."""
    counts = {"requests": 0, "chunks": 0, "errors": 0}
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=streams)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(_stream_worker(session, base, w, stop_at, counts)
                               for w in range(streams)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {**counts, "cpu_s": usage.ru_utime + usage.ru_stime}


async def bench_server(preset: str, streams: int, duration: float) -> list[list[object]]:
    """Prints the server's figures and returns them as rows (figure, value, unit)."""
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.sim.cli", "--port", "0", "--time-scale", "1",
        "--preset", preset, "--metrics-format", "vllm", stdout=asyncio.subprocess.PIPE)
    load: asyncio.subprocess.Process | None = None
    try:
        assert server.stdout is not None
        line = (await asyncio.wait_for(server.stdout.readline(), 30)).decode()
        base = line.rsplit(" on ", 1)[1].strip()
        if not base.startswith("http://127.0.0.1:"):
            raise SystemExit(f"unexpected server address: {line!r}")
        load = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadtest.bench_sim", "--load", base, "--streams",
            str(streams), "--duration", str(WARMUP_S + duration + 1.0),
            stdout=asyncio.subprocess.PIPE)
        async with aiohttp.ClientSession() as session:
            await asyncio.sleep(WARMUP_S)
            a, ta = await _scrape(session, base), time.monotonic()
            await asyncio.sleep(duration)
            b, tb = await _scrape(session, base), time.monotonic()
        out, _ = await asyncio.wait_for(load.communicate(), 60)
        load_counts = json.loads(out)
    finally:
        for proc in (load, server):
            if proc is not None and proc.returncode is None:
                proc.terminate()
                await proc.wait()

    def delta(name: str) -> float:
        return b[name] - a[name]

    wall = tb - ta
    cores = delta("process_cpu_seconds_total") / wall
    tokens = delta("vllm:generation_tokens_total")
    itl = delta("vllm:inter_token_latency_seconds_sum") / max(
        delta("vllm:inter_token_latency_seconds_count"), 1)
    modeled_itl = closed_loop_itl(preset, streams)
    print(f"server: {streams} concurrent streams of {preset} at time scale 1, "
          f"{wall:.1f} s measured after {WARMUP_S:g} s warm-up")
    print(f"  server CPU           {cores:.3f} cores "
          f"({1e6 * delta('process_cpu_seconds_total') / max(tokens, 1):.1f} us per token)")
    print(f"  tokens delivered     {tokens / wall:,.0f} tokens/s "
          f"({delta('vllm:e2e_request_latency_seconds_count') / wall:.1f} requests/s finished)")
    print(f"  in flight at end     running {b['vllm:num_requests_running']:.0f}, "
          f"waiting {b['vllm:num_requests_waiting']:.0f}")
    print(f"  inter-token latency  {1e3 * itl:.2f} ms mean served; the model gives this load "
          f"{1e3 * modeled_itl:.2f} ms in virtual time ({100 * (itl / modeled_itl - 1):+.1f}%: "
          "how far the real-time server fell behind the model)")
    print(f"  load generator       {load_counts['requests']} requests, {load_counts['chunks']} "
          f"chunks, {load_counts['errors']} errors, {load_counts['cpu_s']:.1f} s CPU")
    if cores > 0:
        print(f"  => one core would drive ~{streams / cores:,.0f} such streams before the "
              f"simulator's own CPU limits it (linear extrapolation; one engine runs at most "
              f"max_num_seqs={PRESETS[preset].max_num_seqs} at once)")
    return [
        ["server CPU", round(cores, 3), "cores"],
        ["server CPU per token", round(1e6 * delta("process_cpu_seconds_total")
                                       / max(tokens, 1), 1), "µs"],
        ["tokens delivered", round(tokens / wall), "tokens/s"],
        ["mean inter-token latency served", round(1e3 * itl, 2), "ms"],
        ["mean inter-token latency modeled (virtual time)", round(1e3 * modeled_itl, 2), "ms"],
        ["served over modeled", round(itl / modeled_itl, 3), "ratio"],
        ["load generator errors", load_counts["errors"], "requests"],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=list(PRESETS))
    parser.add_argument("--engine-only", action="store_true", help="skip the server benchmark")
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)  # load generator mode
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.streams <= MAX_STREAMS:
        parser.error(f"--streams must be in 1..{MAX_STREAMS}")
    if not 0 < args.duration <= MAX_DURATION_S:
        parser.error(f"--duration must be in (0, {MAX_DURATION_S:g}]")
    if args.load:
        if not args.load.startswith("http://127.0.0.1:"):
            parser.error("the load generator only targets 127.0.0.1")
        print(json.dumps(asyncio.run(run_load(args.load, args.streams, args.duration))))
        return 0

    e = bench_engine(args.preset, args.streams)
    print(f"engine: {args.streams} sequences x (512 prompt + 512 output tokens), {args.preset}")
    print(f"  {e.us_per_seq_step:.2f} us CPU per sequence-step; {e.us_per_full_step:.0f} us per "
          f"step at batch {args.streams} vs {e.modeled_full_step_ms:.2f} ms modeled "
          f"({100 * e.us_per_full_step / 1e3 / e.modeled_full_step_ms:.1f}% of a core at time "
          "scale 1)")
    tables = [Table(f"Engine: {args.streams} sequences x (512 prompt + 512 output tokens), "
                    f"{args.preset}", ["figure", "value", "unit"], [
                        ["CPU per sequence-step", round(e.us_per_seq_step, 2), "µs"],
                        [f"CPU per step at batch {args.streams}", round(e.us_per_full_step),
                         "µs"],
                        ["modeled step at that batch", round(e.modeled_full_step_ms, 2), "ms"],
                        ["share of a core at time scale 1",
                         round(e.us_per_full_step / 1e3 / e.modeled_full_step_ms, 4), "ratio"],
                    ])]
    if not args.engine_only:
        rows = asyncio.run(bench_server(args.preset, args.streams, args.duration))
        tables.append(Table(f"Server: {args.streams} concurrent streams at time scale 1, "
                            f"{args.duration:g} s measured after a {WARMUP_S:g} s warm-up",
                            ["figure", "value", "unit"], rows,
                            "Served over modeled is how far the real-time server fell behind "
                            "the modeled GPU (1 is not at all)."))
    save(args, "bench_sim", title="What the simulator costs",
         command=command("loadtest.bench_sim", sys.argv[1:] if argv is None else argv),
         tables=tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
