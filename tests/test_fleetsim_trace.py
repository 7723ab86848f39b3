"""Trace replay: a JSONL record per request becomes a request with those lengths, arrival and
prefix sharing; a malformed line is named."""

from __future__ import annotations

import pytest

from loadtest.fleetsim.trace import load_trace, read_trace

TRACE = [
    '{"arrival_s": 0.5, "prompt_tokens": 900, "output_tokens": 40, "prefix_group": "doc"}',
    "",
    '{"arrival_s": 0.1, "prompt_tokens": 1000, "output_tokens": 12, "prefix_group": "doc",'
    ' "prefix_tokens": 800}',
    '{"arrival_s": 0.2, "prompt_tokens": 300, "output_tokens": 2000, "max_tokens": 64}',
]


def test_a_trace_replays_its_times_lengths_and_prefix_groups() -> None:
    items = load_trace(TRACE)
    assert [i.arrival_s for i in items] == [0.1, 0.2, 0.5]
    assert [i.prompt_tokens for i in items] == [1000, 300, 900]
    assert [i.output_tokens for i in items] == [12, 64, 40]  # cut to the client's cap
    assert items[1].max_tokens == 64 and items[0].max_tokens == 1024
    shared = items[0].prompt_ids()[:600]
    assert items[2].prompt_ids()[:600] == shared
    assert items[1].prompt_ids()[:16] != shared[:16]


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "line 1: not JSON"),
    ("[1, 2]", "line 1: expected a JSON object"),
    ('{"prompt_tokens": 5, "output_tokens": 5}', "line 1: missing 'arrival_s'"),
    ('{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 5}', "'arrival_s' must be"),
    ('{"arrival_s": 0, "prompt_tokens": 2.5, "output_tokens": 5}', "'prompt_tokens' must be"),
    ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": true}', "'output_tokens' must be"),
    ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5, "prefix_group": [1]}',
     "'prefix_group' must be"),
    ('{"arrival_s": 0, "prompt_tokens": 9000, "output_tokens": 5}', "leaves no room"),
], ids=["garbage", "not-an-object", "missing-field", "negative-time", "fractional-tokens",
        "boolean-tokens", "bad-group", "too-long"])
def test_a_malformed_trace_line_is_named(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_trace([line], fmt="jsonl")
