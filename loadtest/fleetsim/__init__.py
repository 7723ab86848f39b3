"""`kvgate simulate`: a discrete-event, virtual-time simulation of a fleet of simulated engines
behind the gateway's own routing code (loadtest/simulate_cli.py is the command)."""
