"""kvgate's I/O layer: the aiohttp server, OpenAI API, streaming proxy, cache, telemetry and CLI."""
