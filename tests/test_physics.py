"""The physics in one place: the simulator's presets, `kvgate plan` and the TTFT model's reference
profile all come from `routing.physics`, and `kvgate plan` runs without the load-test package."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

import pytest

from gateway import plan_cli
from loadtest.sim import engine
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from routing import physics, plan
from routing.physics import REFERENCE_PRESET, REFERENCE_PROFILE, Derived, derive
from routing.ttft import BackendProfile


@pytest.mark.parametrize(
    ("name", "blocks", "kv_bytes_per_token"),
    [
        pytest.param("llama-3-8b-h100", 26021, 131072, id="llama-3-8b on H100"),
        pytest.param("llama-3-8b-a100", 26021, 131072, id="llama-3-8b on A100"),
        pytest.param("llama-3-8b-l40s", 12288, 131072, id="llama-3-8b on L40S"),
        pytest.param("llama-3-8b-l4", 1988, 131072, id="llama-3-8b on L4"),
        pytest.param("llama-3-8b-h200", 52199, 131072, id="llama-3-8b on H200"),
        pytest.param("llama-3-8b-b200", 68936, 131072, id="llama-3-8b on B200"),
        pytest.param("llama-3-70b-2xh100", 2960, 327680, id="llama-3-70b on 2 x H100"),
        pytest.param("llama-3-70b-4xh100", 26929, 327680, id="llama-3-70b on 4 x H100"),
        pytest.param("llama-3-70b-2xh100-fp8", 26750, 163840,
                     id="llama-3-70b FP8 on 2 x H100: half the weights, half the KV per token"),
        pytest.param("llama-3.2-1b-l40s", 75695, 32768, id="llama-3.2-1b on L40S"),
        pytest.param("qwen2.5-0.5b-l4", 100394, 12288, id="qwen2.5-0.5b on L4"),
    ],
)
def test_every_preset_gets_the_kv_blocks_its_gpu_memory_and_model_figures_give(
    name: str, blocks: int, kv_bytes_per_token: int
) -> None:
    d = derive(PRESETS[name])
    assert (d.num_gpu_blocks, d.kv_bytes_per_token) == (blocks, kv_bytes_per_token)


def test_the_simulators_default_preset_is_the_reference_deployment() -> None:
    assert PRESETS[DEFAULT_PRESET] is REFERENCE_PRESET


def test_every_simulated_model_and_gpu_is_one_plan_knows_by_name() -> None:
    for preset in PRESETS.values():
        assert physics.MODELS[preset.model.name] is preset.model
        assert any(gpu is preset.gpu for gpu in physics.GPUS.values()), preset.gpu.name


@pytest.mark.parametrize(
    ("module", "name"),
    [
        pytest.param(plan_cli, "MODELS", id="kvgate plan's models"),
        pytest.param(plan_cli, "GPUS", id="kvgate plan's GPUs"),
        pytest.param(plan, "Preset", id="the plan's deployment"),
        pytest.param(plan, "derive", id="the plan's roofline"),
        pytest.param(plan, "attention_pairs", id="the plan's attention work"),
        pytest.param(engine, "Preset", id="the simulated engine's deployment"),
        pytest.param(engine, "derive", id="the simulated engine's roofline"),
        pytest.param(engine, "attention_pairs", id="the simulated engine's attention work"),
    ],
)
def test_plan_and_simulator_use_the_physics_modules_own_objects(
    module: ModuleType, name: str
) -> None:
    assert vars(module)[name] is vars(physics)[name]


@pytest.mark.parametrize(
    ("field", "roofline"),
    [
        pytest.param("prefill_tokens_per_s", lambda d: d.prefill_tokens_per_s(2048),
                     id="prefill speed: a 2k-token prompt alone"),
        pytest.param("decode_base_s", lambda d: d.decode_step_s(1, 0),
                     id="decode base: a step that reads the weights and no KV"),
        pytest.param("decode_per_kv_token_s", lambda d: d.kv_bytes_per_token
                     / d.effective_bandwidth, id="per KV token: its bytes at the bandwidth"),
    ],
)
def test_the_reference_profile_is_the_reference_presets_roofline_rounded(
    field: str, roofline: Callable[[Derived], float]
) -> None:
    derived = roofline(derive(REFERENCE_PRESET))
    assert getattr(REFERENCE_PROFILE, field) == pytest.approx(derived, rel=0.03)


def test_the_ttft_models_default_profile_is_the_reference_profile() -> None:
    default = BackendProfile()
    for field in dataclasses.fields(REFERENCE_PROFILE):
        assert getattr(default, field.name) == getattr(REFERENCE_PROFILE, field.name), field.name


def test_kvgate_plan_imports_nothing_from_the_load_test_package() -> None:
    code = ("import sys; from gateway.cli import main; code = main(['plan', '--json']); "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'loadtest'); "
            "print(loaded); sys.exit(code or bool(loaded))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout[-300:] + done.stderr[-300:]
