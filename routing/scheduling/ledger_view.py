"""A backend whose metrics are stale or missing, as the load-based policies see it: routed by the
gateway's own ledger, preferred less than a fresh backend at equal load, never left idle.

A snapshot that stopped coming long ago is no evidence of what it holds now, but the gateway
knows what it sent there: `Candidate.inflight` requests, holding about `Candidate.reserved_blocks`.
A reading younger than `RECENT_READING_S` still counts as a floor (with what was dispatched since):
other gateways' requests are in it, which this gateway's ledger cannot see. The rule:
a stale backend is read as a fresh backend holding what the ledger says plus
`STALE_EXTRA_REQUESTS` more requests (a typical request's blocks each), of its own KV capacity
when a snapshot or its configuration ever gave one, else of its smallest peer's (the smallest
capacity a candidate reports, so what the ledger sends cannot overfill it unseen). So at equal
load the fresh backend wins, an idle stale backend beats a fresh one holding more than the
extra, and a stale backend is never read as emptier than the gateway's own reservations there
plus the extra. Each load-based policy applies it in
its own terms:
- cost: the prediction is made on `ledger_load` (that reading as a candidate view, the extra
  requests decoding there), so the KV rule, the preemption risk and the TTFT all see it;
- kv_util: `stale_queue_depth` and `stale_kv_free`;
- least_request, power_of_two: `stale_queue_depth` in place of the in-flight count.
Without any capacity to read it by, the KV side stays unknown and the extra requests alone set
it below a fresh backend. Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from routing.backend_work import BackendWork
from routing.predict import BackendLoad, backend_load, lease_block_size
from routing.state import BackendSnapshot, Candidate
from routing.ttft import DEFAULT_BLOCK_SIZE, BackendProfile

# Requests a stale backend is taken to hold beyond what the ledger says.
STALE_EXTRA_REQUESTS = 1
# A stale reading this young still bounds what the backend holds from below (about fifty missed
# scrapes at the default interval); an older one says nothing any more.
RECENT_READING_S = 5.0
LEDGER_FORMAT = "ledger"  # the format of the snapshot `ledger_candidate` makes


def capacity_tokens(candidate: Candidate) -> int | None:
    """The backend's KV capacity in tokens as its snapshot or configuration gives it."""
    snap = candidate.snapshot
    if snap is not None and snap.kv_total_blocks:
        return snap.kv_total_blocks * (snap.block_size or DEFAULT_BLOCK_SIZE)
    return candidate.spec.max_batch_total_tokens


def peer_capacity_tokens(candidates: Sequence[Candidate]) -> int | None:
    """The smallest KV capacity in tokens the candidates report (`capacity_tokens`: a stale
    snapshot's still says how large the backend is); None when none does."""
    sizes = [size for c in candidates if (size := capacity_tokens(c)) is not None]
    return min(sizes) if sizes else None


def request_tokens(typical_prompt: float, mean_output_all: float) -> float:
    """A typical request's KV context in tokens: its prompt and half its reply."""
    return typical_prompt + 0.5 * mean_output_all


def stale_queue_depth(candidate: Candidate) -> float:
    """The requests a stale backend is taken to hold: the ledger's plus the extra."""
    return float(candidate.inflight + STALE_EXTRA_REQUESTS)


def _blocks(tokens: float, block_size: int) -> int:
    return math.ceil(tokens / block_size) if tokens > 0.0 else 0


def stale_kv_free(candidate: Candidate, typical_tokens: int | None,
                  per_request_tokens: float) -> float | None:
    """The free fraction of a stale backend's KV by the ledger (module rule); None when no
    capacity is known for it."""
    block_size = lease_block_size(candidate)
    own = capacity_tokens(candidate)
    total = own if own is not None else typical_tokens
    if not total:
        return None
    total_blocks = total // block_size
    if total_blocks <= 0:
        return 0.0
    used = (candidate.reserved_blocks
            + STALE_EXTRA_REQUESTS * _blocks(per_request_tokens, block_size))
    return max(0.0, 1.0 - used / total_blocks)


def ledger_candidate(candidate: Candidate, typical_tokens: int | None,
                     per_request_tokens: float, now: float | None = None) -> Candidate:
    """A stale backend's view as the ledger reads it (module rule): still stale (so the
    prediction counts only the ledger), holding its in-flight requests plus the extra and their
    blocks, with a snapshot that carries nothing but its capacity (its own, else its smallest
    peer's) and the block size the ledger counts it in."""
    block_size = lease_block_size(candidate)
    snap = candidate.snapshot
    total_blocks: int | None = None
    if snap is not None and snap.kv_total_blocks:
        total_blocks = snap.kv_total_blocks
    elif not candidate.spec.max_batch_total_tokens and typical_tokens:
        total_blocks = typical_tokens // block_size or None
    # The block size the ledger counts its leases in (`lease_block_size` of the view is the
    # candidate's): a TGI token budget without KV figures keeps reading it from the spec.
    size: int | None = block_size
    if snap is not None and snap.block_size:
        size = snap.block_size
    elif total_blocks is None and candidate.spec.max_batch_total_tokens:
        size = None
    recent = (snap is not None and now is not None and snap.kv_free_blocks is not None
              and now - snap.taken_at <= RECENT_READING_S)
    view = BackendSnapshot(taken_at=snap.taken_at if snap is not None else -math.inf,
                           format=LEDGER_FORMAT, kv_total_blocks=total_blocks, block_size=size,
                           kv_free_blocks=snap.kv_free_blocks if recent and snap else None)
    extra = STALE_EXTRA_REQUESTS
    extra_blocks = extra * _blocks(per_request_tokens, block_size)
    since, since_blocks = ((candidate.dispatched_since_scrape + extra,
                            candidate.blocks_since_scrape + extra_blocks) if recent else (0, 0))
    return Candidate(candidate.spec, candidate.healthy, view, True, candidate.inflight + extra,
                     candidate.reserved_blocks + extra_blocks, since, since_blocks)


def ledger_load(candidate: Candidate, profile: BackendProfile, work: BackendWork | None,
                now: float, typical: float, mean_output_all: float,
                typical_tokens: int | None) -> BackendLoad:
    """A stale backend's side of the TTFT model (routing/predict.py `backend_load`) on its
    `ledger_candidate`. The extra requests are read as decoding there (a larger batch, a slower
    step, their KV held), not as prompts queued ahead: the queue ahead is the ledger's own, as
    is the source the prediction's reason names (a stale snapshot, or none)."""
    per_request = request_tokens(typical, mean_output_all)
    load = backend_load(ledger_candidate(candidate, typical_tokens, per_request, now), profile,
                        work, now, typical, mean_output_all)
    own = backend_load(candidate, profile, work, now, typical, mean_output_all)
    return load._replace(source=own.source, queued_tokens=own.queued_tokens,
                         queued_s=own.queued_s)
