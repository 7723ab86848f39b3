"""The data producer: one request's per-candidate facts, computed once per cycle before
admission and the router read them.

For every candidate: the prefix blocks it likely holds (routing/prefix.py `PrefixIndex`), the
prompt tokens it would have to prefill, the TTFT prediction and its parts (routing/predict.py:
KV fit, preemption risk, TPOT before and after, prefill load), the committed peak blocks the
request would add there (its uncached prompt plus its reply at the reservation quantile, as its
lease reserves it alone; admission adds it to the backend's pooled commitments, routing/kv_hold.py;
cached prefix blocks are shared with whoever cached them) and whether the
backend's speed has been read yet. A backend whose metrics are stale or missing is predicted as
its ledger reads it (routing/scheduling/ledger_view.py: what the gateway sent there, plus a
penalty, on its own or its smallest peer's KV capacity). The backend's side of the prediction is
reused while its state is unchanged (routing/scheduling/backends.py). Pure apart from that cache.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from routing.cost import RequestCost
from routing.predict import backend_load, predict_on, request_terms
from routing.prefix import PrefixChain, PrefixIndex
from routing.scheduling.backends import BackendModels
from routing.scheduling.ledger_view import ledger_load, peer_capacity_tokens
from routing.state import Candidate
from routing.ttft import Prediction


class Facts(NamedTuple):
    """Lists are aligned with `candidates`; mappings are keyed by backend id."""

    candidates: list[Candidate]
    preds: list[Prediction]
    predictions: dict[str, Prediction]
    matched: dict[str, int]
    commits: list[int]
    calibrated: list[bool]
    capacities: list[int | None]


def cached_tokens(cost: RequestCost, chain: PrefixChain, matched_blocks: int) -> int:
    """The prompt's tokens a backend holding its first `matched_blocks` chain blocks has cached."""
    return cost.prefix_tokens(chain.chars(matched_blocks)) if matched_blocks else 0


class FactsProducer:
    def __init__(self, models: BackendModels, prefix: PrefixIndex, *, high_water: float) -> None:
        self._models = models
        self._prefix = prefix
        self._high_water = high_water
        # The model's typical prompt and mean reply the cached loads were computed with, and
        # their generation: bumped whenever they change, which drops every cached load.
        self._figures = (math.nan, math.nan)
        self._generation = 0

    def produce(self, candidates: list[Candidate], cost: RequestCost, chain: PrefixChain,
                now: float) -> Facts:
        models = self._models
        states = models.states
        high_water = self._high_water
        matched = self._prefix.matches(chain) if chain.blocks else {}
        typical, mean_all = cost.typical_prompt_tokens, cost.mean_output_all
        if (typical, mean_all) != self._figures:
            self._figures = (typical, mean_all)
            self._generation += 1
        generation = self._generation
        terms = request_terms(cost)
        prompt_tokens, peak = terms.prompt_tokens, terms.peak_tokens
        block_chars, per_char = chain.block_chars, cost.tokens_per_char
        preds: list[Prediction] = []
        predictions: dict[str, Prediction] = {}
        commits: list[int] = []
        calibrated: list[bool] = []
        capacities: list[int | None] = []
        peer_cap: int | None = None
        peer_known = False  # peer_cap computed: only once a stale candidate needs it
        for c in candidates:
            cid = c.spec.id
            depth = matched.get(cid, 0)
            # cached_tokens, inlined.
            cached = min(prompt_tokens, int(depth * block_chars * per_char)) if depth else 0
            st = states.get(cid) or models.state(cid)
            load = st.load
            stale = c.stale
            if stale:
                if not peer_known:
                    peer_cap, peer_known = peer_capacity_tokens(candidates), True
                if st.load_peers != peer_cap:
                    load = None
            if (load is None or st.load_candidate is not c or st.load_version != st.work.version
                    or st.load_now != now or st.load_figures != generation):
                if stale:
                    load = ledger_load(c, st.profile, st.work, now, typical, mean_all, peer_cap)
                    st.load_peers = peer_cap
                else:
                    load = backend_load(c, st.profile, st.work, now, typical, mean_all)
                st.load = load
                st.load_candidate, st.load_version = c, st.work.version
                st.load_now, st.load_figures = now, generation
            pred = predict_on(load, terms, cached, high_water)
            preds.append(pred)
            predictions[cid] = pred
            capacities.append(load.capacity)
            commits.append(-(-(peak - cached) // load.lease_block_size))
            calibrated.append(st.calibrated)
        return Facts(candidates, preds, predictions, matched, commits, calibrated, capacities)
