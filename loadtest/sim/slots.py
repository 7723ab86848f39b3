"""llama.cpp's `GET /slots` over the simulated engine, for `kvgate sim --metrics-format llamacpp`.

The mapping, as if llama-server ran with the engine's figures:
- Slots: the engine's `max_num_seqs`, llama-server's `-np` (parallel sequences): in both, at most
  that many sequences run at once.
- `n_ctx` of each slot: the KV capacity in tokens, `(num_gpu_blocks - 1) * block_size` (the
  null block holds nothing), divided evenly between the slots and rounded down, as llama-server
  splits its context (`-c`) between its slots.
- A running sequence holds one slot (`is_processing: true`) from its admission until it ends, is
  aborted or is preempted. It keeps the same slot from one answer to the next (`SlotTable`); a
  newly admitted one takes the lowest free id.
- `n_past`: the tokens whose KV the sequence holds, prompt and output computed so far. A
  decoding sequence's newest token is computed in the next step: as llama.cpp between two
  decodes, n_past is then `n_prompt_tokens + n_decoded - 1`.
- `n_prompt_tokens`; `n_prompt_tokens_cache`, the prompt tokens found in the prefix cache at the
  sequence's first admission; `next_token[0]`: `n_decoded` (output tokens so far) and
  `n_remain` (`n_predict - n_decoded`); `params`: the request's `n_predict` (its max tokens,
  resolved as the server resolves it) and `stream`.
- An idle slot is written as llama-server writes one that has never run: the engine's freed
  blocks stay in one shared prefix cache, not in a slot.

Where it differs from llama.cpp: the engine's sequences share one paged pool (as vLLM does, or
llama-server with `--kv-unified`), so a sequence may be longer than its slot's share of the
context, which llama-server would refuse; its n_past is written as it is (a reader that caps it
at n_ctx undercounts that sequence). Fields the simulator has no value for (sampling
parameters it ignores, `has_new_line`, `id_task`, timings) are left out, not made up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from loadtest.sim.engine import Engine, RunningSeq

CONTENT_TYPE = "application/json; charset=utf-8"


@dataclass(frozen=True, slots=True)
class RequestParams:
    """What the server knows of a request beyond the engine: its part of a slot's `params`."""

    n_predict: int  # max tokens, as resolved
    stream: bool


class SlotTable:
    """Which slot each running request holds, kept from one /slots answer to the next."""

    def __init__(self, n_slots: int) -> None:
        if n_slots < 1:
            raise ValueError(f"need at least one slot, got {n_slots}")
        self.n_slots = n_slots
        self._slot_of: dict[str, int] = {}

    def assign(self, request_ids: Sequence[str]) -> dict[str, int]:
        """Slot ids of `request_ids` (the running ones now): those seen before keep theirs, the
        others take the lowest free ids in order. ValueError when there are more than slots."""
        if len(request_ids) > self.n_slots:
            raise ValueError(f"{len(request_ids)} running sequences for {self.n_slots} slots")
        current = set(request_ids)
        slot_of = {r: s for r, s in self._slot_of.items() if r in current}
        taken = set(slot_of.values())
        free = (s for s in range(self.n_slots) if s not in taken)
        for request_id in request_ids:
            if request_id not in slot_of:
                slot_of[request_id] = next(free)
        self._slot_of = slot_of
        return dict(slot_of)


def slot_context(engine: Engine, n_slots: int) -> int:
    """Each slot's `n_ctx`: the KV capacity in tokens split evenly between the slots."""
    return (engine.num_gpu_blocks - 1) * engine.block_size // n_slots


def render_slots(running: Sequence[RunningSeq], slot_of: Mapping[str, int], n_slots: int,
                 n_ctx: int, params: Mapping[str, RequestParams]) -> bytes:
    """The /slots JSON array, one object per slot in id order (module docstring). Pure."""
    busy = {slot_of[seq.request_id]: seq for seq in running}
    slots: list[dict[str, Any]] = []
    for slot_id in range(n_slots):
        seq = busy.get(slot_id)
        slot: dict[str, Any] = {"id": slot_id, "n_ctx": n_ctx, "speculative": False,
                                "is_processing": seq is not None,
                                "n_past": 0 if seq is None else seq.context_tokens}
        if seq is not None:
            slot["n_prompt_tokens"] = seq.prompt_tokens
            slot["n_prompt_tokens_cache"] = seq.cached_tokens
            next_token: dict[str, Any] = {"has_next_token": True}
            request = params.get(seq.request_id)
            if request is not None:
                slot["params"] = {"max_tokens": request.n_predict,
                                  "n_predict": request.n_predict, "stream": request.stream}
                next_token["n_remain"] = request.n_predict - seq.decoded
            next_token["n_decoded"] = seq.decoded
            slot["next_token"] = [next_token]
        slots.append(slot)
    return orjson.dumps(slots)


class Slots:
    """The server's /slots: the slot table, and the parameters of the requests in flight
    (`track` when a request is submitted, `untrack` when its handler is done)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = SlotTable(engine.preset.max_num_seqs)
        self.n_ctx = slot_context(engine, self.table.n_slots)
        self.params: dict[str, RequestParams] = {}

    def track(self, request_id: str, params: RequestParams) -> None:
        self.params[request_id] = params

    def untrack(self, request_id: str) -> None:
        self.params.pop(request_id, None)

    def body(self) -> bytes:
        running = self.engine.running_sequences()
        slot_of = self.table.assign([seq.request_id for seq in running])
        return render_slots(running, slot_of, self.table.n_slots, self.n_ctx, self.params)
