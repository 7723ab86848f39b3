"""The data producer: one request's per-candidate facts, computed once per cycle before
admission and the router read them.

For every candidate: the prefix blocks it likely holds (routing/prefix.py `PrefixIndex`), the
prompt tokens it would have to prefill, the TTFT prediction and its parts (routing/predict.py:
KV fit, preemption risk, TPOT before and after, prefill load), the committed peak blocks the
request would add there (its uncached prompt plus its expected reply; cached prefix blocks are
shared with whoever cached them) and whether the backend's speed has been read yet. The
backend's side of the prediction is reused while its state is unchanged
(routing/scheduling/backends.py). Pure apart from that cache.
"""

from __future__ import annotations

from typing import NamedTuple

from routing.cost import RequestCost
from routing.predict import backend_load, predict_on, request_terms
from routing.prefix import PrefixChain, PrefixIndex
from routing.scheduling.backends import BackendModels
from routing.state import Candidate
from routing.ttft import DEFAULT_BLOCK_SIZE, Prediction


class Facts(NamedTuple):
    """Lists are aligned with `candidates`; mappings are keyed by backend id."""

    candidates: list[Candidate]
    preds: list[Prediction]
    predictions: dict[str, Prediction]
    matched: dict[str, int]
    commits: list[int]
    uncached: list[int]
    calibrated: list[bool]
    block_sizes: list[int]
    capacities: list[int | None]


def block_size(candidate: Candidate) -> int:
    """The backend's KV block size in tokens (1 for a token budget such as TGI's)."""
    snap = candidate.snapshot
    if snap is not None and snap.block_size:
        return snap.block_size
    if (snap is None or not snap.kv_total_blocks) and candidate.spec.max_batch_total_tokens:
        return 1
    return DEFAULT_BLOCK_SIZE


def capacity(candidate: Candidate) -> int | None:
    """KV capacity in the backend's blocks (a TGI token budget in tokens); None if unknown."""
    snap = candidate.snapshot
    if snap is not None and snap.kv_total_blocks:
        return snap.kv_total_blocks
    return candidate.spec.max_batch_total_tokens


class FactsProducer:
    def __init__(self, models: BackendModels, prefix: PrefixIndex, *, high_water: float) -> None:
        self._models = models
        self._prefix = prefix
        self._high_water = high_water

    def produce(self, candidates: list[Candidate], cost: RequestCost, chain: PrefixChain,
                now: float) -> Facts:
        models = self._models
        states = models.states
        high_water = self._high_water
        matched = self._prefix.matches(chain) if chain.blocks else {}
        typical, mean_all = cost.typical_prompt_tokens, cost.mean_output_all
        terms = request_terms(cost)
        prompt_tokens, peak = terms.prompt_tokens, terms.peak_tokens
        block_chars, per_char = chain.block_chars, cost.tokens_per_char
        preds: list[Prediction] = []
        predictions: dict[str, Prediction] = {}
        commits: list[int] = []
        uncached: list[int] = []
        calibrated: list[bool] = []
        block_sizes: list[int] = []
        capacities: list[int | None] = []
        for c in candidates:
            cid = c.spec.id
            depth = matched.get(cid, 0)
            # RequestCost.prefix_tokens of the first `depth` blocks, inlined.
            cached = min(prompt_tokens, int(depth * block_chars * per_char)) if depth else 0
            st = states.get(cid) or models.state(cid)
            load = st.load
            if (load is None or st.load_candidate is not c or st.load_profile is not st.profile
                    or st.load_version != st.work.version or st.load_now != now
                    or st.load_typical != typical or st.load_mean_all != mean_all):
                load = st.load = backend_load(c, st.profile, st.work, now, typical, mean_all)
                st.load_candidate, st.load_profile, st.load_version = c, st.profile, st.work.version
                st.load_now, st.load_typical, st.load_mean_all = now, typical, mean_all
            pred = predict_on(load, terms, cached, high_water=high_water)
            preds.append(pred)
            predictions[cid] = pred
            uncached.append(prompt_tokens - cached if prompt_tokens > cached else 0)
            snap = c.snapshot
            if snap is not None and snap.kv_total_blocks:
                size = snap.block_size or DEFAULT_BLOCK_SIZE
                capacities.append(snap.kv_total_blocks)
            else:
                size = block_size(c)
                capacities.append(c.spec.max_batch_total_tokens)
            block_sizes.append(size)
            commits.append(-(-(peak - cached) // size))
            calibrated.append(st.calibrated)
        return Facts(candidates, preds, predictions, matched, commits, uncached, calibrated,
                     block_sizes, capacities)
