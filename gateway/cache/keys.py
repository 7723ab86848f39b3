"""Cache keys: which completion requests share an answer, and which must not be cached at all.

`cache_key(kind, body, model)` takes the JSON-decoded request body and the alias-resolved model
and returns either a `CacheKey` or a `Bypass` naming why the request is not cacheable. It is pure:
no I/O, no clock, no randomness.

- `id` (exact tier) is the sha256 of the canonical request: `kind`, the resolved model, and every
  body field except those that cannot change the answer (`model`, which is replaced by the
  resolved one, `stream`, `stream_options`, `user`, `metadata`, `store`, `service_tier`). Unknown
  fields stay in the key: an unknown field fragments the cache, it never serves a wrong answer.
  The body sits under its own key of the canonical form, so a body field named `kind` cannot
  override the real kind.
- The canonical form is encoded with orjson, keys sorted, numbers normalised so `0` and `0.0`
  (and `-0.0`) hash alike: an int becomes the float of the same value when that float is exact;
  an int no float holds exactly stays an integer literal, so two different seeds never merge.
  Bools stay bools.
- `namespace` (semantic tier) is the same digest with the query text blanked (`null`): a semantic
  match may only come from a request identical in everything but that text, i.e. the same model,
  sampling parameters, tools, system prompt and earlier turns.
- `query` is the text a semantic lookup embeds. chat: the last message when it is a user message
  whose content is a string or a list of only text parts (joined with "\\n"); text: the prompt when
  it is a string or a one-string list. Anything else (images, tool results, an assistant message
  last, token ids) and blank text give `None`, the exact tier only, with `namespace == id`.
- Bypass: `n` > 1, `best_of` > 1 (more than one answer), `logprobs` set to anything but
  null/false or `top_logprobs` set (the cache keeps no logprobs; a completions `logprobs: 0` still
  returns the sampled tokens' logprobs), `echo` (the answer repeats the prompt), a completions
  `prompt` holding more than one prompt, `temperature` above `max_temperature` when that is set
  (absent or null counts as 1.0, OpenAI's default) and no `seed` is set (a seeded request asks
  for the same answer again), and a body nested deeper than `MAX_DEPTH`
  (orjson cannot encode it; no real request comes near). A field with a wrongly typed value is
  no reason to bypass: the backend rejects the request, and error answers are never stored.
- `revision` names the weights behind the model (a configured `model_revision`, the backends'
  `system_fingerprint`): part of both digests, so new weights never serve the old ones' answers.
- `deterministic` (temperature 0, or a seed) is what the semantic tier asks of a request; `capped`
  (the client set `max_tokens` or `max_completion_tokens`) is what an answer cut at its length
  needs to be stored.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

Kind = Literal["chat", "text"]  # /v1/chat/completions, /v1/completions

# Body fields that cannot change the answer; everything else, known or not, is in the key.
IGNORED_FIELDS = frozenset(
    {"model", "stream", "stream_options", "user", "metadata", "store", "service_tier"}
)
# Nesting of the body beyond which it is not cacheable. orjson refuses to encode past 255 levels
# and decodes up to 1024, so a decodable body can be unencodable; real bodies stay under ~20.
MAX_DEPTH = 128


@dataclass(frozen=True, slots=True)
class CacheKey:
    id: str  # sha256 hex of the canonical request: the exact-match identity
    namespace: str  # sha256 hex of the canonical request with the query text blanked
    query: str | None  # the text a semantic lookup embeds; None = exact tier only
    model: str  # the real (alias-resolved) model
    kind: Kind
    deterministic: bool = False  # temperature 0 or a seed: the semantic tier may serve it
    capped: bool = False  # the client set max_tokens: an answer cut at its length may be kept
    revision: str | None = None  # the weights' name the digests include


@dataclass(frozen=True, slots=True)
class Bypass:
    reason: str  # "n", "best_of", "logprobs", "echo", "prompt_list", "temperature", "nesting"


class _TooDeep(Exception):
    """A body nested deeper than MAX_DEPTH: bypassed rather than hashed."""


def cache_key(
    kind: Kind, body: Mapping[str, Any], model: str, *, max_temperature: float | None = None,
    scope: str | None = None, revision: str | None = None,
) -> CacheKey | Bypass:
    """The cache identity of one completion request, or why it has none. A `scope` (a tenant,
    with `cache.scope: tenant`) is part of both the id and the namespace: scopes share nothing.

    `body` is the JSON-decoded request (str keys; values dicts, lists, str, int, float, bool,
    None); any other value raises TypeError, a caller's bug rather than a client's.
    """
    reason = _bypass_reason(kind, body, max_temperature)
    if reason is not None:
        return Bypass(reason)
    try:
        params = {
            name: _normalised(value, 1)
            for name, value in body.items()
            if name not in IGNORED_FIELDS
        }
    except _TooDeep:
        return Bypass("nesting")
    id_ = _digest(kind, model, params, scope, revision)
    temperature = body.get("temperature")
    deterministic = _given(body.get("seed")) or (
        _number(temperature) and not _exceeds(temperature, 0.0))
    capped = _given(body.get("max_tokens")) or _given(body.get("max_completion_tokens"))
    found = _chat_query(params) if kind == "chat" else _text_query(params)
    if found is None:
        return CacheKey(id=id_, namespace=id_, query=None, model=model, kind=kind,
                        deterministic=deterministic, capped=capped, revision=revision)
    query, blanked = found
    return CacheKey(id=id_, namespace=_digest(kind, model, blanked, scope, revision),
                    query=query, model=model, kind=kind, deterministic=deterministic,
                    capped=capped, revision=revision)


def _given(value: object) -> bool:
    """A field set to something (null and absent are the same to OpenAI)."""
    return value is not None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bypass_reason(kind: Kind, body: Mapping[str, Any], max_temperature: float | None
                   ) -> str | None:
    if _exceeds(body.get("n"), 1):
        return "n"
    if _exceeds(body.get("best_of"), 1):
        return "best_of"
    logprobs = body.get("logprobs")
    if (logprobs is not None and logprobs is not False) or body.get("top_logprobs") is not None:
        return "logprobs"
    if body.get("echo"):
        return "echo"
    if kind == "text" and _prompt_count(body.get("prompt")) > 1:
        return "prompt_list"
    if max_temperature is not None and body.get("seed") is None:
        temperature = body.get("temperature")
        if _exceeds(1.0 if temperature is None else temperature, max_temperature):
            return "temperature"
    return None


def _exceeds(value: object, limit: float) -> bool:
    """`value` is a JSON number above `limit` (null, bools and strings are not numbers here)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value > limit


def _prompt_count(prompt: object) -> int:
    """How many prompts a completions `prompt` holds: a string or a list of token ids is one."""
    if not isinstance(prompt, list):
        return 1
    if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
        return 1
    return len(prompt)


def _normalised(value: Any, depth: int) -> Any:
    """`value` with numbers in one form, ready for orjson; the rest unchanged."""
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        try:
            as_float = float(value)
        except OverflowError:
            return orjson.Fragment(str(value))
        # An int no float holds exactly stays an integer literal, which no float encodes as.
        return as_float if as_float == value else orjson.Fragment(str(value))
    if isinstance(value, float):
        # orjson writes NaN and infinities as null; keep them apart from null and each other.
        return value + 0.0 if math.isfinite(value) else orjson.Fragment(repr(value))
    if depth >= MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, Mapping):
        normalised: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"cache keys need str object keys, not {type(key).__name__}")
            normalised[key] = _normalised(item, depth + 1)
        return normalised
    if isinstance(value, list | tuple):
        return [_normalised(item, depth + 1) for item in value]
    raise TypeError(f"cache keys take JSON values, not {type(value).__name__}")


def _digest(kind: Kind, model: str, params: dict[str, Any], scope: str | None,
            revision: str | None) -> str:
    canonical: dict[str, Any] = {"kind": kind, "model": model, "params": params}
    if scope is not None:
        canonical["scope"] = scope
    if revision is not None:
        canonical["revision"] = revision
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _chat_query(params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The last user message's text and `params` with that message's content null."""
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    text = _text_content(last.get("content"))
    if text is None:
        return None
    return text, {**params, "messages": [*messages[:-1], {**last, "content": None}]}


def _text_content(content: object) -> str | None:
    """A message content's text when it is only text and not blank."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                return None
            piece = part.get("text")
            if not isinstance(piece, str):
                return None
            texts.append(piece)
        text = "\n".join(texts)
    else:
        return None
    return text if text.strip() else None


def _text_query(params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The completions prompt's text and `params` with the prompt null."""
    prompt = params.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        return None
    return prompt, {**params, "prompt": None}
