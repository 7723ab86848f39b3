"""The fault-injection suite's helpers: a misbehaving upstream, process control (simulators, the
gateway and Redis as subprocesses to kill, freeze and thaw) and clients that judge every answer."""
