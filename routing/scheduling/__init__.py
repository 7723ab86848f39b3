"""The routing cycle's stages, one module each; routing/dispatch.py runs them in this order.

- cycle: the per-request cycle state every stage reads.
- facts: the data producer (per-candidate predictions, prefix match, committed peaks);
  backends: what it reads, one learned record per backend; ledger_view: how a backend whose
  metrics are stale or missing is read (by the gateway's ledger), for the producer and scorers.
- admission: which candidates may take the request now (KV rule, SLO admission).
- filters, offload, probe: the filters (pure; offload and probe learn in their hooks).
- latency, goodput, affinity, load_scorers: the scorers, each over the whole candidate list.
- pickers: the one choice among the scored survivors.
- learning: the Dispatcher's hooks after dispatch, at a first token and when an attempt ends.
The framework (Router, the plugin protocols) is routing/policy.py; the policies, composed of
these plugins by name, are routing/policies.py.
"""
