"""The public trace formats `kvgate simulate --trace` reads (Azure LLM inference CSV, Mooncake
JSONL, BurstGPT CSV, besides kvgate's JSONL): each is told by its content, read with its real
column layout and times, Mooncake's block-level prefix sharing reaches the gateway's prefix
chains and the engines' prefix caches exactly, a trace's timeline is scaled by one factor to the
rate asked for, and a malformed record is named by its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main as kvgate
from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.loop import SimConfig, simulate
from loadtest.fleetsim.trace import load_trace, read_trace
from loadtest.fleetsim.trace_formats import detect, read_records, timestamp_ns
from loadtest.fleetsim.trace_replay import plan, replay
from loadtest.sim.engine import Engine, SimRequest
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from loadtest.workloads import Limits, WorkItem
from routing.prefix import conversation_text, prefix_chain

DATA = Path(__file__).parent / "data" / "traces"
FILES = {"azure": ["azure_conv_2023.csv", "azure_code_2024.csv"],
         "mooncake": ["mooncake_conversation.jsonl"], "burstgpt": ["burstgpt.csv"]}


def lines(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").splitlines(keepends=True)


def mooncake(*records: tuple[float, int, int, list[int]]) -> list[str]:
    return [json.dumps({"timestamp": t, "input_length": n, "output_length": out, "hash_ids": ids})
            for t, n, out, ids in records]


def common_prefix(a: tuple[int, ...] | str, b: tuple[int, ...] | str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize(("fmt", "name"), [(f, n) for f, names in FILES.items() for n in names])
def test_each_format_is_told_by_its_content_and_read_with_its_lengths(fmt: str, name: str
                                                                      ) -> None:
    text = lines(name)
    assert detect(text[0]) == fmt
    found, records = read_records(text)
    rows = list(records)
    assert found == fmt and len(rows) == len([t for t in text if t.strip()]) - (fmt != "mooncake")
    trace = read_trace(text)
    kept = [r for r in rows if r.output_tokens > 0]
    assert trace.info.format == fmt and trace.info.requests == len(kept) == len(trace.items)
    # Lengths as recorded (each prompt counts its chat template, as a server's usage does).
    assert sorted(i.prompt_tokens for i in trace.items) == sorted(
        max(r.prompt_tokens, 14) for r in kept)
    assert [i.output_tokens for i in trace.items] == [r.output_tokens for r in kept]
    assert trace.items[0].arrival_s == 0.0
    times = [i.arrival_s for i in trace.items]
    assert times == sorted(times)


def test_azure_timestamps_keep_their_seven_digit_fractions_and_utc_offsets() -> None:
    a = timestamp_ns("2023-11-16 18:15:46.6805900")
    assert timestamp_ns("2023-11-16 18:15:46.6805901") - a == 100  # 100 ns apart
    assert timestamp_ns("2023-11-16 18:15:47") - a == 319_410_000
    assert timestamp_ns("2023-11-17T00:00:00Z") - timestamp_ns("2023-11-16 23:59:59.5") == (
        500_000_000)
    assert timestamp_ns("2024-05-10 02:00:00.009930+02:00") == timestamp_ns(
        "2024-05-10 00:00:00.00993")
    items = read_trace(lines("azure_conv_2023.csv")).items
    # Rows 2 and 3 of the file: 18:15:46.0857815 and 18:15:46.4158982.
    assert items[1].arrival_s == pytest.approx(0.3301167, abs=1e-9)


def test_burstgpt_failures_are_skipped_and_counted_in_the_summary() -> None:
    trace = read_trace(lines("burstgpt.csv"))
    assert trace.info.failed == 3 and trace.info.requests == 37
    assert "skipped 3 failed (no reply)" in trace.info.describe()
    # A request of 0 tokens that got a reply is replayed with the shortest prompt.
    assert load_trace(["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                       "0,ChatGPT,0,5,5,API log"])[0].prompt_tokens == 14


def test_mooncake_requests_share_exactly_the_blocks_their_hash_ids_share() -> None:
    a, b, c = load_trace(mooncake((0, 1500, 10, [7, 8, 9]), (1000, 1400, 10, [7, 8, 3]),
                                  (2000, 1500, 10, [8, 7, 9])))
    ids = [i.prompt_ids() for i in (a, b, c)]
    assert [len(x) for x in ids] == [1500, 1400, 1500]
    # Two 512-token blocks, then the third message's template opening, then the ids diverge.
    assert common_prefix(ids[0], ids[1]) == 1024 + 4
    assert common_prefix(ids[0], ids[2]) < 16  # the same blocks in another order share nothing
    # The gateway's prefix chain (256-character blocks) agrees as far as the two blocks' text.
    texts = [conversation_text(i.messages()) for i in (a, b)]
    shared = common_prefix(*texts)
    two_blocks = len(conversation_text(a.messages()[:2]))
    assert two_blocks <= shared < two_blocks + len("user\x1f h0000")  # diverges in the id's tag
    chains = [prefix_chain(t, model="m") for t in texts]
    assert common_prefix(chains[0].blocks, chains[1].blocks) == shared // 256 >= 20
    # Block text is a function of the hash id alone: a cut-short last block is a prefix of it.
    short, = load_trace(mooncake((0, 700, 10, [7, 8])))
    assert common_prefix(short.prompt_ids(), ids[0]) == 700 - 6  # up to its newline and reply
    # More hash ids than the prompt holds: the ones it holds. Fewer: the rest is unique text.
    few, = load_trace(mooncake((0, 600, 10, [7, 8, 9, 10])))
    assert few.prompt_tokens == 600 and common_prefix(few.prompt_ids(), ids[0]) == 600 - 6
    long_a, long_b = load_trace(mooncake((0, 2000, 10, [7]), (1, 2000, 10, [7])))
    assert long_a.prompt_tokens == 2000
    tail = common_prefix(long_a.prompt_ids(), long_b.prompt_ids()) - 512
    assert 0 < tail < 16  # the unique text's template and tag: no engine block past the id's


def test_a_shared_two_block_prefix_is_a_1024_token_prefix_cache_hit() -> None:
    first, second = load_trace(mooncake((0, 1500, 20, [1, 2, 3]), (5000, 1300, 20, [1, 2, 4])))
    engine = Engine(PRESETS[DEFAULT_PRESET])
    for n, item in enumerate((first, second)):
        engine.add(SimRequest(f"r{n}", item.prompt_ids(), item.max_tokens, item.output_tokens))
        while engine.has_work():
            engine.step()
    assert engine.stats().prefix_hits_tokens == 1024
    # The same through the simulated gateway and fleet.
    outcome = simulate((first, second), parse_fleet("1"), SimConfig(policy="round_robin"),
                       duration_s=6.0)
    assert outcome.backends[0].prefix_hits_tokens == 1024
    assert outcome.backends[0].prefix_queries_tokens == 2800


def test_prompts_too_long_for_the_context_are_skipped_in_public_traces_only() -> None:
    azure = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,9000,5",
             "2023-11-16 18:15:47.0000000,100,5"]
    trace = read_trace(azure, limits=Limits(max_context=8192))
    assert trace.info.too_long == 1 and trace.info.requests == 1
    assert "1 longer than the 8192-token context" in trace.info.describe()
    with pytest.raises(ValueError, match="line 1: prompt_tokens 9000 leaves no room"):
        load_trace(['{"arrival_s": 0, "prompt_tokens": 9000, "output_tokens": 5}'])


def test_reading_stops_at_the_limit_or_the_horizon() -> None:
    text = lines("azure_code_2024.csv")
    limited = read_trace(text, limit=5)
    assert len(limited.items) == 5 and limited.info.stopped == "--trace-limit 5"
    early = read_trace(text, horizon_s=3.0)
    assert early.items and all(i.arrival_s < 3.0 for i in early.items)
    assert len(early.items) == sum(1 for i in read_trace(text).items if i.arrival_s < 3.0)
    # kvgate's JSONL need not be in time order: every record inside the horizon is kept.
    jsonl = [json.dumps({"arrival_s": t, "prompt_tokens": 50, "output_tokens": 5})
             for t in (0.0, 5.0, 1.0)]
    assert [i.arrival_s for i in read_trace(jsonl, horizon_s=2.0).items] == [0.0, 1.0]
    fast = read_trace(text, rate_scale=4.0)
    assert [i.arrival_s * 4 for i in fast.items] == pytest.approx(
        [i.arrival_s for i in read_trace(text).items])


def test_a_replay_scales_the_timeline_by_one_factor_and_cuts_it_to_the_window() -> None:
    arrivals = [0.0, 1.0, 1.5, 4.0, 6.0, 10.0]
    items = tuple(WorkItem(t, "trace", (), 1, 1, None) for t in arrivals)
    assert plan(arrivals, None, None).count == 6
    assert plan(arrivals, 5.0, None) == plan(arrivals, 5.0, None)
    assert (plan(arrivals, 5.0, None).count, plan(arrivals, 5.0, None).factor) == (4, 1.0)
    whole = plan(arrivals, None, 3.0)  # all six at 3 requests/s: a 2 s window
    assert whole.window_s == pytest.approx(2.0) and whole.rate_rps == pytest.approx(3.0)
    # 2 requests/s for 2 s: the first four, the 6 s up to the fifth squeezed into 2 s.
    cut = plan(arrivals, 2.0, 2.0)
    assert (cut.count, cut.factor, cut.window_s) == (4, pytest.approx(1 / 3), 2.0)
    scaled, window = replay(items, 2.0, 2.0)
    assert [i.arrival_s for i in scaled] == pytest.approx([0.0, 1 / 3, 0.5, 4 / 3])
    assert window == 2.0
    # Too few requests for the window: all of them, at the rate, in a shorter window.
    assert plan(arrivals, 10.0, 3.0).window_s == pytest.approx(2.0)


@pytest.mark.parametrize(("text", "fmt", "message"), [
    (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,10,5",
      "16/11/2023 18:15,10,5"], "auto", "trace line 3: TIMESTAMP must be a date and time"),
    (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6,ten,5"], "auto",
     "trace line 2: ContextTokens must be an integer >= 0"),
    (["TIMESTAMP,ContextTokens,GeneratedTokens", "", "2023-11-16 18:15:46.6,10"], "auto",
     "trace line 3: 2 columns, the header has 3"),
    (["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
      "-3,ChatGPT,10,5,15,API log"], "auto", "trace line 2: Timestamp must be a number >= 0"),
    (mooncake((0, 100, 5, [1])) + ['{"timestamp": 5, "input_length": 10, "output_length": 1,'
                                   ' "hash_ids": 7}'], "auto", "trace line 2: 'hash_ids' must be"),
    (mooncake((0, 100, 5, [1])) + ['{"timestamp": 5, "input_length": 10}'], "auto",
     "trace line 2: missing 'output_length'"),
    (["id,prompt,reply", "1,2,3"], "auto", "trace line 1: not a known trace format"),
    (['{"prompt": "hi"}'], "auto", "trace line 1: a JSON record with neither"),
    (mooncake((0, 100, 5, [1])), "azure", "trace line 1: not an Azure trace header"),
    (["TIMESTAMP,ContextTokens,GeneratedTokens"], "burstgpt", "missing Timestamp"),
    (["Timestamp,Request tokens,Response tokens", "1,2,3"], "jsonl", "trace line 1: not JSON"),
], ids=["azure-time", "azure-count", "azure-short-row", "burstgpt-time", "mooncake-ids",
        "mooncake-missing", "unknown-csv", "unknown-json", "forced-azure", "forced-burstgpt",
        "forced-jsonl"])
def test_a_malformed_record_is_named_by_its_line(text: list[str], fmt: str, message: str
                                                 ) -> None:
    with pytest.raises(ValueError, match=message):
        read_trace(text, fmt=fmt)


TINY = ["simulate", "--backends", "1", "--policies", "round_robin", "--quiet"]


@pytest.mark.parametrize(("fmt", "name"), [(f, n) for f, names in FILES.items() for n in names])
def test_the_cli_replays_each_format_end_to_end(fmt: str, name: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert kvgate([*TINY, "--trace", str(DATA / name), "--duration", "8", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    trace = doc["config"]["trace"]
    assert (trace["source"], trace["format"], trace["stopped"]) == (name, fmt, "8 s")
    point = doc["points"][0]
    replayed = point["trace_replay"]
    run = point["policies"]["round_robin"]["runs"][0]
    assert run["requests"] == replayed["requests"] == trace["requests"] > 0
    assert run["completed"] == run["requests"]
    assert replayed["compression"] == 1.0 and replayed["window_s"] == 8.0
    failed = read_trace(lines(name), horizon_s=8.0).info.failed  # in the first 8 s
    assert trace["skipped_failed"] == failed and (failed > 0) == (fmt == "burstgpt")


def test_the_summary_says_what_was_skipped_and_how_the_timeline_was_scaled(
        capsys: pytest.CaptureFixture[str]) -> None:
    burst = str(DATA / "burstgpt.csv")
    assert kvgate([*TINY, "--trace", burst, "--rate-scale", "4", "--duration", "10"]) == 0
    out = capsys.readouterr().out
    assert "trace burstgpt.csv (burstgpt): 37 requests" in out
    assert "skipped 3 failed (no reply)" in out
    assert "the first 40.0 s of the trace" in out and "in 10.0 s: timeline compressed 4x" in out
    assert kvgate([*TINY, "--trace", burst, "--rate-scale", "4", "--duration", "10",
                   "--json", "-"]) == 0
    replayed = json.loads(capsys.readouterr().out)["points"][0]["trace_replay"]
    assert replayed["compression"] == 4.0
    assert replayed["rate_rps"] == pytest.approx(4 * replayed["native_rate_rps"], rel=1e-3)


def test_load_scales_a_trace_to_a_fraction_of_the_measured_capacity(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = [*TINY, "--trace", str(DATA / "azure_code_2024.csv"), "--load", "0.1", "--duration",
            "4", "--json", "-"]
    assert kvgate(args) == 0
    doc = json.loads(capsys.readouterr().out)
    point = doc["points"][0]
    assert point["rate_rps"] == pytest.approx(0.1 * doc["capacity_rps"], abs=1e-3)
    replayed = point["trace_replay"]  # the first rate x 4 s requests, in 4 s
    assert replayed["window_s"] == 4.0
    assert replayed["requests"] == round(point["rate_rps"] * 4)
    assert replayed["compression"] == pytest.approx(
        replayed["trace_window_s"] / 4.0, rel=1e-3)


def test_trace_limit_replays_the_first_requests(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvgate([*TINY, "--trace", str(DATA / "mooncake_conversation.jsonl"), "--trace-limit",
                   "6", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["trace"]["requests"] == 6
    assert doc["points"][0]["policies"]["round_robin"]["runs"][0]["requests"] == 6


@pytest.mark.parametrize(("extra", "message"), [
    (["--trace", "BAD"], "bad.csv: trace line 3: TIMESTAMP must be"),
    (["--trace", "BAD", "--trace-format", "burstgpt"], "trace line 1: not a BurstGPT header"),
    (["--trace", "BAD", "--rate-scale", "0"], "--rate-scale must be > 0"),
    (["--trace", "BAD", "--trace-limit", "0"], "--trace-limit must be >= 1"),
    (["--rate-scale", "2"], "--rate-scale needs --trace"),
    (["--trace-format", "azure"], "--trace-format needs --trace"),
], ids=["malformed", "forced-format", "zero-scale", "zero-limit", "scale-alone", "format-alone"])
def test_trace_problems_exit_2_with_one_line(extra: list[str], message: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\n"
                   "yesterday,10,5\n")
    assert kvgate([*TINY, *(str(bad) if x == "BAD" else x for x in extra)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_prompts_past_an_8k_context_are_served_by_a_long_context_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mooncake's conversations run past Llama 3's 8,192 tokens: on those presets such a
    prompt is skipped and counted, and the summary names a model that serves it; a Llama 3.1
    fleet (128k context) replays every one."""
    trace = tmp_path / "long.jsonl"
    blocks = [20, 20, 2, 20, 20]  # of 512 tokens: one prompt of 1,024, four of 10,240
    trace.write_text("".join(
        json.dumps({"timestamp": 500 * i, "input_length": n * 512, "output_length": 64,
                    "hash_ids": list(range(100 * i, 100 * i + n))}) + "\n"
        for i, n in enumerate(blocks)))
    short = ["simulate", "--policies", "round_robin", "--quiet", "--trace", str(trace)]
    assert kvgate([*short, "--backends", "1xllama-3-8b-h100"]) == 0
    out = capsys.readouterr().out
    assert "skipped 4 longer than the 8192-token context" in out and "llama-3.1-8b" in out
    assert kvgate([*short, "--backends", "1xllama-3.1-8b-h100", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["trace"]["skipped_too_long"] == 0
    assert doc["points"][0]["policies"]["round_robin"]["runs"][0]["completed"] == 5
