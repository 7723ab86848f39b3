"""A vLLM-V1-like inference engine over simulated time: continuous batching on a paged KV cache.

One `step()` is one scheduler iteration, after vLLM V1's `Scheduler.schedule`:

1. Running sequences first, in admission order. Each gets all its uncomputed tokens (one for a
   decode, the rest of its prompt for a chunked prefill), capped by the step's token budget
   (`max_num_batched_tokens`). A sequence that needs a block when none is free preempts the newest
   running sequence (possibly itself), by recompute: its blocks are freed and it goes back to the
   front of the waiting queue, keeping the tokens it already emitted.
2. Then, only if nothing was preempted in this step, waiting requests in arrival order while the
   budget lasts and fewer than `max_num_seqs` run: a request's cached prefix (full blocks found by
   hash, at most up to its second-to-last token so that one token is always computed) is skipped,
   and it is admitted only if blocks for its first chunk are free; the first that does not fit
   stops admission (first come, first served).
3. The step takes the time `Derived.step_time` gives for its prefill and decode work. A sequence
   whose computed tokens reach all its known tokens samples one new token at the end of the step:
   the first output token ends the step that completes the prefill; a recomputed sequence resumes
   with its next token. A request ends at `max_tokens`, or at its natural length unless
   `ignore_eos`; its blocks go back to the pool, still findable by hash.

Prefix-cache counters (`prefix_queries_tokens`, `prefix_hits_tokens`) count each request once, at
its first admission, as vLLM's main prefix-cache metrics do; recomputations after a preemption are
not counted. Generated tokens are synthetic (a pure function of the prompt and the position), so
blocks that fill during decode are hashed too and a recomputation can hit them.

Decoding sequences advance in bulk (see `Engine`): a step costs time in proportion to the
sequences that prefill, cross a block boundary, finish or are preempted in it, not to the batch.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from types import MappingProxyType
from typing import NamedTuple

from loadtest.sim.kvcache import BlockPool, chain_hashes
from routing.physics import Derived, Preset, attention_pairs, derive


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    prompt: tuple[int, ...]  # token ids (tokens.tokenize of the rendered prompt)
    max_tokens: int  # hard cap on output tokens (>= 1)
    natural_len: int  # the length at which the model would stop by itself (EOS)
    ignore_eos: bool = False  # when True, output is exactly max_tokens
    # Separates prefix caches that must not be shared: LoRA adapter, vLLM's cache_salt.
    extra_key: str = ""


class TokenEvent(NamedTuple):
    """One output token. A named tuple, not a frozen dataclass: one is made per token on the
    engine's hottest path, and a tuple is built about three times faster."""

    request_id: str
    token_index: int  # 0 for the first output token
    finish_reason: str | None  # None while running; "stop" | "length" on the last token
    num_cached_tokens: int  # prompt tokens served from prefix cache at the request's admission


class StepResult(NamedTuple):
    """One step's outcome. A named tuple like `TokenEvent`: one is made per step."""

    duration: float  # seconds this step takes on the simulated GPU (not scaled)
    events: tuple[TokenEvent, ...]  # tokens produced at the END of this step
    num_prefill_tokens: int
    num_decode_seqs: int
    preempted: tuple[str, ...]  # request ids preempted in this step


class EngineStats(NamedTuple):
    """The engine's counters, as its /metrics reports them. A named tuple: the fleet simulation
    reads one per scrape of every backend."""

    running: int
    waiting: int
    num_gpu_blocks: int
    block_size: int
    free_blocks: int  # blocks a new request could get without preempting (cached-free included)
    used_blocks: int  # free + used == num_gpu_blocks (the reserved null block counts as used)
    kv_usage: float  # vLLM V1: 1 - free_blocks / (num_gpu_blocks - 1)
    preemptions_total: int
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    prompt_tokens_total: int
    generation_tokens_total: int
    finished: Mapping[str, int]  # by reason: "stop", "length", "abort"


class RunningSeq(NamedTuple):
    """One running sequence as a server reports it (`Engine.running_sequences`)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int  # prompt tokens found in the prefix cache at its first admission
    context_tokens: int  # tokens whose KV it holds (computed so far: llama.cpp's n_past)
    decoded: int  # output tokens sampled so far


def root_key(extra_key: str = "") -> int:
    """The parent hash of a sequence's first block: its cache-separating key (adapter, salt)."""
    return hash((zlib.crc32(extra_key.encode()), 0x6B76))


class _Seq:
    """The engine's mutable state of one request.

    While `decoding` (see `Engine`), `num_computed`, `num_tokens` and `num_output` hold their
    values as of step `tick0`; each step since has added one to all three."""

    __slots__ = ("request_id", "prompt", "prompt_len", "target", "final_reason", "num_output",
                 "num_tokens", "num_computed", "num_scheduled", "blocks", "hashes",
                 "num_registered", "num_cached_tokens", "root", "admitted", "done",
                 "order", "decoding", "tick0", "phase", "finish_tick")

    def __init__(self, request: SimRequest) -> None:
        self.request_id = request.request_id
        self.prompt = request.prompt
        self.prompt_len = len(request.prompt)
        if request.ignore_eos or request.natural_len > request.max_tokens:
            self.target, self.final_reason = request.max_tokens, "length"
        else:
            self.target, self.final_reason = request.natural_len, "stop"
        self.num_output = 0
        self.num_tokens = self.prompt_len  # known tokens: prompt + output
        self.num_computed = 0  # tokens whose KV is in `blocks`
        self.num_scheduled = 0  # tokens computed in the current step
        self.blocks: list[int] = []
        self.hashes: list[int] = []  # hash chain of full blocks of known tokens, computed lazily
        self.num_registered = 0  # leading blocks registered in the prefix cache
        self.num_cached_tokens = 0
        self.root = root_key(request.extra_key)
        self.admitted = False  # admitted at least once (prefix counters count only the first)
        self.done = False
        self.order = 0  # admission number: running order is ascending order
        self.decoding = False  # advanced in bulk (Engine docstring)
        self.tick0 = 0  # while decoding: the step its counters are as of
        self.phase = 0  # while decoding: (num_computed - tick0) mod block size
        self.finish_tick = 0  # while decoding: the step that samples its last token

    def extend_hashes(self, num_blocks: int, block_size: int) -> None:
        """Make `hashes` cover the first `num_blocks` full blocks of the known tokens.

        Output tokens are synthetic, a pure function of the root, the prompt and their position.
        So a block holding some is hashed, once rather than token by token, from its parent (which
        identifies the root and every prompt token before the block), the prompt tokens in it and
        the position of its first output token: the same request recomputed after a preemption
        hashes to the same blocks, and two requests share such a block exactly when all its tokens
        and all before it agree, as with token-by-token ids.
        """
        hashes = self.hashes
        have = len(hashes)
        if have >= num_blocks:
            return
        start, end, prompt_len = have * block_size, num_blocks * block_size, self.prompt_len
        parent = hashes[-1] if have else self.root
        full_prompt = prompt_len - prompt_len % block_size
        prompt_end = min(end, full_prompt)  # full prompt blocks
        if start < prompt_end:
            # All the prompt's full blocks (the usual case) need no copy: chain_hashes drops the
            # partial last block itself.
            tokens = self.prompt if start == 0 and prompt_end == full_prompt else (
                self.prompt[start:prompt_end])
            hashes.extend(chain_hashes(parent, tokens, block_size))
            parent, start = hashes[-1], prompt_end
        if start >= end:
            return
        prompt = self.prompt
        for at in range(start, end, block_size):
            if at < prompt_len:  # the prompt ends inside this block (a tuple of under a block)
                parent = hash((parent, prompt[at:prompt_len]))
            else:  # output only: the position of its first token (an int, never a tuple)
                parent = hash((parent, at - prompt_len))
            hashes.append(parent)


class Engine:
    """The scheduler of the module docstring.

    Bulk decoding: a running sequence whose computed tokens are all its known tokens but the last
    (its latest output) needs exactly one token per step; such a *decoding* sequence is not visited
    at every step. It always runs before every sequence still prefilling (those are the newest: a
    prefill that does not fit the step's budget ends admission), so while the decoding sequences
    fit in the token budget, every step schedules each of them once. Their counters advance
    implicitly (`_Seq.tick0`), and a step touches only those that cross a block boundary (a new
    block before the step, registering the filled one after it; bucketed by phase), finish, or
    are preempted. When that ordering or the budget does not hold, every sequence is
    materialised and the step runs one sequence at a time; the outcome is the same either way.
    The buckets (by phase, by finishing step) hold their sequences in running order with no
    sorting: a sequence starts decoding at the end of a step in which every decoding sequence was
    older than every other running one (or none was left decoding), so it is newer than every
    sequence already in a bucket, and those that start together do so in running order.

    `every_token=False` makes `StepResult.events` carry only each request's first and last
    tokens (the fleet simulation needs no others), so steps cost nothing per decoding sequence.
    """

    def __init__(self, preset: Preset, *, num_gpu_blocks: int | None = None,
                 enable_prefix_caching: bool = True, every_token: bool = True) -> None:
        self.preset = preset
        self.derived: Derived = derive(preset)
        self.num_gpu_blocks = num_gpu_blocks if num_gpu_blocks is not None else (
            self.derived.num_gpu_blocks)
        self.block_size = preset.block_size
        self._pool = BlockPool(self.num_gpu_blocks, enable_caching=enable_prefix_caching)
        self._caching = enable_prefix_caching
        self._every_token = every_token
        self._running: dict[_Seq, None] = {}  # in running (admission) order
        self._plain: list[_Seq] = []  # the running sequences not decoding, in running order
        self._waiting: deque[_Seq] = deque()
        self._requests: dict[str, _Seq] = {}
        self._order = 0
        self._tick = 0  # steps that scheduled anything
        self._by_phase: list[dict[_Seq, None]] = [{} for _ in range(self.block_size)]
        self._finish_at: dict[int, dict[_Seq, None]] = {}  # decoding sequences by finish_tick
        self._ctx_base = 0  # sum over decoding sequences of num_tokens - tick0
        self._preemptions = 0
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished = {"stop": 0, "length": 0, "abort": 0}

    def add(self, request: SimRequest) -> None:
        """Queue a request; ValueError if it is malformed or can never run here."""
        prompt_len = len(request.prompt)
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if prompt_len < 1 or request.max_tokens < 1 or request.natural_len < 1:
            raise ValueError("a request needs a prompt, max_tokens >= 1 and natural_len >= 1")
        if prompt_len + request.max_tokens > self.preset.max_model_len:
            raise ValueError(
                f"prompt ({prompt_len} tokens) + max_tokens ({request.max_tokens}) exceeds the "
                f"maximum context length of {self.preset.max_model_len} tokens")
        # The last output token is sampled, never fed back, so its KV is never stored.
        blocks = -(-(prompt_len + request.max_tokens - 1) // self.block_size)
        if blocks > self.num_gpu_blocks - 1:
            raise ValueError(
                f"prompt ({prompt_len} tokens) + max_tokens ({request.max_tokens}) needs {blocks} "
                f"KV blocks; the whole cache has {self.num_gpu_blocks - 1}")
        seq = _Seq(request)
        self._requests[request.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a queued or running request and free its blocks; False if it is not here."""
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return False
        if seq in self._running:
            if seq.decoding:
                self._undecode(seq)
            else:
                self._plain.remove(seq)
            del self._running[seq]
            self._release(seq)
        else:
            self._waiting.remove(seq)
        seq.done = True
        self._finished["abort"] += 1
        return True

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def _release(self, seq: _Seq) -> None:
        self._pool.free(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_registered = 0

    # Bulk decoding's bookkeeping.

    def _decode(self, seq: _Seq) -> None:
        """`seq` sampled a token in the step just taken and runs on: it decodes from now on."""
        tick = self._tick
        seq.decoding = True
        seq.tick0 = tick
        seq.phase = (seq.num_computed - tick) % self.block_size
        self._by_phase[seq.phase][seq] = None
        seq.finish_tick = tick + seq.target - 1 - seq.num_output
        self._finish_at.setdefault(seq.finish_tick, {})[seq] = None
        self._ctx_base += seq.num_tokens - tick

    def _drop_decoding(self, seq: _Seq) -> None:
        seq.decoding = False
        self._ctx_base -= seq.num_tokens - seq.tick0
        del self._by_phase[seq.phase][seq]
        finishing = self._finish_at[seq.finish_tick]
        del finishing[seq]
        if not finishing:
            del self._finish_at[seq.finish_tick]

    def _undecode(self, seq: _Seq) -> None:
        """Materialise a decoding sequence's counters (as of the current step's start)."""
        self._drop_decoding(seq)
        delta = self._tick - seq.tick0
        seq.num_computed += delta
        seq.num_tokens += delta
        seq.num_output += delta

    def _decoders_run_first(self) -> bool:
        """Every sequence still prefilling is newer than every decoding one."""
        return not any(s.decoding for s in islice(reversed(self._running), len(self._plain)))

    def _preempt_newest(self, preempted: list[str]) -> _Seq:
        victim = self._running.popitem()[0]
        if victim.decoding:
            self._undecode(victim)
        else:
            self._plain.pop()  # the newest running sequence is the newest plain one
        self._release(victim)
        self._waiting.appendleft(victim)
        self._preemptions += 1
        preempted.append(victim.request_id)
        return victim

    # The step.

    def step(self) -> StepResult:
        pool, bs = self._pool, self.block_size
        budget = self.preset.max_num_batched_tokens
        running = self._running
        preempted: list[str] = []
        decoders = len(running) - len(self._plain)
        if decoders and (decoders > budget or self._plain and not self._decoders_run_first()):
            for seq in running:
                if seq.decoding:
                    self._undecode(seq)
            self._plain = list(running)
            decoders = 0
        if decoders:
            # Decoding sequences at a block boundary need a block, in running order.
            for seq in list(self._by_phase[-self._tick % bs]):  # preemption edits it
                if not seq.decoding:
                    continue  # preempted in this loop
                victim = None
                while pool.num_free < 1 and victim is not seq:
                    victim = self._preempt_newest(preempted)
                if victim is seq:
                    break  # it preempted itself, and it was the last running sequence
                seq.blocks.append(pool.allocate_one())
            decoders = len(running) - len(self._plain)
            budget -= decoders

        plain = self._plain
        scheduled: list[_Seq] = []
        i = 0
        while i < len(plain) and budget > 0:
            seq = plain[i]
            computed = seq.num_computed
            n = seq.num_tokens - computed
            if n > budget:
                n = budget
            if computed + n > len(seq.blocks) * bs:
                need = (computed + n + bs - 1) // bs - len(seq.blocks)
                victim = None
                while need > pool.num_free and victim is not seq:
                    victim = self._preempt_newest(preempted)  # plain[i:] are not scheduled yet
                if victim is seq:
                    break  # it preempted itself, and it was the last running sequence
                if need == 1:
                    seq.blocks.append(pool.allocate_one())
                else:
                    seq.blocks.extend(pool.allocate(need))
            seq.num_scheduled = n
            scheduled.append(seq)
            budget -= n
            i += 1

        if not preempted:
            self._admit_waiting(scheduled, budget)
        return self._finish_step(decoders, scheduled, tuple(preempted))

    def _admit_waiting(self, scheduled: list[_Seq], budget: int) -> None:
        pool, bs, waiting, running = self._pool, self.block_size, self._waiting, self._running
        max_seqs = self.preset.max_num_seqs
        while waiting and budget > 0 and len(running) < max_seqs:
            seq = waiting[0]
            num_tokens = seq.num_tokens
            hit: list[int] = []
            if self._caching:
                max_hit_blocks = (num_tokens - 1) // bs
                seq.extend_hashes(max_hit_blocks, bs)
                hit = pool.lookup(seq.hashes[:max_hit_blocks])
            num_cached = len(hit) * bs
            n = min(num_tokens - num_cached, budget)
            need = -(-(num_cached + n) // bs) - len(hit)
            if need > pool.num_free - pool.num_evictable(hit):
                break
            waiting.popleft()
            pool.touch(hit)
            seq.blocks = hit + pool.allocate(need)
            seq.num_computed = num_cached
            seq.num_registered = len(hit)
            if not seq.admitted:
                seq.admitted = True
                seq.num_cached_tokens = num_cached
                if self._caching:
                    self._prefix_queries += num_tokens
                    self._prefix_hits += num_cached
            self._order += 1
            seq.order = self._order
            running[seq] = None
            self._plain.append(seq)
            seq.num_scheduled = n
            scheduled.append(seq)
            budget -= n

    def _finish_step(self, decoders: int, scheduled: list[_Seq], preempted: tuple[str, ...]
                     ) -> StepResult:
        if not scheduled and not decoders:
            return StepResult(0.0, (), 0, 0, preempted)
        pool, bs, caching, tick = self._pool, self.block_size, self._caching, self._tick
        every_token = self._every_token
        events: list[TokenEvent] = []
        decode_seqs, decode_ctx = decoders, self._ctx_base + decoders * tick
        if decoders:
            if every_token:
                for seq in self._running:  # the decoding sequences come first
                    if not seq.decoding:
                        break
                    index = seq.num_output + tick - seq.tick0
                    events.append(TokenEvent(
                        seq.request_id, index, seq.final_reason if index + 1 == seq.target
                        else None, seq.num_cached_tokens))
            if caching:  # blocks this step fills, in running order (the first hash wins)
                register = pool.register
                for seq in self._by_phase[(-tick - 1) % bs]:
                    full = (seq.num_computed + tick - seq.tick0 + 1) // bs
                    hashes = seq.hashes
                    at = (full - 1) * bs
                    if len(hashes) == seq.num_registered == full - 1 and at >= seq.prompt_len:
                        # The usual case, inline: one output-only block (`extend_hashes`).
                        hashes.append(hash((hashes[-1], at - seq.prompt_len)))
                        register(seq.blocks[full - 1], hashes[-1])
                    else:
                        seq.extend_hashes(full, bs)
                        pool.register_range(seq.blocks, hashes, seq.num_registered, full)
                    seq.num_registered = full
            finishing = self._finish_at.get(tick)
            if finishing:
                for seq in list(finishing):  # ending edits it
                    self._undecode(seq)  # as of this step's start; then this step's token
                    seq.num_computed += 1
                    seq.num_tokens += 1
                    seq.num_output += 1
                    self._end(seq)
                    if not every_token:
                        events.append(TokenEvent(seq.request_id, seq.target - 1,
                                                 seq.final_reason, seq.num_cached_tokens))
            self._generation_tokens += decoders

        prefill_tokens = prefill_pairs = emitted = 0
        runs_on: list[_Seq] = []
        for seq in scheduled:
            n = seq.num_scheduled
            computed = seq.num_computed
            known = seq.num_tokens
            if n == 1 and computed == known - 1 and seq.num_output:
                decode_seqs += 1
                decode_ctx += known
            else:
                prefill_tokens += n
                prefill_pairs += attention_pairs(computed, n)
            computed += n
            seq.num_computed = computed
            if caching and computed >= (seq.num_registered + 1) * bs:
                full = computed // bs
                seq.extend_hashes(full, bs)
                pool.register_range(seq.blocks, seq.hashes, seq.num_registered, full)
                seq.num_registered = full
            if computed != known:
                continue  # a prefill chunk that does not finish the prompt yet
            index = seq.num_output
            seq.num_output = index + 1
            seq.num_tokens = known + 1
            emitted += 1
            if index == 0:
                self._prompt_tokens += seq.prompt_len
            if index + 1 == seq.target:
                self._end(seq)
                events.append(TokenEvent(seq.request_id, index, seq.final_reason,
                                         seq.num_cached_tokens))
            else:
                runs_on.append(seq)
                if every_token or index == 0:
                    events.append(TokenEvent(seq.request_id, index, None, seq.num_cached_tokens))
        self._generation_tokens += emitted
        self._tick = tick + 1
        if emitted:
            for seq in runs_on:
                self._decode(seq)
            self._plain = [s for s in self._plain if not (s.decoding or s.done)]
        duration = self.derived.step_time(prefill_tokens, prefill_pairs, decode_seqs, decode_ctx)
        return StepResult(duration, tuple(events), prefill_tokens, decode_seqs, preempted)

    def _end(self, seq: _Seq) -> None:
        """`seq` sampled its last token: its blocks go back to the pool (still findable)."""
        self._finished[seq.final_reason] += 1
        seq.done = True
        self._pool.free(seq.blocks)
        seq.blocks = []
        del self._requests[seq.request_id]
        del self._running[seq]

    def stats(self) -> EngineStats:
        pool = self._pool
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.block_size,
            free_blocks=pool.num_free,
            used_blocks=pool.num_used,
            kv_usage=pool.usage(),
            preemptions_total=self._preemptions,
            prefix_queries_tokens=self._prefix_queries,
            prefix_hits_tokens=self._prefix_hits,
            prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._generation_tokens,
            finished=MappingProxyType(dict(self._finished)),
        )

    def cached_prefix_tokens(self, hashes: list[int]) -> int:
        """Tokens of a prompt the prefix cache holds now, given the prompt's block hash chain
        (`chain_hashes(root_key(...), prompt, block_size)`, all but a last token's block, as
        admission looks it up). Reads the cache, changes nothing."""
        return len(self._pool.lookup(hashes)) * self.block_size

    def running_sequences(self) -> list[RunningSeq]:
        """The running sequences in admission order, with their counters as of now (a decoding
        sequence's hold their values as of step `tick0`; every step since added one)."""
        out: list[RunningSeq] = []
        for seq in self._running:
            ahead = self._tick - seq.tick0 if seq.decoding else 0
            out.append(RunningSeq(seq.request_id, seq.prompt_len, seq.num_cached_tokens,
                                  seq.num_computed + ahead, seq.num_output + ahead))
        return out

    def invariant_violations(self) -> list[str]:
        """Problems with the engine's bookkeeping, for tests: empty when all is consistent."""
        problems = self._pool.invariant_violations()
        refs = [0] * self.num_gpu_blocks
        for seq in self._running:
            for b in seq.blocks:
                refs[b] += 1
            computed = seq.num_computed + (self._tick - seq.tick0 if seq.decoding else 0)
            if len(seq.blocks) * self.block_size < computed:
                problems.append(f"{seq.request_id}: {computed} computed tokens do not fit "
                                f"in {len(seq.blocks)} blocks")
        plain = [s for s in self._running if not s.decoding]
        if plain != self._plain:
            problems.append("the plain sequences are not the running ones not decoding")
        decoding = {s for s in self._running if s.decoding}
        if decoding != {s for bucket in self._by_phase for s in bucket} or decoding != {
                s for finishing in self._finish_at.values() for s in finishing}:
            problems.append("the decoding sequences' buckets do not match the running ones")
        for bucket in (*self._by_phase, *self._finish_at.values()):
            orders = [s.order for s in bucket]
            if orders != sorted(orders):
                problems.append("a decoding sequences' bucket is out of running order")
        for seq in self._waiting:
            if seq.blocks or seq.num_computed:
                problems.append(f"{seq.request_id}: waiting but holds blocks")
        for b in range(1, self.num_gpu_blocks):
            if refs[b] != self._pool.ref_cnt[b]:
                problems.append(f"block {b}: {refs[b]} holders but ref_cnt {self._pool.ref_cnt[b]}")
        if len(self._running) > self.preset.max_num_seqs:
            problems.append(f"{len(self._running)} running > max_num_seqs")
        return problems
