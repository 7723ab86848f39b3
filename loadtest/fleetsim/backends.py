"""The simulated fleet: which engines, and how to name it on a command line.

A fleet is written as comma-separated `[Nx]PRESET` items, e.g.
`4xllama-3-8b-h100,4xllama-3-8b-l40s` (four fast and four slow backends), or as a bare count `N`
for N backends of the default preset.
Presets are `kvgate sim`'s (`loadtest.sim.presets.PRESETS`) plus the same 8B model on slower GPUs
defined here, so that mixed fleets serve one model: the gateway routes requests for a model among
the backends that serve it, and a fleet simulation compares policies within one such pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from loadtest.sim.presets import (
    DEFAULT_PRESET,
    L4,
    L40S,
    LLAMA_3_8B,
    PRESETS,
    GpuSpec,
    Preset,
)

A100_SXM = GpuSpec("A100 SXM 80GB", hbm_bytes=80e9, bandwidth=2.039e12, flops=312e12)

# The default preset's model on slower GPUs, for heterogeneous fleets.
FLEET_PRESETS: Mapping[str, Preset] = MappingProxyType({
    p.name: p
    for p in (
        Preset("llama-3-8b-a100", LLAMA_3_8B, A100_SXM),
        Preset("llama-3-8b-l40s", LLAMA_3_8B, L40S),
        Preset("llama-3-8b-l4", LLAMA_3_8B, L4),
    )
})
MAX_BACKENDS = 256


def preset_names() -> tuple[str, ...]:
    return (*PRESETS, *(name for name in FLEET_PRESETS if name not in PRESETS))


def find_preset(name: str) -> Preset:
    """`kvgate sim`'s preset of that name, else one of FLEET_PRESETS; ValueError otherwise."""
    preset = PRESETS.get(name) or FLEET_PRESETS.get(name)
    if preset is None:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(preset_names())}")
    return preset


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """One preset per backend, in backend order (ids b0, b1, ...)."""

    presets: tuple[Preset, ...]

    @property
    def model(self) -> str:
        return self.presets[0].model_name

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(f"b{i}" for i in range(len(self.presets)))

    def describe(self) -> str:
        """`4xllama-3-8b-h100,4xllama-3-8b-l40s`: runs of equal presets, in order."""
        runs: list[list[object]] = []
        for p in self.presets:
            if runs and runs[-1][1] == p.name:
                runs[-1][0] = int(str(runs[-1][0])) + 1
            else:
                runs.append([1, p.name])
        return ",".join(f"{n}x{name}" for n, name in runs)


def parse_fleet(text: str) -> FleetSpec:
    """A fleet from its command-line form (module docstring); ValueError naming the problem."""
    text = text.strip()
    if text.isdigit():
        text = f"{text}x{DEFAULT_PRESET}"
    presets: list[Preset] = []
    for item in text.split(","):
        item = item.strip()
        count, sep, name = item.partition("x")
        if not (sep and count.isdigit()):
            count, name = "1", item
        if int(count) < 1:
            raise ValueError(f"backend count must be >= 1 in {item!r}")
        presets.extend([find_preset(name)] * int(count))
        if len(presets) > MAX_BACKENDS:
            raise ValueError(f"at most {MAX_BACKENDS} backends")
    if not presets:
        raise ValueError("a fleet needs at least one backend")
    models = sorted({p.model_name for p in presets})
    if len(models) > 1:
        raise ValueError(f"a simulated fleet serves one model; these presets serve "
                         f"{', '.join(models)}")
    return FleetSpec(tuple(presets))
