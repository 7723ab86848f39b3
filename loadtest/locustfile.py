"""Locust load test: streaming chat users drawing requests from kvgate's workload generators.

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 [--workload chat]
           [--model llama-3-8b] [--seed 0] [--think-scale 1.0] [--max-context 8192]

(`python -m loadtest.run_locust` runs it headless against `kvgate demo`, bounded in time.)

Each user owns one stream of `loadtest.workloads.SessionSource` (stream = the user's number), so
users never send the same unique text while groups' documents and system prompts are shared, as
in the offline simulation. A session's requests are sent in order, each after the think time the
workload gives it (times --think-scale; 0 sends them back to back). Requests stream
(`stream: true`, with usage) and ask for exactly the workload's output length (`max_tokens` =
output tokens with vLLM's `ignore_eos`, which the simulator honours).

Locust's own timer for the "chat" request stops at the response headers, so each response also
reports, as request types of their own:
- TTFT: request sent -> first content token;
- TPOT: (last content token - first) / (tokens - 1), once per reply of two tokens or more
  (tokens from the reply's usage, else its content chunks);
- ITL: every gap between consecutive content chunks.
A reply fails (and counts as a "chat" failure) on a non-200 status, an SSE error event, a stream
that ends without `data: [DONE]`, or no content at all.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from locust import HttpUser, events, task
from locust.env import Environment

from loadtest.workloads import WORKLOADS, Limits, SessionSource, WorkItem, workload

_user_numbers = itertools.count()  # streams of one locust process, one per user


def _arguments(parser: Any, **_: Any) -> None:
    parser.add_argument("--workload", default="chat", choices=WORKLOADS,
                        help="kvgate workload the users draw from")
    parser.add_argument("--model", default="llama-3-8b", help="model to request")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--think-scale", type=float, default=1.0,
                        help="multiply the workload's think times (0: back to back)")
    parser.add_argument("--max-context", type=int, default=8192,
                        help="the served model's context length (prompt + max_tokens)")
    parser.add_argument("--summary-json", default="",
                        help="at exit, write every request type's final figures here as JSON")


PERCENTILES = (0.5, 0.9, 0.99)


def _write_summary(environment: Environment, **_: Any) -> None:
    """The final figures (after the stop timeout), by request type: what run_locust reports."""
    path = environment.parsed_options.summary_json if environment.parsed_options else ""
    if not path:
        return
    out = {}
    for (name, method), entry in sorted(environment.stats.entries.items()):
        out[f"{method} {name}"] = {
            "count": entry.num_requests, "failures": entry.num_failures,
            "mean_ms": entry.avg_response_time,
            **{f"p{round(q * 100)}_ms": entry.get_response_time_percentile(q)
               for q in PERCENTILES},
        }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, sort_keys=True)


_hooks: Any = events  # locust's event hooks are untyped
_hooks.init_command_line_parser.add_listener(_arguments)
_hooks.quitting.add_listener(_write_summary)


def _report(env: Environment, kind: str, seconds: float) -> None:
    fire: Any = env.events.request.fire
    fire(request_type=kind, name="chat", response_time=seconds * 1000.0,
                            response_length=0, exception=None, context={})


class ChatUser(HttpUser):
    """One client that runs workload sessions one after another."""

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.model: str = options.model
        self.think_scale: float = options.think_scale
        spec = workload(options.workload, limits=Limits(max_context=options.max_context))
        self.source = SessionSource(spec, seed=options.seed, stream=next(_user_numbers) % 10_000)

    @task
    def session(self) -> None:
        previous = 0.0
        for item in self.source.next_session():
            wait = (item.arrival_s - previous) * self.think_scale
            previous = item.arrival_s
            if wait > 0:
                time.sleep(wait)  # cooperative: locust has monkey-patched time.sleep
            self.chat(item)

    def chat(self, item: WorkItem) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": role, "content": content} for role, content in item.messages()],
            "max_tokens": item.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if item.conversation is not None:
            body["user"] = item.conversation  # the session a gateway may keep affinity for
        started = time.perf_counter()
        with self.client.post("/v1/chat/completions", json=body, stream=True, name="chat",
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            error = self._consume(resp, started)
            if error is not None:
                resp.failure(error)
            else:
                resp.success()

    def _consume(self, resp: Any, started: float) -> str | None:
        """Reads the SSE stream, reporting TTFT, ITL and TPOT; the failure, if any."""
        env = self.environment
        first = last = None
        chunks = 0
        usage_tokens: int | None = None
        done = False
        for raw in resp.iter_lines():
            if not raw or not raw.startswith(b"data: "):
                continue
            data = raw[6:]
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return f"stream error: {chunk['error'].get('message', chunk['error'])}"
            usage = chunk.get("usage")
            if usage:
                usage_tokens = usage.get("completion_tokens")
            choices = chunk.get("choices") or []
            if not choices or not (choices[0].get("delta") or {}).get("content"):
                continue
            now = time.perf_counter()
            if first is None:
                first = now
                _report(env, "TTFT", now - started)
            else:
                assert last is not None
                _report(env, "ITL", now - last)
            last = now
            chunks += 1
        if not done:
            return "the stream ended without data: [DONE]"
        if first is None or last is None:
            return "the reply had no content"
        tokens = usage_tokens or chunks  # a chunk may carry several tokens; usage counts them
        if tokens > 1:
            _report(env, "TPOT", (last - first) / (tokens - 1))
        return None
