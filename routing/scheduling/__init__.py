"""The routing cycle in named stages; see routing/dispatch.py for the order they run in."""
