"""A vLLM-like inference server simulator: a pure engine plus a thin real-time aiohttp server."""
