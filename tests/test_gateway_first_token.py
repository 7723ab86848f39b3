"""The first streamed token of a reply reaches the router at once: the cost policy learns a
backend's speed from it while the reply is still streaming, not only when it ends."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from gateway.admission import GATE
from gateway.app import create_app
from gateway.config import Settings
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from routing.speed import ProfileEstimator
from routing.ttft import SLOW_START_SCALE

MODEL = PRESETS[DEFAULT_PRESET].model_name


async def test_a_streamed_first_token_calibrates_the_backend_before_the_reply_ends() -> None:
    async with running_sim(time_scale=1.0) as sim:
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": sim}],
            "routing": {"poll_interval_s": 0.05}})
        app = create_app(settings)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            dispatcher = app[GATE].dispatcher
            untaught = ProfileEstimator().profile()
            body = {"model": MODEL, "stream": True, "max_tokens": 400, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "word " * 200}]}
            async with aiohttp.ClientSession() as http, http.post(
                f"http://{host}:{port}/v1/chat/completions", json=body
            ) as resp:
                assert resp.status == 200
                backend = resp.headers["x-kvgate-backend"]
                async for line in resp.content:
                    if b'"content":"' in line and b'"content":""' not in line:
                        break  # the first text token has been relayed
                # 399 tokens still to come, so no TPOT has been measured: the first token
                # alone moved the speed off the slow start.
                learned = dispatcher.profile(backend)
                assert learned.decode_base_s < untaught.decode_base_s / (SLOW_START_SCALE / 2)
        finally:
            await runner.cleanup()
