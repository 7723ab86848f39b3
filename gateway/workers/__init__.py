"""`kvgate serve --workers N`: N worker processes behind one port, deciding as one gateway.

- gateway/workers/supervisor.py: the supervisor (the process `kvgate serve` runs): the host's
  one poller, the workers' start, restart and drain.
- gateway/workers/worker.py: one worker: the gateway of gateway/serve.py, with its scrapes read
  from the host's board and its ledger on the host's table.
- gateway/workers/segment.py: the shared-memory segment both live in.
- gateway/workers/metrics.py: one `/metrics` for the host, the workers' expositions merged.
"""
