"""The simulated fleet: which engines, and how to name it on a command line.

A fleet is written as comma-separated `[Nx]PRESET` items, e.g.
`4xllama-3-8b-h100,4xllama-3-8b-l40s` (four fast and four slow backends), or as a bare count `N`
for N backends of the default preset.
Presets are `kvgate sim`'s (`loadtest.sim.presets.PRESETS`), among them the same 8B model on
slower GPUs, so that mixed fleets serve one model: the gateway routes requests for a model among
the backends that serve it, and a fleet simulation compares policies within one such pool (the
same fleet can be run live, one `kvgate sim --preset` each).
"""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.sim.presets import (
    DEFAULT_PRESET,
    PRESETS,
    Preset,
    lookup,
)

MAX_BACKENDS = 256


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def find_preset(name: str) -> Preset:
    """`kvgate sim`'s preset of that name, or a deployment named `MODEL-[Nx]GPU[-fp8]`
    (`loadtest.sim.presets.lookup`); ValueError naming the known ones otherwise."""
    preset = lookup(name)
    if preset is None:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(preset_names())}, or "
                         "MODEL-[Nx]GPU[-fp8]")
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
