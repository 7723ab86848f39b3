"""kvgate's decisions: backend state, metrics parsing, cost estimates, policies and admission.

Pure code over plain values (the metrics poller is the one I/O piece). Never imports `gateway`.
"""
